"""``hearth --self-test``: headless answer from the default model (engine/tools/self_test.py), on a fake LLM, through
the app's ``main`` and the engine's own entry."""

from __future__ import annotations

import os
import types
from typing import TYPE_CHECKING, Any

import pytest

import engine
from app.__main__ import main
from engine.tools import self_test

if TYPE_CHECKING:
    from typing import Self


class _FakeLLM:
    """Stands in for ``engine.LLM``: answers every chat with ``reply``, or fails to load."""

    reply = "The capital of France is Paris."
    fail: Exception | None = None

    def __init__(self, model: str, **kwargs: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.path = f"/models/{model}"
        self.sampling_defaults = {"temperature": 0.3, "top_p": 0.3, "repetition_penalty": 1.1}

    def chat(self, messages: list[dict[str, str]], params: Any) -> Any:
        assert messages == [{"role": "user", "content": "What is the capital of France?"}]
        # the model's own sampling settings, seeded: what the app's chat would answer
        assert (params.temperature, params.top_p, params.max_tokens) == (0.3, 0.3, self_test.MAX_TOKENS)
        assert params.seed == self_test.SEED
        return types.SimpleNamespace(text=f" {self.reply}\n")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture
def fake_llm(monkeypatch: pytest.MonkeyPatch) -> type[_FakeLLM]:
    fake = type("FakeLLM", (_FakeLLM,), {})
    monkeypatch.setattr(engine, "LLM", fake, raising=False)
    return fake


def test_self_test_prints_the_reply(fake_llm: type[_FakeLLM], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hearth", "--self-test", "What is the capital of France?"]) == 0
    out, err = capsys.readouterr()
    assert out == "The capital of France is Paris.\n"
    assert "self-test: loaded /models/default" in err


def test_self_test_fails_on_load_error(fake_llm: type[_FakeLLM], capsys: pytest.CaptureFixture[str]) -> None:
    fake_llm.fail = engine.ModelLoadError("no model")
    assert self_test.run_self_test("What is the capital of France?") == 1
    assert "self-test failed: ModelLoadError: no model" in capsys.readouterr().err


def test_self_test_fails_on_empty_reply(fake_llm: type[_FakeLLM], capsys: pytest.CaptureFixture[str]) -> None:
    fake_llm.reply = ""
    assert self_test.run_self_test("What is the capital of France?") == 1
    assert "reply was empty" in capsys.readouterr().err


def test_the_engines_entry_takes_the_launchers_arguments(fake_llm: type[_FakeLLM], tmp_path: Any,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", "")  # restored after the test: main sets it for the process
    assert self_test.main(["--data-dir", str(tmp_path), "--self-test", "What is the capital of France?"]) == 0
    assert capsys.readouterr().out == "The capital of France is Paris.\n"
    assert os.environ["HEARTH_DATA_DIR"] == str(tmp_path.resolve())


def test_self_test_waits_for_the_kernels_measured_after_the_answer(
    fake_llm: type[_FakeLLM], capsys: pytest.CaptureFixture[str]
) -> None:
    """A first load measures its kernels after the answer; the self-test waits for them before it closes the model, so
    a second self-test on the same data folder finds every plan cached."""
    joined: list[bool] = []
    fake_llm.tuning = types.SimpleNamespace(join=lambda: joined.append(True))  # type: ignore[attr-defined]
    assert self_test.run_self_test("What is the capital of France?") == 0
    assert joined == [True]
    assert "measured after the answer" in capsys.readouterr().err
