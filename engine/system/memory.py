"""Giving a closed model's memory back to the system.

Dropping the last reference to a model frees its tensors into the C allocator, but glibc keeps freed pages in its
heaps and arenas (one per thread that allocated): a process that loaded a 1B model and unloaded it would still hold
gigabytes. ``give_back`` collects what Python still holds (reference cycles through modules and closures), empties
the CUDA cache where there is one, and asks glibc to return its free pages (``malloc_trim``). Elsewhere (musl,
macOS, Windows) the allocator has no such call and returns large blocks on its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable
from functools import cache

import torch


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def give_back() -> None:
    """Return what freed models leave behind: Python's cycles, the CUDA cache, and the C heap's free pages."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
