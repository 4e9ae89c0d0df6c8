"""Embedders: text to unit vectors, the best available first, with the reason for the choice in words.

- an embedding model already on disk (bge, e5, gte, multilingual-e5, nomic-embed-text, Qwen3-Embedding...), named
  by its folder or, for a llama.cpp GGUF encoder (``bert``, ``nomic-bert``), its file (``--embedder PATH``) or found
  by model discovery (``auto``), run by the engine's own code
  (``engine/model/embedding.py``, imported only then: this package stays torch-free until one is used). Of several
  found, ``auto`` takes the smallest: indexing runs on the CPU beside the chat.
- ``wordllama``: WordLlama's static token embeddings (256 dimensions, MIT), averaged over a text's tokens. The
  ``wordllama`` wheel ships the weights and the tokenizer; they are read here directly with ``safetensors`` and
  ``tokenizers``, because the package's own loader looks in a cache folder and falls back to a download, and the
  index must work offline. No torch, so it runs anywhere the app does.
- ``bm25``: no embedder; retrieval is FTS5's BM25 alone (`choose_embedder` says why when it falls back to it).

A collection records the embedder its vectors came from (``wordllama``, ``bm25``, or the model folder's absolute
path); vectors of two embedders are never mixed (``engine/docs/indexer.py`` indexes again when it changes).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

EMBEDDER_CHOICES = ("auto", "bm25", "wordllama")
#: Models bigger than this are not picked by ``auto`` (indexing a folder with one would take hours on a CPU); a
#: path names them explicitly.
MAX_AUTO_PARAMETERS = 1_000_000_000


class Embedder(Protocol):
    """Texts to float32 unit vectors of ``dim`` dimensions."""

    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


def embed_query(embedder: Embedder, query: str) -> np.ndarray:
    """A search query's vector: through the embedder's ``embed_query`` where it has one (models trained with a
    query prompt, such as Qwen3-Embedding's instruction or e5's ``query: ``), else ``embed``."""
    own: Callable[[list[str]], np.ndarray] | None = getattr(embedder, "embed_query", None)
    return (own or embedder.embed)([query])[0]


@dataclass(frozen=True)
class EmbedderChoice:
    """The embedder in use (``None``: BM25 alone), its name and why it was chosen."""

    embedder: Embedder | None
    name: str
    reason: str


def _wordllama_root() -> Path:
    """The folder holding WordLlama's ``weights/`` and ``tokenizers/``: in the PyInstaller bundle
    ``_internal/wordllama`` (``sys._MEIPASS``; ``packaging/hearth.spec`` copies the two files there, not the package),
    else the installed wheel's package folder.

    Raises:
        FileNotFoundError: when the package is not installed.
    """
    bundle = getattr(sys, "_MEIPASS", None)
    if getattr(sys, "frozen", False) and bundle:
        return Path(bundle) / "wordllama"
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the wordllama package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def wordllama_files() -> tuple[Path, Path]:
    """The weights and tokenizer files shipped in the installed ``wordllama`` wheel (or the bundle's copy).

    Raises:
        FileNotFoundError: when the package or its files are not installed.
    """
    root = _wordllama_root()
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
_cache_lock = threading.Lock()


def is_model_path(name: str) -> bool:
    """Whether an embedder name is a model folder (anything but ``auto``, ``bm25`` and ``wordllama``)."""
    return name not in EMBEDDER_CHOICES


def load_embedder(name: str) -> Embedder | None:
    """The embedder called ``name`` (kept once loaded): ``None`` for ``bm25``, WordLlama, or the embedding model in
    the folder ``name``.

    Raises:
        ValueError: for ``auto``, or a folder that holds no embedding model Hearth runs (the reason in words).
        FileNotFoundError: when WordLlama's files are not installed, or the folder does not exist.
    """
    if name == "bm25":
        return None
    if name == "auto":
        raise ValueError("auto is a choice, not an embedder: call choose_embedder")
    with _cache_lock:
        if name not in _cache:
            _cache[name] = WordLlamaEmbedder() if name == "wordllama" else open_model_embedder(name)
        return _cache[name]


def open_model_embedder(path: str) -> Embedder:
    """The embedding model in the folder (or GGUF file) ``path``, loaded now and not kept (the multi-model server unloads it when
    idle; :func:`load_embedder` keeps one).

    Raises:
        ValueError: a folder that holds no embedding model Hearth runs (the reason in words).
        FileNotFoundError: when the folder does not exist.
    """
    if not Path(path).exists():
        raise FileNotFoundError(f"no embedding model at {path}")
    from engine.api import ModelLoadError
    from engine.model.embedding import TransformerEmbedder

    try:
        return TransformerEmbedder(Path(path))
    except ModelLoadError as exc:
        raise ValueError(str(exc)) from exc


@dataclass(frozen=True)
class FoundEmbedder:
    """An embedding model found on disk that Hearth runs: its folder, name, size and where it was found."""

    path: Path
    name: str
    num_parameters: int
    source: str


_found: list[FoundEmbedder] | None = None
#: The home folder model discovery reads for ``auto`` (None: the user's own, with HF_HOME and the like honoured).
search_home: Path | None = None


def find_embedding_models(refresh: bool = False) -> list[FoundEmbedder]:
    """The embedding models Hearth runs among the models on disk (``engine.loading.discovery``), smallest first;
    the scan runs once per process unless ``refresh``."""
    global _found
    if _found is None or refresh:
        from engine.loading.discovery import discover_models

        models = [m for m in discover_models(search_home) if m.kind == "embedding" and m.runnable]
        _found = sorted(
            (FoundEmbedder(Path(m.path), m.name, m.num_parameters or 0, m.source) for m in models),
            key=lambda f: (f.num_parameters, f.name),
        )
    return list(_found)


def choose_embedder(requested: str = "auto") -> EmbedderChoice:
    """The embedder for ``requested``: ``auto`` (the best available: an embedding model found on disk, else
    WordLlama, else BM25 alone), ``bm25``, ``wordllama`` or a model folder; with the reason in words.

    Raises:
        ValueError: for a named embedder that cannot load (its reason included).
    """
    if requested == "bm25":
        return EmbedderChoice(None, "bm25", "BM25 alone, as asked")
    if is_model_path(requested):
        if not Path(requested).expanduser().exists():
            raise ValueError(
                f"unknown embedder {requested!r}: choose one of {', '.join(EMBEDDER_CHOICES)} or an embedding "
                "model's folder (there is no such folder)"
            )
        path = str(Path(requested).expanduser().resolve())
        try:
            model = load_embedder(path)
        except (OSError, ValueError, ImportError) as exc:
            raise ValueError(f"the embedding model {requested} cannot load: {exc}") from exc
        return EmbedderChoice(model, path, f"{_described(model)}, as asked")
    skipped = ""
    if requested == "auto":
        found = find_embedding_models()
        small = [f for f in found if f.num_parameters <= MAX_AUTO_PARAMETERS]
        for candidate in small:
            path = str(candidate.path.resolve())
            try:
                model = load_embedder(path)
            except (OSError, ValueError, ImportError) as exc:
                skipped = f"; {candidate.name} was found but cannot load ({exc})"
                continue
            others = f", the smallest of {len(found)} found" if len(found) > 1 else ""
            return EmbedderChoice(
                model, path, f"{_described(model)}: an embedding model on disk ({candidate.source}{others})"
            )
        if found and not small:
            skipped = f"; the embedding models on disk are too large to index with on a CPU ({found[0].name})"
    try:
        embedder = load_embedder("wordllama")
    except (OSError, ValueError, ImportError) as exc:
        if requested == "wordllama":
            raise ValueError(f"the wordllama embedder cannot load: {exc}") from exc
        return EmbedderChoice(None, "bm25", f"BM25 alone: no embedder is available ({exc}){skipped}")
    why = "as asked" if requested == "wordllama" else "the best embedder available offline: no embedding model on disk"
    return EmbedderChoice(embedder, "wordllama", f"WordLlama static embeddings (256 dimensions), {why}{skipped}")


def _described(embedder: Embedder | None) -> str:
    return str(getattr(embedder, "description", None) or getattr(embedder, "name", "?"))
