"""``python -m engine.docs eval``: retrieval quality measured on a hand-made set, not asserted.

The set is a folder holding documents and ``questions.jsonl``: one question a line, with the ``file`` that answers
it, its ``page`` where the file has pages, an ``expect`` substring that only the right passage holds, and whether the
question is a ``paraphrase`` (worded unlike the passage, so BM25 cannot simply match its words). A retrieved chunk
answers a question when it comes from that file (and page) and holds the substring, whitespace and case aside.

Each embedder indexes the documents the questions name into a fresh temporary home; every question is then searched
with each mode the collection supports (``bm25``; ``vector`` and ``hybrid`` where it has vectors), and the run
reports recall@5 (the share of questions with an answering chunk in the top 5), MRR@10 (the mean of 1/rank of the
first answering chunk in the top 10, 0 without one) and recall@5 over the paraphrased questions alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.docs import store
from engine.docs.indexer import index_collection
from engine.docs.search import Hit, search

#: The set in the repository: ``tests/data/retrieval`` next to the ``engine`` package.
DEFAULT_SET = Path(__file__).resolve().parents[2] / "tests" / "data" / "retrieval"
EMBEDDERS = ("bm25", "wordllama")
RECALL_AT = 5
MRR_AT = 10
COLLECTION = "eval"


@dataclass(frozen=True)
class Question:
    question: str
    file: str
    page: int | None
    expect: str
    paraphrase: bool


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def load_questions(folder: Path) -> list[Question]:
    """The set's questions.

    Raises:
        FileNotFoundError: without ``questions.jsonl`` or a document it names.
        ValueError: for a line that is not a question object.
    """
    path = folder / "questions.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no questions.jsonl in {folder}")
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            question = Question(
                str(raw["question"]),
                str(raw["file"]),
                None if raw.get("page") is None else int(raw["page"]),
                str(raw["expect"]),
                bool(raw.get("paraphrase", False)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}, line {number}: not a question ({exc})") from exc
        if not (folder / question.file).is_file():
            raise FileNotFoundError(f"{path}, line {number}: no document {question.file} in {folder}")
        questions.append(question)
    if not questions:
        raise ValueError(f"{path} holds no questions")
    return questions


def answers(hit: Hit, question: Question) -> bool:
    """Whether a retrieved chunk is the passage the question asks for."""
    return (
        Path(hit.file).name == question.file
        and (question.page is None or hit.page == question.page)
        and _norm(question.expect) in _norm(hit.text)
    )


def first_rank(hits: list[Hit], question: Question) -> int | None:
    """The rank (from 1) of the first chunk that answers the question, or ``None``."""
    return next((rank for rank, hit in enumerate(hits, start=1) if answers(hit, question)), None)


def _scores(ranks: list[int | None], questions: list[Question]) -> dict[str, float]:
    def recall(pairs: list[tuple[int | None, Question]]) -> float:
        return sum(1 for r, _ in pairs if r is not None and r <= RECALL_AT) / len(pairs) if pairs else 0.0

    pairs = list(zip(ranks, questions, strict=True))
    return {
        f"recall@{RECALL_AT}": round(recall(pairs), 3),
        f"mrr@{MRR_AT}": round(sum(1 / r for r in ranks if r is not None) / len(ranks), 3),
        f"recall@{RECALL_AT}_paraphrased": round(recall([p for p in pairs if p[1].paraphrase]), 3),
    }


def evaluate(folder: Path = DEFAULT_SET, embedders: tuple[str, ...] = EMBEDDERS) -> dict[str, object]:
    """Index the set with each embedder and score every mode; returns the report ``--json`` prints.

    Raises:
        FileNotFoundError, ValueError: for a missing or malformed set, or an embedder that cannot load.
    """
    questions = load_questions(folder)
    documents = sorted({q.file for q in questions})
    rows: list[dict[str, object]] = []
    misses: dict[str, list[str]] = {}
    chunks = 0
    with tempfile.TemporaryDirectory(prefix="hearth-docs-eval-") as tmp:
        for name in embedders:
            conn = store.connect(Path(tmp) / name)
            try:
                report = index_collection(conn, COLLECTION, [folder / d for d in documents], name)
                if report.skipped:
                    raise ValueError(f"the set has unreadable documents: {report.skipped}")
                chunks = report.chunks
                modes = ("bm25",) if report.embedder == "bm25" else ("bm25", "vector", "hybrid")
                for mode in modes:
                    ranks = [
                        first_rank(search(conn, COLLECTION, q.question, top_k=MRR_AT, mode=mode), q)
                        for q in questions
                    ]
                    rows.append({"embedder": report.embedder, "mode": mode, **_scores(ranks, questions)})
                    misses[f"{report.embedder}/{mode}"] = [
                        q.question
                        for q, r in zip(questions, ranks, strict=True)
                        if r is None or r > RECALL_AT
                    ]
            finally:
                conn.close()
    return {
        "set": str(folder),
        "documents": documents,
        "chunks": chunks,
        "questions": len(questions),
        "paraphrased": sum(q.paraphrase for q in questions),
        "results": rows,
        "misses": misses,
    }


def table(result: dict[str, object]) -> str:
    """The results as an aligned Markdown table."""
    rows = result["results"]
    assert isinstance(rows, list)
    head = ["embedder", "mode", f"recall@{RECALL_AT}", f"MRR@{MRR_AT}", f"recall@{RECALL_AT} paraphrased"]
    keys = [f"recall@{RECALL_AT}", f"mrr@{MRR_AT}", f"recall@{RECALL_AT}_paraphrased"]
    body = [[str(r["embedder"]), str(r["mode"]), *(f"{r[k]:.3f}" for k in keys)] for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        padded = [
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i >= 2 else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *(line(b) for b in body)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.docs eval", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set", type=Path, default=DEFAULT_SET, help="the set's folder (default: %(default)s)"
    )
    parser.add_argument("--embedder", action="append", choices=EMBEDDERS, help="one embedder (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the JSON report only")
    parser.add_argument(
        "--misses", action="store_true", help="list the questions each mode misses in its top 5"
    )
    args = parser.parse_args(argv)
    try:
        result = evaluate(args.set, tuple(args.embedder or EMBEDDERS))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.misses:
        del result["misses"]
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(json.dumps(result, indent=1))
    print()
    documents = result["documents"]
    assert isinstance(documents, list)
    print(
        f"{result['questions']} questions ({result['paraphrased']} paraphrased), {len(documents)}"
        f" documents, {result['chunks']} chunks"
    )
    print(table(result))
    return 0
