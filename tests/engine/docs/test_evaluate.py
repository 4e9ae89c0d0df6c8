"""The retrieval eval on the set in tests/data/retrieval, with the real WordLlama weights: its report's structure,
the set's own rules (60+ questions, half of the worded ones paraphrased, exact-name and code questions, a PDF with
pages, a docx and Markdown), a floor well below the README's targets so that only a broken index or search fails
it, hybrid at least as good as its parts, and the cross-validated sweep that chose the fusion."""

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
    worded = [q for q in questions if not q.exact]  # a code or a name cannot be paraphrased
    assert len(worded) >= 60 and sum(q.paraphrase for q in worded) * 2 >= len(worded)
    exact = [q for q in questions if q.exact]
    assert len(exact) >= 10 and not any(q.paraphrase for q in exact)
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
        for key in ("recall@5", "mrr@10", "recall@5_paraphrased", "recall@5_exact"):
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


def test_hybrid_is_at_least_as_good_as_each_of_its_parts(report: dict[str, object]) -> None:
    """The fusion's target (the eval is deterministic): recall@5 and MRR@10 no lower than BM25's or the vectors',
    and no exact-name or code question lost that BM25 alone finds."""
    scores = {r["mode"]: r for r in report["results"] if r["embedder"] == "wordllama"}  # type: ignore[union-attr]
    for key in ("recall@5", "mrr@10"):
        assert scores["hybrid"][key] >= max(scores["bm25"][key], scores["vector"][key]), (key, scores)
    assert scores["hybrid"]["recall@5_exact"] >= scores["bm25"]["recall@5_exact"]
    assert scores["hybrid"]["recall@5_paraphrased"] >= scores["vector"]["recall@5_paraphrased"]


def test_the_sweep_scores_each_fusion_on_both_halves_and_crosses_them() -> None:
    swept = evaluate.sweep(ks=(10, 60), weights=(1.0,))
    assert [(r["k"], r["weight"]) for r in swept["hybrid"]] == [(10, 1.0), (60, 1.0)]
    for row in [*swept["hybrid"], swept["vector"], swept["default_without_margin"]]:
        assert set(row) >= {"all", "odd", "even"}
    chosen = swept["chosen"]
    assert chosen["odd"]["held_out"] == "even" and chosen["even"]["held_out"] == "odd"
    for tune, pick in chosen.items():  # each half's choice is its best, scored on the other half
        best = max(swept["hybrid"], key=lambda r: (r[tune]["recall@5"], r[tune]["mrr@10"]))
        assert (pick["k"], pick["hybrid"]) == (best["k"], best[pick["held_out"]])
    lines = evaluate.sweep_table(swept).splitlines()
    assert len(lines) == 2 + 1 + 2 + 1 and len({len(line) for line in lines}) == 1


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--embedder", "bm25", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in out["results"]] == ["bm25"] and "misses" not in out
    assert main(["eval", "--set", str(tmp_path)]) == 2
    assert "no questions.jsonl" in capsys.readouterr().err
    (tmp_path / "questions.jsonl").write_text('{"question": "q", "file": "absent.md", "expect": "x"}\n')
    assert main(["eval", "--set", str(tmp_path)]) == 2
    assert "no document absent.md" in capsys.readouterr().err


def test_an_embedding_model_on_disk_is_scored_as_rows_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--embedder PATH``: a tiny random BERT folder (as ``index --embedder PATH`` takes one) indexes a part of the
    set, and each of its modes gets a row beside BM25's; a name that is neither an embedder nor a path is refused."""
    from tests.engine.embedding_models import build_tiny_embedder

    model = tmp_path / "tiny-bge"
    model.mkdir()
    build_tiny_embedder("bert", model, "mean")
    subset = tmp_path / "set"
    subset.mkdir()
    lines = (evaluate.DEFAULT_SET / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if json.loads(line)["file"] == "pump_controller.md"][:8]
    (subset / "questions.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    (subset / "pump_controller.md").write_bytes((evaluate.DEFAULT_SET / "pump_controller.md").read_bytes())

    assert main(["eval", "--set", str(subset), "--embedder", "bm25", "--embedder", str(model), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["questions"] == len(kept) == 8
    rows = out["results"]
    path = str(model.resolve())
    assert [(r["embedder"], r["mode"]) for r in rows] == [
        ("bm25", "bm25"), (path, "bm25"), (path, "vector"), (path, "hybrid"),
    ]  # fmt: skip
    for row in rows:
        assert 0.0 <= row["recall@5"] <= 1.0 and 0.0 <= row["mrr@10"] <= 1.0, row
    assert rows[1]["recall@5"] == rows[0]["recall@5"]  # BM25 is BM25, whatever made the vectors
    assert not list(model.glob("*.sqlite3*"))  # the index went to the temporary home, not the model's folder

    for wrong in ("auto", str(tmp_path / "no-such-model")):
        with pytest.raises(SystemExit) as refused:
            main(["eval", "--set", str(subset), "--embedder", wrong])
        assert refused.value.code == 2
        assert "an embedding model's folder or GGUF file" in capsys.readouterr().err
