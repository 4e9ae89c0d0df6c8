"""Embedding models run by the engine against transformers' own implementation, on tiny random models of every
type in the embedding registry: same token ids, same pooled and normalised vectors (fp32), alone and batched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.api import ModelLoadError
from engine.architectures import EMBEDDING_ARCHITECTURES, count_encoder_parameters
from engine.loading.embedding_model import embedding_problem, is_embedding_folder, read_embedding_spec
from engine.model.embedding import TransformerEmbedder
from tests.engine.embedding_models import build_tiny_embedder

TEXTS = [
    "The lighthouse keeper oiled the clock motor.",
    "a",
    "Storm at sea, night light on the tower, and the boat in the harbour was tied with rope.",
    "Members spent pounds on paint",
]
ENCODERS = sorted(t for t, a in EMBEDDING_ARCHITECTURES.items() if a.path == "encoder")
DECODERS = sorted(t for t, a in EMBEDDING_ARCHITECTURES.items() if a.path == "fused")


def _reference(model: torch.nn.Module, ids: list[list[int]], pad: int, pooling: str) -> np.ndarray:
    """transformers' token states over a right-padded batch, pooled as sentence-transformers pools them."""
    width = max(len(x) for x in ids)
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    with torch.no_grad():
        states = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    if pooling == "cls":
        pooled = states[:, 0]
    elif pooling == "last":
        pooled = states[torch.arange(len(ids)), mask.sum(1) - 1]
    else:
        pooled = (states * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("model_type", ENCODERS)
def test_encoder_matches_transformers(tmp_path: Path, model_type: str, pooling: str) -> None:
    import transformers

    folder, model = build_tiny_embedder(model_type, tmp_path / model_type, pooling)
    embedder = TransformerEmbedder(folder)
    assert embedder.spec.pooling == pooling and "pooling config" in embedder.spec.pooling_source
    assert embedder.dim == 32 and embedder.name == str(folder.resolve())
    assert embedder.num_parameters == sum(p.numel() for n, p in model.named_parameters() if "pooler" not in n)
    texts = [embedder.spec.document_prompt + t for t in TEXTS]  # nomic's "search_document: ", else none
    ids = embedder.token_ids(texts)
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    assert ids == [hf_tokenizer(t)["input_ids"] for t in texts]  # the same ids as transformers' tokenizer
    pad = int(model.config.pad_token_id or 0)
    expected = _reference(model, ids, pad, pooling)
    batched = embedder.embed(TEXTS)
    assert batched.dtype == np.float32 and batched.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(batched, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-6)
    alone = np.concatenate([embedder.embed([t]) for t in TEXTS])
    np.testing.assert_allclose(alone, expected, atol=1e-5)  # padding beside longer texts changes nothing


def test_encoder_pooling_defaults_to_the_registry_and_long_texts_are_cut(tmp_path: Path) -> None:
    folder, model = build_tiny_embedder("bert", tmp_path / "bare")  # no sentence-transformers files
    spec = read_embedding_spec(folder)
    assert spec.pooling == EMBEDDING_ARCHITECTURES["bert"].pooling and "default" in spec.pooling_source
    assert is_embedding_folder(folder, {"model_type": "bert"})  # an encoder is an embedder even without them
    embedder = TransformerEmbedder(folder)
    long_text = " ".join(["lighthouse keeper"] * 200)
    [ids] = embedder.token_ids([long_text])
    assert len(ids) == model.config.max_position_embeddings == spec.max_tokens
    np.testing.assert_allclose(
        embedder.embed([long_text]), _reference(model, [ids], 0, spec.pooling), atol=1e-5
    )
    assert count_encoder_parameters(model.config) == sum(
        p.numel() for n, p in model.named_parameters() if "pooler" not in n
    )


@pytest.mark.parametrize("causal_lm", [False, True], ids=["base-model", "causal-lm"])
@pytest.mark.parametrize("model_type", DECODERS)
def test_decoder_embedder_matches_transformers_last_token(
    tmp_path: Path, model_type: str, causal_lm: bool
) -> None:
    """Qwen3-Embedding style: the fused decoder's last-token state, normalised, against transformers' base model
    on each text alone (so no padding enters the reference); the query gets the folder's instruction prompt."""
    folder, model = build_tiny_embedder(model_type, tmp_path / model_type, "last", causal_lm=causal_lm)
    base = model.model if causal_lm else model
    embedder = TransformerEmbedder(folder)
    assert embedder.spec.pooling == "last" and embedder.dim == 32
    ids = embedder.token_ids(TEXTS)
    assert all(x[-1] == 2 for x in ids)  # the tokenizer's end-of-text comes last, as Qwen3-Embedding's does
    expected = np.concatenate([_reference(base, [x], 0, "last") for x in ids])
    np.testing.assert_allclose(embedder.embed(TEXTS), expected, atol=1e-5)
    query = "where is the boat?"
    [prompted] = embedder.token_ids([embedder.spec.query_prompt + query])
    np.testing.assert_allclose(
        embedder.embed_query([query]), _reference(base, [prompted], 0, "last"), atol=1e-5
    )


def test_folders_that_are_not_embedders_are_refused_in_words(tmp_path: Path) -> None:
    folder, _ = build_tiny_embedder(
        "qwen3", tmp_path / "chat"
    )  # a qwen3 without pooling files is a chat model
    assert not is_embedding_folder(folder, {"model_type": "qwen3"})
    assert "chat model, not an embedding model" in embedding_problem(folder)
    bert, _ = build_tiny_embedder("bert", tmp_path / "bert", "mean")
    (bert / "1_Pooling" / "config.json").write_text('{"pooling_mode_max_tokens": true}')
    assert "max_tokens" in embedding_problem(bert)
    (bert / "modules.json").write_text('[{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}]')
    with pytest.raises(ModelLoadError, match="Dense module"):
        TransformerEmbedder(bert)
    gguf = tmp_path / "nomic.gguf"
    gguf.write_bytes(b"GGUF")
    assert "nomic.gguf is truncated" in embedding_problem(gguf)
    (tmp_path / "empty").mkdir()
    assert "no config.json" in embedding_problem(tmp_path / "empty")
