"""The default model's first answer: at the sampling defaults the app starts it with, it names Paris.

Counts seeded samples of "What is the capital of France?" through the real engine (the default model, bf16),
all 20 submitted together as the app would batch them. The defaults are ``sampling_defaults("default")``:
``engine/loading/default_model.py`` records how they were measured.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.loading.default_model import SAMPLING_PRESETS, sampling_defaults

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
NUM_SEEDS = 20
MIN_CORRECT = 19


@pytest.fixture(scope="module")
def llm():
    with LLM("default", quantization="bf16", max_batch_size=NUM_SEEDS, start_loop=False) as model:
        yield model


def test_the_default_model_uses_its_preset() -> None:
    defaults = sampling_defaults("default")
    assert defaults == SAMPLING_PRESETS["smollm2-135m"]
    SamplingParams(**defaults)  # valid as they stand


@pytest.mark.slow
def test_the_first_answer_is_right_in_19_of_20_seeds(llm: LLM) -> None:
    assert llm.sampling_defaults == sampling_defaults("default")
    params = [SamplingParams(max_tokens=16, seed=seed, **llm.sampling_defaults) for seed in range(NUM_SEEDS)]
    handles = [llm.engine.submit(QUESTION, p) for p in params]
    while not all(h.done() for h in handles):
        llm.engine.step()
    answers = [h.result().text for h in handles]
    wrong = [a for a in answers if "paris" not in a.lower()]
    assert len(answers) - len(wrong) >= MIN_CORRECT, wrong
