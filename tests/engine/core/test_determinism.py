"""Greedy replies repeat bitwise, whatever shares the step or the prefix cache (``deterministic=True``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine.api import SamplingParams
from engine.core.llm import LLM
from engine.model.attention import blocked_attention
from engine.model.quantization import DenseLinear, Int4Linear, Int8Linear, PackedFp16Linear
from engine.model.row_invariance import PaddedRows, is_row_invariant, row_multiple

SYSTEM = {"role": "system", "content": "You are Hearth, a helpful assistant running locally. Answer briefly."}
QUESTION = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
OTHERS = ["Write a haiku about snow.", "What is 17 times 23?", "Explain photosynthesis.", "List the planets."]
GREEDY = SamplingParams(max_tokens=32, temperature=0.0)


# --- kernels ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fp16_packed", "int8", "int4"])
def test_packed_kernels_are_row_invariant(kind: str) -> None:
    """torch's int8/int4 kernels compute each row alone. fbgemm's packed fp16 kernel does on AVX-512 CPUs, but on
    AVX2-only ones (Zen 3) a row's result depends on the call's row count modulo 4: deterministic plans pad its calls
    to that multiple, which must make it row-invariant."""
    w = torch.randn(96, 128, generator=torch.Generator().manual_seed(1)) * 0.05
    kernel = {
        "fp16_packed": lambda: PackedFp16Linear(w),
        "int8": lambda: Int8Linear.quantize(w),
        "int4": lambda: Int4Linear.quantize(w),
    }[kind]()
    if kind == "fp16_packed":
        multiple = row_multiple(kernel, 128, torch.bfloat16)
        assert multiple is not None and is_row_invariant(PaddedRows(kernel, multiple), 128, torch.bfloat16)
    else:
        assert is_row_invariant(kernel, 128, torch.bfloat16)


class _Leaky:
    """A linear layer whose rows depend on the call: on the other rows, or on the row count modulo 4."""

    nbytes = 0

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.w = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.w.to(x.dtype))
        if self.mode == "neighbours":
            return y + x.mean(dim=0).sum() * 1e-2
        return y + (x.shape[0] % 4) * 1e-2


def test_the_check_catches_kernels_that_depend_on_the_call_and_pads_where_that_helps() -> None:
    assert not is_row_invariant(_Leaky("neighbours"), 16, torch.float32)
    assert row_multiple(_Leaky("neighbours"), 16, torch.float32) is None
    assert not is_row_invariant(_Leaky("tail"), 16, torch.float32)
    assert row_multiple(_Leaky("tail"), 16, torch.float32) == 4
    padded = PaddedRows(_Leaky("tail"), 4)
    x = torch.randn(3, 16)
    assert padded(x).shape == (3, 8) and torch.equal(padded(x)[1], padded(x[1:2])[0])


def test_fp32_dense_is_made_row_invariant() -> None:
    """The fp32 BLAS treats a partial block of rows differently; padding to whole blocks fixes it."""
    w = torch.randn(256, 192, generator=torch.Generator().manual_seed(2))
    multiple = row_multiple(DenseLinear(w), 192, torch.float32)
    assert multiple is not None
    assert is_row_invariant(PaddedRows(DenseLinear(w), multiple), 192, torch.float32)


# --- attention -------------------------------------------------------------------------------------------------
def test_attention_of_a_query_is_the_same_in_a_prefill_a_chunk_and_a_decode_batch() -> None:
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim, scale = 6, 2, 32, 32**-0.5

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    for length in (1, 70, 200):
        q, k, v = rand(length, heads, dim), rand(length, kv_heads, dim), rand(length, kv_heads, dim)
        pos = torch.arange(length)
        full = blocked_attention(q[None], k[None], v[None], pos[None], scale)[0]
        reference = F.scaled_dot_product_attention(
            *(t.float().transpose(0, 1)[None] for t in (q, k, v)), is_causal=True, scale=scale, enable_gqa=True
        )[0].transpose(0, 1)
        assert torch.allclose(full.float(), reference, atol=2e-2)
        for chunk in {1, 3, min(length, 65)}:  # a chunk after a prefix-cache hit
            part = blocked_attention(q[None, -chunk:], k[None], v[None], pos[None, -chunk:], scale)[0]
            assert torch.equal(part, full[-chunk:])
        for others in ((5,), (300, 9)):  # a decode beside shorter and longer sequences
            longest = max(length, *others)
            g = 1 + len(others)
            qs, ks, vs = rand(g, 1, heads, dim), rand(g, longest, kv_heads, dim), rand(g, longest, kv_heads, dim)
            qs[0, 0], ks[0, :length], vs[0, :length] = q[-1], k, v
            qpos = torch.tensor([[length - 1]] + [[n - 1] for n in others])
            assert torch.equal(blocked_attention(qs, ks, vs, qpos, scale)[0, 0], full[-1])


# --- the engine ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["bf16", "int8", "int4"])
def llm(request: pytest.FixtureRequest, shared_default_llm: Callable[..., LLM]) -> LLM:
    return shared_default_llm(request.param, deterministic=True)


def _greedy(llm: LLM, messages: list[dict[str, str]], others: list[str] | None = None) -> list[int]:
    return _greedy_output(llm, messages, others).token_ids


def _greedy_output(llm: LLM, messages: list[dict[str, str]], others: list[str] | None = None) -> Any:
    handles = [llm.engine.submit(messages, GREEDY)]
    handles += [llm.engine.submit([SYSTEM, {"role": "user", "content": o}], GREEDY) for o in others or []]
    while not all(h.done() for h in handles):
        llm.engine.step()
    return handles[0].result()


def test_greedy_repeats_after_a_prefix_cache_hit_and_inside_a_batch(llm: LLM) -> None:
    llm.engine.block_manager.reset_prefix_cache()
    first = _greedy(llm, QUESTION)  # nothing cached
    again = _greedy_output(llm, QUESTION)  # the full blocks are shared, the start of the one the reply filled copied
    assert again.token_ids == first
    assert again.metrics.num_cached_tokens == again.metrics.num_prompt_tokens - 1
    llm.engine.block_manager.reset_prefix_cache()
    _greedy(llm, [SYSTEM, {"role": "user", "content": "Name three rivers in Europe."}])  # caches the system prefix
    assert _greedy(llm, QUESTION) == first
    assert _greedy(llm, QUESTION, OTHERS) == first  # beside four other requests
    assert llm.engine.block_manager.num_prefix_hit_tokens > 0
