"""The C heap: a step's temporaries kept between layers, and a closed model's memory given back to the system.

Dropping the last reference to a model frees its tensors into the C allocator, but glibc keeps freed pages in its
heaps and arenas (one per thread that allocated): a process that loaded a 1B model and unloaded it would still hold
gigabytes. ``give_back`` collects what Python still holds (reference cycles through modules and closures), empties
the CUDA cache where there is one, and asks glibc to return its free pages (``malloc_trim``). Elsewhere (musl,
macOS, Windows) the allocator has no such call and returns large blocks on its own.

A prefill step's temporaries are large (a 512-token chunk's gate and up projections of an 8B model take 59 MB),
and glibc serves each allocation over 32 MB with a fresh ``mmap`` that its ``free`` unmaps: every layer then
faults in and zeroes its buffers again, both threads queueing on the kernel's lock of the address space. That cost
up to a quarter of the 8B prefill (docs/BENCHMARKS.md). :func:`step_heap` turns ``mmap`` off while a step runs, so those
buffers come from the heap and are reused by the next layer; :func:`keep_freed_heap` has glibc keep up to
``KEEP_FREED`` of freed memory at the top of its heaps, and :func:`trim_heap` gives it back once the engine has been
idle for a while (``engine.core.llm_engine.HEAP_IDLE_TRIM_S``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

import torch

#: glibc's mallopt parameters (malloc.h) and its default cap on mmapped chunks
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _DEFAULT_MMAP_MAX = -1, -4, 65536
#: freed memory glibc keeps at the top of a heap instead of returning it at once (a step's temporaries)
KEEP_FREED = 1 << 30


@cache
def _glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (the only one whose heap these calls tune), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if getattr(libc, "gnu_get_libc_version", None) is not None else None


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    libc = _glibc()
    trim = None if libc is None else getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


@cache
def _mallopt() -> Callable[[int, int], int] | None:
    libc = _glibc()
    mallopt = None if libc is None else getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_heap() -> bool:
    """Have glibc keep up to ``KEEP_FREED`` of freed memory at the top of its heaps (for :func:`step_heap`)."""
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_TRIM_THRESHOLD, KEEP_FREED) == 1


@contextmanager
def step_heap() -> Iterator[None]:
    """While the block runs, glibc serves large allocations from its heaps instead of fresh mmaps."""
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    mallopt(_M_MMAP_MAX, 0)
    try:
        yield
    finally:
        mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)


def trim_heap() -> None:
    """Return the heaps' free pages to the system (an idle engine's step temporaries)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def give_back() -> None:
    """Return what freed models leave behind: Python's cycles, the CUDA cache, and the C heap's free pages."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
