"""The retrieval eval on the set in tests/data/retrieval, with the real WordLlama weights: its report's structure,
the set's own rules (60+ questions, half of them paraphrased, a PDF with pages, a docx and Markdown), and a floor
well below the README's targets so that only a broken index or search fails it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.docs import evaluate
from engine.docs.__main__ import main


@pytest.fixture(scope="module")
def report() -> dict[str, object]:
    return evaluate.evaluate()


def test_the_set_has_enough_paraphrased_questions_over_every_format() -> None:
    questions = evaluate.load_questions(evaluate.DEFAULT_SET)
    assert len(questions) >= 60
    assert sum(q.paraphrase for q in questions) * 2 >= len(questions)
    suffixes = {Path(q.file).suffix for q in questions}
    assert {".pdf", ".docx", ".md"} <= suffixes
    assert len({q.page for q in questions if q.file.endswith(".pdf")}) >= 5
    for path in evaluate.DEFAULT_SET.iterdir():
        assert path.is_dir() or path.stat().st_size < 200_000, path


def test_the_report_scores_every_mode_of_every_embedder(report: dict[str, object]) -> None:
    rows = report["results"]
    assert isinstance(rows, list)
    assert [(r["embedder"], r["mode"]) for r in rows] == [
        ("bm25", "bm25"),
        ("wordllama", "bm25"),
        ("wordllama", "vector"),
        ("wordllama", "hybrid"),
    ]
    for row in rows:
        for key in ("recall@5", "mrr@10", "recall@5_paraphrased"):
            assert 0.0 <= row[key] <= 1.0
    assert report["questions"] == len(evaluate.load_questions(evaluate.DEFAULT_SET))
    assert report["chunks"] > 30
    table = evaluate.table(report)
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows) and len({len(line) for line in lines}) == 1  # aligned


def test_a_modest_floor(report: dict[str, object]) -> None:
    scores = {(r["embedder"], r["mode"]): r for r in report["results"]}  # type: ignore[union-attr]
    assert scores[("bm25", "bm25")]["recall@5"] >= 0.6
    assert scores[("wordllama", "vector")]["recall@5"] >= 0.7
    assert scores[("wordllama", "hybrid")]["recall@5"] >= 0.75
    assert scores[("wordllama", "hybrid")]["recall@5_paraphrased"] >= 0.6


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--embedder", "bm25", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in out["results"]] == ["bm25"] and "misses" not in out
    assert main(["eval", "--set", str(tmp_path)]) == 2
    assert "no questions.jsonl" in capsys.readouterr().err
    (tmp_path / "questions.jsonl").write_text('{"question": "q", "file": "absent.md", "expect": "x"}\n')
    assert main(["eval", "--set", str(tmp_path)]) == 2
    assert "no document absent.md" in capsys.readouterr().err
