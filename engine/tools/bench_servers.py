"""Server against server: Hearth's ``python -m engine.serve`` and llama.cpp's ``llama-server`` on the same prompts.

``python -m engine.bench --server`` (implied by ``--llama-server``) starts our server in a subprocess on the
bench's model and level and times it over HTTP as a user's client sees it: decode streams on ``/v1/completions``
(token ids in, greedy, EOS ignored, streamed) and, with ``--prefill N``, one fresh N-token prompt answered with one
token (no prefix reuse). llama.cpp's server gets the same token ids on its ``/completion``, once in each weight
layout it offers (its default, which repacks Q4_0, Q4_K and IQ4_NL for the CPU's SIMD, and ``--no-repack``), each
alternating round by round with ours, so that a drift in the machine's speed falls on both sides of that layout's
ratio. The rows are those of the layout against which our ratio is lower (llama.cpp's better layout, judged on
rounds run side by side with ours), each the median round; every layout's pair of medians goes beside them.
"""

from __future__ import annotations

import http.client
import json
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.tools import bench_paths, llama_server
from engine.tools.bench_cuda_graphs import median_row

Emit = Callable[[dict[str, Any]], None]

#: llama.cpp's two weight layouts: its default (repacked where it has a repack) and ``--no-repack``
LAYOUTS = {"repacked": False, "no_repack": True}


@contextmanager
def hearth_server(model: str, precision: dict[str, Any], batch: int, device: str, threads: int) -> Iterator[int]:
    """``python -m engine.serve`` on ``model`` at the bench's precision and threads until the block ends; yields its
    port."""
    options = ["--max-batch-size", str(batch), "--device", device, "--threads", str(threads)]
    if "quantization" in precision:
        options += ["--quantization", str(precision["quantization"])]
    else:
        options += ["--dtype", str(precision["dtype"])]
    with bench_paths.running_server(model, options) as port:
        yield port


def hearth_prefill_seconds(port: int, prompt: list[int]) -> float:
    """Wall time of one ``/v1/completions`` request that reads ``prompt`` and answers one token."""
    body = json.dumps({"model": "default", "prompt": prompt, "max_tokens": 1, "temperature": 0.0})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read()
        if response.status != 200:
            raise RuntimeError(f"the server answered {response.status}: {text[:300]!r}")
    finally:
        conn.close()
    return time.perf_counter() - start


def bench_decode(port: int, prompts: list[list[int]], levels: list[int], max_tokens: int, repeats: int,
                 emit: Emit, llama: tuple[Path, Path, int] | None = None) -> dict[tuple[str, int], Any]:
    """Rows ``hearth`` (and ``llama_server``, given ``(binary, gguf, threads)``) at each concurrency."""
    rows: dict[tuple[str, int], Any] = {}
    for c in levels:
        batch = [prompts[i % len(prompts)] for i in range(c)]
        bench_paths.bench_server(port, batch, 4)  # warm this batch shape
        ours: dict[str, list[dict[str, Any]]] = {}
        theirs: dict[str, list[dict[str, Any]]] = {}
        died: dict[str, str] = {}
        for layout, no_repack in (LAYOUTS.items() if llama else [("", False)]):
            if llama is None:
                ours[layout] = [bench_paths.bench_server(port, batch, max_tokens).row("hearth", c) for _ in range(repeats)]
                continue
            binary, gguf, threads = llama
            try:
                with llama_server.serving(binary, gguf, prompts, c, max_tokens, threads, no_repack) as run:
                    # warmed again once llama.cpp has loaded: its load reads its whole file, which can push our
                    # weights' pages out of the page cache, and its own warm-up ran after that load too
                    bench_paths.bench_server(port, batch, 4)
                    for _ in range(repeats):
                        ours.setdefault(layout, []).append(bench_paths.bench_server(port, batch, max_tokens).row("hearth", c))
                        theirs.setdefault(layout, []).append(run().row("llama_server", c))
            except llama_server.ServerDied as exc:
                died[layout] = str(exc)
        if llama is None:
            rows[("hearth", c)] = mine = median_row(ours[""])
            mine.update(path="server", rounds_tok_s=[r["tok_s"] for r in ours[""]])
            emit(mine)
            continue
        if not theirs:
            raise SystemExit(f"llama-server died in both layouts at {c} streams: {died}")
        pairs = {layout: (median_row(ours[layout]), median_row(theirs[layout])) for layout in theirs}
        ratios = {layout: m["tok_s"] / t["tok_s"] for layout, (m, t) in pairs.items()}
        layout = min(ratios, key=lambda name: ratios[name])  # llama.cpp's better layout: our lower ratio
        mine, row = pairs[layout]
        mine.update(path="server", rounds_tok_s=[r["tok_s"] for r in ours[layout]])
        row.update(gguf=llama[1].name, layout=layout, rounds_tok_s=[r["tok_s"] for r in theirs[layout]],
                   layouts={name: {"hearth_tok_s": m["tok_s"], "llama_server_tok_s": t["tok_s"],
                                   "ratio": round(ratios[name], 2)} for name, (m, t) in pairs.items()})
        if died:
            row["died"] = died
        rows[("hearth", c)], rows[("llama_server", c)] = mine, row
        emit(mine)
        emit(row)
    return rows


def bench_prefill(port: int, n: int, vocab: int, repeats: int, emit: Emit,
                  llama: tuple[Path, Path, int] | None = None) -> dict[str, Any]:
    """Prompt tokens per second on fresh ``n``-token prompts, ours and (given ``(binary, gguf, threads)``) llama.cpp's
    in each layout, in alternating rounds; the median round of each, llama.cpp's better layout in the ratio."""
    rounds = max(1, repeats)
    rng = random.Random(0)

    def fresh() -> list[int]:
        return [rng.randrange(1000, vocab) for _ in range(n)]

    hearth_prefill_seconds(port, fresh()[:64])  # warm
    mine: dict[str, list[float]] = {}
    theirs: dict[str, list[float]] = {}
    died: dict[str, str] = {}
    for layout, no_repack in (LAYOUTS.items() if llama else [("", False)]):
        if llama is None:
            mine[layout] = [n / hearth_prefill_seconds(port, fresh()) for _ in range(rounds)]
            continue
        binary, gguf, threads = llama
        try:
            with llama_server.running_server(binary, gguf, 1, threads, -(-(n + 64) // 256) * 256, no_repack) as server:
                llama_server.prefill_seconds(server, fresh()[:64])  # warm
                hearth_prefill_seconds(port, fresh()[:64])  # and ours again, after llama.cpp's load
                for _ in range(rounds):
                    mine.setdefault(layout, []).append(n / hearth_prefill_seconds(port, fresh()))
                    theirs.setdefault(layout, []).append(n / llama_server.prefill_seconds(server, fresh()))
        except llama_server.ServerDied as exc:
            died[layout] = str(exc)
    if llama is not None and not theirs:
        raise SystemExit(f"llama-server died in both layouts reading a {n}-token prompt: {died}")
    ratios = {layout: _median(mine[layout]) / _median(theirs[layout]) for layout in theirs}
    layout = min(ratios, key=lambda name: ratios[name]) if ratios else ""  # llama.cpp's better layout
    ours = mine.get(layout, [])
    row: dict[str, Any] = {"system": "prefill", "path": "server", "prompt_tokens": n,
                           "hearth_tok_s": round(_median(ours), 1), "hearth_rounds": [round(v, 1) for v in ours]}
    if died:
        row["died"] = died
    if theirs:
        row.update(llama_server_tok_s=round(_median(theirs[layout]), 1), llama_server_layout=layout,
                   llama_server_rounds=[round(v, 1) for v in theirs[layout]], ratio=round(ratios[layout], 2),
                   layouts={name: {"hearth_tok_s": round(_median(mine[name]), 1),
                                   "llama_server_tok_s": round(_median(theirs[name]), 1),
                                   "ratio": round(ratios[name], 2)} for name in theirs})
    emit(row)
    return row


def _median(values: list[float]) -> float:
    """The lower middle value (the median of an odd count)."""
    return sorted(values)[(len(values) - 1) // 2]
