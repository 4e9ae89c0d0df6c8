"""A seeded generator of crafted GGUF files: a small valid model with a few mutations applied to its value types,
counts, dimensions, layer and head counts, template, tokens, offsets and header bytes.

:class:`GgufFile` holds a GGUF as editable parts (metadata entries with their value types, the tensor table) and
writes them back byte for byte, wrong types and lying counts included; the tensor data of the base are reused as they
are. :func:`mutate_gguf` applies one to three mutations chosen by a :class:`random.Random` and returns what they did,
so that a failing mutant names itself and can be rebuilt from its index alone
(``tests/reliability/test_crafted_files.py``; safetensors folders: ``tests/reliability/crafted_folders.py``).
"""

from __future__ import annotations

import copy
import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# --- GGUF --------------------------------------------------------------------------------------------------------

STRING, ARRAY = 8, 9
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
INT_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)
FLOAT_TYPES = (6, 12)
INT_RANGES = {0: (0, 2**8), 1: (-(2**7), 2**7), 2: (0, 2**16), 3: (-(2**15), 2**15), 4: (0, 2**32),
              5: (-(2**31), 2**31), 10: (0, 2**64), 11: (-(2**63), 2**63)}  # fmt: skip
#: ggml type ids: real ones (F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, BF16), a removed one (4) and unknown ones.
GGML_TYPES = (0, 1, 2, 8, 12, 14, 30, 4, 99, 2**32 - 1)
INTERESTING_INTS = (0, 1, 2, 3, 5, 7, -1, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1)
INTERESTING_FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, -1e-6, 1e300, 5e-324, 1e-45)
TEMPLATES = (
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{{ 'x' * 3000000000 }}",
    "{% if %}",
    "{{ raise_exception('this model refuses every chat') }}",
    "",
    "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "{{ undefined_name.attribute.other }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{{ messages }}" * 50,
)


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass
class Array:
    """A GGUF array value: its item type and items (nested arrays are :class:`Array` items)."""

    item_type: int
    items: list[Any]


@dataclass
class GgufFile:
    """A GGUF file as parts that can be written back with any value, type or count."""

    version: int
    kvs: list[list[Any]]  # [key, value type, value]
    tensors: list[list[Any]]  # [name, dims (ggml order), ggml type, offset in the data]
    data: bytes
    magic: bytes = b"GGUF"
    counts: list[int | None] = field(default_factory=lambda: [None, None])  # a lying tensor / metadata count
    alignment: int = 32  # where the writer starts the data (the file's own general.alignment may differ)
    flips: list[tuple[int, int]] = field(default_factory=list)  # (fraction of the header in 1e6ths, byte)
    cut: float | None = None  # keep this fraction of the file

    @classmethod
    def parse(cls, raw: bytes) -> GgufFile:
        pos = 0

        def take(fmt: str) -> Any:
            nonlocal pos
            (value,) = struct.unpack_from(fmt, raw, pos)
            pos += struct.calcsize(fmt)
            return value

        def string() -> str:
            nonlocal pos
            n = take("<Q")
            pos += n
            return raw[pos - n : pos].decode("utf-8")

        def value(kind: int) -> Any:
            if kind == STRING:
                return string()
            if kind == ARRAY:
                item = take("<I")
                return Array(item, [value(item) for _ in range(take("<Q"))])
            return take(SCALARS[kind])

        assert raw[:4] == b"GGUF"
        pos = 4
        version, n_tensors, n_kvs = take("<I"), take("<Q"), take("<Q")
        kvs = []
        for _ in range(n_kvs):
            key, kind = string(), take("<I")
            kvs.append([key, kind, value(kind)])
        tensors = []
        for _ in range(n_tensors):
            name = string()
            dims = [take("<Q") for _ in range(take("<I"))]
            tensors.append([name, dims, take("<I"), take("<Q")])
        alignment = next((v for k, _t, v in kvs if k == "general.alignment"), 32)
        return cls(version, kvs, tensors, raw[_align(pos, alignment) :], alignment=alignment)

    def to_bytes(self) -> bytes:
        out = bytearray(self.magic + struct.pack("<I", self.version))
        out += struct.pack("<Q", self.counts[0] if self.counts[0] is not None else len(self.tensors))
        out += struct.pack("<Q", self.counts[1] if self.counts[1] is not None else len(self.kvs))
        for key, kind, value in self.kvs:
            out += _string(key) + struct.pack("<I", kind) + _value(kind, value)
        for name, dims, kind, offset in self.tensors:
            out += _string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", kind, offset)
        header_end = len(out)
        out += b"\0" * (_align(len(out), self.alignment) - len(out))
        for where, byte in self.flips:
            out[min(header_end - 1, 24 + where * max(1, header_end - 24) // 10**6)] = byte
        out += self.data
        return bytes(out if self.cut is None else out[: int(len(out) * self.cut)])

    def get(self, key: str) -> list[Any] | None:
        return next((kv for kv in self.kvs if kv[0] == key), None)


def _string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, value: Any) -> bytes:
    if kind == STRING:
        return _string(value)
    if kind == ARRAY:
        return struct.pack("<IQ", value.item_type, len(value.items)) + b"".join(
            _value(value.item_type, v) for v in value.items
        )
    if kind == 6 and math.isfinite(value) and abs(value) > 3.4e38:
        value = math.copysign(math.inf, value)  # what a float32 becomes past its range
    if kind in SCALARS:
        return struct.pack(SCALARS[kind], value)
    return b""  # an unknown value type: nothing after it


def random_value(rng: random.Random, kind: int, depth: int = 0) -> Any:
    """A value that fits GGUF value type ``kind``, drawn from edge cases."""
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        value = rng.choice(INTERESTING_INTS)
        return value if low <= value < high else rng.choice((low, high - 1))
    if kind == 6:
        return rng.choice((*INTERESTING_FLOATS[:6], 3.0e38))
    if kind == 12:
        return rng.choice(INTERESTING_FLOATS)
    if kind == 7:
        return rng.random() < 0.5
    if kind == STRING:
        return rng.choice(("", "llama", "x" * 5000, "\udcff", "gpt2", "1e309", "-1", "{{"))
    if kind == ARRAY:
        item = rng.choice((*SCALARS, STRING, ARRAY)) if depth < 8 else 4
        return Array(item, [random_value(rng, item, depth + 1) for _ in range(rng.randint(0, 3))])
    return 0


def _deep_array(depth: int) -> Array:
    value = Array(4, [1])
    for _ in range(depth):
        value = Array(ARRAY, [value])
    return value


def _number_kvs(g: GgufFile) -> list[list[Any]]:
    return [kv for kv in g.kvs if kv[1] in SCALARS and (not kv[0].startswith("tokenizer.ggml.") or
                                                          kv[0].endswith("_token_id"))]  # fmt: skip


def _retype(rng: random.Random, g: GgufFile) -> str:
    kv = rng.choice(g.kvs)
    kind = rng.choice((*SCALARS, STRING, ARRAY, 13, 2**32 - 1))
    kv[1], kv[2] = kind, random_value(rng, kind)
    return f"{kv[0]} retyped to {kind}"


def _renumber(rng: random.Random, g: GgufFile) -> str:
    kv = rng.choice(_number_kvs(g))
    old = kv[2]
    if kv[1] in FLOAT_TYPES or rng.random() < 0.15:
        kv[1] = rng.choice(FLOAT_TYPES)
        kv[2] = rng.choice((*INTERESTING_FLOATS, float(old) * 10, float(old) / 10))
    else:
        base = int(old) if isinstance(old, int | bool) else 1
        value = rng.choice((*INTERESTING_INTS, base + 1, base - 1, base * 2, base // 2, base * 3))
        low, high = INT_RANGES.get(kv[1], (0, 0))
        if not low <= value < high:
            kv[1] = 10 if value >= 0 else 11
            value = min(value, 2**64 - 1)
        kv[2] = value
    return f"{kv[0]} {old!r} -> {kv[2]!r}"


def _drop_kv(rng: random.Random, g: GgufFile) -> str:
    kv = g.kvs.pop(rng.randrange(len(g.kvs)))
    return f"dropped {kv[0]}"


def _duplicate_kv(rng: random.Random, g: GgufFile) -> str:
    kv = copy.deepcopy(rng.choice(_number_kvs(g)))
    kv[2] = random_value(rng, kv[1])
    g.kvs.insert(rng.randrange(len(g.kvs) + 1), kv)
    return f"{kv[0]} twice, second {kv[2]!r}"


def _nest(rng: random.Random, g: GgufFile) -> str:
    depth = rng.choice((3, 5, 50, 300))
    g.kvs.insert(rng.randrange(len(g.kvs) + 1), ["general.nested", ARRAY, _deep_array(depth)])
    return f"an array nested {depth} deep"


def _tensor_dims(rng: random.Random, g: GgufFile) -> str:
    t = rng.choice(g.tensors)
    dims = t[1]
    op = rng.randrange(6)
    if op == 0:
        i = rng.randrange(len(dims))
        dims[i] = rng.choice((0, 1, dims[i] + 1, dims[i] * 2, dims[i] // 2, 2**32, 2**63, 2**64 - 1))
    elif op == 1:
        dims.reverse()
    elif op == 2:
        dims.append(rng.choice((1, 2)))
    elif op == 3 and len(dims) > 1:
        dims.pop()
    elif op == 4:
        dims.extend([1] * rng.choice((3, 300)))
    else:
        dims[:] = [dims[0] * 2, *([dims[1] // 2] if len(dims) > 1 else [])]
    return f"{t[0]} dims -> {dims[:6]}{'...' if len(dims) > 6 else ''}"


def _tensor_type(rng: random.Random, g: GgufFile) -> str:
    t = rng.choice(g.tensors)
    t[2] = rng.choice(GGML_TYPES)
    return f"{t[0]} type -> {t[2]}"


def _tensor_offset(rng: random.Random, g: GgufFile) -> str:
    t = rng.choice(g.tensors)
    t[3] = rng.choice((t[3] + 1, t[3] + 32, max(0, t[3] - 32), 0, len(g.data), 2**63, rng.choice(g.tensors)[3]))
    return f"{t[0]} offset -> {t[3]}"


def _tensor_name(rng: random.Random, g: GgufFile) -> str:
    i = rng.randrange(len(g.tensors))
    op = rng.randrange(4)
    if op == 0:
        g.tensors.pop(i)
        return "a tensor dropped"
    if op == 1:
        g.tensors.append(copy.deepcopy(g.tensors[i]))
        return f"{g.tensors[i][0]} twice"
    old = g.tensors[i][0]
    g.tensors[i][0] = rng.choice(("blk.7.attn_q.weight", "blk.99999999999.attn_q.weight", "", "x" * 300,
                                  "token_embd.weight", "output.weight", old.replace("blk.1", "blk.2")))  # fmt: skip
    return f"{old} renamed {g.tensors[i][0][:40]}"


def _counts(rng: random.Random, g: GgufFile) -> str:
    which = rng.randrange(2)
    real = len(g.tensors) if which == 0 else len(g.kvs)
    g.counts[which] = rng.choice((real + 1, max(0, real - 1), 0, 2**40, 2**64 - 1))
    return f"{('tensor', 'metadata')[which]} count -> {g.counts[which]}"


def _version_magic(rng: random.Random, g: GgufFile) -> str:
    if rng.random() < 0.5:
        g.version = rng.choice((1, 2, 4, 2**32 - 1))
        return f"version {g.version}"
    g.magic = rng.choice((b"GGUG", b"FUGG", b"\0\0\0\0"))
    return f"magic {g.magic!r}"


def _alignment(rng: random.Random, g: GgufFile) -> str:
    value = rng.choice((0, 1, 3, 7, 64, 2**31, 2**64 - 1))
    kv = g.get("general.alignment")
    if kv is None:
        g.kvs.append(["general.alignment", 4 if value < 2**32 else 10, value])
    else:
        kv[1], kv[2] = 4 if value < 2**32 else 10, value
    if rng.random() < 0.5 and 0 < value <= 4096:
        g.alignment = value  # a writer that honoured it
    return f"general.alignment {value}"


def _tokens(rng: random.Random, g: GgufFile) -> str:
    kv = g.get("tokenizer.ggml.tokens")
    if kv is None or not isinstance(kv[2], Array):
        return "no tokens to change"
    items: list[Any] = kv[2].items
    op = rng.randrange(7)
    if op == 0:
        n = rng.choice((0, 1, 17, len(items) // 2, len(items) - 1))
        del items[n:]
        return f"tokens cut to {n}"
    if op == 1:
        n = rng.choice((1, 100, 2000))
        items.extend(f"<extra_{i}>" for i in range(n))
        return f"{n} tokens past the embedding"
    if op == 2:
        item_type = rng.choice((4, 6, ARRAY))
        kv[2] = Array(item_type, [random_value(rng, item_type) for _ in items[:8]])
        return "tokens are not strings"
    if op == 3:
        i = rng.randrange(len(items))
        items[i] = rng.choice(("", items[0], "\udcff", "x" * 10000))
        return f"token {i} -> {items[i][:10]!r}"
    if op == 4:
        name = rng.choice(("tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores"))
        other = g.get(name)
        if other is None or not isinstance(other[2], Array):
            return f"no {name}"
        other[2].items = other[2].items[: rng.choice((0, 5))] + ([" ".join(["a"] * 3), ""] if "merges" in name else [])
        return f"{name} cut"
    if op == 5:
        name = rng.choice(("bos", "eos", "padding", "unknown"))
        key = f"tokenizer.ggml.{name}_token_id"
        value = rng.choice((len(items), len(items) + 10**6, 2**32 - 1))
        kv2 = g.get(key)
        if kv2 is None:
            g.kvs.append([key, 4, value])
        else:
            kv2[1], kv2[2] = 4, value
        return f"{key} -> {value}"
    model = g.get("tokenizer.ggml.model")
    if model is not None:
        model[2] = rng.choice(("llama", "bert", "t5", "rwkv", "", "none"))
        return f"tokenizer model -> {model[2]!r}"
    return "no tokenizer model"


def _template(rng: random.Random, g: GgufFile) -> str:
    value = rng.choice(TEMPLATES)
    kv = g.get("tokenizer.chat_template")
    kind, value = (STRING, value) if rng.random() < 0.85 else (4, 7)
    if kv is None:
        g.kvs.append(["tokenizer.chat_template", kind, value])
    else:
        kv[1], kv[2] = kind, value
    return f"template {str(value)[:30]!r}"


def _flip(rng: random.Random, g: GgufFile) -> str:
    for _ in range(rng.randint(1, 8)):
        g.flips.append((rng.randrange(10**6), rng.choice((0, 0xFF, rng.randrange(256)))))
    return f"{len(g.flips)} header bytes flipped"


def _cut(rng: random.Random, g: GgufFile) -> str:
    g.cut = rng.choice((0.0, 0.001, 0.01, 0.5, 0.99, rng.random()))
    return f"file cut to {g.cut:.3f}"


#: (weight, mutation): the header's parts are where a crafted file does its damage, so they are drawn most.
GGUF_MUTATIONS: list[tuple[int, Callable[[random.Random, GgufFile], str]]] = [
    (10, _renumber), (6, _retype), (2, _drop_kv), (2, _duplicate_kv), (2, _nest), (8, _tensor_dims),
    (4, _tensor_type), (4, _tensor_offset), (4, _tensor_name), (2, _counts), (1, _version_magic),
    (2, _alignment), (7, _tokens), (3, _template), (4, _flip), (2, _cut),
]  # fmt: skip


def mutate_gguf(rng: random.Random, base: GgufFile) -> tuple[GgufFile, list[str]]:
    """A copy of ``base`` with one to three mutations; and what they were."""
    g = GgufFile(base.version, copy.deepcopy(base.kvs), copy.deepcopy(base.tensors), base.data,
                 alignment=base.alignment)  # fmt: skip
    weights = [w for w, _ in GGUF_MUTATIONS]
    done = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        (mutation,) = rng.choices([m for _, m in GGUF_MUTATIONS], weights)
        done.append(mutation(rng, g))
    return g, done


def write_base_gguf(path: Path, seed: int = 0) -> Path:
    """A small valid llama GGUF (hidden 64, two layers, the default model's tokenizer cut to 512 tokens) with F32,
    F16, Q8_0 and Q4_0 tensors, written as llama.cpp's converter lays one out."""
    from gguf import GGMLQuantizationType, GGUFWriter

    from engine.loading.default_model import source_gguf_path
    from engine.tools.make_gguf import tokenizer_fields, truncate_vocab
    from engine.tools.random_blocks import random_tensor

    q = GGMLQuantizationType
    hidden, inter, heads, kv_heads, vocab = 64, 128, 4, 2, 512
    kv = kv_heads * hidden // heads
    writer = GGUFWriter(str(path), "llama")
    writer.add_type("model")
    writer.add_name("crafted base")
    writer.add_block_count(2)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(hidden // heads)
    for key, value, vtype, sub_type in truncate_vocab(tokenizer_fields(source_gguf_path()), vocab):
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    rng = np.random.default_rng(seed)
    specs: list[tuple[str, tuple[int, ...], Any]] = [("token_embd.weight", (vocab, hidden), q.Q8_0)]
    for i in range(2):
        b = f"blk.{i}"
        specs += [(f"{b}.attn_norm.weight", (hidden,), q.F32), (f"{b}.ffn_down.weight", (hidden, inter), q.Q4_0),
                  (f"{b}.ffn_gate.weight", (inter, hidden), q.F16), (f"{b}.ffn_up.weight", (inter, hidden), q.F16),
                  (f"{b}.ffn_norm.weight", (hidden,), q.F32), (f"{b}.attn_k.weight", (kv, hidden), q.F16),
                  (f"{b}.attn_output.weight", (hidden, hidden), q.F16), (f"{b}.attn_q.weight", (hidden, hidden), q.F16),
                  (f"{b}.attn_v.weight", (kv, hidden), q.F16)]  # fmt: skip
    specs.append(("output_norm.weight", (hidden,), q.F32))
    for name, shape, qtype in specs:
        if len(shape) == 1:
            writer.add_tensor(name, 1 + rng.standard_normal(shape[0], dtype=np.float32) * np.float32(0.02))
        elif qtype in (q.F16, q.F32):
            writer.add_tensor(name, random_tensor(rng, qtype, *shape))
        else:
            writer.add_tensor(name, random_tensor(rng, qtype, *shape), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
