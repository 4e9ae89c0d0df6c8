"""A GGUF file's config, tokenizer and (for the default model) weights as a Hugging Face folder, without
transformers' GGUF loader.

transformers reads a GGUF's metadata through ``gguf.GGUFReader``, which builds a numpy object for every token
and merge before returning one, and reads it all again for the tokenizer. Here the header is read once by
:func:`engine.loading.gguf_reader.read_tensor_table` (arrays in bulk), and the files written are the ones
transformers' ``from_pretrained(gguf_file=...)`` and ``save_pretrained`` write (``tests/engine/loading/
test_gguf_convert.py`` compares them): the loader, the native path and the HF-reference tests read these folders,
so they must not depend on which converter made them. Where transformers' own choices look odd (qwen3's head size
is its config class's default, not the file's), they are kept for that reason.

Covered: the config of the registry's GGUF types (llama, mistral, qwen2, qwen3) and byte-level BPE tokenizers
("gpt2" in ``tokenizer.ggml.model``: SmolLM, Llama 3, Qwen). Anything else (a sentencepiece vocabulary, a file
without merges, another architecture) is converted by transformers, with a log line.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.loading.gguf_reader import TensorEntry, read_tensor_table

log = logging.getLogger("engine")

ProgressFn = Callable[[float, str], None]

#: llama.cpp's config keys (after ``<arch>.``) -> transformers' config fields, as transformers maps them.
_CONFIG_KEYS = {
    "context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size", "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
}  # fmt: skip
#: transformers reads the rotary width as the head size for these types only.
_HEAD_DIM_FROM_ROPE = ("llama", "mistral")
#: The special token ids a GGUF names -> the config's fields (and the tokenizer's ``<name>_token``).
_TOKEN_IDS = {"bos": "bos_token_id", "eos": "eos_token_id", "unknown": "unk_token_id", "padding": "pad_token_id"}
_SHARED = {"attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-6,
           "use_cache": True, "tie_word_embeddings": False, "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "pad_token_id": None, "rope_theta": 10000.0}  # fmt: skip
_QWEN = {**_SHARED, "bos_token_id": None, "eos_token_id": None, "intermediate_size": 22016, "max_position_embeddings":
         32768, "max_window_layers": 28, "num_key_value_heads": 32, "use_sliding_window": False, "vocab_size": 151936}
#: Every field each config class writes, with its default (None where ``__post_init__`` derives it).
_CLASS_FIELDS: dict[str, dict[str, Any]] = {
    "llama": {**_SHARED, "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2, "head_dim": None,
              "intermediate_size": 11008, "max_position_embeddings": 2048, "mlp_bias": False,
              "num_key_value_heads": None, "pretraining_tp": 1, "vocab_size": 32000},
    "mistral": {**_SHARED, "bos_token_id": 1, "eos_token_id": 2, "head_dim": None, "intermediate_size": 14336,
                "max_position_embeddings": 131072, "num_key_value_heads": 8, "sliding_window": 4096,
                "vocab_size": 32000},
    "qwen2": _QWEN,
    "qwen3": {**_QWEN, "attention_bias": False, "head_dim": 128},
}  # fmt: skip
_MODEL_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM"}  # fmt: skip


def transformers_version() -> str:
    """The installed transformers' version, as its ``save_pretrained`` stamps it (without importing it)."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def read(path: Path) -> tuple[dict[str, Any], list[TensorEntry]]:
    """The file's metadata with its arrays decoded (vocabulary, merges, token types) and its tensor table."""
    return read_tensor_table(path, arrays=True)


def _value(value: Any) -> Any:
    """A metadata value as transformers' GGUF reader gives it: a one-item array is its item, numbers plain."""
    if isinstance(value, list) or hasattr(value, "tolist"):
        items = value.tolist() if hasattr(value, "tolist") else value
        return items[0] if len(items) == 1 else items
    return value


def model_type(metadata: dict[str, Any]) -> str:
    """The config's ``model_type``: the file's architecture, but "mistral" for a llama file named just that
    (transformers' rule: llama.cpp writes Mistral models as "llama")."""
    arch = str(metadata.get("general.architecture", ""))
    return "mistral" if arch == "llama" and metadata.get("general.name") == "mistral" else arch


def config_fields(metadata: dict[str, Any], tensors: list[TensorEntry]) -> dict[str, Any] | None:
    """config.json's fields as transformers writes them for this file, or None for a type not covered here."""
    arch, kind = str(metadata.get("general.architecture", "")), model_type(metadata)
    if kind not in _CLASS_FIELDS:
        return None
    given: dict[str, Any] = {}
    for key, field in _CONFIG_KEYS.items():
        if f"{arch}.{key}" in metadata:
            given[field] = _value(metadata[f"{arch}.{key}"])
    if kind in _HEAD_DIM_FROM_ROPE and f"{arch}.rope.dimension_count" in metadata:
        given["head_dim"] = _value(metadata[f"{arch}.rope.dimension_count"])
    for gguf_name, field in _TOKEN_IDS.items():
        if f"tokenizer.ggml.{gguf_name}_token_id" in metadata:
            given[field] = _value(metadata[f"tokenizer.ggml.{gguf_name}_token_id"])
    if "vocab_size" not in given and isinstance(metadata.get("tokenizer.ggml.tokens"), list):
        given["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    given["tie_word_embeddings"] = all(t.name != "output.weight" for t in tensors)
    fields = {**_CLASS_FIELDS[kind], **given}
    if "head_dim" in fields and fields["head_dim"] is None:
        fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    if fields["num_key_value_heads"] is None:
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    if kind in ("qwen2", "qwen3"):
        fields["sliding_window"] = None  # the class keeps a window only with use_sliding_window
        fields["layer_types"] = ["full_attention"] * int(fields["num_hidden_layers"])
    fields["rope_parameters"] = {"rope_theta": fields.pop("rope_theta"), "rope_type": "default"}
    fields["model_type"] = kind
    if "general.name" in metadata:
        fields["_model_name_or_path"] = metadata["general.name"]
    fields["transformers_version"] = transformers_version()
    return fields


def _dump(fields: dict[str, Any], out: Path) -> None:
    out.write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_config(metadata: dict[str, Any], tensors: list[TensorEntry], out: Path, *, dtype: str | None = None) -> bool:
    """Write ``out/config.json``; with ``dtype`` as a saved model's (its class and dtype named), and its
    generation_config.json. False (nothing written) for a type not covered here."""
    fields = config_fields(metadata, tensors)
    if fields is None:
        return False
    if dtype is not None:
        fields |= {"architectures": [_MODEL_CLASSES[fields["model_type"]]], "dtype": dtype}
        generation = {k: fields[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if fields[k] is not None}
        generation |= {"_from_model_config": True, "output_attentions": False, "output_hidden_states": False,
                       "transformers_version": fields["transformers_version"], "use_cache": True}  # fmt: skip
        _dump(generation, out / "generation_config.json")
    _dump(fields, out / "config.json")
    return True


def write_side_files(path: Path, out: Path) -> None:
    """Write the config.json and tokenizer files of the GGUF at ``path`` into the folder ``out``."""
    metadata, tensors = read(path)
    if not write_config(metadata, tensors, out):
        log.info("%s: architecture %r is converted by transformers", path.name, metadata.get("general.architecture"))
        from transformers import AutoConfig

        AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True).save_pretrained(out)
    if not write_tokenizer(metadata, model_type(metadata), out):
        log.info("%s: tokenizer %r is converted by transformers", path.name, metadata.get("tokenizer.ggml.model"))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        tokenizer.save_pretrained(out)


def write_model(path: Path, out: Path, progress: ProgressFn) -> None:
    """Write the GGUF at ``path`` as a bf16 safetensors model folder (config, generation config, weights and
    tokenizer) into ``out``, as transformers' dequantizing load and ``save_pretrained`` would. Reports
    "convert i/N" per tensor, then "save"."""
    import torch
    from safetensors.torch import save_file

    from engine.architectures import GgufLayout
    from engine.loading.formats.gguf_blocks import dequantize
    from engine.loading.gguf_weights import GgufWeights

    progress(0.0, "convert")
    metadata, tensors = read(path)
    kind = model_type(metadata)
    fields = config_fields(metadata, tensors)
    if fields is None or metadata.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{path.name} is not a byte-level BPE model of a type this converter knows ({kind})")
    weights = GgufWeights(path, SimpleNamespace(**fields))
    layout = weights.layout or GgufLayout()
    state: dict[str, torch.Tensor] = {}
    total = max(len(weights.entries), 1)
    for i, tensor in enumerate(weights.entries):
        name = layout.hf_name(tensor.name)
        if name is not None and not (name == "lm_head.weight" and fields["tie_word_embeddings"]):
            shape = tuple(reversed(tensor.dims))
            state[name] = dequantize(tensor.kind, weights.rows(name, tensor)).reshape(shape).to(torch.bfloat16)
        progress(0.8 * (i + 1) / total, f"convert {i + 1}/{total}")  # "convert 3/272": the tensors done
    progress(0.8, "save")
    write_config(metadata, tensors, out, dtype="bfloat16")
    if not write_tokenizer(metadata, kind, out):
        raise ValueError(f"the tokenizer of {path.name} cannot be converted")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    progress(1.0, "save")


# --- the tokenizer ---------------------------------------------------------------------------------------------
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: ``tokenizer.ggml.pre`` -> the split its merges were learned on (transformers' table); others split as GPT-2.
_PRE_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}  # fmt: skip
#: The tokenizer class transformers' AutoTokenizer picks for a byte-level GGUF of each type.
_TOKENIZER_CLASSES = {"llama": "TokenizersBackend", "mistral": "TokenizersBackend", "qwen2": "Qwen2Tokenizer",
                      "qwen3": "Qwen2Tokenizer"}  # fmt: skip
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: each byte as a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return dict(sorted(chars.items()))


def _special(metadata: dict[str, Any], tokens: list[str], name: str) -> str | None:
    token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
    return tokens[int(token_id)] if token_id is not None else None


def write_tokenizer(metadata: dict[str, Any], kind: str, out: Path) -> bool:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja for a byte-level BPE vocabulary as
    transformers converts it; False (nothing written) for any other tokenizer or model type."""
    tokens, merges = metadata.get("tokenizer.ggml.tokens"), metadata.get("tokenizer.ggml.merges")
    if metadata.get("tokenizer.ggml.model") != "gpt2" or kind not in _TOKENIZER_CLASSES or not isinstance(
        tokens, list
    ) or not isinstance(merges, list):
        return False
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    spelling = _bytes_to_unicode()
    alphabet = frozenset(spelling.values())
    vocab = {t if alphabet.issuperset(t) else "".join(spelling[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(tokens)}  # fmt: skip
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None,
                                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))  # fmt: skip
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    types = metadata.get("tokenizer.ggml.token_type")
    types = [] if types is None or isinstance(types, int) else types.tolist()
    # llama.cpp's control tokens are special; one spelled outside the byte alphabet is a mislabel, left out
    control = [t for t, k in zip(tokens, types, strict=False) if k == _CONTROL and alphabet.issuperset(t)]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    known = tokenizer.get_vocab()
    user = [t for t, k in zip(tokens, types, strict=False) if k == _USER_DEFINED and t in known]
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    named = {name: _special(metadata, tokens, gguf) for name, gguf in
             (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))}  # fmt: skip
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in named.values() if t])
    split = _PRE_SPLITS.get(str(metadata.get("tokenizer.ggml.pre")))
    if split is not None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )  # fmt: skip
    bos, eos = named["bos"], named["eos"]
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    single = f"{f'{bos}:0 ' if add_bos else ''}$A:0{f' {eos}:0' if add_eos else ''}"
    pair = f"{single}{f' {bos}:1' if add_bos else ''} $B:1{f' {eos}:1' if add_eos else ''}"
    specials = [(t, tokenizer.token_to_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on and t]
    tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    tokenizer.save(str(out / "tokenizer.json"))
    config: dict[str, Any] = {
        "backend": "tokenizers", "bos_token": bos, "eos_token": eos, "is_local": True, "local_files_only": True,
        "model_max_length": int(1e30), "pad_token": named["pad"], "tokenizer_class": _TOKENIZER_CLASSES[kind],
        "unk_token": named["unk"],
    }  # fmt: skip
    if config["tokenizer_class"] == "Qwen2Tokenizer":
        config["add_prefix_space"] = None
    text = json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    (out / "tokenizer_config.json").write_text(text, encoding="utf-8")
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str):
        with open(out / "chat_template.jinja", "w", encoding="utf-8") as fh:
            fh.write(template)
    return True
