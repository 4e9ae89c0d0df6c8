"""A seeded generator of crafted safetensors folders: a small valid llama folder with a few mutations applied to its
config.json (types, sizes, heads, rope, nesting), its safetensors header (dtypes, shapes, offsets, length), its
tokenizer (ids past the embedding, templates) and its generation config. :class:`SafetensorsFolder` holds the folder
as parts; :func:`mutate_folder` returns a mutated copy and what was done (``tests/reliability/test_crafted_files.py``).
"""

from __future__ import annotations

import copy
import json
import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.reliability.crafted_files import TEMPLATES

ST_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2), "I64": (np.int64, 8),
             "U8": (np.uint8, 1), "BOOL": (np.bool_, 1)}  # fmt: skip
CONFIG_VALUES: tuple[Any, ...] = (0, 1, 2, 3, 5, -1, 2**31, 10**30, 0.5, 64.0, "64", None, True, [64], {"a": 1},
                                  math.nan, math.inf, -math.inf, 1e-30)  # fmt: skip


@dataclass
class SafetensorsFolder:
    """A Hugging Face model folder as parts: JSON files, raw text files, and one safetensors file's header and
    data."""

    config: Any
    tokenizer: dict[str, Any]
    tokenizer_config: dict[str, Any]
    header: dict[str, Any]
    data: bytes
    raw: dict[str, str] = field(default_factory=dict)  # files written as given text, replacing the above
    header_len: int | None = None  # a lying header length

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True)
        files = {"config.json": self.config, "tokenizer.json": self.tokenizer,
                 "tokenizer_config.json": self.tokenizer_config}  # fmt: skip
        for name, value in files.items():
            (folder / name).write_text(json.dumps(value))
        for name, text in self.raw.items():
            (folder / name).write_text(text)
        header = json.dumps(self.header).encode()
        length = self.header_len if self.header_len is not None else len(header)
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", length) + header + self.data)
        return folder


def tiny_folder(config: dict[str, Any], tokenizer_dir: Path, seed: int = 0) -> SafetensorsFolder:
    """A random-weight llama folder of ``config``'s shape (fp32) with the tokenizer files of ``tokenizer_dir``."""
    rng = np.random.default_rng(seed)
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                   p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                   p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                   p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                   p + "mlp.down_proj.weight": (hidden, inter)}  # fmt: skip
    header: dict[str, Any] = {}
    chunks = []
    offset = 0
    for name, shape in shapes.items():
        values = (rng.standard_normal(shape) * 0.1 + (1.0 if len(shape) == 1 else 0.0)).astype(np.float32)
        chunks.append(values.tobytes())
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + values.nbytes]}
        offset += values.nbytes
    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    tokenizer_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    template = tokenizer_dir / "chat_template.jinja"
    if template.is_file():
        tokenizer_config["chat_template"] = template.read_text()
    return SafetensorsFolder(dict(config), tokenizer, tokenizer_config, header, b"".join(chunks))


_CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "head_dim", "bos_token_id",
                "eos_token_id", "tie_word_embeddings", "model_type", "architectures", "torch_dtype")  # fmt: skip


def _config_value(rng: random.Random, f: SafetensorsFolder) -> str:
    key = rng.choice(_CONFIG_KEYS)
    old = f.config.get(key) if isinstance(f.config, dict) else None
    if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.5:
        value: Any = rng.choice((old + 1, old - 1, old * 2, old // 2, old * 3, old + 8))
    else:
        value = rng.choice(CONFIG_VALUES)
    f.config[key] = value
    return f"config {key} {old!r} -> {value!r}"


def _config_shape(rng: random.Random, f: SafetensorsFolder) -> str:
    """Heads and sizes that agree with the weights' element counts but not with each other."""
    choice = rng.choice(({"num_attention_heads": 3}, {"num_key_value_heads": 3}, {"num_key_value_heads": 8},
                         {"num_attention_heads": 64, "num_key_value_heads": 64}, {"head_dim": 15},
                         {"num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 63},
                         {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8},
                         {"vocab_size": 256}, {"vocab_size": 100000}))  # fmt: skip
    f.config.update(choice)
    return f"config {choice}"


def _config_rope(rng: random.Random, f: SafetensorsFolder) -> str:
    value = rng.choice(({"type": "linear", "factor": 0}, {"rope_type": "yarn"}, {"rope_type": "linear", "factor": "x"},
                        {"rope_type": "llama3", "factor": math.inf}, {"rope_type": "unknown"}, [1, 2], "linear",
                        {"rope_type": "linear", "factor": -2.0}))  # fmt: skip
    f.config["rope_scaling"] = value
    return f"rope_scaling {value!r}"


def _config_text(rng: random.Random, f: SafetensorsFolder) -> str:
    text = json.dumps(f.config)
    choice = rng.randrange(4)
    if choice == 0:
        f.raw["config.json"] = "[" * 100_000 + "]" * 100_000
        return "config.json nested 100000 deep"
    if choice == 1:
        f.raw["config.json"] = text.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e999')
        return "config rms_norm_eps 1e999"
    if choice == 2:
        f.raw["config.json"] = text[: rng.randrange(len(text))]
        return "config.json cut"
    f.raw["config.json"] = text.replace('"hidden_size": 64', '"hidden_size": 1' + "0" * 400)
    return "config hidden_size 10^400"


def _header(rng: random.Random, f: SafetensorsFolder) -> str:
    name = rng.choice(list(f.header))
    entry = f.header[name]
    op = rng.randrange(7)
    if op == 0:
        entry["dtype"] = rng.choice((*ST_DTYPES, "X", 5))
    elif op == 1:
        entry["shape"] = rng.choice(([], [0], entry["shape"][::-1], [*entry["shape"], 1], [2**40, 2**40], [-1, 64],
                                     "64", [1.5]))  # fmt: skip
    elif op == 2:
        begin, end = entry["data_offsets"]
        entry["data_offsets"] = rng.choice(([begin + 4, end + 4], [0, end - begin], [end, begin], [-4, end], [begin]))
    elif op == 3:
        del f.header[name]
    elif op == 4:
        f.header["model.layers.9.mlp.up_proj.weight"] = dict(entry)
    elif op == 5:
        f.header["__metadata__"] = rng.choice(({"format": "pt"}, "junk", [1], {"a": {"b": 2}}))
    else:
        f.header_len = rng.choice((0, 2, 2**40, len(json.dumps(f.header)) + 9))
        return f"header length {f.header_len}"
    return f"{name} op {op} -> {f.header.get(name)}"


def _tokenizer(rng: random.Random, f: SafetensorsFolder) -> str:
    vocab: dict[str, int] = f.tokenizer["model"]["vocab"]
    op = rng.randrange(6)
    if op == 0:
        n = rng.choice((1, 100, 5000))
        base = max(vocab.values()) + 1
        vocab.update({f"zz{i}": base + i for i in range(n)})
        return f"{n} vocabulary ids past the embedding"
    if op == 1:
        f.tokenizer["added_tokens"].append({"id": rng.choice((512, 10**6, 2**31)), "content": "<|hostile|>",
                                            "single_word": False, "lstrip": False, "rstrip": False,
                                            "normalized": False, "special": True})  # fmt: skip
        return "an added token past the embedding"
    if op == 2:
        text = json.dumps(f.tokenizer)
        f.raw["tokenizer.json"] = text[: rng.randrange(len(text))]
        return "tokenizer.json cut"
    if op == 3:
        f.tokenizer["model"]["type"] = rng.choice(("Unigram", "WordPiece", "Nope", 3))
        return f"tokenizer model {f.tokenizer['model']['type']}"
    if op == 4:
        key = rng.choice(("eos_token", "bos_token", "tokenizer_class", "model_max_length"))
        f.tokenizer_config[key] = rng.choice(CONFIG_VALUES + ("<|not_a_token|>", "LlamaTokenizer", "Nope"))
        return f"tokenizer_config {key} -> {f.tokenizer_config[key]!r}"
    f.tokenizer_config["chat_template"] = rng.choice((*TEMPLATES, 7, None, ["x"]))
    return f"template {str(f.tokenizer_config['chat_template'])[:30]!r}"


def _generation(rng: random.Random, f: SafetensorsFolder) -> str:
    value = rng.choice(({"eos_token_id": [2, 10**9]}, {"eos_token_id": "x"}, {"temperature": math.nan},
                        {"eos_token_id": -1}, [1], "junk"))  # fmt: skip
    f.raw["generation_config.json"] = json.dumps(value)
    return f"generation_config {value!r}"


FOLDER_MUTATIONS: list[tuple[int, Callable[[random.Random, SafetensorsFolder], str]]] = [
    (10, _config_value), (6, _config_shape), (3, _config_rope), (3, _config_text), (8, _header), (6, _tokenizer),
    (2, _generation),
]  # fmt: skip


def mutate_folder(rng: random.Random, base: SafetensorsFolder) -> tuple[SafetensorsFolder, list[str]]:
    """A copy of ``base`` with one to three mutations; and what they were."""
    f = SafetensorsFolder(copy.deepcopy(base.config), copy.deepcopy(base.tokenizer),
                          copy.deepcopy(base.tokenizer_config), copy.deepcopy(base.header), base.data)  # fmt: skip
    weights = [w for w, _ in FOLDER_MUTATIONS]
    done = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        (mutation,) = rng.choices([m for _, m in FOLDER_MUTATIONS], weights)
        done.append(mutation(rng, f))
    return f, done
