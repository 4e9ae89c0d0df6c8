"""Embedding models on disk: whether a folder holds one, and how it turns a text into a vector.

An embedding model is known by its files, not its name:

* a sentence-transformers folder (``modules.json``, ``config_sentence_transformers.json`` or
  ``sentence_bert_config.json``): bge, e5, gte, all-MiniLM, Qwen3-Embedding...;
* or a config whose ``model_type`` is an encoder type of the embedding registry
  (:data:`engine.architectures.EMBEDDING_ARCHITECTURES`): a bare BERT cannot chat, so it is listed as an embedder.

* or a llama.cpp GGUF file of an encoder the registry reads (``bert``, ``nomic-bert``), known by its header.

Pooling comes from sentence-transformers' ``1_Pooling/config.json`` when the folder has one (the model was trained
with it), or a GGUF's ``{arch}.pooling_type``, else the registry's default for the type. Query and document prompts
come from ``config_sentence_transformers.json`` (Qwen3-Embedding's instruction, e5's ``query: ``), else the
registry's (nomic-embed-text's ``search_query: ``/``search_document: ``). :func:`encoder_config` reads an
encoder's config in either spelling (transformers' or nomic's original remote-code keys) and refuses in words what
the encoder does not run. Stdlib only: model discovery reads it for every folder it meets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from engine.api import ModelLoadError
from engine.architectures import EMBEDDING_ARCHITECTURES, EMBEDDING_GGUF_TYPES, EmbeddingArchitecture, Pooling
from engine.loading.gguf_reader import read_regular_text, read_tensor_table

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


#: llama.cpp's ``{arch}.pooling_type`` values (``LLAMA_POOLING_TYPE_*``): 0 none, 1 mean, 2 CLS, 3 last, 4 rank.
_GGUF_POOLING: dict[int, Pooling] = {1: "mean", 2: "cls", 3: "last"}


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """A BERT-family encoder's shape and math, whatever spelling its config used.

    Attributes:
        hidden, layers, heads: the widths and counts.
        eps: the LayerNorm epsilon.
        activation: the MLP's activation ("gelu", "silu"...); gated (SwiGLU) when the weights have a gate.
        rope_theta: the rotary base (nomic-bert), or None for a learned position table (BERT).
        max_positions: the longest input (position table rows less the offset, or the trained length).
        pad_id: the padding token's id.
        position_offset: RoBERTa's first position id (padding id + 1), else 0.
        vocab_size: rows of the word embedding.
    """

    hidden: int
    layers: int
    heads: int
    eps: float
    activation: str
    rope_theta: float | None
    max_positions: int
    pad_id: int
    position_offset: int
    vocab_size: int


#: nomic's original remote-code config keys -> transformers' names (``NomicBertConfig``).
_NOMIC_KEYS = {
    "n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
    "n_inner": "intermediate_size", "n_positions": "max_position_embeddings",
    "layer_norm_epsilon": "layer_norm_eps",
}  # fmt: skip
#: nomic's original config flags and the value the encoder runs; anything else is refused by name.
_NOMIC_FLAGS: dict[str, Any] = {
    "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
    "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
    "prenorm": False, "parallel_block": False, "use_rms_norm": False, "causal": False, "moe_every_n_layers": 0,
}  # fmt: skip


def _refuse(where: str, what: str) -> ModelLoadError:
    return ModelLoadError(f"{where} {what}: Hearth's encoder does not run that.")


def encoder_config(config: dict[str, Any], arch: EmbeddingArchitecture, where: str) -> EncoderConfig:
    """An encoder's config (``config.json``'s fields) in one spelling; nomic-bert's original keys (``n_embd``,
    ``rotary_emb_base``, ``activation_function``...) are read as transformers' ``NomicBertConfig`` names them.

    Raises:
        ModelLoadError: a missing size, or a feature the encoder does not run (named, with its value).
    """
    config = dict(config)
    for old, new in _NOMIC_KEYS.items():
        if old in config and new not in config:
            config[new] = config[old]
    rope_theta: float | None = None
    activation = str(config.get("hidden_act", "silu" if arch.rotary else "gelu"))
    if arch.rotary:
        for key, runs in _NOMIC_FLAGS.items():
            value = config.get(key, runs)
            if value != runs and not (runs == 0 and value is None):
                raise _refuse(where, f"sets {key} = {value!r} (Hearth runs {runs!r})")
        if "activation_function" in config:  # the original spelling: "swiglu" is a SiLU gate
            act = str(config["activation_function"])
            if act != "swiglu":
                raise _refuse(where, f"has a {act} MLP (activation_function; Hearth runs swiglu)")
            activation = "silu"
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope = rope if isinstance(rope, dict) else {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "dynamic"):
            raise _refuse(where, f"scales its rotary positions ({rope_type})")
        if rope_type == "dynamic" or config.get("rotary_scaling_factor"):
            # dynamic NTK scaling (nomic's rotary_scaling_factor) changes nothing up to the trained length, and the
            # encoder's inputs are cut there (below)
            trained = config.get("max_trained_positions") or rope.get("original_max_position_embeddings")
            config["max_trained_positions"] = trained or config.get("max_position_embeddings")
        theta = config.get("rotary_emb_base", rope.get("rope_theta", config.get("rope_theta", 1000.0)))
        rope_theta = float(theta) if isinstance(theta, (int, float)) else float("nan")
        if not rope_theta >= 1:
            raise ModelLoadError(f"{where} has a rotary base of {theta!r}; it must be at least 1.")
    sizes: dict[str, float] = {}
    for key, default in (
        ("hidden_size", None), ("num_hidden_layers", None), ("num_attention_heads", None), ("vocab_size", None),
        ("max_position_embeddings", 512), ("layer_norm_eps", 1e-12),
    ):  # fmt: skip
        value = config.get(key) if config.get(key) is not None else default
        try:
            sizes[key] = float(value) if key == "layer_norm_eps" else int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            raise ModelLoadError(
                f"{where} has no usable {key} in its config ({value!r}); re-download the model."
            ) from None
    hidden, layers = int(sizes["hidden_size"]), int(sizes["num_hidden_layers"])
    heads, vocab = int(sizes["num_attention_heads"]), int(sizes["vocab_size"])
    max_positions, eps = int(sizes["max_position_embeddings"]), sizes["layer_norm_eps"]
    if min(hidden, layers, heads, vocab) < 1 or hidden % heads:
        raise ModelLoadError(f"{where}'s config is damaged: {heads} heads cannot split a width of {hidden}.")
    pad = config.get("pad_token_id")
    pad_id = int(pad) if isinstance(pad, int) else (1 if arch.position_offset else 0)
    offset = pad_id + 1 if arch.position_offset else 0
    positions = max_positions - offset
    trained = config.get("max_trained_positions")  # nomic v1/v1.5: 8192 positions, trained on 2048
    if arch.rotary and isinstance(trained, int) and trained > 0:
        positions = min(positions, trained)
    if positions < 1 or not eps > 0:
        raise ModelLoadError(
            f"{where}'s config is damaged: {positions} positions, a LayerNorm epsilon of {eps}."
        )
    return EncoderConfig(hidden, layers, heads, eps, activation, rope_theta, positions, pad_id, offset, vocab)


def gguf_encoder_config(metadata: dict[str, Any], where: str) -> tuple[str, EncoderConfig]:
    """The registry type and encoder config of a llama.cpp GGUF encoder's metadata (``bert.*``/``nomic-bert.*``).

    Raises:
        ModelLoadError: a GGUF architecture the registry does not read, a causal one, or a missing size.
    """
    gguf_arch = str(metadata.get("general.architecture", ""))
    model_type = EMBEDDING_GGUF_TYPES.get(gguf_arch)
    if model_type is None:
        known = ", ".join(sorted(EMBEDDING_GGUF_TYPES))
        raise ModelLoadError(
            f"{where} is a {gguf_arch or 'GGUF of no architecture'} GGUF; Hearth runs GGUF embedding models of the "
            f"{known} architectures."
        )
    arch = EMBEDDING_ARCHITECTURES[model_type]
    if metadata.get(f"{gguf_arch}.attention.causal", False):
        raise _refuse(where, "has causal attention (attention.causal)")
    keys = {
        "hidden_size": "embedding_length", "num_hidden_layers": "block_count",
        "num_attention_heads": "attention.head_count", "max_position_embeddings": "context_length",
        "layer_norm_eps": "attention.layer_norm_epsilon", "intermediate_size": "feed_forward_length",
    }  # fmt: skip
    config: dict[str, Any] = {
        hf: metadata[f"{gguf_arch}.{key}"] for hf, key in keys.items() if f"{gguf_arch}.{key}" in metadata
    }
    tokens = metadata.get("tokenizer.ggml.tokens")
    config["vocab_size"] = len(tokens) if isinstance(tokens, list) else tokens
    pad = metadata.get("tokenizer.ggml.padding_token_id")
    config["pad_token_id"] = pad if isinstance(pad, int) else 0
    if arch.rotary:
        config["rope_theta"] = metadata.get(f"{gguf_arch}.rope.freq_base", 1000.0)
        config["hidden_act"] = "silu"
    return model_type, encoder_config(config, arch, where)


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
        gguf: ``folder`` is a llama.cpp GGUF file, not a folder.
    """

    folder: Path
    model_type: str
    pooling: Pooling
    pooling_source: str
    max_tokens: int
    query_prompt: str = ""
    document_prompt: str = ""
    gguf: bool = False


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
    if folder.is_file():
        return _gguf_spec(folder)
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
    if arch.path == "encoder":
        positions = encoder_config(config, arch, folder.name).max_positions
    else:
        positions = min(int(config.get("max_position_embeddings", 512)), MAX_DECODER_TOKENS)
    max_tokens = min(int(limit), positions) if isinstance(limit, int) and limit > 0 else positions
    st_config = _json(folder / "config_sentence_transformers.json")
    prompts = cast(dict[str, Any], st_config.get("prompts") or {}) if isinstance(st_config, dict) else {}
    if not isinstance(prompts, dict) or not any(isinstance(v, str) and v for v in prompts.values()):
        prompts = {"query": arch.query_prompt, "document": arch.document_prompt}
    query = prompts.get("query", "")
    document = prompts.get("document", prompts.get("passage", ""))
    return EmbeddingSpec(
        folder, model_type, pooling, source, max_tokens,
        query if isinstance(query, str) else "", document if isinstance(document, str) else "",
    )  # fmt: skip


def _gguf_spec(path: Path) -> EmbeddingSpec:
    """How a GGUF encoder file runs, from its header (the vocabulary is not decoded here)."""
    metadata, _tensors = read_tensor_table(path)
    model_type, config = gguf_encoder_config(metadata, path.name)
    arch = EMBEDDING_ARCHITECTURES[model_type]
    tokenizer = metadata.get("tokenizer.ggml.model")
    if tokenizer != "bert":
        raise ModelLoadError(
            f"{path.name} has a {tokenizer or 'missing'} tokenizer; Hearth reads a GGUF encoder's WordPiece "
            'vocabulary (tokenizer.ggml.model "bert") only.'
        )
    kind = metadata.get(f"{metadata['general.architecture']}.pooling_type")
    if kind == 4:
        raise ModelLoadError(f"{path.name} is a reranker (pooling_type rank), not an embedding model.")
    if isinstance(kind, int) and kind in _GGUF_POOLING:
        pooling, source = (
            _GGUF_POOLING[kind],
            f"{_GGUF_POOLING[kind]} pooling, as the file's pooling_type says",
        )
    else:
        pooling, source = arch.pooling, f"{arch.pooling} pooling, the default for the type"
    return EmbeddingSpec(
        path,
        model_type,
        pooling,
        source,
        config.max_positions,
        arch.query_prompt,
        arch.document_prompt,
        gguf=True,
    )


def embedding_problem(folder: Path) -> str:
    """Why the embedding model in ``folder`` cannot run ("" when it can)."""
    try:
        read_embedding_spec(folder)
    except ModelLoadError as exc:
        return str(exc)
    return ""
