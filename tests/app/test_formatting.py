from __future__ import annotations

from app.formatting import format_bytes, format_percent, format_rate, format_seconds, reply_stats_line


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"
    assert format_bytes(None) == "–"


def test_format_seconds_rate_percent() -> None:
    assert format_seconds(0.035) == "35 ms"
    assert format_seconds(1.2) == "1.20 s"
    assert format_seconds(125) == "2 min 5 s"
    assert format_rate(42.26) == "42.3 tok/s"
    assert format_percent(0.374) == "37 %"


def test_reply_stats_line() -> None:
    stats = {"tok_s": 20.0, "ttft_s": 0.25, "num_generated_tokens": 30}
    assert reply_stats_line(stats, "stop") == "20.0 tok/s · first token 250 ms · 30 tokens"
    assert reply_stats_line(stats, "abort").endswith("· stopped")
    assert reply_stats_line(None, "length") == "hit the token limit"
    assert reply_stats_line({}, None) == ""
