"""Sampler, sampling parameters and the incremental detokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.api import SamplingParams
from engine.core.detokenizer import IncrementalDetokenizer
from engine.model.sampler import Sampler, filtered_probs


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", 1e-300),  # NaN probabilities in multinomial, once
        ("repetition_penalty", float("inf")),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", float("nan")),
        ("stop", [""]),
        ("seed", -1),
        ("seed", 2**64),  # overflowed the generator's seed, once
        ("seed", True),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.1),
        ("logit_bias", {5: 101.0}),
        ("logit_bias", {-1: 1.0}),
        ("min_p", 1.5),
        ("n", 0),
        ("n", 9),
        ("top_logprobs", 21),
        ("json_schema", "not a schema"),
        ("repeat_last_n", -2),
        ("repeat_last_n", 1.5),
        ("repeat_last_n", True),
    ],
)
def test_invalid_sampling_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_tiny_temperatures_mean_greedy() -> None:
    """1e-40 used to divide the logits into inf and NaN; below the greedy threshold it is plain argmax."""
    assert SamplingParams(temperature=1e-40).is_greedy
    assert SamplingParams(temperature=0.0).is_greedy
    assert not SamplingParams(temperature=0.01).is_greedy
    logits = torch.randn(2, 100)
    tokens = Sampler().sample(logits, [SamplingParams(temperature=1e-40, seed=2**64 - 1)] * 2, ["a", "b"], [[], []])
    assert tokens.tokens == logits.argmax(dim=-1).tolist()


def test_the_largest_seed_samples() -> None:
    params = SamplingParams(temperature=0.9, seed=2**64 - 1)
    tokens = Sampler().sample(torch.randn(1, 100), [params], ["a"], [[]]).tokens
    assert 0 <= tokens[0] < 100


def test_seeded_sampling_is_reproducible_whatever_it_is_batched_with() -> None:
    logits = torch.randn(3, 100)
    params = [SamplingParams(temperature=0.8, seed=42), SamplingParams(temperature=1.0), SamplingParams()]
    a = [Sampler().sample(logits, params, ["x", "y", "z"], [[], [], []]).tokens[0] for _ in range(3)]
    b = Sampler().sample(logits[:1], params[:1], ["x"], [[]]).tokens[0]
    assert a == [b, b, b]


def test_top_k_one_is_greedy_and_top_p_keeps_the_nucleus() -> None:
    row = torch.tensor([1.0, 3.0, 2.0, 0.5])
    assert torch.equal(filtered_probs(row, 1.0, 1, 1.0) > 0, torch.tensor([False, True, False, False]))
    probs = filtered_probs(row, 1.0, 0, 0.7)
    assert probs[1] > 0 and probs[2] > 0 and probs[0] == 0 and probs[3] == 0
    assert float(probs.sum()) == pytest.approx(1.0)


def test_repetition_penalty_discourages_seen_tokens() -> None:
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    assert Sampler().sample(logits, [greedy], ["r"], [[0]]).tokens == [1]


WINDOW_ROW = [2.0, 1.0, -1.0, 0.5, 3.0]
WINDOW_HISTORY = [0, 2, 4, 4, 1]  # two prompt tokens, then the reply 4, 4, 1


@pytest.mark.parametrize(("last_n", "expected"), [
    # all five tokens: 0, 1, 2 and 4 penalised (/2 above 0, *2 below), then the reply's 4, 4, 1 lose
    # 0.25 * count + 0.5: 4 -> 3/2 - 1 = 0.5, 1 -> 1/2 - 0.75 = -0.25
    (None, [1.0, -0.25, -2.0, 0.5, 0.5]),
    (-1, [1.0, -0.25, -2.0, 0.5, 0.5]),
    (5, [1.0, -0.25, -2.0, 0.5, 0.5]),
    (100, [1.0, -0.25, -2.0, 0.5, 0.5]),
    (4, [2.0, -0.25, -2.0, 0.5, 0.5]),  # 2, 4, 4, 1: the first prompt token (0) is out of the window
    (3, [2.0, -0.25, -1.0, 0.5, 0.5]),  # 4, 4, 1: the reply alone
    (1, [2.0, -0.25, -1.0, 0.5, 3.0]),  # 1: one token of the reply, the 4s are out
    (0, WINDOW_ROW),  # off
])
def test_the_penalty_window_reads_only_the_last_tokens(last_n: int | None, expected: list[float]) -> None:
    """Repetition 2, frequency 0.25, presence 0.5 over the last ``repeat_last_n`` tokens, computed by hand."""
    from engine.model.sampler import adjusted_logits

    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5,
                            repeat_last_n=last_n)
    row = adjusted_logits(torch.tensor(WINDOW_ROW), params, WINDOW_HISTORY, 2)
    assert row.tolist() == pytest.approx(expected)
    # the sampler picks from the same row, and verifying a draft reads the same window
    token = int(torch.tensor(expected).argmax())
    assert Sampler().sample(torch.tensor([WINDOW_ROW]), [params], ["w"], [WINDOW_HISTORY], [2]).tokens == [token]
    assert Sampler().verify(torch.tensor([WINDOW_ROW]), params, "w", WINDOW_HISTORY, 2, []) == [token]


def test_a_zero_window_makes_penalised_greedy_plain_greedy() -> None:
    penalised = SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5)
    assert penalised.is_penalised and not penalised.is_plain_greedy
    off = SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, repeat_last_n=0)
    assert not off.is_penalised and off.is_plain_greedy
    assert SamplingParams(repeat_last_n=64).repeat_last_n == 64 and SamplingParams().repeat_last_n is None


def test_greedy_penalised_decoding_with_a_window_over_the_whole_history_is_unchanged(default_llm: Any) -> None:
    """A window at least as long as prompt and reply gives the tokens the whole-history penalty gives (Hugging Face's
    semantics); a short one reads less, and 0 decodes as no penalty."""
    prompt = "List the days of the week, then list them again, and again."
    max_tokens = 32
    num_prompt = len(default_llm.generate([prompt], SamplingParams(max_tokens=1))[0].prompt_token_ids)
    # the last token is drawn after prompt + max_tokens - 1 others: a window of that many reads everything
    windows: list[dict[str, Any]] = [{}, {"repeat_last_n": num_prompt + max_tokens - 1}, {"repeat_last_n": -1},
                                     {"repeat_last_n": 0}, {"repeat_last_n": 4}, {"repetition_penalty": 1.0}]
    handles = [default_llm.engine.submit(prompt, SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **{"repetition_penalty": 1.3, **w}))
        for w in windows]  # stepped together: greedy rows do not depend on their batch
    while not all(h.done() for h in handles):
        default_llm.engine.step()
    whole, everything, minus_one, off, short, plain = (list(h.result().token_ids) for h in handles)
    assert everything == whole and minus_one == whole
    assert whole != plain  # the penalty changes this reply: the comparison means something
    assert off == plain and short != whole


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def test_detokenizer_never_emits_broken_characters(tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = "Café 🍕 naïve — 東京 done"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add([t]) for t in ids] + [detok.finish()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_detokenizer_cuts_stop_strings_split_across_tokens(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer("alpha beta gamma delta", add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, stop=["gam"])
    out = "".join(detok.add([t]) for t in ids) + detok.finish()
    assert out == "alpha beta "
    assert detok.stopped


def test_presence_and_frequency_penalties_count_only_the_reply() -> None:
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    params = SamplingParams(temperature=0.0, frequency_penalty=0.2, presence_penalty=0.0)
    # token 0 is in the prompt only: no penalty, it still wins
    assert Sampler().sample(logits, [params], ["p"], [[0, 0]], [2]).tokens == [0]
    # generated once: 2.0 - 0.2 = 1.8 < 1.9
    assert Sampler().sample(logits, [params], ["p"], [[0, 0]], [1]).tokens == [1]
    presence = SamplingParams(temperature=0.0, presence_penalty=0.15)
    assert Sampler().sample(logits, [presence], ["p"], [[0]], [0]).tokens == [1]


def test_logit_bias_and_min_p() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0]])
    assert Sampler().sample(logits, [SamplingParams(temperature=0.0, logit_bias={2: 100.0})], ["b"], [[]]).tokens == [2]
    probs = filtered_probs(torch.tensor([3.0, 2.0, -3.0]), 1.0, 0, 1.0, min_p=0.1)
    assert probs[2] == 0 and probs[1] > 0


def test_logprobs_come_from_the_sampling_distribution_before_truncation() -> None:
    logits = torch.randn(1, 50)
    params = SamplingParams(temperature=0.5, top_k=2, logprobs=True, top_logprobs=5, seed=3)
    result = Sampler().sample(logits, [params], ["l"], [[]])
    lp = result.logprobs[0]
    assert lp is not None and lp.token_id == result.tokens[0] and len(lp.top) == 5
    expected = torch.log_softmax(logits[0] / 0.5, dim=-1)  # after temperature, before top-k
    assert lp.logprob == pytest.approx(float(expected[lp.token_id]), abs=1e-5)
    assert sum(float(torch.tensor(v).exp()) for _, v in lp.top) <= 1.0 + 1e-6


def test_a_failing_row_fails_alone() -> None:
    logits = torch.randn(3, 20)
    logits[1] = float("nan")
    params = [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=0.8), SamplingParams()]
    result = Sampler().sample(logits, params, ["a", "b", "c"], [[], [], []])
    assert set(result.errors) == {1} and "NaN" in result.errors[1]
    assert result.tokens[1] == -1 and all(0 <= result.tokens[i] < 20 for i in (0, 2))


def _packed(allowed: list[int], vocab: int) -> torch.Tensor:
    """A packed int32 bitmask (llguidance's layout: bit j of word i allows token 32 i + j)."""
    words = torch.zeros(-(-vocab // 32), dtype=torch.int64)
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_grammar_masks_apply_to_their_rows_only_and_a_dead_end_fails_alone(temperature: float) -> None:
    vocab = 70
    logits = torch.randn(3, vocab)
    masks = [_packed([5, 41, 69], vocab), None, _packed([], vocab)]
    params = [SamplingParams(temperature=temperature, seed=3)] * 3
    result = Sampler().sample(logits, params, ["a", "b", "c"], [[], [], []], masks=masks)
    assert result.tokens[0] in (5, 41, 69)
    if temperature == 0.0:
        assert result.tokens[0] == max((5, 41, 69), key=lambda t: float(logits[0, t]))
        assert result.tokens[1] == int(logits[1].argmax())
    assert 0 <= result.tokens[1] < vocab
    assert set(result.errors) == {2} and result.tokens[2] == -1
