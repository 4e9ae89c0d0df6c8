"""Engine fixtures: the default model in fp32 with its HF twin, and tiny random models of several families.

``tiny_llm(model, **options)`` makes engines on the tiny models with the options most tests want (fp32, stepped by
the test, a small KV cache) and closes them at teardown.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.architectures import ARCHITECTURES, TESTED_MODEL_TYPES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_tiny_model(family: str, folder: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Save a random-weight model of ``family`` (a model type) with the default model's tokenizer."""
    import transformers

    config = transformers.AutoConfig.for_model(
        family,
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.15,  # wide logits: fewer near-ties between the top two tokens
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        **(ARCHITECTURES[family].tiny or {}),  # the fields the registry sets for this type
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {f: build_tiny_model(f, root / f, default_model_dir) for f in TESTED_MODEL_TYPES}


#: The type of the ``tiny_llm`` fixture: ``tiny_llm(model="llama", **options) -> LLM``.
TinyLLM = Callable[..., Any]
#: What ``tiny_llm`` passes to ``LLM`` unless the test says otherwise.
TINY_LLM_OPTIONS: dict[str, Any] = {"dtype": "float32", "start_loop": False, "kv_cache_bytes": 8 << 20}


@pytest.fixture
def tiny_llm(tiny_model_dirs: dict[str, Path]) -> Iterator[TinyLLM]:
    """``tiny_llm(model="llama", **options)``: an ``LLM`` on a tiny model, named by its family in
    ``tiny_model_dirs`` or given as a folder, with ``TINY_LLM_OPTIONS`` under ``options``; closed at teardown."""
    from engine import LLM

    made: list[Any] = []

    def make(model: str | Path = "llama", **options: Any) -> Any:
        folder = tiny_model_dirs[model] if isinstance(model, str) and model in tiny_model_dirs else model
        made.append(LLM(folder, **{**TINY_LLM_OPTIONS, **options}))
        return made[-1]

    yield make
    for llm in made:
        llm.close()


@pytest.fixture(scope="session")
def default_llm(shared_default_llm: Callable[..., Any]) -> Any:
    """The default model in fp32, stepped by the test itself (no loop thread), shared by the session."""
    return shared_default_llm("fp32", kv_cache_bytes=256 << 20, max_num_batched_tokens=256)


@pytest.fixture(scope="session")
def default_hf_model(default_model_dir: Path) -> Any:
    """An independent HF copy of the default model in fp32: the reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    return model.eval()
