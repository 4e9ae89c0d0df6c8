"""``python -m engine.bench --cuda-graphs``: our engine with its CUDA graphs and without, in alternating rounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.core.llm import LLM
from engine.tools.timings import Timings


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median tok/s (the lower middle one of an even count)."""
    return dict(sorted(rows, key=lambda r: r["tok_s"])[(len(rows) - 1) // 2])


def bench_cuda_graphs(
    llm: LLM, levels: list[int], max_tokens: int, repeats: int, bench_engine: Callable[[LLM, int, int], Timings],
    emit: Callable[[dict[str, Any]], None],
) -> dict[tuple[str, int], Any]:
    """Our engine with its CUDA graphs and without, in alternating rounds (each row the median round)."""
    graphs = llm.engine.runner.cuda_graphs
    if graphs is None:
        raise SystemExit(f"--cuda-graphs: this engine replays no CUDA graphs ({llm.graph_status})")
    rows: dict[tuple[str, int], Any] = {}
    for c in levels:
        rounds: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for paused in (False, True):  # capture this batch shape's graphs, warm the eager path
            graphs.paused = paused
            bench_engine(llm, c, max_tokens)
        for _ in range(max(1, repeats)):
            for paused in (False, True):
                graphs.paused = paused
                rounds[not paused].append(bench_engine(llm, c, max_tokens).row("hearth", c))
        graphs.paused = False
        for on, name in ((True, "hearth"), (False, "hearth_no_cuda_graphs")):
            row = median_row(rounds[on])
            row.update(system=name, level=llm.quantization, rounds_tok_s=[r["tok_s"] for r in rounds[on]])
            rows[(name, c)] = row
            emit(row)
        emit({"system": "cuda_graphs", "concurrency": c, "captured": graphs.captured,
               "disabled_reason": graphs.disabled_reason})
    return rows
