"""Plain-text formatting of sizes, rates and durations for the panes. No Qt."""

from __future__ import annotations

from typing import Any

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(num_bytes: float | None) -> str:
    """Return e.g. "512 B", "1.5 GiB"; "–" for None."""
    if num_bytes is None:
        return "–"
    value = float(num_bytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(seconds: float | None) -> str:
    """Return e.g. "35 ms", "1.20 s", "2 min 5 s"; "–" for None."""
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def format_rate(tokens_per_s: float | None) -> str:
    """Return e.g. "42.3 tok/s"; "–" for None."""
    if tokens_per_s is None:
        return "–"
    return f"{tokens_per_s:.1f} tok/s"


def format_percent(fraction: float | None) -> str:
    """Return e.g. "37 %" for 0.37; "–" for None."""
    if fraction is None:
        return "–"
    return f"{fraction * 100:.0f} %"


def reply_stats_line(stats: dict[str, Any] | None, finish_reason: str | None = None) -> str:
    """Return the small line under a finished reply: speed, time to first token, token count."""
    parts: list[str] = []
    if stats:
        if stats.get("tok_s") is not None:
            parts.append(format_rate(stats["tok_s"]))
        if stats.get("ttft_s") is not None:
            parts.append(f"first token {format_seconds(stats['ttft_s'])}")
        if stats.get("num_generated_tokens") is not None:
            parts.append(f"{stats['num_generated_tokens']} tokens")
    if finish_reason == "abort":
        parts.append("stopped")
    elif finish_reason == "length":
        parts.append("hit the token limit")
    return " · ".join(parts)
