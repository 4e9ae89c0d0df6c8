"""The docs name what exists: ARCHITECTURE.md's paths are in the tree and every module is in it, README's make
targets and links are real. Plain text checks, so a rename or split that forgets the docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
README = ROOT / "README.md"
#: Source files that ARCHITECTURE.md must name: Python modules and the native step's C++.
SOURCE_SUFFIXES = (".py", ".cpp", ".h")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
BRACES = re.compile(r"\{([^{}]*)\}")


@pytest.fixture(scope="session", autouse=True)
def native_decode_step() -> None:
    """These checks read text only: no torch, no native build (overrides the suite-wide fixture)."""


def expand_braces(text: str) -> list[str]:
    """``engine/core/{a,b}.py`` → ``engine/core/a.py``, ``engine/core/b.py`` (any number of brace groups)."""
    match = BRACES.search(text)
    if match is None:
        return [text]
    head, tail = text[: match.start()], text[match.end() :]
    return [
        path for option in match.group(1).split(",") for path in expand_braces(head + option.strip() + tail)
    ]


def named_paths(markdown: str) -> set[str]:
    """Every repository path in the document's inline code spans: those whose first part is a top-level folder."""
    top_level = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".git")}
    paths = set()
    for span in CODE_SPAN.findall(FENCE.sub("", markdown)):
        span = BRACES.sub(lambda m: m.group(0).replace(" ", ""), span)
        for word in span.split():
            word = word.strip(",;:()")
            if "/" in word and word.split("/", 1)[0] in top_level:
                paths.update(expand_braces(word))
    return paths


def source_files() -> list[str]:
    files = [p for pkg in ("engine", "app") for p in (ROOT / pkg).rglob("*") if p.suffix in SOURCE_SUFFIXES]
    return sorted(p.relative_to(ROOT).as_posix() for p in files if p.name != "__init__.py")


def test_brace_expansion() -> None:
    assert expand_braces("engine/core/{request,context}.py") == [
        "engine/core/request.py",
        "engine/core/context.py",
    ]
    assert expand_braces("app/{a,b}/{c,d}.py") == ["app/a/c.py", "app/a/d.py", "app/b/c.py", "app/b/d.py"]
    assert named_paths("see `engine/x/{a, b}.py` and `engine/y.py` (`LLM`)") == {
        "engine/x/a.py",
        "engine/x/b.py",
        "engine/y.py",
    }


def test_architecture_names_only_paths_that_exist() -> None:
    missing = sorted(p for p in named_paths(ARCHITECTURE.read_text()) if not (ROOT / p).exists())
    assert not missing, f"docs/ARCHITECTURE.md names paths that are not in the tree: {missing}"


def test_architecture_names_every_module() -> None:
    named = named_paths(ARCHITECTURE.read_text())
    unnamed = [p for p in source_files() if p not in named]
    assert not unnamed, (
        f"docs/ARCHITECTURE.md does not name these modules (add a line saying what each does): {unnamed}"
    )


def readme_code() -> str:
    text = README.read_text()
    return "\n".join(FENCE.findall(text) + CODE_SPAN.findall(text))


def test_readme_make_targets_exist() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    named = set(re.findall(r"(?:^|[\s`])make ([a-z][\w-]*)", readme_code(), re.MULTILINE))
    assert "test" in named, "README.md must name `make test`: CI runs it (.ci/run)"
    assert named <= targets, f"README.md names make targets the Makefile lacks: {sorted(named - targets)}"


def test_readme_links_exist() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link and not link.startswith("mailto:")]
    assert local, "README.md links to no docs"
    missing = sorted(link for link in local if not (ROOT / link).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"
