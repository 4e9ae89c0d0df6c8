"""The engine stays Qt-free, and the pinned libraries are the ones installed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path


def test_engine_never_imports_qt(repo_root: Path) -> None:
    code = (
        "import sys, engine, engine.core.llm, engine.tools.bench, engine.loading.loader, engine.system.hardware\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('PySide6', 'shiboken6', 'app')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=repo_root, check=True, timeout=120)


def _pins(repo_root: Path) -> dict[str, str]:
    deps = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["dependencies"]
    return {d.split("==")[0].strip().lower(): d.split("==")[1].split(";")[0].strip() for d in deps if "==" in d}


def test_exact_pins_match_what_is_installed(repo_root: Path) -> None:
    pins = _pins(repo_root)
    assert "transformers" in pins
    for name, version in pins.items():
        installed = metadata.version(name)
        assert installed == version, (
            f"{name} {installed} is installed but pyproject.toml pins {version}; the engine reaches into "
            f"{name}'s internals, so run `make install` or update the pin and the code together"
        )


def test_transformers_apis_the_engine_reaches_into_still_exist() -> None:
    import inspect

    import transformers
    from transformers import AttentionInterface, GgufConfig
    from transformers.modeling_gguf_pytorch_utils import tqdm  # noqa: F401 - patched for load progress
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.models.llama import modeling_llama

    assert callable(AttentionInterface.register)
    assert "dequantize" in inspect.signature(GgufConfig).parameters
    assert "llama" in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    rotary = modeling_llama.LlamaRotaryEmbedding(transformers.LlamaConfig(hidden_size=64, num_attention_heads=4))
    assert list(inspect.signature(rotary.forward).parameters)[:2] == ["x", "position_ids"]
    assert hasattr(transformers.PreTrainedModel, "set_attn_implementation")
