"""The paths users take, against the engine stepped by hand: ``LLM.generate``'s loop thread, and Hearth's server.

``python -m engine.bench --paths`` prints, for each concurrency, three rows on the same prompts and sampling
(greedy, EOS ignored, so every stream writes ``max_tokens`` tokens):

* ``hearth_loop``: requests submitted to ``LLM(...)``, whose own thread loads the model and steps it (what
  ``LLM.generate``, scripts and the server go through), each token timed by its ``on_output`` callback;
* ``hearth``: then the engine stepped by hand in this thread (the figure the other rows are compared with);
* ``hearth_server``: ``python -m engine.serve`` in a subprocess on a free loopback port, one HTTP client thread per
  stream on ``/v1/completions`` (token ids in, ``ignore_eos``, streamed), each chunk timed as it arrives.

The summary line gives each path's tok/s as a ratio of the hand-stepped engine's in the same run.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from engine.api import SamplingParams, StepOutput
from engine.core.llm import LLM
from engine.tools.local_server import free_port, stop, wait_until_healthy
from engine.tools.timings import Timings, time_concurrent_streams

_READY_TIMEOUT_S = 300.0


def bench_loop(llm: LLM, prompts: list[list[int]], max_tokens: int) -> Timings:
    """Every prompt submitted at once to an engine stepped by its own loop thread; tokens timed on arrival."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    timings = Timings()
    handles = []
    start = time.perf_counter()
    for prompt in prompts:
        times: list[float] = []
        timings.starts.append(time.perf_counter())
        timings.token_times.append(times)

        def on_output(out: StepOutput, times: list[float] = times) -> None:
            now = time.perf_counter()
            times.extend([now] * len(out.new_token_ids))

        handles.append(llm.engine.submit(prompt, params, on_output=on_output))
    for handle in handles:
        handle.result()
    timings.wall_s = time.perf_counter() - start
    return timings


@contextmanager
def running_server(model: str, options: list[str]) -> Iterator[int]:
    """``python -m engine.serve`` on a free loopback port until the block ends; yields the port."""
    port = free_port()
    command = [sys.executable, "-m", "engine.serve", "--model", model, "--port", str(port), "--log-level",
               "warning", *options]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_healthy(process, port, _READY_TIMEOUT_S, lambda: _exit_output(process))
        yield port
    finally:
        stop(process, 20)
        if process.stderr is not None:
            process.stderr.close()


def _exit_output(process: subprocess.Popen[bytes]) -> str:
    """What an ended server wrote to stderr (nothing is read from one still running: that would block)."""
    if process.poll() is None or process.stderr is None:
        return ""
    return process.stderr.read().decode(errors="replace")


def _stream(port: int, prompt: list[int], max_tokens: int, times: list[float]) -> None:
    """One streamed completion; a timestamp per token (a chunk's tokens, counted from ``usage``, share one)."""
    body = json.dumps({"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"the server answered {response.status}: {response.read()[:300]!r}")
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage")
            if usage:  # the last chunks: tokens whose text came out together get this chunk's time
                times.extend([time.perf_counter()] * max(int(usage["completion_tokens"]) - len(times), 0))
            elif chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.perf_counter())
    finally:
        conn.close()


def bench_server(port: int, prompts: list[list[int]], max_tokens: int) -> Timings:
    """Every prompt at once, one client thread each."""
    return time_concurrent_streams(prompts, lambda prompt, times: _stream(port, prompt, max_tokens, times))


def main(model: str, precision: dict[str, Any], levels: list[int], max_tokens: int,
         prompt_for: Callable[[int], list[dict[str, str]]], hand: Callable[[LLM, int, int], Timings],
         emit: Callable[[dict[str, Any]], None]) -> None:
    """Rows for the three paths at each concurrency in ``levels``, then a summary of ratios."""
    batch = max(levels + [16])
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    # the loop-thread engine first: it loads and steps on its own thread, as in a script; then, once that thread
    # has ended, an engine stepped by hand on this one (torch work on two live threads slows both, see LLM)
    llm = LLM(model, max_batch_size=batch, **precision)
    prompts = [llm.engine.tokenize(prompt_for(i)) for i in range(max(levels))]
    level, dtype = llm.quantization, str(llm.dtype).removeprefix("torch.")
    for c in levels:
        bench_loop(llm, prompts[:c], 4)
        rows[("hearth_loop", c)] = bench_loop(llm, prompts[:c], max_tokens).row("hearth_loop", c)
        emit(rows[("hearth_loop", c)])
    llm.close()
    llm = LLM(model, start_loop=False, max_batch_size=batch, **precision)
    for c in levels:
        hand(llm, c, 4)  # warm this batch shape
        rows[("hearth", c)] = hand(llm, c, max_tokens).row("hearth", c)
        emit(rows[("hearth", c)])
    llm.close()
    options = ["--max-batch-size", str(batch)]
    options += ["--quantization", level] if "quantization" in precision else ["--dtype", precision["dtype"]]
    with running_server(model, options) as port:
        for c in levels:
            bench_server(port, prompts[:c], 4)
            rows[("hearth_server", c)] = bench_server(port, prompts[:c], max_tokens).row("hearth_server", c)
            emit(rows[("hearth_server", c)])
    summary: dict[str, Any] = {"system": "summary_paths", "level": level, "dtype": dtype}
    for c in levels:
        base = rows[("hearth", c)]["tok_s"]
        for name in ("hearth_loop", "hearth_server"):
            summary[f"{name}_vs_hand@{c}"] = round(rows[(name, c)]["tok_s"] / base, 3) if base else None
    emit(summary)
