"""Safetensors headers and shard lists, read and checked without loading any tensor."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

from engine.api import ModelLoadError
from engine.loading.gguf_reader import open_regular

_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
#: More dimensions than any weight has; a header claiming more is refused before its shape is multiplied out.
MAX_SAFETENSORS_DIMS = 16
#: Bytes per element of each safetensors dtype (sub-byte types are checked loosely).
SAFETENSORS_ITEMSIZE: dict[str, float] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}  # fmt: skip
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}


def read_safetensors_header(path: Path) -> list[tuple[str, str, list[int]]]:
    """Parse and check a safetensors file's header against the file size.

    Args:
        path: The ``.safetensors`` file.

    Returns:
        ``(name, dtype, shape)`` for every tensor.

    Raises:
        ModelLoadError: The file is truncated or its header is corrupt; the message names the file.
    """
    advice = "Re-download the model; the file is damaged or was not copied completely."
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise ModelLoadError(f"{path.name} is truncated ({size} bytes, no header). {advice}")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > _MAX_SAFETENSORS_HEADER or 8 + header_len > size:
                raise ModelLoadError(
                    f"{path.name} is corrupt or truncated: its header claims {header_len} bytes but the "
                    f"file has {size}. {advice}"
                )
            raw = fh.read(header_len)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}.") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ModelLoadError(f"{path.name} is corrupt: its header is not valid JSON. {advice}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path.name} is corrupt: its header is not a JSON object. {advice}")
    data_size = size - 8 - header_len
    tensors: list[tuple[str, str, list[int]]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(entry["dtype"])
            shape = entry["shape"]
            if not isinstance(shape, list) or len(shape) > MAX_SAFETENSORS_DIMS:
                raise TypeError("shape")
            shape = [int(d) for d in shape]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ModelLoadError(
                f"{path.name} is corrupt: tensor '{name}' has a malformed header entry. {advice}"
            ) from None
        itemsize = SAFETENSORS_ITEMSIZE.get(dtype)
        if itemsize is None:
            raise ModelLoadError(f"{path.name}: tensor '{name}' has unknown dtype {dtype}. {advice}")
        if end > data_size:
            raise ModelLoadError(
                f"{path.name} is truncated: tensor '{name}' ends at byte {8 + header_len + end} but the "
                f"file has only {size} bytes. {advice}"
            )
        expected = math.prod(shape) * itemsize
        if begin < 0 or end < begin or (itemsize >= 1 and end - begin != expected):
            raise ModelLoadError(
                f"{path.name} is corrupt: tensor '{name}' ({dtype} {shape}) should take {int(expected)} "
                f"bytes but its offsets give {end - begin}. {advice}"
            )
        tensors.append((name, dtype, shape))
    return tensors


def safetensors_files(folder: Path) -> list[Path]:
    """List the weight shards, following an index file when there is one."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            names = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelLoadError(
                f"{index_path.name} in {folder} is corrupt. Re-download the model."
            ) from None
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ModelLoadError(
                f"{folder} is incomplete: weight shard(s) {', '.join(missing)} listed in "
                f"{index_path.name} are missing. Re-download the model."
            )
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))
