"""Crafted model files end in a ModelLoadError within 5 s and under 1 GiB of memory growth, or load and answer.

A seeded generator (``tests/reliability/crafted_files.py`` and ``crafted_folders.py``) mutates a small valid GGUF
file (two layers of width 64, the default model's tokenizer cut to 512 tokens, F32/F16/Q8_0/Q4_0 tensors) and a
small safetensors folder with the same tokenizer: value types, counts, dimensions, layer and head counts, templates,
tokens, offsets, header bytes. Each mutant is
opened by ``LLM`` in this process, as the app opens a file the user picked. Nothing but ``ModelLoadError`` may come
out, and a mutant that loads must answer a short greedy request: a few of them (and every one whose tokenizer or
template was changed) are asked one.

``pytest --fuzz-mutants N`` (or ``HEARTH_FUZZ_MUTANTS``) sets how many mutants run (300 by default; two thirds
GGUF) and ``HEARTH_FUZZ_SEED`` the seed. A failing mutant is named by its test id (``gguf-0137``) and rebuilt from it alone.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import psutil
import pytest

from engine.api import ModelLoadError, SamplingParams
from tests.reliability.crafted_files import GgufFile, mutate_gguf, write_base_gguf
from tests.reliability.crafted_folders import SafetensorsFolder, mutate_folder, tiny_folder

DEFAULT_MUTANTS = 300
SEED = int(os.environ.get("HEARTH_FUZZ_SEED") or 20261201)
LOAD_LIMIT_S = 5.0
HANG_S = 60.0  # a mutant still running then is reported as hung (the thread cannot be stopped)
GROWTH_LIMIT = 2**30
#: Mutants that load and are asked a request, at least, per kind (others only load, which runs a warm-up step).
ASKED = 6
LLM_OPTIONS: dict[str, Any] = {"dtype": "float32", "quantization": "fp32", "start_loop": False,
                               "kv_cache_bytes": 2 << 20, "max_batch_size": 2}  # fmt: skip
FOLDER_CONFIG: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False,
}  # fmt: skip


class Bases:
    """The unmutated files and what the mutants have done so far."""

    def __init__(self, gguf: GgufFile, folder: SafetensorsFolder, root: Path) -> None:
        self.gguf, self.folder, self.root = gguf, folder, root
        self.asked = {"gguf": 0, "folder": 0}
        self.outcomes: dict[str, int] = {}


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bases]:
    """The base GGUF and folder, each loaded and asked once (so no mutant pays for the first imports)."""
    from engine.loading import native

    root = tmp_path_factory.mktemp("crafted")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEARTH_DATA_DIR", str(root / "data"))
        path = root / "base.gguf"
        write_base_gguf(path)
        gguf = GgufFile.parse(path.read_bytes())
        assert gguf.to_bytes() == path.read_bytes()  # the parts write back the same file
        folder = tiny_folder(FOLDER_CONFIG, native.gguf_side_folder(path))
        state = Bases(gguf, folder, root)
        for model in (path, folder.write(root / "base-folder")):
            outcome, detail = _open_and_ask(model, ask=True)
            assert outcome == "answered", detail
        gc.collect()
        gc.freeze()  # each LLM.close() collects garbage: only the mutants' own objects, not every module's
        try:
            yield state
        finally:
            gc.unfreeze()


def _open_and_ask(model: Path, ask: bool) -> tuple[str, str]:
    """Open ``model`` with ``LLM`` (and ask it a greedy chat request if ``ask``): ("refused", message),
    ("loaded", ""), ("answered", text) or ("escaped", what came out instead of a ModelLoadError)."""
    from engine import LLM

    try:
        llm = LLM(model, **LLM_OPTIONS)
    except ModelLoadError as exc:
        return "refused", str(exc)
    except BaseException as exc:  # noqa: BLE001 -- the finding this test exists for
        return "escaped", f"{type(exc).__name__}: {exc}"[:500]
    try:
        if not ask:
            return "loaded", ""
        greedy = SamplingParams(max_tokens=4, temperature=0.0)
        texts = [llm.generate("Hello there", greedy)[0]]
        try:
            texts.append(llm.chat([{"role": "user", "content": "Hi"}], greedy))
        except (ValueError, jinja2.TemplateError) as exc:  # a broken template refuses the chat request, in words
            assert str(exc), "a chat request was refused without a reason"
        for out in texts:
            if out.finish_reason not in ("stop", "length"):
                return "escaped", f"the request ended with {out.finish_reason}: {out}"[:500]
        return "answered", texts[0].text
    except BaseException as exc:  # noqa: BLE001
        return "escaped", f"a loaded mutant failed its request: {type(exc).__name__}: {exc}"[:500]
    finally:
        llm.close()


def _run_bounded(model: Path, ask: bool) -> tuple[str, str, float, int]:
    """:func:`_open_and_ask` on a thread: outcome, detail, seconds taken and the peak RSS growth seen meanwhile."""
    process = psutil.Process()
    before = process.memory_info().rss
    box: list[tuple[str, str]] = []
    thread = threading.Thread(target=lambda: box.append(_open_and_ask(model, ask)), daemon=True)
    start = time.monotonic()
    thread.start()
    peak = before
    while thread.is_alive() and time.monotonic() - start < HANG_S:
        thread.join(0.01)
        peak = max(peak, process.memory_info().rss)
    elapsed = time.monotonic() - start
    assert box, f"still running after {HANG_S:.0f} s"
    return *box[0], elapsed, peak - before


def _check(bases: Bases, kind: str, index: int, model: Path, done: list[str], interesting: bool) -> None:
    ask = interesting or bases.asked[kind] < ASKED
    outcome, detail, elapsed, growth = _run_bounded(model, ask)
    if outcome == "answered":
        bases.asked[kind] += 1
    bases.outcomes[outcome] = bases.outcomes.get(outcome, 0) + 1
    what = f"{kind} mutant {index} ({'; '.join(done)})"
    assert outcome != "escaped", f"{what}: {detail}"
    assert outcome != "refused" or len(detail.split()) >= 5, f"{what}: refused without words: {detail!r}"
    load_s = elapsed if outcome == "refused" or not ask else None
    if load_s is not None:
        assert load_s < LOAD_LIMIT_S, f"{what}: took {load_s:.1f} s ({outcome})"
    assert growth < GROWTH_LIMIT, f"{what}: memory grew by {growth / 2**20:.0f} MiB ({outcome})"


def mutant_counts(config: pytest.Config) -> tuple[int, int]:
    """(GGUF mutants, folder mutants) of this run: ``--fuzz-mutants``, else ``HEARTH_FUZZ_MUTANTS``, else 300."""
    total = config.getoption("fuzz_mutants") or int(os.environ.get("HEARTH_FUZZ_MUTANTS") or DEFAULT_MUTANTS)
    gguf = -(-total * 2 // 3)
    return gguf, total - gguf


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "index" in metafunc.fixturenames:
        gguf, folders = mutant_counts(metafunc.config)
        kind = "gguf" if "gguf" in metafunc.function.__name__ else "folder"
        metafunc.parametrize("index", range(gguf if kind == "gguf" else folders), ids=lambda i: f"{kind}-{i:04d}")


def test_a_crafted_gguf_is_refused_in_words_or_loads_and_answers(bases: Bases, index: int) -> None:
    rng = random.Random(f"{SEED}-gguf-{index}")
    mutant, done = mutate_gguf(rng, bases.gguf)
    folder = bases.root / f"gguf-{index}"
    folder.mkdir()
    path = folder / "model.gguf"
    path.write_bytes(mutant.to_bytes())
    interesting = any(word in " ".join(done) for word in ("token", "template"))
    try:
        _check(bases, "gguf", index, path, done, interesting)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(bases.root / "data" / "cache" / "gguf", ignore_errors=True)


def test_a_crafted_safetensors_folder_is_refused_in_words_or_loads_and_answers(bases: Bases, index: int) -> None:
    rng = random.Random(f"{SEED}-folder-{index}")
    mutant, done = mutate_folder(rng, bases.folder)
    folder = mutant.write(bases.root / f"folder-{index}")
    interesting = any(word in " ".join(done) for word in ("token", "template", "vocab"))
    try:
        _check(bases, "folder", index, folder, done, interesting)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
