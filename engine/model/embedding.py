"""Embedding models run by the engine: texts to L2-normalised vectors, for the document index and the server.

Two kinds, each a row of the embedding registry (:data:`engine.architectures.EMBEDDING_ARCHITECTURES`):

* BERT-family encoders (bge, e5, gte, all-MiniLM, multilingual-e5, nomic-embed-text...): ``engine/model/encoder.py``
  over a padded batch, then CLS or mean pooling; from a Hugging Face folder or a llama.cpp GGUF file (``bert``,
  ``nomic-bert``), whose WordPiece vocabulary becomes a ``tokenizers`` tokenizer here.
* decoder embedders (Qwen3-Embedding): the fused decoder of the chat models (``engine/model/llama.py``) over the
  packed texts, each a causal prefill into a scratch KV pool, then the last token's state.

How a folder pools and prompts is read by :func:`engine.loading.embedding_model.read_embedding_spec`. Texts are
tokenized with the folder's ``tokenizer.json`` (or a WordPiece ``vocab.txt``, or a GGUF's vocabulary) and cut to the
model's length; they
are embedded in batches of similar length so little padding is computed. No transformers at run time.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from engine.api import ModelLoadError
from engine.architectures import EMBEDDING_ARCHITECTURES
from engine.loading.embedding_model import (
    EmbeddingSpec,
    encoder_config,
    gguf_encoder_config,
    read_embedding_spec,
)
from engine.loading.gguf_reader import read_regular_text
from engine.model.encoder import Encoder, encoder_state, read_gguf_state, read_state

#: Tokens per forward pass at most (padding included), so a long batch cannot take much memory.
MAX_BATCH_TOKENS = 8192


def _tokenizer(folder: Path, max_tokens: int) -> Any:
    """The folder's tokenizer with its special tokens, cut to ``max_tokens`` and unpadded."""
    from tokenizers import Tokenizer

    if (folder / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    elif (folder / "vocab.txt").is_file():
        from tokenizers import BertWordPieceTokenizer

        try:
            config = json.loads(read_regular_text(folder / "tokenizer_config.json"))
        except (OSError, ValueError):
            config = {}
        lower = bool(config.get("do_lower_case", True)) if isinstance(config, dict) else True
        tokenizer = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=lower)
    else:
        raise ModelLoadError(
            f"{folder.name} has no tokenizer.json or vocab.txt; Hearth reads its tokenizer from those."
        )
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


#: llama.cpp's token types (``tokenizer.ggml.token_type``): 3 is a control token ([CLS], [SEP], [PAD]...).
_CONTROL = 3


def gguf_wordpiece(metadata: dict[str, Any], max_tokens: int, where: str) -> Any:
    """A GGUF's WordPiece vocabulary (``tokenizer.ggml.model`` "bert") as a ``tokenizers`` tokenizer that splits as
    BERT's does: ``[CLS] text [SEP]``, lower-cased as llama.cpp's WPM tokenizer always does.

    llama.cpp's converter rewrites each word-start token with a leading U+2581 and drops the ``##`` of a
    continuation (control tokens stay as they are); this puts them back.

    Raises:
        ModelLoadError: when the vocabulary is missing or names no [CLS]/[SEP]/[UNK].
    """
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ModelLoadError(f"{where} has no vocabulary (tokenizer.ggml.tokens); re-download it.")
    types = metadata.get("tokenizer.ggml.token_type")
    types = [int(t) for t in types] if types is not None and len(types) == len(tokens) else [1] * len(tokens)
    vocab: dict[str, int] = {}
    specials: list[str] = []
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == _CONTROL or (token.startswith("[") and token.endswith("]")):
            word = token  # older converters kept every [..] token as it was
            if kind == _CONTROL:
                specials.append(token)
        elif token.startswith("\u2581"):
            word = token[1:]
        else:
            word = "##" + token
        vocab.setdefault(word, i)

    def special(names: tuple[str, ...], fallback: str) -> str:
        for name in names:  # newer converters write [CLS] as the bos token, older ones as cls
            token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
            if isinstance(token_id, int) and 0 <= token_id < len(tokens):
                return str(tokens[token_id]).removeprefix("\u2581")
        if fallback not in vocab:
            raise ModelLoadError(
                f"{where}'s vocabulary has no {fallback} token (tokenizer.ggml.{names[0]}_token_id)."
            )
        return fallback

    cls = special(("cls", "bos"), "[CLS]")
    sep, unk = special(("seperator", "eos"), "[SEP]"), special(("unknown",), "[UNK]")
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])]
    )
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True) for t in dict.fromkeys([cls, sep, unk, *specials])]
    )
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


class TransformerEmbedder:
    """An embedding model folder, loaded once: ``embed`` for documents, ``embed_query`` for search queries.

    Thread-safe: one forward pass at a time (the index's thread and the server may share it).

    Args:
        folder: the model's folder.
        dtype: the compute dtype (float32 by default: the vectors of a collection must not depend on the machine).

    Raises:
        ModelLoadError: when the folder is not an embedding model Hearth runs, or its files do not match.
    """

    def __init__(self, folder: Path, dtype: torch.dtype = torch.float32) -> None:
        self.spec: EmbeddingSpec = read_embedding_spec(Path(folder))
        folder = self.spec.folder
        self.name = str(folder.resolve())
        self.dtype = dtype
        self._lock = threading.Lock()
        arch = EMBEDDING_ARCHITECTURES[self.spec.model_type]
        self._encoder: Encoder | None = None
        self._decoder: Any = None
        with torch.no_grad():
            if self.spec.gguf:
                metadata, state = read_gguf_state(folder)
                _type, shape = gguf_encoder_config(metadata, folder.name)
                self.tokenizer = gguf_wordpiece(metadata, self.spec.max_tokens, folder.name)
                self._encoder = Encoder(shape, state, dtype, folder)
                self.dim = shape.hidden
            else:
                config = json.loads(read_regular_text(folder / "config.json"))
                self.tokenizer = _tokenizer(folder, self.spec.max_tokens)
                state = read_state(folder, arch.weight_prefixes)
                if arch.path == "encoder":
                    shape = encoder_config(config, arch, folder.name)
                    self._encoder = Encoder(shape, encoder_state(state), dtype, folder)
                    self.dim = shape.hidden
                else:
                    self._decoder, self._decoder_config = _fused_decoder(config, state, dtype, folder)
                    self.num_parameters = sum(int(t.numel()) for t in state.values())
                    self.dim = int(config["hidden_size"])
        del state
        if self._encoder is not None:
            self.num_parameters = self._encoder.num_parameters
        kind = "encoder" if arch.path == "encoder" else "decoder"
        source = ", GGUF" if self.spec.gguf else ""
        self.description = f"{folder.name} ({self.spec.model_type} {kind}{source}, {self.dim} dimensions, {self.spec.pooling_source})"

    def embed(self, texts: list[str]) -> np.ndarray:
        """Documents (chunks) to unit vectors [len(texts), dim], float32; the model's document prompt first."""
        return self._embed([self.spec.document_prompt + t for t in texts])

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Search queries to unit vectors, with the model's query prompt (an instruction, ``query: ``) first."""
        return self._embed([self.spec.query_prompt + t for t in texts])

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """The ids each text is embedded from: special tokens added, cut to the model's length."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    def _embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.token_ids(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        with self._lock, torch.no_grad():
            start = 0
            while start < len(order):
                longest, end = max(1, len(ids[order[start]])), start
                while (
                    end < len(order)
                    and max(longest, len(ids[order[end]])) * (end - start + 1) <= MAX_BATCH_TOKENS
                ):
                    longest = max(longest, len(ids[order[end]]))
                    end += 1
                end = max(end, start + 1)
                batch = [ids[i] or [0] for i in order[start:end]]
                vectors = self._pooled(batch)
                out[order[start:end]] = F.normalize(vectors.float(), dim=-1).numpy()
                start = end
        return out

    def _pooled(self, batch: list[list[int]]) -> torch.Tensor:
        if self._encoder is not None:
            return self._encoder_pooled(self._encoder, batch)
        return self._decoder_pooled(batch)

    def _encoder_pooled(self, encoder: Encoder, batch: list[list[int]]) -> torch.Tensor:
        width = max(len(x) for x in batch)
        ids = torch.full((len(batch), width), encoder.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, x in enumerate(batch):
            ids[row, : len(x)] = torch.tensor(x, dtype=torch.long)
            mask[row, : len(x)] = 1
        states = encoder.forward(ids, mask)
        if self.spec.pooling == "cls":
            return states[:, 0]
        if self.spec.pooling == "last":
            return states[torch.arange(len(batch)), mask.sum(dim=1) - 1]
        weights = mask[:, :, None].to(states.dtype)
        return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)

    def _decoder_pooled(self, batch: list[list[int]]) -> torch.Tensor:
        from engine.api import NULL_BLOCK
        from engine.model.attention import AttentionContext, PrefillChunk
        from engine.model.kv_cache import KVCache

        lens = [len(x) for x in batch]
        total, block = sum(lens), 16
        first = (NULL_BLOCK + 1) * block  # the null block stays untouched
        kv = KVCache(
            self._decoder_config, -(-(first + total) // block), block, self.dtype, torch.device("cpu")
        )
        ids = torch.tensor([t for x in batch for t in x], dtype=torch.long)
        pos = torch.cat([torch.arange(n) for n in lens])
        starts = np.cumsum([0, *lens[:-1]]).tolist()
        chunks = [PrefillChunk(int(s), n, n, None, None) for s, n in zip(starts, lens, strict=True)]
        ctx = AttentionContext(torch.arange(first, first + total), 0, None, None, chunks)
        states = self._decoder.hidden_states(ids, pos, kv, ctx)
        ends = torch.tensor([s + n - 1 for s, n in zip(starts, lens, strict=True)])
        if self.spec.pooling == "last":
            return states[ends]
        if self.spec.pooling == "cls":
            return states[torch.tensor(starts)]
        return torch.stack([states[s : s + n].mean(dim=0) for s, n in zip(starts, lens, strict=True)])


def _fused_decoder(
    config: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, where: Path
) -> tuple[Any, Any]:
    """The fused Llama-family decoder over a decoder embedder's weights (dense, unquantized), and its config."""
    from engine.loading.native import build, make_config
    from engine.loading.shape import check_config_values
    from engine.model.llama import FusedDecoder
    from engine.model.quantization import DenseLinear

    check_config_values(config, where, "The file is damaged or comes from different models; re-download it.")
    model_config = make_config(config)
    named = {n if n.startswith(("model.", "lm_head.")) else f"model.{n}": t for n, t in state.items()}
    model = build(model_config, named, dtype, where)
    decoder = FusedDecoder(
        model, lambda role, names, weight, bias: DenseLinear(weight, bias), quantized=False
    )
    return decoder, model_config
