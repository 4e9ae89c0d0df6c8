"""``python -m engine.docs eval``: retrieval quality measured on a hand-made set, not asserted.

The set is a folder holding documents and ``questions.jsonl``: one question a line, with the ``file`` that answers
it, its ``page`` where the file has pages, an ``expect`` substring that only the right passage holds, and whether the
question is a ``paraphrase`` (worded unlike the passage, so BM25 cannot simply match its words) or ``exact`` (it
names a code, a setting or a person the passage holds word for word: a fusion that buries BM25's exact matches under
the vectors' near misses shows there). A retrieved chunk answers a question when it comes from that file (and page)
and holds the substring, whitespace and case aside.

Each embedder (``bm25``, ``wordllama``, or an embedding model's folder or GGUF file on disk, as
``python -m engine.docs index --embedder PATH`` takes it, reported under its absolute path) indexes the documents
the questions name into a fresh temporary home; every question is then searched with each mode the collection
supports (``bm25``; ``vector`` and ``hybrid`` where it has vectors), and the run reports recall@5 (the share of
questions with an answering chunk in the top 5), MRR@10 (the mean of 1/rank of the first answering chunk in the top
10, 0 without one) and recall@5 over the paraphrased and the exact questions alone.

``--sweep`` chooses the fusion by cross-validation: hybrid search with each RRF constant of :data:`SWEEP_KS` and
each vector weight of :data:`SWEEP_WEIGHTS` is scored on the odd-numbered questions and on the even-numbered ones;
the pair best on one half (recall@5, then MRR@10) is reported on the other half, against the vectors alone there.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.docs import store
from engine.docs.embedders import EMBEDDER_CHOICES
from engine.docs.indexer import index_collection
from engine.docs.search import BM25_MARGIN, RRF_K, VECTOR_WEIGHT, Hit, search

#: The set in the repository: ``tests/data/retrieval`` next to the ``engine`` package.
DEFAULT_SET = Path(__file__).resolve().parents[2] / "tests" / "data" / "retrieval"
#: The embedders scored when none is named (an embedding model's path may be named besides).
EMBEDDERS = ("bm25", "wordllama")
#: The RRF constants and vector weights ``--sweep`` tries.
SWEEP_KS = (1, 2, 3, 5, 10, 20, 60)
SWEEP_WEIGHTS = (1.0, 1.25, 1.5, 2.0)
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
    exact: bool = False


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
                bool(raw.get("exact", False)),
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
        f"recall@{RECALL_AT}_exact": round(recall([p for p in pairs if p[1].exact]), 3),
    }


def evaluate(folder: Path = DEFAULT_SET, embedders: tuple[str, ...] = EMBEDDERS) -> dict[str, object]:
    """Index the set with each embedder (a name of :data:`EMBEDDERS` or an embedding model's path) and score every
    mode; returns the report ``--json`` prints.

    Raises:
        FileNotFoundError, ValueError: for a missing or malformed set, or an embedder that cannot load.
    """
    questions = load_questions(folder)
    documents = sorted({q.file for q in questions})
    rows: list[dict[str, object]] = []
    misses: dict[str, list[str]] = {}
    chunks = 0
    with tempfile.TemporaryDirectory(prefix="hearth-docs-eval-") as tmp:
        for number, name in enumerate(embedders):
            conn = store.connect(Path(tmp) / str(number))  # a model's path is no folder name
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
        "exact": sum(q.exact for q in questions),
        "results": rows,
        "misses": misses,
    }


def _pair(scores: dict[str, float]) -> tuple[float, float]:
    return scores[f"recall@{RECALL_AT}"], scores[f"mrr@{MRR_AT}"]


def sweep(folder: Path = DEFAULT_SET, ks: tuple[int, ...] = SWEEP_KS,
          weights: tuple[float, ...] = SWEEP_WEIGHTS) -> dict[str, Any]:
    """Hybrid search (WordLlama) with each RRF constant in ``ks`` and vector weight in ``weights``, scored on all,
    the odd-numbered and the even-numbered questions, and the pair each half chooses, scored on the other half; and
    the default fusion without its BM25 margin guard."""
    questions = load_questions(folder)
    parts = {"all": range(len(questions)), "odd": range(0, len(questions), 2), "even": range(1, len(questions), 2)}
    with tempfile.TemporaryDirectory(prefix="hearth-docs-sweep-") as tmp:
        conn = store.connect(Path(tmp) / "wordllama")
        try:
            index_collection(conn, COLLECTION, [folder / d for d in sorted({q.file for q in questions})], "wordllama")

            def scores(mode: str, k: float = RRF_K, weight: float = VECTOR_WEIGHT,
                       margin: float | None = BM25_MARGIN) -> dict[str, dict[str, float]]:
                ranks = [first_rank(search(conn, COLLECTION, q.question, MRR_AT, mode, k, weight, margin), q)
                         for q in questions]
                return {name: _scores([ranks[i] for i in part], [questions[i] for i in part])
                        for name, part in parts.items()}

            vector = scores("vector")
            unguarded = scores("hybrid", margin=None)
            rows: list[dict[str, Any]] = [{"k": k, "weight": w, **scores("hybrid", k, w)} for k in ks for w in weights]
        finally:
            conn.close()
    chosen = {}
    for tune, test in (("odd", "even"), ("even", "odd")):
        best = max(rows, key=lambda r: _pair(r[tune]))  # the first (smallest k) of equals
        chosen[tune] = {"k": best["k"], "weight": best["weight"], "held_out": test, "hybrid": best[test],
                        "vector": vector[test]}
    return {"questions": len(questions), "vector": vector, "hybrid": rows, "chosen": chosen,
            "default_without_margin": unguarded}


def sweep_table(result: dict[str, Any]) -> str:
    """The sweep as a Markdown table: recall@5 / MRR@10 on all, odd and even questions for each fusion."""
    def cell(scores: dict[str, float]) -> str:
        return f"{scores[f'recall@{RECALL_AT}']:.3f} / {scores[f'mrr@{MRR_AT}']:.3f}"

    vector, rows = result["vector"], result["hybrid"]
    body = [["vector", "", *(cell(vector[h]) for h in ("all", "odd", "even"))]]
    body += [["hybrid", f"k={r['k']:g}, w={r['weight']:g}", *(cell(r[h]) for h in ("all", "odd", "even"))]
             for r in rows]
    unguarded = result["default_without_margin"]
    body.append(["hybrid", f"k={RRF_K:g}, w={VECTOR_WEIGHT:g}, no margin", *(cell(unguarded[h])
                                                                           for h in ("all", "odd", "even"))])
    return _markdown(["mode", "fusion", "all", "odd", "even"], body)


def table(result: dict[str, object]) -> str:
    """The results as an aligned Markdown table."""
    rows = result["results"]
    assert isinstance(rows, list)
    head = ["embedder", "mode", f"recall@{RECALL_AT}", f"MRR@{MRR_AT}", f"recall@{RECALL_AT} paraphrased",
            f"recall@{RECALL_AT} exact"]
    keys = [f"recall@{RECALL_AT}", f"mrr@{MRR_AT}", f"recall@{RECALL_AT}_paraphrased", f"recall@{RECALL_AT}_exact"]
    return _markdown(head, [[str(r["embedder"]), str(r["mode"]), *(f"{r[k]:.3f}" for k in keys)] for r in rows])


def _markdown(head: list[str], body: list[list[str]]) -> str:
    """An aligned Markdown table: the first two columns to the left, numbers to the right."""
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        padded = [
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i >= 2 else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), rule, *(line(b) for b in body)])


def _embedder(value: str) -> str:
    """``--embedder``: a name of :data:`EMBEDDERS` or a path that exists (whether it holds a model says the load)."""
    if value in EMBEDDERS or (value not in EMBEDDER_CHOICES and Path(value).expanduser().exists()):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r} is not {', '.join(EMBEDDERS)} or an embedding model's folder or GGUF file"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.docs eval", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set", type=Path, default=DEFAULT_SET, help="the set's folder (default: %(default)s)"
    )
    parser.add_argument("--embedder", action="append", type=_embedder, metavar="|".join((*EMBEDDERS, "PATH")),
                        help="one embedder (repeatable): bm25, wordllama, or an embedding model's folder or GGUF file")
    parser.add_argument("--json", action="store_true", help="print the JSON report only")
    parser.add_argument(
        "--misses", action="store_true", help="list the questions each mode misses in its top 5"
    )
    parser.add_argument("--sweep", action="store_true",
                        help="choose RRF's constant by cross-validation over the odd and even questions")
    args = parser.parse_args(argv)
    if args.sweep:
        try:
            swept = sweep(args.set)
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(swept, indent=1) if args.json else sweep_table(swept))
        if not args.json:
            for tune, pick in swept["chosen"].items():
                print(f"chosen on the {tune} questions: k={pick['k']:g}, w={pick['weight']:g}; on the"
                      f" {pick['held_out']} questions hybrid"
                      f" {_pair(pick['hybrid'])}, vector {_pair(pick['vector'])} (recall@5, MRR@10)")
        return 0
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
        f"{result['questions']} questions ({result['paraphrased']} paraphrased, {result['exact']} exact),"
        f" {len(documents)}"
        f" documents, {result['chunks']} chunks"
    )
    print(table(result))
    return 0
