from __future__ import annotations

import itertools

from app.chat.markdown import Span, add_copy_links, close_open_fence, code_blocks, tokenize_code


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


def test_code_blocks_finds_finished_blocks_only() -> None:
    text = "Intro\n```python\nx = 1\n  y = 2\n```\nmid\n~~~\nplain\n~~~\n```sh\nstill streaming"
    blocks = code_blocks(text)
    assert [(b.code, b.language) for b in blocks] == [("x = 1\n  y = 2", "python"), ("plain", "")]


def test_add_copy_links_puts_a_link_under_each_finished_block() -> None:
    text = "A\n```\none\n```\nB\n```\ntwo\n```\n"
    linked = add_copy_links(text, lambda k: f"hearth:copy-code/5/{k}")
    assert linked == ("A\n```\none\n```\n\n[Copy code](hearth:copy-code/5/0)\nB\n```\ntwo\n```\n\n"
                      "[Copy code](hearth:copy-code/5/1)\n")
    assert add_copy_links("no code", str) == "no code"
    assert [b.code for b in code_blocks(linked)] == ["one", "two"]
