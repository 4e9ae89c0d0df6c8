"""Markdown helpers that need no Qt: streaming fix-ups, code blocks and code tokenizing.

Qt renders the Markdown itself (``QTextCursor.insertMarkdown``); this module only prepares text
for it (closing a streaming code block, adding a "Copy code" link under each finished one, setting
a model's ``<think>`` reasoning apart from its answer), finds the code to copy, and splits code lines
into coloured spans for :class:`app.chat.code_highlighter.CodeHighlighter`.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"

#: Span kinds :func:`tokenize_code` returns; the highlighter maps each to a colour.
KINDS = ("keyword", "string", "comment", "number", "builtin")

_C_LIKE_KEYWORDS = frozenset(
    {
        "auto", "break", "case", "catch", "char", "class", "const", "continue", "default", "delete",
        "do", "double", "else", "enum", "export", "extends", "false", "final", "float", "for", "fn",
        "func", "function", "if", "impl", "import", "in", "int", "interface", "let", "long",
        "match", "mod", "mut", "new", "null", "nullptr", "package", "private", "protected", "pub",
        "public", "return", "self", "short", "static", "struct", "super", "switch", "this", "throw",
        "true", "try", "type", "typedef", "typeof", "union", "unsigned", "use", "using", "var",
        "void", "volatile", "while", "yield", "async", "await", "def", "elif", "except", "finally",
        "from", "global", "lambda", "nonlocal", "not", "or", "and", "pass", "raise", "with", "is",
        "None", "True", "False", "echo", "then", "fi", "done", "esac", "local"
    }
)
_PYTHON_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)
_PYTHON_BUILTINS = frozenset({"print", "len", "range", "dict", "list", "set", "tuple", "str", "int",
                              "float", "bool", "open", "isinstance", "super", "enumerate", "zip", "map"})
_HASH_COMMENT_LANGS = frozenset({"python", "py", "sh", "bash", "shell", "zsh", "ruby", "rb", "yaml",
                                 "yml", "toml", "perl", "r", "make", "makefile", "dockerfile", "ini"})

_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"?|'(?:[^'\\]|\\.)*'?|`(?:[^`\\]|\\.)*`?")
_NUMBER = re.compile(r"\b(?:0[xX][0-9a-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\b")
_WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


@dataclass(frozen=True, slots=True)
class Span:
    """A coloured run within one line of code."""

    start: int
    length: int
    kind: str


def close_open_fence(text: str) -> str:
    """Return ``text`` with a closing fence added if a code block is still open.

    While a reply streams, a code block has its opening ``` but not yet its closing one; without
    this the rest of the reply would flicker between code and prose on every repaint.
    """
    open_fence: str | None = None
    for line in text.splitlines():
        match = _FENCE.match(line)
        if not match:
            continue
        fence = match.group(1)
        if open_fence is None:
            open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not line.strip()[len(fence):]:
            open_fence = None
    if open_fence is None:
        return text
    return text + ("" if text.endswith("\n") else "\n") + open_fence + "\n"


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply split into the model's reasoning (its ``<think>`` block) and its answer."""

    answer: str
    #: The text inside ``<think>…</think>``; "" when the reply has none.
    reasoning: str = ""
    #: The reasoning has begun but not yet ended (the reply is still thinking).
    is_thinking: bool = False


def split_reasoning(text: str) -> Reply:
    """Split a reply at its ``<think>…</think>`` block.

    Reasoning models write ``<think>`` first (some chat templates put it in the prompt, so the reply
    holds only the closing ``</think>``); an unclosed block means the reply is still thinking.
    """
    stripped = text.lstrip()
    if stripped.startswith(_THINK_OPEN):
        inner = stripped[len(_THINK_OPEN):]
        reasoning, closed, answer = inner.partition(_THINK_CLOSE)
        if not closed:
            return Reply("", reasoning.strip(), is_thinking=True)
        return Reply(answer.lstrip(), reasoning.strip())
    if _THINK_CLOSE in text and _THINK_OPEN not in text:
        reasoning, _, answer = text.partition(_THINK_CLOSE)
        return Reply(answer.lstrip(), reasoning.strip())
    return Reply(text)


@dataclass(frozen=True, slots=True)
class CodeBlock:
    """A finished fenced code block: its text, and the line index of its closing fence."""

    code: str
    language: str
    indent: str
    closing_line: int


def code_blocks(text: str) -> list[CodeBlock]:
    """Return the fenced code blocks of ``text`` that have their closing fence, in order."""
    blocks: list[CodeBlock] = []
    open_fence: str | None = None
    indent = language = ""
    body: list[str] = []
    for number, line in enumerate(text.splitlines()):
        match = _FENCE.match(line)
        if open_fence is None:
            if match:
                open_fence = match.group(1)
                indent = line[: len(line) - len(line.lstrip())]
                language = line.strip()[len(open_fence):].strip()
                body = []
            continue
        fence = match.group(1) if match else ""
        if fence and fence[0] == open_fence[0] and len(fence) >= len(open_fence) \
                and not line.strip()[len(fence):]:
            blocks.append(CodeBlock("\n".join(_dedent(body, indent)), language, indent, number))
            open_fence = None
        else:
            body.append(line)
    return blocks


def _dedent(lines: list[str], indent: str) -> list[str]:
    return [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines]


def add_copy_links(text: str, href: Callable[[int], str], label: str = "Copy code") -> str:
    """Return ``text`` with a ``[label](href(k))`` line under the k-th finished code block."""
    blocks = code_blocks(text)
    if not blocks:
        return text
    lines = text.splitlines()
    for k, block in reversed(list(enumerate(blocks))):
        lines.insert(block.closing_line + 1, f"{block.indent}[{label}]({href(k)})")
        lines.insert(block.closing_line + 1, "")
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def _comment_markers(language: str) -> tuple[str, ...]:
    lang = language.lower()
    if lang in _HASH_COMMENT_LANGS:
        return ("#",)
    if lang in {"sql", "lua", "haskell", "hs"}:
        return ("--",)
    if lang in {"", "text", "plain"}:
        return ("#", "//")
    return ("//", "#") if lang in {"php"} else ("//",)


def tokenize_code(line: str, language: str = "") -> list[Span]:
    """Split one line of code into keyword/string/comment/number/builtin spans.

    A small, language-agnostic highlighter: good enough to make code readable, not a parser.
    Block comments and multi-line strings are not tracked across lines.
    """
    lang = language.lower()
    keywords = _PYTHON_KEYWORDS if lang in {"python", "py"} else _C_LIKE_KEYWORDS
    spans: list[Span] = []
    taken = [False] * len(line)

    def claim(start: int, end: int, kind: str) -> None:
        if start >= end or any(taken[start:end]):
            return
        spans.append(Span(start, end - start, kind))
        taken[start:end] = [True] * (end - start)

    comment_at = len(line)
    for match in _STRING.finditer(line):
        marker_hits = [line.find(m, 0, match.start()) for m in _comment_markers(lang)]
        hits = [h for h in marker_hits if h >= 0]
        if hits:
            comment_at = min(hits)
            break
        claim(match.start(), match.end(), "string")
    else:
        hits = [h for h in (_find_outside(line, m, taken) for m in _comment_markers(lang)) if h >= 0]
        if hits:
            comment_at = min(hits)
    if comment_at < len(line):
        claim(comment_at, len(line), "comment")
    code = line[:comment_at]
    for match in _NUMBER.finditer(code):
        claim(match.start(), match.end(), "number")
    for match in _WORD.finditer(code):
        word = match.group()
        if word in keywords:
            claim(match.start(), match.end(), "keyword")
        elif lang in {"python", "py"} and word in _PYTHON_BUILTINS:
            claim(match.start(), match.end(), "builtin")
    spans.sort(key=lambda s: s.start)
    return spans


def _find_outside(line: str, marker: str, taken: list[bool]) -> int:
    start = 0
    while True:
        index = line.find(marker, start)
        if index < 0 or not taken[index]:
            return index
        start = index + 1
