"""``engine.core`` imports in one direction: no module reaches back to one that imports it."""

from __future__ import annotations

import itertools

import grimp


def test_engine_core_has_no_import_circles() -> None:
    graph = grimp.build_graph("engine")
    core = sorted(m for m in graph.modules if m.startswith("engine.core."))
    circles = [
        (a, b) for a, b in itertools.combinations(core, 2) if graph.chain_exists(a, b) and graph.chain_exists(b, a)
    ]
    assert circles == []


def test_the_request_handle_does_not_know_the_engine() -> None:
    """``RequestHandle`` cancels through the callable it is given, so ``request.py`` needs no ``llm_engine``."""
    graph = grimp.build_graph("engine")
    assert not graph.chain_exists("engine.core.request", "engine.core.llm_engine")
