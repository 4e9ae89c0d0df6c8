"""Speculative decoding: drafts, verification, rollback, the adaptive policy, and the output it must not change.

Greedy output with speculation must equal HF ``generate`` (the near-tie allowance of ``hf_reference.py``), and
sampled output must keep its distribution: chi-square tests over seeded draws, of the verifier alone and through
the engine with a draft model that disagrees with the target.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams
from engine.api import EngineConfig
from engine.architectures import ARCHITECTURES, TESTED_MODEL_TYPES
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.core.speculative import SpecPolicy, expected_tokens, ngram_draft
from engine.model.sampler import Sampler
from tests.engine.conftest import TOKENIZER_FILES, TinyLLM
from tests.engine.hf_reference import assert_matches_hf

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small tin of oil and a "
    "cloth. He polished the great lens until it gleamed, then lit the lamp and watched its beam sweep the water."
)
GROUNDED = [{"role": "user", "content": "Repeat this paragraph exactly:\n\n" + PARAGRAPH}]
OPEN = [{"role": "user", "content": "Write a haiku about the sea."}]


def chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square statistic exceeded with probability ~0.001 (Wilson-Hilferty; z = 3.09)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def chi2(observed: Counter[Any], expected: dict[Any, float], n: int) -> tuple[float, int]:
    """Pearson's statistic, with cells expected below 5 pooled into one."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for cell, p in expected.items():
        if n * p < 5:
            pooled_obs += observed.get(cell, 0)
            pooled_exp += n * p
            continue
        stat += (observed.get(cell, 0) - n * p) ** 2 / (n * p)
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    assert sum(observed.values()) == n and set(observed) <= set(expected), "a draw fell outside the support"
    return stat, cells - 1


# --- pieces ------------------------------------------------------------------------------------------------------
def test_ngram_draft_continues_the_latest_match() -> None:
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 3, 4, 6, 7]
    assert ngram_draft(tokens, 2) == [3, 4]  # the latest earlier "6 7" is followed by 3 4
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3], 3) == [9, 1, 2]  # the longest suffix (1 2 3) wins
    assert ngram_draft([1, 2, 3, 4], 4) == []
    assert ngram_draft([4, 5, 4, 5], 4) == [4, 5]  # stops at the context's end


def test_config_validation() -> None:
    assert EngineConfig(speculative={"draft_model": "/some/path"}).num_speculative_tokens == 4
    with pytest.raises(ValueError, match="speculative must be one of"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ValueError, match="draft_model"):
        EngineConfig(speculative={"model": "x"})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(num_speculative_tokens=0)


def test_serve_flag_takes_a_method_or_a_draft_model_path() -> None:
    from engine.serving.cli import _parser, speculative_option

    args = _parser().parse_args(["--speculative", "self-int4", "--num-speculative-tokens", "3"])
    assert speculative_option(args.speculative) == "self-int4" and args.num_speculative_tokens == 3
    assert speculative_option("/models/SmolLM2-135M") == {"draft_model": "/models/SmolLM2-135M"}
    assert _parser().parse_args([]).speculative == "off"


def test_policy_pauses_a_sequence_that_keeps_missing_then_probes_again() -> None:
    policy = SpecPolicy(k=4)
    seq = Sequence("r", [1, 2, 3, 4], SamplingParams())
    for _ in range(4):
        seq.token_ids.append(0)
        policy.record(seq, 4, 0)
    assert not policy.seq_enabled(seq)
    seq.token_ids.extend([0] * policy.first_backoff)
    assert policy.seq_enabled(seq)  # the pause ran out: try again
    policy.record(seq, 4, 0)
    policy.record(seq, 4, 0)
    assert not policy.seq_enabled(seq)
    assert policy._seqs["r"].backoff == 2 * policy.first_backoff  # failing again pauses longer
    seq.token_ids.extend([0] * 2 * policy.first_backoff)
    for _ in range(3):
        policy.record(seq, 4, 4)
    assert policy.seq_enabled(seq) and policy._seqs["r"].backoff == 0  # it pays again: back to normal


def test_batch_switch_follows_the_measured_step_cost() -> None:
    """Cheap extra tokens (memory-bound steps) favour drafting; expensive ones (compute-bound) do not."""
    policy = SpecPolicy(k=4)
    for tokens in (1, 8, 16, 32, 64) * 4:  # memory-bound: 10 ms a step plus 0.05 ms a token
        policy.cost.observe(tokens, 0.010 + 0.00005 * tokens)
    a, b = policy.cost.coefficients()
    assert a == pytest.approx(0.010, rel=1e-3) and b == pytest.approx(0.00005, rel=1e-3)
    assert policy.decide_batch([0.6] * 2, 0)
    assert policy.decide_batch([0.6] * 16, 0)
    for tokens in (1, 8, 16, 32, 64) * 40:  # compute-bound: every token costs as much as the whole overhead
        policy.cost.observe(tokens, 0.001 + 0.001 * tokens)
    assert not policy.decide_batch([0.6] * 16, 0)
    assert policy.decide_batch([0.9], 0)  # one stream with a good draft pays again
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0


def test_scheduler_reserves_a_draft_and_rolls_back_what_was_rejected() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=16)
    bm = BlockManager(16, 4)
    sched = Scheduler(config, bm)
    seq = Sequence("r", [1, 2, 3, 4, 5, 6], SamplingParams())
    sched.add(seq)
    batch = sched.schedule()
    sched.postprocess(batch)
    seq.token_ids.append(7)  # the first generated token; the sequence now decodes
    seq.draft_token_ids, seq.num_spec_wanted = [8, 9, 10, 11], 4
    batch = sched.schedule()
    assert batch.num_new_tokens == [5] and batch.num_draft_tokens == [4]
    assert len(seq.block_table) == 3  # room for 7 + the draft: 11 tokens
    sched.postprocess(batch)  # the draft is not computed until verified
    assert seq.num_computed_tokens == 7 and seq.num_hashed_blocks == 1
    seq.token_ids += [8, 99]  # one draft token accepted, then the target's own
    sched.accept_draft(seq, 1)
    assert seq.num_computed_tokens == 8 and seq.num_hashed_blocks == 2  # [5 6 7 8] published: all accepted
    assert len(seq.block_table) == 3 and bm.num_used_blocks == 3
    assert sum(b.hash is not None for b in bm.blocks) == 2
    seq.token_ids += [12, 13]
    seq.draft_token_ids, seq.num_spec_wanted = [14, 15], 2
    sched.schedule()
    sched.finish(seq)
    sched.running.remove(seq)
    assert bm.num_used_blocks == 0 and all(b.ref_count == 0 for b in bm.blocks[1:])


def _law_of_verify(logits: torch.Tensor, q: torch.Tensor, one_hot: bool, n: int) -> Counter[Any]:
    """What ``verify`` emits (up to two tokens) over ``n`` seeded draws, each with a fresh draft from ``q``."""
    sampler = Sampler()
    gen = torch.Generator().manual_seed(1)
    out: Counter[Any] = Counter()
    for i in range(n):
        draft = [int(torch.multinomial(row, 1, generator=gen)) for row in q]
        params = SamplingParams(temperature=0.8, top_k=4, seed=i)
        tokens = sampler.verify(logits, params, f"r{i}", [], 0, draft, None if one_hot else q)
        out[tuple(tokens[:2])] += 1
    return out


def _expected_law(p: list[torch.Tensor], q: torch.Tensor) -> dict[Any, float]:
    """The first token follows ``p[0]`` exactly; it is the accepted draft with probability ``min(p, q)``, and only
    then a second token follows, itself verified against ``p[1]``."""
    expected: dict[Any, float] = {}
    for a in range(len(p[0])):
        accepted = min(float(p[0][a]), float(q[0][a]))
        if float(p[0][a]) - accepted > 0:
            expected[(a,)] = float(p[0][a]) - accepted
        for b in range(len(p[1])):
            if accepted > 0 and float(p[1][b]) > 0:
                expected[(a, b)] = accepted * float(p[1][b])
    return expected


def test_verify_keeps_the_target_distribution() -> None:
    """Rejection sampling against one-hot (n-gram) and model drafts: what is emitted follows the target."""
    from engine.model.sampler import filtered_probs

    torch.manual_seed(0)
    vocab, n = 6, 4000
    logits = torch.randn(3, vocab) * 1.5
    p = [filtered_probs(row / 0.8, 1.0, 4, 1.0) for row in logits]
    one_hot = torch.zeros(2, vocab)
    one_hot[0, int(logits[0].argmax())] = one_hot[1, 3] = 1.0
    model_q = torch.softmax(torch.randn(2, vocab), dim=-1)
    for name, q in (("one-hot", one_hot), ("model", model_q)):
        observed = _law_of_verify(logits, q, name == "one-hot", n)
        stat, df = chi2(observed, _expected_law(p, q), n)
        assert stat < chi2_critical(df), f"{name} draft: chi-square {stat:.1f} over {df} df"


# --- through the engine ------------------------------------------------------------------------------------------
def _always_draft(llm: Any) -> None:
    """Turn the adaptive policy's switches off: every eligible decode drafts, whether or not it pays."""
    policy = llm.engine.speculator.policy
    policy.margin = policy.min_rate = 0.0


def _staggered(llm: Any, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Each request arrives while the others decode (and speculate), so drafts share steps with prefills."""
    handles = []
    for p in prompts:
        handles.append(llm.engine.submit(p, params))
        for _ in range(2):
            llm.engine.step()
    while not all(h.done() for h in handles):
        llm.engine.step()
    return [h.result().token_ids for h in handles]


@pytest.fixture(scope="module")
def ngram_llm(default_model_dir: Path) -> Any:
    llm = LLM("default", dtype="float32", start_loop=False, kv_cache_bytes=64 << 20, max_num_batched_tokens=64,
              speculative="ngram")
    yield llm
    llm.close()


def test_default_model_ngram_greedy_matches_hf(ngram_llm: Any, default_hf_model: Any) -> None:
    engine = ngram_llm.engine
    prompts = [engine.tokenize(GROUNDED), engine.tokenize(OPEN), engine.tokenize("def add(a, b):\n    return"),
               engine.tokenize([{"role": "user", "content": "Quote: " + PARAGRAPH[:120]}])]
    params = SamplingParams(max_tokens=40, temperature=0.0)
    outputs = _staggered(ngram_llm, prompts, params)
    verdicts = [assert_matches_hf(default_hf_model, p, out, 40) for p, out in zip(prompts, outputs, strict=True)]
    assert verdicts.count("exact") >= len(verdicts) - 1, verdicts
    m = ngram_llm.metrics()
    assert m.spec_acceptance_rate > 0.5 and m.spec_tokens_per_step > 2, m
    assert m.kv_blocks_used == 0


def test_no_blocks_leak_after_speculative_and_cancelled_requests(ngram_llm: Any) -> None:
    engine = ngram_llm.engine
    params = SamplingParams(max_tokens=60, temperature=0.7, seed=3)
    keep = [engine.submit(GROUNDED, params), engine.submit(OPEN, SamplingParams(max_tokens=30, temperature=0))]
    endless = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    drop = [engine.submit(GROUNDED, endless) for _ in range(3)]
    logprobs = engine.submit(GROUNDED, SamplingParams(max_tokens=20, temperature=0, logprobs=True))
    for step in range(24):
        engine.step()
        if step in (4, 12, 20):  # mid-prefill, then mid-speculation
            engine.cancel(drop[(step - 4) // 8].request_id)
    while not all(h.done() for h in [*keep, *drop, logprobs]):
        engine.step()
    assert [h.result().finish_reason for h in drop] == ["abort"] * 3
    out = logprobs.result()
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)  # it decoded plainly
    bm = engine.block_manager
    assert bm.num_used_blocks == 0 and all(b.ref_count == 0 for b in bm.blocks[1:])


def test_repeatable_replies_are_bitwise_the_same_with_speculation(shared_default_llm: Callable[..., Any]) -> None:
    """In deterministic mode (bf16, the app's default) a token scored inside a verification chunk has the bits it
    has in plain decoding, so speculation changes nothing in a greedy reply, not even a near tie."""
    paragraph = ("The lighthouse stood on the northern cliff for two hundred years. Every night its keeper climbed "
                 "the ninety steps, trimmed the wick and watched the ships pass between the rocks.")
    messages = [{"role": "user", "content": f"Repeat this paragraph exactly:\n\n{paragraph}"}]
    params = SamplingParams(max_tokens=48, temperature=0.0)
    plain = shared_default_llm("bf16", deterministic=True).chat(messages, params).token_ids
    with LLM("default", quantization="bf16", deterministic=True, speculative="ngram", start_loop=False,
             kv_cache_bytes=64 << 20) as llm:
        speculated = llm.chat(messages, params).token_ids
        accepted = llm.metrics().spec_acceptance_rate
    assert accepted > 0.5  # the drafts were used, not skipped
    assert speculated == plain


def test_default_model_self_int4_greedy_matches_hf(default_model_dir: Path, default_hf_model: Any) -> None:
    llm = LLM("default", dtype="float32", start_loop=False, kv_cache_bytes=32 << 20, speculative="self-int4",
              num_speculative_tokens=3)
    _always_draft(llm)  # an int4 draft may not pay on this machine; this is about the output
    try:
        prompts = [llm.engine.tokenize(GROUNDED), llm.engine.tokenize(OPEN)]
        outputs = _staggered(llm, prompts, SamplingParams(max_tokens=24, temperature=0.0))
        for p, out in zip(prompts, outputs, strict=True):
            assert_matches_hf(default_hf_model, p, out, 24)
        m = llm.metrics()
        assert m.spec_acceptance_rate > 0.3 and m.kv_blocks_used == 0, m
    finally:
        llm.close()


REPEATING = [5, 9, 14, 22, 5, 9, 14, 22, 5, 9, 14, 22, 31, 40]


@pytest.mark.parametrize("family", TESTED_MODEL_TYPES)
def test_tiny_models_greedy_unchanged_by_speculation(
    family: str, tiny_model_dirs: dict[str, Path], tiny_llm: TinyLLM
) -> None:
    from transformers import AutoModelForCausalLM

    folder = tiny_model_dirs[family]
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    # n-gram drafts need the reply to repeat its context, which a random model's rarely does; a model draft
    # (the int4 copy, or the model itself loaded again as a draft on the HF-module path) always drafts
    drafting: str | dict[str, str] = "self-int4" if ARCHITECTURES[family].path == "fused" else {"draft_model": str(folder)}
    for method in ("ngram", drafting):
        llm = tiny_llm(family, max_num_batched_tokens=32, speculative=method)
        _always_draft(llm)
        prompts = [REPEATING, llm.engine.tokenize("The capital of France is"), REPEATING[3:] * 2]
        outputs = _staggered(llm, prompts, SamplingParams(max_tokens=16, temperature=0.0))
        for p, out in zip(prompts, outputs, strict=True):
            assert_matches_hf(reference, p, out, 16)
        if method != "ngram":
            assert llm.engine.stats.num_spec_verifications > 0, f"{family}/{method} never speculated"
        assert llm.metrics().kv_blocks_used == 0


# --- a separate draft model -------------------------------------------------------------------------------------
def _small_model(folder: Path, tokenizer_dir: Path, seed: int, like: Path | None = None) -> Path:
    """A tiny llama with the default model's tokenizer files and an embedding for each of its tokens (a model whose
    tokenizer outruns its embedding is refused at load); with
    ``like``, that model's weights plus noise (a draft that agrees with it often, not always)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3, bos_token_id=1, eos_token_id=2,
        pad_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    if like is not None:
        model.load_state_dict(transformers.LlamaForCausalLM.from_pretrained(like).state_dict())
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.05 * param.std())
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("draft-pair")
    target = _small_model(root / "target", default_model_dir, 0)
    return target, _small_model(root / "draft", default_model_dir, 1, like=target)


def test_draft_model_with_another_tokenizer_is_refused(small_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = small_pair
    other = tmp_path / "other"
    shutil.copytree(draft, other)
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="tokenizer"):
        LLM(target, dtype="float32", start_loop=False, kv_cache_bytes=4 << 20, speculative={"draft_model": str(other)})


def test_draft_model_keeps_greedy_and_sampled_output(small_pair: tuple[Path, Path]) -> None:
    """The draft (another random model) often disagrees, so both acceptance and the residual are exercised.

    Sampled: the joint law of three tokens (the first from the prefill, the next two through verification) under
    top-k 2 equals the one computed from the target model alone.
    """
    from transformers import AutoModelForCausalLM

    target, draft = small_pair
    reference = AutoModelForCausalLM.from_pretrained(target, dtype="float32").eval()
    prompt = [5, 17, 33, 8, 21]
    llm = LLM(target, dtype="float32", start_loop=False, kv_cache_bytes=8 << 20, max_batch_size=128, max_waiting=4096,
              speculative={"draft_model": str(draft)}, num_speculative_tokens=2)
    try:
        greedy = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0))[0]
        assert_matches_hf(reference, prompt, greedy.token_ids, 12)
        _always_draft(llm)  # this is about the law, not whether drafting pays
        n = 1200
        params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=2, seed=i, ignore_eos=True) for i in range(n)]
        handles = [llm.engine.submit(prompt, p) for p in params]
        while not all(h.done() for h in handles):
            llm.engine.step()
        observed = Counter(tuple(h.result().token_ids) for h in handles)
        assert llm.engine.stats.num_spec_verifications >= n // 2
        assert 0.05 < llm.metrics().spec_acceptance_rate < 0.95  # both paths taken
        assert llm.metrics().kv_blocks_used == 0
    finally:
        llm.close()
    expected = _reference_law(reference, prompt, 3, top_k=2)
    stat, df = chi2(observed, expected, n)
    assert stat < chi2_critical(df), f"chi-square {stat:.1f} over {df} df"


@torch.no_grad()
def _reference_law(model: Any, prompt: list[int], length: int, top_k: int) -> dict[Any, float]:
    """The exact law of ``length`` tokens sampled at temperature 1 with top-k from ``model``."""
    from engine.model.sampler import filtered_probs

    law: dict[Any, float] = {(): 1.0}
    for _ in range(length):
        nxt: dict[Any, float] = {}
        for prefix, mass in law.items():
            logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1].float()
            probs = filtered_probs(logits, 1.0, top_k, 1.0)
            for t in torch.nonzero(probs).flatten().tolist():
                nxt[(*prefix, t)] = mass * float(probs[t])
        law = nxt
    return law
