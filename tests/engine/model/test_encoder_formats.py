"""The encoder's other sources against transformers' own implementation: nomic-bert folders as the hub holds them
(nomic's original config keys and weight names) and llama.cpp GGUF files of bert and nomic-bert encoders (F32 and
Q8_0), each on a tiny random model with padding in the batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.api import ModelLoadError
from engine.loading.embedding_model import embedding_problem, read_embedding_spec
from engine.loading.gguf_reader import read_tensor_table
from engine.model.embedding import TransformerEmbedder
from tests.engine.embedding_models import (
    build_tiny_embedder,
    gguf_reference,
    nomic_original_config,
    write_gguf,
)
from tests.engine.model.test_embedding import TEXTS, _reference


def _check(embedder: TransformerEmbedder, model: torch.nn.Module, pooling: str = "mean") -> None:
    """Documents (batched and alone) and a query, each with the model's prompt, equal transformers' vectors."""
    texts = [embedder.spec.document_prompt + t for t in TEXTS]
    ids = embedder.token_ids(texts)
    expected = _reference(model, ids, 0, pooling)
    np.testing.assert_allclose(embedder.embed(TEXTS), expected, atol=1e-5)
    np.testing.assert_allclose(np.concatenate([embedder.embed([t]) for t in TEXTS]), expected, atol=1e-5)
    query = "where is the boat?"
    [prompted] = embedder.token_ids([embedder.spec.query_prompt + query])
    np.testing.assert_allclose(
        embedder.embed_query([query]), _reference(model, [prompted], 0, pooling), atol=1e-5
    )


@pytest.mark.parametrize("spelling", ["hub", "transformers"])
def test_nomic_bert_folder_matches_transformers(tmp_path: Path, spelling: str) -> None:
    """Two spellings. "hub": nomic's config keys (n_embd, rotary_emb_base, activation_function...) over the weights as the hub
    names them (encoder.layers.N.attn.Wqkv, mlp.fc11...); "transformers": NomicBertConfig's keys over
    NomicBertModel's own parameter names."""
    folder, model = build_tiny_embedder("nomic_bert", tmp_path / "nomic", "mean")
    if spelling == "hub":
        (folder / "config.json").write_text(json.dumps(nomic_original_config(model.config)))
    else:
        from safetensors.torch import save_file

        save_file(
            {n: t.contiguous() for n, t in model.state_dict().items()}, str(folder / "model.safetensors")
        )
    embedder = TransformerEmbedder(folder)
    assert (
        embedder.spec.query_prompt == "search_query: "
        and embedder.spec.document_prompt == "search_document: "
    )
    assert (
        embedder.spec.pooling == "mean" and embedder.spec.max_tokens == model.config.max_position_embeddings
    )
    assert embedder.num_parameters == sum(p.numel() for p in model.parameters())
    _check(embedder, model)


def test_nomic_dynamic_rotary_scaling_runs_up_to_the_trained_length(tmp_path: Path) -> None:
    """nomic's rotary_scaling_factor (dynamic NTK) leaves positions up to the trained length as they are: inputs are
    cut there and the vectors are the unscaled model's."""
    folder, model = build_tiny_embedder("nomic_bert", tmp_path / "nomic", "mean")
    config = nomic_original_config(model.config) | {"rotary_scaling_factor": 2.0, "max_trained_positions": 16}
    (folder / "config.json").write_text(json.dumps(config))
    embedder = TransformerEmbedder(folder)
    assert embedder.spec.max_tokens == 16
    assert max(len(x) for x in embedder.token_ids([embedder.spec.document_prompt + t for t in TEXTS])) == 16
    _check(embedder, model)


def test_a_folder_prompt_overrides_nomics_default(tmp_path: Path) -> None:
    folder, _ = build_tiny_embedder("nomic_bert", tmp_path / "nomic", "mean")
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "q: ", "passage": "d: "}})
    )
    spec = read_embedding_spec(folder)
    assert (spec.query_prompt, spec.document_prompt) == ("q: ", "d: ")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rotary_emb_fraction", 0.5),
        ("rotary_emb_interleaved", True),
        ("qkv_proj_bias", True),
        ("mlp_fc2_bias", True),
        ("prenorm", True),
        ("moe_every_n_layers", 2),
        ("activation_function", "gelu"),
    ],
)
def test_nomic_settings_the_encoder_does_not_run_are_refused_by_name(
    tmp_path: Path, key: str, value: object
) -> None:
    folder, model = build_tiny_embedder("nomic_bert", tmp_path / "nomic", "mean")
    config = nomic_original_config(model.config) | {key: value}
    (folder / "config.json").write_text(json.dumps(config))
    problem = embedding_problem(folder)
    assert key in problem and "does not run" in problem
    with pytest.raises(ModelLoadError, match=key):
        TransformerEmbedder(folder)


@pytest.mark.parametrize("quantized", [False, True], ids=["F32", "Q8_0"])
@pytest.mark.parametrize("model_type", ["bert", "nomic_bert"])
def test_gguf_encoder_matches_transformers(tmp_path: Path, model_type: str, quantized: bool) -> None:
    """A GGUF written as llama.cpp's converter writes it; transformers runs the same (dequantized) weights."""
    folder, model = build_tiny_embedder(model_type, tmp_path / "hf", "mean")
    path = write_gguf(folder, model, tmp_path / f"{model_type}.gguf", quantized)
    _metadata, entries = read_tensor_table(path)
    kinds = {e.kind for e in entries}
    assert kinds == ({"F32", "Q8_0"} if quantized else {"F32"})
    if quantized:
        model = gguf_reference(folder, path, tmp_path / "reference")
    embedder = TransformerEmbedder(path)
    assert (
        embedder.spec.gguf
        and embedder.spec.pooling == "mean"
        and "pooling_type" in embedder.spec.pooling_source
    )
    assert "GGUF" in embedder.description and embedder.dim == 32
    assert embedder.name == str(path.resolve())
    from tokenizers import Tokenizer

    own = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = [embedder.spec.document_prompt + t for t in [*TEXTS, "Ünïcode Lighthouse, keepers?"]]
    assert embedder.token_ids(texts) == [e.ids for e in own.encode_batch(texts)]  # the vocabulary put back
    _check(embedder, model)


def test_gguf_pooling_and_refusals(tmp_path: Path) -> None:
    import gguf

    folder, model = build_tiny_embedder("bert", tmp_path / "hf", "mean")
    cls = write_gguf(folder, model, tmp_path / "cls.gguf", False, pooling=2)
    assert read_embedding_spec(cls).pooling == "cls"
    np.testing.assert_allclose(
        TransformerEmbedder(cls).embed(TEXTS),
        _reference(model, TransformerEmbedder(cls).token_ids(TEXTS), 0, "cls"),
        atol=1e-5,
    )
    rank = write_gguf(folder, model, tmp_path / "rank.gguf", False, pooling=4)
    assert "reranker" in embedding_problem(rank)
    writer = gguf.GGUFWriter(str(tmp_path / "chat.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "bert, nomic-bert" in embedding_problem(tmp_path / "chat.gguf")
