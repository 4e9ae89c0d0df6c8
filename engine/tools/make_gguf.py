"""``python -m engine.tools.make_gguf``: random-weight GGUF files in the shapes and block types users run.

The GGUF kernels are measured on 1B-8B models in Q4_K_M, Q4_0 and Q8_0, the files users download. Real checkpoints
are gigabytes behind a login; for speed only the shapes and the block types matter, so this writes random blocks
(``engine/tools/random_blocks.py``) straight into the layout llama.cpp's ``convert_hf_to_gguf.py`` and
``llama-quantize`` produce: the same tensor names, metadata keys and type mix. The vocabulary, tokenizer and chat
template are the default model's (SmolLM2, 49152 tokens), copied from its GGUF, so both Hearth and llama-server
load the file and generate (nonsense) text.

Llama 3's ``rope_freqs`` table is left out: transformers' GGUF config reader does not see it, so with it llama.cpp
would compute a different rope than Hearth. Tensor data are written one tensor at a time, never the whole file
in memory.
"""

from __future__ import annotations

import argparse
import functools
import mmap
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType

from engine.tools.random_blocks import random_tensor

Q = GGMLQuantizationType


@dataclass(frozen=True, slots=True)
class Shape:
    """A model's hyperparameters as its GGUF states them."""

    name: str
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    rope_theta: float
    context: int
    tied: bool
    qkv_bias: bool = False
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES: dict[str, Shape] = {
    "llama-1b": Shape("Llama 3.2 1B", "llama", 2048, 16, 32, 8, 8192, 500000.0, 131072, tied=True),
    "llama-8b": Shape("Llama 3.1 8B", "llama", 4096, 32, 32, 8, 14336, 500000.0, 131072, tied=False),
    "qwen-1.5b": Shape("Qwen2.5 1.5B", "qwen2", 1536, 28, 12, 2, 8960, 1000000.0, 32768, tied=True,
                       qkv_bias=True, norm_eps=1e-6),
    "tiny": Shape("Tiny Llama", "llama", 256, 2, 4, 2, 768, 10000.0, 2048, tied=True),
}

#: Each ``--type`` and the ``general.file_type`` llama-quantize writes for it (plain K types as their _S files).
FILE_TYPES: dict[str, LlamaFileType] = {
    "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M, "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_1": LlamaFileType.MOSTLY_Q4_1, "Q4_K": LlamaFileType.MOSTLY_Q4_K_S, "Q5_K": LlamaFileType.MOSTLY_Q5_K_S,
    "Q6_K": LlamaFileType.MOSTLY_Q6_K, "F16": LlamaFileType.MOSTLY_F16,
}
#: The default model's vocabulary size (its tokenizer is copied into every file).
VOCAB = 49152


def use_more_bits(layer: int, layers: int) -> bool:
    """llama-quant.cpp's choice of the layers whose ``attn_v`` and ``ffn_down`` Q4_K_M keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def weight_type(file_type: str, role: str, layer: int, layers: int, tied: bool, cols: int) -> GGMLQuantizationType:
    """The block type llama-quantize gives a 2-D weight (``role``: the name without ``blk.N.`` and ``.weight``).

    Q4_K_M and Q4_0 follow llama-quant.cpp: the output head (the token embedding when tied) is Q6_K (Q8_0 when
    its rows are not a whole number of 256-blocks); Q4_K_M also keeps ``attn_v`` and ``ffn_down`` in Q6_K on the
    :func:`use_more_bits` layers. Q8_0 is Q8_0 throughout (the head stays Q8_0 there too), and the plain types put
    every weight in that one type, as ``llama-quantize --pure`` does.
    """
    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown type {file_type!r}; choose from {', '.join(FILE_TYPES)}")
    head = role == "output" or (tied and role == "token_embd")
    if file_type in ("Q4_K_M", "Q4_0") and head:
        return Q.Q6_K if cols % 256 == 0 else Q.Q8_0
    if file_type == "Q4_K_M":
        return Q.Q6_K if role in ("attn_v", "ffn_down") and use_more_bits(layer, layers) else Q.Q4_K
    return Q.__members__[file_type]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of the file: its name, numpy shape (``[rows, cols]``, ggml's ne reversed) and type."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType


def plan(shape: Shape, file_type: str, vocab: int = VOCAB) -> list[TensorSpec]:
    """Every tensor in the order the converter writes them (HF's sorted names within each layer)."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim

    def weight(name: str, rows: int, cols: int, layer: int = -1) -> TensorSpec:
        role = name.removeprefix(f"blk.{layer}.")
        qtype = weight_type(file_type, role, layer, shape.layers, shape.tied, cols)
        return TensorSpec(f"{name}.weight", (rows, cols), qtype)

    def vector(name: str, size: int) -> TensorSpec:
        return TensorSpec(name, (size,), Q.F32)

    specs = [weight("token_embd", vocab, h)]
    for i in range(shape.layers):
        b = f"blk.{i}"
        specs += [vector(f"{b}.attn_norm.weight", h), weight(f"{b}.ffn_down", h, shape.intermediate, i),
                  weight(f"{b}.ffn_gate", shape.intermediate, h, i), weight(f"{b}.ffn_up", shape.intermediate, h, i),
                  vector(f"{b}.ffn_norm.weight", h)]
        for proj, rows in (("attn_k", kv), ("attn_output", h), ("attn_q", h), ("attn_v", kv)):
            if shape.qkv_bias and proj != "attn_output":
                specs.append(vector(f"{b}.{proj}.bias", rows))
            specs.append(weight(f"{b}.{proj}", rows, h, i))
    specs.append(vector("output_norm.weight", h))
    if not shape.tied:
        specs.append(weight("output", vocab, h))
    return specs


#: A metadata field as ``GGUFWriter.add_key_value`` takes it: key, value, type, array item type.
Field = tuple[str, Any, GGUFValueType, GGUFValueType | None]
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def tokenizer_fields(source: Path) -> list[Field]:
    """Every ``tokenizer.*`` field of ``source`` (vocabulary, merges, special ids, chat template), ready for
    ``GGUFWriter.add_key_value``: key, value, type, array item type. Not to be changed in place (cached).

    Read here rather than through ``gguf.GGUFReader``, which builds an array object for every item of every
    field and tensor before returning one.
    """
    stat = source.stat()
    return _tokenizer_fields(source.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _tokenizer_fields(source: Path, _size: int, _mtime_ns: int) -> list[Field]:
    with source.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{source} is not a GGUF file")
        return _read_tokenizer_fields(data, source)


def _read_tokenizer_fields(data: mmap.mmap, source: Path) -> list[Field]:
    pos = 24  # magic, version, tensor count, field count

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        size = take("<Q")
        pos += size
        return data[pos - size : pos].decode("utf-8")

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == _STRING:
            return string()
        if kind in _SCALARS:
            return take(_SCALARS[kind])
        if kind != _ARRAY:
            raise ValueError(f"{source} has a metadata value of unknown type {kind}")
        item, count = take("<I"), take("<Q")
        if item in _SCALARS:
            dtype = np.dtype(_SCALARS[item])
            pos += dtype.itemsize * count
            return np.frombuffer(data, dtype, count, pos - dtype.itemsize * count).tolist()
        return [value(item) for _ in range(count)]

    fields: list[Field] = []
    for _ in range(struct.unpack_from("<Q", data, 16)[0]):
        key, kind = string(), take("<I")
        start = pos
        got = value(kind)
        if key.startswith("tokenizer."):
            sub = GGUFValueType(struct.unpack_from("<I", data, start)[0]) if kind == _ARRAY else None
            fields.append((key, got, GGUFValueType(kind), sub))
    return fields


def truncate_vocab(fields: list[Field], size: int,
                   ) -> list[Field]:
    """The tokenizer cut to its first ``size`` tokens, with the BPE merges among them (a merge whose parts or
    result fall outside is dropped), so that it still tokenizes any text.

    Raises:
        ValueError: ``size`` leaves out a special token the fields name (bos, eos, ...) or is not below the
            vocabulary's size.
    """
    values = {key: value for key, value, *_ in fields}
    tokens = values.get("tokenizer.ggml.tokens", [])
    if not 0 < size < len(tokens):
        raise ValueError(f"--vocab must be between 1 and {len(tokens) - 1}, not {size}")
    named = {key: value for key, value in values.items() if key.endswith("_token_id")}
    if any(value >= size for value in named.values()):
        raise ValueError(f"--vocab {size} leaves out special tokens ({named})")
    kept = set(tokens[:size])
    out = []
    for key, value, vtype, sub in fields:
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = value[:size]
        elif key == "tokenizer.ggml.merges":
            value = [m for m in value if (p := m.split(" ")) and len(p) == 2 and {*p, "".join(p)} <= kept]
        out.append((key, value, vtype, sub))
    return out


def _data(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    if len(spec.shape) == 1:
        noise = rng.standard_normal(spec.shape[0], dtype=np.float32) * np.float32(0.02)
        return noise if spec.name.endswith(".bias") else 1 + noise
    return random_tensor(rng, spec.qtype, *spec.shape)


def write_gguf(out: Path, shape_name: str, file_type: str, seed: int = 0, layers: int | None = None,
               vocab: int | None = None, tokenizer_gguf: Path | None = None) -> list[TensorSpec]:
    """Write the random-weight file; returns its tensors. The same arguments give the same bytes.

    ``vocab`` keeps only the tokenizer's first ``vocab`` tokens (see :func:`truncate_vocab`): a small file that
    every reader opens at once, for tests. ``tokenizer_gguf`` is the GGUF whose tokenizer is copied (default:
    the default model's).

    Raises:
        ValueError: an unknown shape or type, a layer count below one, or a ``vocab`` out of range.
        OSError: the file cannot be written.
    """
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r}; choose from {', '.join(SHAPES)}")
    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown type {file_type!r}; choose from {', '.join(FILE_TYPES)}")
    shape = SHAPES[shape_name]
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers must be at least 1, not {layers}")
        shape = replace(shape, layers=layers)
    if tokenizer_gguf is None:
        from engine.loading.default_model import source_gguf_path

        tokenizer_gguf = source_gguf_path()
    partial = out.with_name(f".{out.name}.partial")  # a file cut short never takes the real name
    writer = GGUFWriter(partial, shape.arch)
    writer.add_type("model")
    writer.add_name(f"{shape.name} random {file_type}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.norm_eps)
    writer.add_file_type(int(FILE_TYPES[file_type]))
    tokenizer = tokenizer_fields(tokenizer_gguf)
    if vocab is not None:
        tokenizer = truncate_vocab(tokenizer, vocab)
    vocab = next((len(value) for key, value, *_ in tokenizer if key == "tokenizer.ggml.tokens"), VOCAB)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(shape.head_dim)
    for key, value, vtype, sub_type in tokenizer:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    if file_type != "F16":
        writer.add_quantization_version(2)
    specs = plan(shape, file_type, vocab)
    for spec in specs:
        dtype = np.float32 if spec.qtype == Q.F32 else np.float16 if spec.qtype == Q.F16 else np.uint8
        nbytes = _nbytes(spec)
        byte_shape = spec.shape if dtype is not np.uint8 else (spec.shape[0], nbytes // spec.shape[0])
        raw = None if dtype is not np.uint8 else spec.qtype
        writer.add_tensor_info(spec.name, byte_shape, np.dtype(dtype), nbytes, raw_dtype=raw)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, spec in enumerate(specs):
            writer.write_tensor_data(_data(spec, np.random.default_rng([seed, index])))
        writer.close()
        partial.replace(out)
    finally:
        writer.close()
        partial.unlink(missing_ok=True)
    return specs


def _nbytes(spec: TensorSpec) -> int:
    block, size = GGML_QUANT_SIZES[spec.qtype]
    return int(np.prod(spec.shape)) // block * size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.make_gguf", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, choices=list(SHAPES))
    parser.add_argument("--type", required=True, choices=list(FILE_TYPES), dest="file_type")
    parser.add_argument("--out", required=True, type=Path, help="the .gguf file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    parser.add_argument("--vocab", type=int, default=None,
                        help="keep only the tokenizer's first N tokens (a small file for tests)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        specs = write_gguf(args.out, args.shape, args.file_type, args.seed, args.layers, args.vocab)
    except (ValueError, OSError) as exc:
        print(f"make_gguf: {exc}", file=sys.stderr)
        return 2
    counts = Counter(spec.qtype.name for spec in specs)
    size = args.out.stat().st_size
    print(f"{args.out}: {size / 2**20:.1f} MiB, {len(specs)} tensors "
          f"({', '.join(f'{n} {t}' for t, n in counts.most_common())}) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
