"""Which shape the kernel tuner measures now, for a load's progress: measuring a large shape (the lm_head) is the
longest step of a first load on a CPU, and a bar that sits still without a word looks hung."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

_reporting = threading.local()


@contextlib.contextmanager
def reporting(report: Callable[[str, int], None]) -> Iterator[None]:
    """Within the block, each shape this thread measures is announced first as ``report(what, count)``: the role
    and shape ("lm_head 49152x576") and how many were measured before it. Shapes whose plans are cached are not
    announced: they cost nothing."""
    before = getattr(_reporting, "report", None), getattr(_reporting, "count", 0)
    _reporting.report, _reporting.count = report, 0
    try:
        yield
    finally:
        _reporting.report, _reporting.count = before


def announce(what: str) -> None:
    """Tell the thread's reporter, if it has one, that ``what`` is measured next."""
    report = getattr(_reporting, "report", None)
    if report is not None:
        count = _reporting.count
        _reporting.count = count + 1
        report(what, count)
