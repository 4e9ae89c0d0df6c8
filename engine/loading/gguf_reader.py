"""GGUF headers: metadata and the tensor table, read with bounds checks from a memory-mapped file, and the
Hugging Face-style config they describe."""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from engine.api import ModelLoadError

if TYPE_CHECKING:
    import numpy as np

#: The first four bytes of every GGUF file (files in Ollama's blob store have no .gguf extension).
GGUF_MAGIC = b"GGUF"


#: GGML_MAX_DIMS: a GGUF tensor has at most this many dimensions.
GGUF_MAX_DIMS = 4
#: The largest ``general.alignment`` accepted (llama.cpp writes 32; it must be a power of two).
_MAX_ALIGNMENT = 1 << 20
#: Array nesting deeper than this is refused (llama.cpp writes flat arrays only).
_MAX_ARRAY_DEPTH = 4


def open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file.

    A FIFO, socket or device named like a model file would block ``open()`` (or never end a read), and the
    Models scan opens files at startup, so the file is opened without blocking and checked before any read.

    Raises:
        OSError: The path is missing, unreadable or not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_text(path: Path, errors: str = "strict") -> str:
    """The UTF-8 text of ``path`` if it is a regular file (see :func:`open_regular`); OSError otherwise."""
    with open_regular(path) as fh:
        return fh.read().decode("utf-8", errors=errors)


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts with the GGUF magic, whatever its name."""
    try:
        with open_regular(path) as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


_U64 = struct.Struct("<Q")


class _GgufCursor:
    """Bounds-checked little-endian reads from a memory-mapped GGUF file."""

    def __init__(self, data: mmap.mmap, name: str) -> None:
        self.data, self.name, self.pos = data, name, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ModelLoadError(
                f"{self.name} is truncated: its metadata ends early (at byte {self.pos} of "
                f"{len(self.data)}). {GGUF_ADVICE}"
            )
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        length = int(self.take("<Q"))
        if self.pos + length > len(self.data):
            raise ModelLoadError(
                f"{self.name} is truncated: a metadata string runs past the end. {GGUF_ADVICE}"
            )
        raw = bytes(self.data[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def count(self, what: str, min_bytes: int) -> int:
        """A count read from the file, refused when its items (each ``min_bytes`` at least) cannot fit in what
        is left of the file, so that no loop runs for a count the file could not hold."""
        value = int(self.take("<Q"))
        if value > (len(self.data) - self.pos) // min_bytes:
            raise ModelLoadError(
                f"{self.name} is truncated or corrupt: it claims {value} {what}, more than its {len(self.data)} "
                f"bytes can hold. {GGUF_ADVICE}"
            )
        return value

    def array(self, item_kind: int) -> list[str] | np.ndarray:
        """A flat array's items (the cursor at its count): strings as a list, numbers as a numpy array."""
        if item_kind in _GGUF_SCALARS:
            import numpy as np  # only a conversion decodes arrays: a header scan stays on the standard library

            dtype = np.dtype(_GGUF_SCALARS[item_kind])
            count = self.count("array items", dtype.itemsize)
            values = np.frombuffer(self.data, dtype, count, self.pos).copy()
            self.pos += dtype.itemsize * count
            return values
        if item_kind != _GGUF_STRING:
            raise ModelLoadError(f"{self.name} is corrupt: unknown metadata type {item_kind}. {GGUF_ADVICE}")
        items = self.count("array items", 8)
        data, pos, end = self.data, self.pos, len(self.data)
        length_at = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(items):  # a vocabulary: 100k+ strings, so one tight loop
            length = length_at(data, pos)[0] if pos + 8 <= end else end
            if pos + 8 + length > end:
                raise ModelLoadError(f"{self.name} is truncated: a metadata string runs past the end. {GGUF_ADVICE}")
            append(data[pos + 8 : pos + 8 + length].decode("utf-8", errors="replace"))
            pos += 8 + length
        self.pos = pos
        return out

    def skip(self, kind: int, depth: int = 0) -> None:
        if kind == _GGUF_STRING:
            length = int(self.take("<Q"))  # read first: `pos += take()` would use the old pos
            self.pos += length
        elif kind == _GGUF_ARRAY:
            if depth >= _MAX_ARRAY_DEPTH:
                raise ModelLoadError(f"{self.name} is corrupt: its metadata nests arrays too deep. {GGUF_ADVICE}")
            item_kind = int(self.take("<I"))
            if item_kind in _GGUF_SCALARS:
                count = int(self.take("<Q"))  # read first: `pos += take()` would use the old pos
                self.pos += struct.calcsize(_GGUF_SCALARS[item_kind]) * count
            elif item_kind == _GGUF_STRING:  # a vocabulary: 100k+ strings, so one tight loop
                items = self.count("array items", 8)
                data, pos, end = self.data, self.pos, len(self.data)
                length_at = _U64.unpack_from
                for _ in range(items):
                    if pos + 8 > end:
                        self.pos = pos
                        self.take("<Q")  # raises: the file is truncated
                    pos += 8 + length_at(data, pos)[0]
                self.pos = pos
            elif item_kind == _GGUF_ARRAY:
                # a string takes 8 bytes at least (its length), an array 12 (item type and count)
                for _ in range(self.count("array items", 8 if item_kind == _GGUF_STRING else 12)):
                    self.skip(item_kind, depth + 1)
                    if self.pos > len(self.data):
                        break
            else:
                raise ModelLoadError(
                    f"{self.name} is corrupt: unknown metadata type {item_kind}. {GGUF_ADVICE}"
                )
        elif kind in _GGUF_SCALARS:
            self.pos += struct.calcsize(_GGUF_SCALARS[kind])
        else:
            raise ModelLoadError(f"{self.name} is corrupt: unknown metadata type {kind}. {GGUF_ADVICE}")
        if self.pos > len(self.data):
            raise ModelLoadError(f"{self.name} is truncated: its metadata runs past the end. {GGUF_ADVICE}")


GGUF_ADVICE = "Re-download it; the file is damaged or was not copied completely."
#: The tensor tables last read (without arrays), newest last, by the file's identity and version (device, inode, size,
#: modification and change times): a file written again is parsed again.
_TABLES: dict[tuple[int, ...], tuple[dict[str, Any], list[TensorEntry]]] = {}
_MAX_TABLES = 4
#: A version of a file is cached only once it has stood unchanged this long. File times come from a coarse clock
#: (a few milliseconds a tick), so a file written again within one tick at the same size keeps its key; while a
#: file is that fresh it is parsed at every read (git's "racily clean" entries).
_SETTLED_NS = 2_000_000_000


def _now_ns() -> int:
    return time.time_ns()
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


class TensorEntry(NamedTuple):
    """One tensor of a GGUF file's table: where its bytes lie and what they are."""

    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length
    kind: str  # ggml type name ("Q4_K", "F32", ...)
    kind_id: int  # its number in ``gguf.GGMLQuantizationType``
    offset: int  # absolute byte offset of its data in the file
    nbytes: int

    @property
    def rows(self) -> int:
        return math.prod(self.dims[1:])


def read_gguf_header(path: Path) -> tuple[dict[str, Any], list[tuple[str, int, str, int]]]:
    """Parse a GGUF file's metadata and tensor table and check every tensor lies inside the file.

    Only the metadata values the loader needs are decoded (strings and integers); large arrays such
    as the vocabulary are skipped, which keeps this fast even for big tokenizers.

    Args:
        path: The ``.gguf`` file.

    Returns:
        ``(metadata, tensors)``: metadata maps keys to decoded scalars/strings (arrays map to their
        length); tensors are ``(name, element count, ggml type name, bytes)``.

    Raises:
        ModelLoadError: The file is not a GGUF, is truncated or is corrupt; the message names it.
    """
    metadata, entries = read_tensor_table(path)
    return metadata, [(e.name, math.prod(e.dims), e.kind, e.nbytes) for e in entries]


def read_tensor_table(path: Path, arrays: bool = False) -> tuple[dict[str, Any], list[TensorEntry]]:
    """:func:`read_gguf_header` with each tensor's dimensions and place in the file (:class:`TensorEntry`): what
    reading a tensor's bytes needs, without decoding the vocabulary as ``gguf.GGUFReader`` does.

    With ``arrays``, flat arrays are decoded too (what converting the tokenizer needs): strings to a ``list[str]``,
    numbers to a 1-D numpy array; nested arrays stay their length."""
    name = path.name
    try:
        fh = open_regular(path)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    with fh:
        info = os.fstat(fh.fileno())
        size = info.st_size
        if size < 24:
            raise ModelLoadError(f"{name} is truncated ({size} bytes). {GGUF_ADVICE}")
        if arrays:
            return _parse_header(fh, name, size, arrays)
        # one load reads the table several times (validate, recommend, the weights): parse it once per version
        key = (info.st_dev, info.st_ino, size, info.st_mtime_ns, info.st_ctime_ns)
        table = _TABLES.pop(key, None) or _parse_header(fh, name, size)
        if _now_ns() - max(info.st_mtime_ns, info.st_ctime_ns) >= _SETTLED_NS:
            _TABLES[key] = table
            while len(_TABLES) > _MAX_TABLES:
                del _TABLES[next(iter(_TABLES))]
        return dict(table[0]), list(table[1])


def _parse_header(
    fh: BinaryIO, name: str, size: int, arrays: bool = False
) -> tuple[dict[str, Any], list[TensorEntry]]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ModelLoadError(f"{name} is not a GGUF file (it does not start with 'GGUF'). {GGUF_ADVICE}")
        cur = _GgufCursor(data, name)
        cur.pos = 4
        version = int(cur.take("<I"))
        if version not in (2, 3):
            raise ModelLoadError(
                f"{name} uses GGUF version {version}, which is not supported (only 2 and 3, little-endian)."
            )
        # a tensor entry takes 24 bytes at least (name length, dimension count, type, offset), a key 13
        tensor_count = cur.count("tensors", 24)
        kv_count = cur.count("metadata entries", 13)
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key, kind = cur.string(), int(cur.take("<I"))
            if kind == _GGUF_STRING:
                metadata[key] = cur.string()
            elif kind in _GGUF_SCALARS:
                metadata[key] = cur.take(_GGUF_SCALARS[kind])
            elif kind == _GGUF_ARRAY:
                start = cur.pos
                item_kind = int(cur.take("<I"))
                metadata[key] = int(cur.take("<Q"))
                if arrays and item_kind != _GGUF_ARRAY:
                    cur.pos = start + 4
                    metadata[key] = cur.array(item_kind)
                else:
                    cur.pos = start
                    cur.skip(kind)
            else:
                cur.skip(kind)
        infos: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(tensor_count):
            tname = cur.string()
            n_dims = int(cur.take("<I"))
            if n_dims > GGUF_MAX_DIMS:
                raise ModelLoadError(
                    f"{name} is corrupt: tensor '{tname[:80]}' claims {n_dims} dimensions; GGUF allows at most "
                    f"{GGUF_MAX_DIMS}. {GGUF_ADVICE}"
                )
            dims = tuple(int(cur.take("<Q")) for _ in range(n_dims))
            infos.append((tname, dims, int(cur.take("<I")), int(cur.take("<Q"))))
        alignment = metadata.get("general.alignment", 32)
        if isinstance(alignment, bool) or not isinstance(alignment, int) or not 0 < alignment <= _MAX_ALIGNMENT or (
            alignment & (alignment - 1)
        ):
            raise ModelLoadError(
                f"{name} is corrupt: its general.alignment is {str(alignment)[:40]!r}, not a power of two up to "
                f"{_MAX_ALIGNMENT}. {GGUF_ADVICE}"
            )
        data_start = -(-cur.pos // alignment) * alignment
    tensors: list[TensorEntry] = []
    for tname, dims, kind, offset in infos:
        count = math.prod(dims)
        try:
            qtype = GGMLQuantizationType(kind)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelLoadError(
                f"{name} is corrupt: tensor '{tname}' has unknown type {kind}. {GGUF_ADVICE}"
            ) from None
        nbytes = count // block * type_size
        end = data_start + offset + nbytes
        if end > size:
            raise ModelLoadError(
                f"{name} is truncated: tensor '{tname}' ends at byte {end} but the file has only {size} "
                f"bytes. {GGUF_ADVICE}"
            )
        tensors.append(TensorEntry(tname, dims, qtype.name, int(qtype.value), data_start + offset, nbytes))
    return metadata, tensors


def gguf_config(metadata: dict[str, Any], tensors: list[tuple[str, int, str, int]]) -> dict[str, Any]:
    """A Hugging Face-style config built from a GGUF header (:func:`read_gguf_header`), enough for the
    recommendation's estimates of weights and KV cache (``engine/loading/recommend.py``)."""
    arch = str(metadata.get("general.architecture", ""))
    names = {name for name, _count, _kind, _nbytes in tensors}
    cfg: dict[str, Any] = {
        "model_type": arch,
        "num_parameters": sum(count for _name, count, _kind, _nbytes in tensors),
        "tie_word_embeddings": "output.weight" not in names,
    }
    keys = {
        "num_hidden_layers": f"{arch}.block_count",
        "hidden_size": f"{arch}.embedding_length",
        "intermediate_size": f"{arch}.feed_forward_length",
        "num_attention_heads": f"{arch}.attention.head_count",
        "num_key_value_heads": f"{arch}.attention.head_count_kv",
        "head_dim": f"{arch}.attention.key_length",
        "max_position_embeddings": f"{arch}.context_length",
    }
    for field_name, key in keys.items():
        value = metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            cfg[field_name] = value
    vocab = metadata.get(f"{arch}.vocab_size") or metadata.get("tokenizer.ggml.tokens")
    if isinstance(vocab, int) and "hidden_size" in cfg:
        cfg["vocab_size"] = vocab
    needed = ("num_hidden_layers", "hidden_size", "num_attention_heads")
    if not all(k in cfg for k in needed):  # no KV estimate without the shape: count parameters only
        for k in ("num_hidden_layers", "vocab_size"):
            cfg.pop(k, None)
    return cfg
