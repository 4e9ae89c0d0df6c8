"""``hearth --self-test PROMPT``: answer one prompt with the default model and exit, no window.

It checks that an installed or bundled Hearth can load its default model and generate, e.g. on a
machine without a display or network (``packaging/smoke.sh`` runs it on the PyInstaller bundle).
It talks to ``engine`` directly instead of through ``app.bridge.engine_bridge``, which needs a Qt event
loop; that makes it the second ``app`` module importing ``engine``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

MAX_TOKENS = 32
SEED = 0


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

    started = time.monotonic()
    try:
        with LLM("default", start_loop=False) as llm:
            loaded = time.monotonic()
            options: dict[str, Any] = {**llm.sampling_defaults, "max_tokens": max_tokens, "seed": SEED}
            params = SamplingParams(**options)
            out = llm.chat([{"role": "user", "content": prompt}], params)
    except Exception as exc:  # noqa: BLE001 (any failure is the result, reported in one line)
        print(f"self-test failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    reply = out.text.strip()
    print(
        f"self-test: loaded {llm.path} in {loaded - started:.1f} s, answered in {time.monotonic() - loaded:.1f} s",
        file=sys.stderr,
    )
    print(reply, flush=True)
    if not reply:
        print("self-test failed: the model's reply was empty", file=sys.stderr)
        return 1
    return 0
