"""``hearth --self-test PROMPT``: answer one prompt with the default model, search two documents with WordLlama
(the document index's offline embedder), and exit; no window, and no Qt.

It checks that an installed or bundled Hearth can load its default model and generate on a machine without a
display, the display libraries Qt's GUI needs (libEGL, libGL) or a network: ``packaging/smoke.sh`` runs it on the
PyInstaller bundle. It lives in the engine, not the app, so that the bundle's launcher runs it without importing the
``app`` package, whose import loads Qt. ``python -m engine.tools.self_test --self-test PROMPT`` runs it from a checkout.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

MAX_TOKENS = 32
SEED = 0
#: One chat of this many tokens: the KV cache the load recommendation estimates for one chat
#: (``engine/loading/recommend.py``), not the engine's default of every concurrent chat at the model's full context.
CONTEXT_TOKENS = 4096


class StageClock:
    """A load's ``progress(fraction, stage)`` callback that keeps how long each stage took ("convert 3/272" counts
    as "convert"; each shape tuned is a stage of its own), so a slow load says where its time went."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.stages: dict[str, float] = {}
        self._current: tuple[str, float] | None = None

    def __call__(self, fraction: float, stage: str) -> None:
        name = stage.split(" ")[0] if stage.split(" ")[-1].count("/") == 1 else stage
        if self._current is not None and self._current[0] == name:
            return
        self.stop()
        self._current = (name, time.monotonic())

    def stop(self) -> None:
        """End the stage running now."""
        if self._current is not None:
            name, since = self._current
            self.stages[name] = self.stages.get(name, 0.0) + time.monotonic() - since
            self._current = None

    def summary(self) -> str:
        """The stages in order with their seconds, those under 0.05 s left out: ``verify 0.2 s, warm up 1.1 s``."""
        shown = [f"{name} {seconds:.1f} s" for name, seconds in self.stages.items() if seconds >= 0.05]
        return ", ".join(shown) or "none over 0.05 s"


def run_self_test(prompt: str, *, max_tokens: int = MAX_TOKENS) -> int:
    """Load the default model, print its reply to ``prompt`` on stdout; return the exit code.

    The reply is sampled as the app's chat samples it: with the model's own sampling settings (its
    ``generation_config.json`` or Hearth's preset), seeded so a run repeats. Plain greedy decoding is not used: the
    default model's first token is a near tie that the kernels chosen on a given CPU may break either way.

    Timings and errors go to stderr, so stdout holds only the reply.

    Returns:
        0 when the model answered with some text, 1 when loading or generating failed or the reply
        was empty (the reason goes to stderr).
    """
    from engine import LLM, SamplingParams

    clock = StageClock()
    started = clock.started
    try:
        with LLM("default", start_loop=False, progress=clock, max_batch_size=1, max_model_len=CONTEXT_TOKENS) as llm:
            clock.stop()
            loaded = time.monotonic()
            load_facts = _load_facts(llm)
            options: dict[str, Any] = {**llm.sampling_defaults, "max_tokens": max_tokens, "seed": SEED}
            params = SamplingParams(**options)
            out = llm.chat([{"role": "user", "content": prompt}], params)
            answered = time.monotonic()
            tuning = getattr(llm, "tuning", None)
            if tuning is not None:  # the shapes this load left unmeasured: measured now, for the next load
                tuning.join()
            measured_s = time.monotonic() - answered
    except Exception as exc:  # noqa: BLE001 (any failure is the result, reported in one line)
        print(f"self-test failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    reply = out.text.strip()
    print(
        f"self-test: loaded {llm.path} in {loaded - started:.1f} s, answered in {answered - loaded:.1f} s; kernels "
        f"measured after the answer in {measured_s:.1f} s",
        file=sys.stderr,
    )
    print(f"self-test: load stages: {clock.summary()}", file=sys.stderr)
    print(f"self-test: {load_facts}", file=sys.stderr)
    print(reply, flush=True)
    if not reply:
        print("self-test failed: the model's reply was empty", file=sys.stderr)
        return 1
    try:
        print(f"self-test: {check_document_search()}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 (as above)
        print(f"self-test failed: document search: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


#: The self-test's documents: the question below names neither file's words, so only vectors find the right one.
_DOCUMENTS = {
    "bread.txt": "Knead the dough for ten minutes, let it rise until doubled, then bake the loaf in a hot oven.",
    "planets.txt": "Jupiter is the largest planet of the solar system; Saturn, with its rings, comes second.",
}
_QUERY = "Which world orbiting the sun is the biggest?"


def check_document_search() -> str:
    """Index two small text files with WordLlama, the document index's offline embedder, into a throwaway index and
    search them by vector alone; returns what happened in one line.

    The bundle must carry WordLlama's files: without them ``auto`` indexes with BM25 alone, which a user sees only
    as poorer search (``packaging/hearth.spec``, WORDLLAMA_FILES).

    Raises:
        ValueError: when WordLlama cannot load (its files are missing; the reason in words).
        RuntimeError: when the search does not find the right file first.
    """
    import tempfile

    from engine.docs import store
    from engine.docs.indexer import index_collection
    from engine.docs.search import search

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hearth-self-test-") as tmp:
        folder = Path(tmp, "files")
        folder.mkdir()
        for name, text in _DOCUMENTS.items():
            (folder / name).write_text(text, encoding="utf-8")
        conn = store.connect(Path(tmp, "index"))
        try:
            report = index_collection(conn, "self-test", [folder], "wordllama")
            hits = search(conn, "self-test", _QUERY, top_k=1, mode="vector")
        finally:
            conn.close()
    found = Path(hits[0].file).name if hits else "nothing"
    if report.embedder != "wordllama" or found != "planets.txt":
        raise RuntimeError(f"embedder {report.embedder} ({report.embedder_reason}) found {found} first, "
                           "not planets.txt")
    return (f"document search: embedder {report.embedder} ({report.embedder_reason}), {report.chunks} chunks, "
            f"found {found} in {time.monotonic() - started:.1f} s")


def _load_facts(llm: Any) -> str:
    """The KV cache's size and where this load's kernel plans came from: ``kernel plans: tuned 0 shapes, 7 from
    the cache, 0 provisional``. A second load on the same data folder tunes none, except provisional plans (timed
    too noisily to trust, ``engine/model/autotune.py``) that it measures again on a quiet machine."""
    runner = getattr(getattr(llm, "engine", None), "runner", None)
    if runner is None:
        return "kernel plans: unknown"
    plans = [choice.plan for choice in getattr(runner, "kernel_choices", [])]
    cached = sum(1 for plan in plans if plan.cached)
    untimed = sum(1 for plan in plans if plan.untimed)
    provisional = sum(1 for plan in plans if not plan.trusted)
    kv = getattr(getattr(runner, "kv", None), "nbytes", 0)
    return (f"KV cache {kv / 2**20:.0f} MiB ({CONTEXT_TOKENS} tokens, 1 chat); "
            f"kernel plans: tuned {len(plans) - cached - untimed} shapes, {cached} from the cache, {provisional} "
            f"provisional, {untimed} measured after the answer")


def main(argv: list[str]) -> int:
    """Parse the launcher's arguments (``--self-test PROMPT``, ``--data-dir``, ``--debug``; others ignored) and run
    the self-test; returns the exit code."""
    parser = argparse.ArgumentParser(prog="hearth", description="Answer one prompt with the default model and exit.")
    parser.add_argument("--self-test", metavar="PROMPT", required=True, help="the prompt to answer")
    parser.add_argument("--data-dir", help="where Hearth keeps its data (default: per-user data folder)")
    parser.add_argument("--debug", action="store_true", help="log debug messages")
    args, _ = parser.parse_known_args(argv)
    if args.data_dir:  # before the engine is imported: its model cache lives in the data dir too
        from engine.system.paths import DATA_DIR_ENV

        os.environ[DATA_DIR_ENV] = str(Path(args.data_dir).expanduser().resolve())
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)-7s %(message)s", datefmt="%H:%M:%S")
    return run_self_test(args.self_test)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
