"""Embedding models on disk: whether a folder holds one, and how it turns a text into a vector.

An embedding model is known by its files, not its name:

* a sentence-transformers folder (``modules.json``, ``config_sentence_transformers.json`` or
  ``sentence_bert_config.json``): bge, e5, gte, all-MiniLM, Qwen3-Embedding...;
* or a config whose ``model_type`` is an encoder type of the embedding registry
  (:data:`engine.architectures.EMBEDDING_ARCHITECTURES`): a bare BERT cannot chat, so it is listed as an embedder.

Pooling comes from sentence-transformers' ``1_Pooling/config.json`` when the folder has one (the model was trained
with it), else the registry's default for the type. Query and document prompts come from
``config_sentence_transformers.json`` (Qwen3-Embedding's instruction, e5's ``query: ``). Stdlib only: model
discovery reads it for every folder it meets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from engine.api import ModelLoadError
from engine.architectures import EMBEDDING_ARCHITECTURES, Pooling
from engine.loading.gguf_reader import read_regular_text

#: sentence-transformers' files: any one marks a folder as an embedding model.
SENTENCE_TRANSFORMERS_FILES = (
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
)
#: The longest input a decoder embedder is given (its context may be far longer than any chunk).
MAX_DECODER_TOKENS = 8192

_POOLING_MODES: dict[str, Pooling] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}
_UNSUPPORTED_MODES = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


@dataclass(frozen=True, slots=True)
class EmbeddingSpec:
    """How one embedding model folder is run.

    Attributes:
        folder: the model's folder.
        model_type: config.json's ``model_type`` (its entry in the embedding registry).
        pooling: "cls", "mean" or "last".
        pooling_source: where the pooling came from, in words (the folder's pooling config or the registry).
        max_tokens: inputs are cut to this many tokens, special tokens included.
        query_prompt: put before a search query (empty for most encoders).
        document_prompt: put before each indexed chunk.
    """

    folder: Path
    model_type: str
    pooling: Pooling
    pooling_source: str
    max_tokens: int
    query_prompt: str = ""
    document_prompt: str = ""


def _json(path: Path) -> Any:
    try:
        return json.loads(read_regular_text(path))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{path} cannot be read ({exc}). Re-download the model.") from exc


def is_embedding_folder(folder: Path, config: dict[str, Any] | None) -> bool:
    """Whether ``folder`` (with its parsed ``config.json``) holds an embedding model rather than a chat model."""
    if any((folder / name).is_file() for name in SENTENCE_TRANSFORMERS_FILES):
        return True
    arch = EMBEDDING_ARCHITECTURES.get(str((config or {}).get("model_type", "")))
    return arch is not None and arch.path == "encoder"


def _pooling_module(folder: Path) -> Path | None:
    """The folder of the Pooling module that ``modules.json`` lists; refuses modules Hearth does not run."""
    modules = _json(folder / "modules.json")
    if not isinstance(modules, list):
        return folder / "1_Pooling" if (folder / "1_Pooling" / "config.json").is_file() else None
    pooling = None
    for module in modules:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        name = kind.rsplit(".", 1)[-1]
        if name == "Pooling":
            pooling = folder / str(module.get("path", "1_Pooling"))
        elif name not in ("Transformer", "Normalize"):
            raise ModelLoadError(
                f"{folder.name} has a {name} module after its encoder (modules.json); Hearth runs only the "
                "encoder, its pooling and normalization."
            )
    return pooling


def _pooling(folder: Path, default: Pooling) -> tuple[Pooling, str]:
    where = _pooling_module(folder)
    config = _json(where / "config.json") if where is not None else None
    if not isinstance(config, dict):
        return default, f"{default} pooling, the default for the type"
    modes = [mode for key, mode in _POOLING_MODES.items() if config.get(key)]
    odd = [key for key in _UNSUPPORTED_MODES if config.get(key)]
    if odd or len(modes) != 1:
        named = ", ".join(
            k.removeprefix("pooling_mode_") for k in (*odd, *(k for k in _POOLING_MODES if config.get(k)))
        )
        raise ModelLoadError(
            f"{folder.name} pools its tokens by {named or 'no mode'}; Hearth runs one of CLS, mean and last-token."
        )
    return modes[0], f"{modes[0]} pooling, as the model's pooling config says"


def read_embedding_spec(folder: Path) -> EmbeddingSpec:
    """How the embedding model in ``folder`` runs.

    Raises:
        ModelLoadError: when the folder is not an embedding model Hearth runs, with the reason in words.
    """
    folder = Path(folder)
    if folder.is_file() and folder.suffix.lower() == ".gguf":
        raise ModelLoadError(
            f"{folder.name} is a GGUF file: Hearth runs embedding models from Hugging Face folders (safetensors) only."
        )
    config = _json(folder / "config.json")
    if not isinstance(config, dict):
        raise ModelLoadError(f"{folder} has no config.json: it is not a Hugging Face model folder.")
    model_type = str(config.get("model_type", ""))
    arch = EMBEDDING_ARCHITECTURES.get(model_type)
    if arch is None:
        known = ", ".join(sorted(EMBEDDING_ARCHITECTURES))
        raise ModelLoadError(
            f"{folder.name} is a {model_type or 'model of no type'}; embedding models run as {known}."
        )
    if not is_embedding_folder(folder, config):
        raise ModelLoadError(
            f"{folder.name} is a {model_type} chat model, not an embedding model (it has no sentence-transformers "
            "files: modules.json, 1_Pooling/config.json)."
        )
    if not sorted(folder.glob("*.safetensors")):
        raise ModelLoadError(
            f"{folder.name} has no .safetensors weights; Hearth reads embedding models from those."
        )
    if not (folder / "tokenizer.json").is_file() and not (folder / "vocab.txt").is_file():
        raise ModelLoadError(
            f"{folder.name} has no tokenizer.json or vocab.txt; Hearth reads an embedding model's tokenizer from those."
        )
    pooling, source = _pooling(folder, arch.pooling)
    bert_config = _json(folder / "sentence_bert_config.json")
    limit = bert_config.get("max_seq_length") if isinstance(bert_config, dict) else None
    positions = int(config.get("max_position_embeddings", 512))
    if arch.position_offset:
        positions -= int(config.get("pad_token_id", 1)) + 1
    if arch.path == "fused":
        positions = min(positions, MAX_DECODER_TOKENS)
    max_tokens = min(int(limit), positions) if isinstance(limit, int) and limit > 0 else positions
    st_config = _json(folder / "config_sentence_transformers.json")
    prompts = cast(dict[str, Any], st_config.get("prompts") or {}) if isinstance(st_config, dict) else {}
    query = prompts.get("query", "")
    document = prompts.get("document", prompts.get("passage", ""))
    return EmbeddingSpec(
        folder, model_type, pooling, source, max_tokens,
        query if isinstance(query, str) else "", document if isinstance(document, str) else "",
    )  # fmt: skip


def embedding_problem(folder: Path) -> str:
    """Why the embedding model in ``folder`` cannot run ("" when it can)."""
    try:
        read_embedding_spec(folder)
    except ModelLoadError as exc:
        return str(exc)
    return ""
