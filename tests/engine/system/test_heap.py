"""A step's large temporaries come from glibc's heap, reused from layer to layer, and go back once the engine idles.

Each check runs in a fresh process, so that the heap and its settings are the check's own. Page faults are what
the change is about: a buffer glibc maps afresh is faulted in (and zeroed) page by page every time it is used.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.system import memory

pytestmark = pytest.mark.skipif(memory._mallopt() is None, reason="the C library is not glibc")

_SCRIPT = r"""
import json, resource
import psutil, torch
import torch.nn.functional as F
from engine.system import memory

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def layer(x):
    # a 512-token chunk through an MLP's element-wise part: a 59 MB gate-and-up buffer (over glibc's 32 MB mmap
    # limit), the gate's SiLU and its product with up (29 MB each), the residual
    gate, up = x.repeat(1, 7).chunk(2, -1)
    return x + (F.silu(gate) * up)[:, : x.shape[1]]

def layers(n):
    x, counts = torch.ones(512, 4096), []
    for _ in range(n):
        before = faults()
        x = layer(x)
        counts.append(faults() - before)
    return counts

torch.set_num_threads(1)
memory.keep_freed_heap()
plain = layers(10)
with memory.step_heap():
    heap = layers(10)
kept = psutil.Process().memory_info().rss
memory.trim_heap()
trimmed = psutil.Process().memory_info().rss
print(json.dumps({"plain": plain, "heap": heap, "kept_mb": kept / 2**20, "trimmed_mb": trimmed / 2**20}))
"""


def test_a_steps_big_buffers_are_reused_in_the_heap_and_given_back_when_idle() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    pages = (59 + 29 + 29 + 8) * 2**20 // 4096  # what one layer writes
    assert min(result["plain"]) > pages // 2, result  # mapped afresh every layer: each page faulted in again
    # on the heap, the layers after the first reuse its pages (glibc's bins now and then need a fresh run)
    assert sum(result["heap"][1:]) < sum(result["plain"][1:]) / 4, result
    assert result["kept_mb"] - result["trimmed_mb"] > 50, result  # and given back when the engine idles
