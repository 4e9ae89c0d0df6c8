"""``python -m app.bench_reply``: one reply's speed in the real window against the engine alone, in one run.

It opens the main window (offscreen unless a display is set) on a temporary data folder, loads the default model
through the Model pane, and asks the same question ``--replies`` times through the chat pane, greedy, with the
Generation box's "Max tokens" set. Each reply's tok/s is the figure the chat shows under it (decode speed after
the first token, timed by the engine). A 10 ms timer on the GUI thread measures stalls: the longest gap between its
ticks beyond 10 ms, while replies stream.

Then the engine alone, in the same process: ``LLM`` at the level and "Repeatable replies" setting the app loaded,
stepped by hand, answers the same question as often. One JSON line compares the medians.

Like ``app/self_test.py`` it imports ``engine`` itself, for the engine-alone half.

This is a benchmark, not a test: the ratio is meaningful only from one run on a quiet machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

QUESTION = "Write a long story about a dragon who learns to bake bread. Use many paragraphs."
TICK_MS = 10


def _wait(app: Any, done: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not finish in time")
        app.processEvents()
        time.sleep(0.002)


def _app_replies(replies: int, max_tokens: int, repeatable: bool) -> tuple[list[float], float, Any]:
    """Each reply's tok/s in the window, the longest GUI stall in seconds, and the loaded model's info."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app import create_window

    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory() as data_dir:
        win = create_window(data_dir=data_dir)
        win.show()
        loaded: list[Any] = []
        win.bridge.signals.model_loaded.connect(loaded.append)
        win.model_pane.load_settings_form.set_repeatable(repeatable)
        win.model_pane.set_sampling_params({**win.model_pane.sampling_params(), "temperature": 0.0,
                                            "max_tokens": max_tokens})
        win.model_pane.load()
        _wait(app, lambda: bool(loaded), 300)
        win.model_pane.set_sampling_params({**win.model_pane.sampling_params(), "temperature": 0.0,
                                            "max_tokens": max_tokens})  # a model's own defaults replace them
        finished: list[Any] = []
        win.bridge.signals.request_finished.connect(lambda _rid, info: finished.append(info))
        ticks: list[float] = []
        timer = QTimer()
        timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
        rates: list[float] = []
        stall = 0.0
        for i in range(replies + 1):  # the first reply warms up and is not counted
            ticks.clear()
            timer.start(TICK_MS)
            win.chat_pane.send(QUESTION)
            _wait(app, lambda n=i + 1: len(finished) >= n, 600)
            timer.stop()
            if i:
                rates.append(float(finished[-1].metrics.get("tok_s") or 0.0))
                gaps = [b - a for a, b in itertools.pairwise(ticks)]
                stall = max([stall, *(g - TICK_MS / 1000 for g in gaps)])
        info = loaded[0]
        win.close()
        win.bridge.shutdown()
        app.processEvents()
    return rates, stall, info


def _engine_replies(replies: int, max_tokens: int, level: str, repeatable: bool) -> list[float]:
    from engine import LLM, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    rates = []
    with LLM("default", quantization=level or "auto", deterministic=repeatable, start_loop=False) as llm:
        messages = [{"role": "user", "content": QUESTION}]
        for i in range(replies + 1):
            out = llm.chat(messages, params)
            if i:
                rates.append(out.metrics.tok_s)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.bench_reply", description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeatable", choices=("on", "off"), default="on",
                        help="the app's 'Repeatable replies' setting (default: on, as in a fresh app)")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    repeatable = args.repeatable == "on"
    app_rates, stall_s, info = _app_replies(args.replies, args.max_tokens, repeatable)
    engine_rates = _engine_replies(args.replies, args.max_tokens, info.quantization, repeatable)
    app_tok_s, engine_tok_s = statistics.median(app_rates), statistics.median(engine_rates)
    print(json.dumps({
        "system": "app_reply", "level": info.quantization, "repeatable": repeatable, "max_tokens": args.max_tokens,
        "app_tok_s": [round(r, 2) for r in app_rates], "engine_tok_s": [round(r, 2) for r in engine_rates],
        "app_vs_engine": round(app_tok_s / engine_tok_s, 3) if engine_tok_s else None,
        "gui_max_stall_ms": round(stall_s * 1000, 1),
    }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
