"""A closed model's memory goes back to the system: unloading, and switching between models again and again.

Each measurement runs in a fresh process, so that its resident size is the engine's alone. The two models are tiny
in depth but wide (about 220 MB each in fp32), so that a model left behind, or a heap that keeps its pages, shows
well past the 150 MB the checks allow.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: What a user may see left over after unloading, or after ten switches against one.
SLACK_MB = 150

_SCRIPT = r"""
import json, sys
import psutil
from engine import LLM, SamplingParams

process = psutil.Process()
def rss_mb():
    return process.memory_info().rss / 2**20

params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
def use(path):
    llm = LLM(path, dtype="float32", kv_cache_bytes=16 << 20)
    llm.generate(["Tell me about the sea."], params)
    return llm

no_model = rss_mb()
llm = use(sys.argv[1])
loaded = rss_mb()
llm.close()
del llm
unloaded = rss_mb()
after_switch = []
llm = use(sys.argv[1])
for i in range(10):
    llm.close()
    llm = use(sys.argv[2 - i % 2])
    after_switch.append(rss_mb())
llm.close()
print(json.dumps({"no_model": no_model, "loaded": loaded, "unloaded": unloaded, "switches": after_switch}))
"""


def _wide_model(family: str, folder: Path, tokenizer_dir: Path) -> Path:
    import shutil

    import torch
    import transformers

    from tests.engine.conftest import TOKENIZER_FILES

    config = transformers.AutoConfig.for_model(
        family, vocab_size=49152, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
        pad_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


@pytest.mark.slow
def test_unloading_and_switching_give_the_memory_back(tmp_path: Path, default_model_dir: Path) -> None:
    first = _wide_model("llama", tmp_path / "llama", default_model_dir)
    second = _wide_model("qwen2", tmp_path / "qwen2", default_model_dir)
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(first), str(second)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    mb = json.loads(done.stdout.strip().splitlines()[-1])
    assert mb["loaded"] - mb["no_model"] > SLACK_MB + 50, mb  # large enough that a model left behind would show
    assert mb["unloaded"] - mb["no_model"] < SLACK_MB, mb
    assert mb["switches"][-1] - mb["switches"][0] < SLACK_MB, mb
