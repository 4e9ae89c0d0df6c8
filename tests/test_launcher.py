"""The bundle's entry script (packaging/launcher.py) on a machine without Qt's display libraries: the self-test runs
without importing Qt at all, and the window's start names the missing library and its package instead of a
traceback. Each runs the real script in a fresh interpreter, with an import hook standing in for the missing
system library (PySide6's GUI module then fails to import exactly as it does there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Self

import pytest

LAUNCHER = Path(__file__).resolve().parent.parent / "packaging" / "launcher.py"

# Makes ``import PySide6...`` fail as on a minimal Debian without libEGL (the GUI modules' shared objects link it), records every PySide6 import attempted, and
# runs the launcher as the bundle does (``__main__``), with ``sys.argv`` from the command line.
_RUN = """
import importlib.abc, runpy, sys
tried = []
class NoDisplayLibs(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("PySide6", "shiboken6"):
            tried.append(name)
            if {block_all} or name in ("PySide6.QtGui", "PySide6.QtWidgets"):
                raise ImportError("libEGL.so.1: cannot open shared object file: No such file or directory")
        return None
sys.meta_path.insert(0, NoDisplayLibs())
{setup}
try:
    runpy.run_path({launcher!r}, run_name="__main__")
finally:
    print("PySide6 imports tried:", tried, file=sys.stderr)
"""

# The engine's LLM, replaced by one that answers at once: what is tested is the route, not the model.
_FAKE_LLM = """
import types, engine
class FakeLLM:
    path = "/models/default"
    sampling_defaults = {}
    def __init__(self, model, **kw): pass
    def chat(self, messages, params): return types.SimpleNamespace(text="Paris.")
    def __enter__(self): return self
    def __exit__(self, *exc): pass
engine.LLM = FakeLLM
"""


def _launch(*args: str, block_all: bool, setup: str = "") -> subprocess.CompletedProcess[str]:
    code = _RUN.format(block_all=block_all, setup=setup, launcher=str(LAUNCHER))
    return subprocess.run([sys.executable, "-c", code, *args], check=False, capture_output=True, text=True,
                          timeout=120)


def test_the_self_test_imports_no_qt(tmp_path: Path) -> None:
    done = _launch("--data-dir", str(tmp_path), "--self-test", "What is the capital of France?", block_all=True,
                   setup=_FAKE_LLM)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Paris.\n"
    assert "PySide6 imports tried: []" in done.stderr


def test_a_missing_display_library_is_named_with_its_package() -> None:
    done = _launch(block_all=False)
    assert done.returncode == 1, done.stderr
    assert "lacks the system library libEGL.so.1" in done.stderr
    assert "sudo apt install libegl1" in done.stderr
    assert "Traceback" not in done.stderr


def test_other_import_errors_are_not_hidden() -> None:
    sys.path.insert(0, str(LAUNCHER.parent))
    try:
        import launcher
    finally:
        sys.path.remove(str(LAUNCHER.parent))
    assert launcher.missing_library_message(ImportError("No module named 'markdown_it'")) is None
    assert launcher.missing_library_message(
        ImportError("libxkbcommon.so.0: cannot open shared object file: No such file or directory")
    ) is not None


def test_the_self_test_sizes_its_kv_cache_as_the_load_estimate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One chat of the recommendation's context, not the engine's default of every concurrent chat at the model's
    full context (which reserved 5.7 GiB for the default model where the load advice said 0.18 GiB)."""
    import types

    import engine
    from engine.loading.recommend import recommend
    from engine.tools import self_test

    seen: dict[str, object] = {}

    class RecordingLLM:
        path = "/models/default"

        def __init__(self, model: str, **kwargs: object) -> None:
            self.sampling_defaults: dict[str, object] = {}
            seen.update(kwargs, model=model)

        def chat(self, messages: object, params: object) -> types.SimpleNamespace:
            return types.SimpleNamespace(text="Paris.")

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(engine, "LLM", RecordingLLM, raising=False)
    assert self_test.run_self_test("What is the capital of France?") == 0
    config = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
              "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
              "max_position_embeddings": 8192, "tie_word_embeddings": True}  # the default model's
    estimate = recommend(config, device="cpu")
    assert (seen["max_batch_size"], seen["max_model_len"]) == (1, estimate.context_length)
    blocks = estimate.context_length // 16 + 1  # the context's 16-token blocks and the engine's null block
    assert estimate.kv_budget_bytes == blocks * 16 * estimate.kv_bytes_per_token
    assert estimate.kv_budget_bytes / 2**30 < 0.2
    err = capsys.readouterr().err
    assert "self-test: load stages:" in err
