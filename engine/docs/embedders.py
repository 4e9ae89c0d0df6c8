"""Embedders: text to unit vectors, the best available first, with the reason for the choice in words.

- ``wordllama``: WordLlama's static token embeddings (256 dimensions, MIT), averaged over a text's tokens. The
  ``wordllama`` wheel ships the weights and the tokenizer; they are read here directly with ``safetensors`` and
  ``tokenizers``, because the package's own loader looks in a cache folder and falls back to a download, and the
  index must work offline. No torch, so it runs anywhere the app does.
- ``bm25``: no embedder; retrieval is FTS5's BM25 alone (`choose_embedder` says why when it falls back to it).

Transformer embedders run by the engine (BERT-family, Qwen3-Embedding) are a later addition to this list.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

EMBEDDER_CHOICES = ("auto", "bm25", "wordllama")


class Embedder(Protocol):
    """Texts to float32 unit vectors of ``dim`` dimensions."""

    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class EmbedderChoice:
    """The embedder in use (``None``: BM25 alone), its name and why it was chosen."""

    embedder: Embedder | None
    name: str
    reason: str


def wordllama_files() -> tuple[Path, Path]:
    """The weights and tokenizer files shipped in the installed ``wordllama`` wheel.

    Raises:
        FileNotFoundError: when the package or its files are not installed.
    """
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the wordllama package is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    weights = sorted((root / "weights").glob("*_256.safetensors")) or sorted(
        (root / "weights").glob("*.safetensors")
    )
    tokenizers = sorted((root / "tokenizers").glob("*tokenizer*.json"))
    if not weights or not tokenizers:
        raise FileNotFoundError(f"wordllama's weights or tokenizer are missing under {root}")
    preferred = [w for w in weights if w.name == "l2_supercat_256.safetensors"]
    return (preferred or weights)[0], tokenizers[0]


class WordLlamaEmbedder:
    """WordLlama: the mean of a text's token vectors, normalized (cosine similarity is then a dot product)."""

    name = "wordllama"

    def __init__(self, weights: Path | None = None, tokenizer: Path | None = None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if weights is None or tokenizer is None:
            found_weights, found_tokenizer = wordllama_files()
            weights, tokenizer = weights or found_weights, tokenizer or found_tokenizer
        tensors = load_file(str(weights))
        matrix = tensors.get("embedding.weight", next(iter(tensors.values())))
        self.matrix = np.ascontiguousarray(matrix, dtype=np.float32)
        self.dim = int(self.matrix.shape[1])
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.source = Path(weights).name

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        vocab = self.matrix.shape[0]
        for i, encoding in enumerate(self.tokenizer.encode_batch(texts, add_special_tokens=False)):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            ids = ids[(ids >= 0) & (ids < vocab)]
            if ids.size:
                out[i] = self.matrix[ids].mean(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


_cache: dict[str, Embedder] = {}


def load_embedder(name: str) -> Embedder | None:
    """The embedder called ``name`` (kept once loaded); ``None`` for ``bm25``.

    Raises:
        ValueError: for an unknown name.
        FileNotFoundError: when its files are not installed.
    """
    if name == "bm25":
        return None
    if name != "wordllama":
        raise ValueError(f"unknown embedder {name!r}: choose one of {', '.join(EMBEDDER_CHOICES)}")
    if name not in _cache:
        _cache[name] = WordLlamaEmbedder()
    return _cache[name]


def choose_embedder(requested: str = "auto") -> EmbedderChoice:
    """The embedder for ``requested`` (``auto``: the best available), with the reason in words.

    Raises:
        ValueError: for an unknown name, or a named embedder that cannot load (its reason included).
    """
    if requested not in EMBEDDER_CHOICES:
        raise ValueError(f"unknown embedder {requested!r}: choose one of {', '.join(EMBEDDER_CHOICES)}")
    if requested == "bm25":
        return EmbedderChoice(None, "bm25", "BM25 alone, as asked")
    try:
        embedder = load_embedder("wordllama")
    except (OSError, ValueError, ImportError) as exc:
        if requested == "wordllama":
            raise ValueError(f"the wordllama embedder cannot load: {exc}") from exc
        return EmbedderChoice(None, "bm25", f"BM25 alone: no embedder is available ({exc})")
    why = "as asked" if requested == "wordllama" else "the best embedder available offline"
    return EmbedderChoice(embedder, "wordllama", f"WordLlama static embeddings (256 dimensions), {why}")
