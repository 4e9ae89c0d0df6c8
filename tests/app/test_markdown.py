from __future__ import annotations

import itertools

from app.markdown import Span, close_open_fence, tokenize_code


def test_close_open_fence_closes_a_streaming_code_block() -> None:
    assert close_open_fence("Look:\n```python\nx = 1") == "Look:\n```python\nx = 1\n```\n"
    assert close_open_fence("~~~\ncode\n") == "~~~\ncode\n~~~\n"


def test_close_open_fence_leaves_finished_text_alone() -> None:
    text = "a\n```\ncode\n```\nb"
    assert close_open_fence(text) == text
    assert close_open_fence("no code") == "no code"


def test_tokenize_python() -> None:
    line = 'def f(x): return "a#b" + 12  # note'
    kinds = {line[s.start:s.start + s.length]: s.kind for s in tokenize_code(line, "python")}
    assert kinds == {"def": "keyword", "return": "keyword", '"a#b"': "string", "12": "number",
                     "# note": "comment"}


def test_tokenize_c_like_comment_and_string() -> None:
    line = 'int x = 5; // "not a string"'
    spans = tokenize_code(line, "c")
    assert Span(0, 3, "keyword") in spans
    assert Span(11, len(line) - 11, "comment") in spans
    assert not any(s.kind == "string" for s in spans)


def test_tokenize_spans_do_not_overlap() -> None:
    spans = tokenize_code("for i in range(10): print('x', i)  # loop", "py")
    ends = [(s.start, s.start + s.length) for s in spans]
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(ends))
