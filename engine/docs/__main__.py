"""``python -m engine.docs``: index files into a collection, search it, list the collections.

    python -m engine.docs index PATH... --collection NAME [--embedder auto|bm25|wordllama|PATH] [--home DIR]
    python -m engine.docs search NAME "query" [--top-k N] [--mode hybrid|bm25|vector] [--json] [--home DIR]
    python -m engine.docs list [--json] [--home DIR]
    python -m engine.docs eval [--set DIR] [--embedder bm25|wordllama|PATH]... [--json] [--misses]
    python -m engine.docs bench [--pages N] [--chunks N] [--embedder wordllama|bm25|PATH]

``--embedder PATH`` names an embedding model's folder (bge, e5, gte, Qwen3-Embedding...); ``auto`` takes one found
on disk, else WordLlama. ``index`` with no PATH brings the collection up to date with its roots (and finishes an interrupted run).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

from engine.docs import store
from engine.docs.embedders import EMBEDDER_CHOICES
from engine.docs.indexer import index_collection
from engine.docs.search import MODES, search


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.docs", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    home = argparse.ArgumentParser(add_help=False)
    home.add_argument(
        "--home", type=Path, default=None, help="the index's folder (default: documents/ in the data folder)"
    )
    index = sub.add_parser("index", parents=[home], help="index files and folders into a collection")
    index.add_argument("paths", nargs="*", type=Path)
    index.add_argument("--collection", required=True)
    index.add_argument(
        "--embedder",
        default="auto",
        metavar="|".join((*EMBEDDER_CHOICES, "PATH")),
        help="auto (an embedding model on disk, else WordLlama), bm25, wordllama, or an embedding model's folder or GGUF file",
    )
    index.add_argument("--json", action="store_true", help="print the report as JSON")
    find = sub.add_parser("search", parents=[home], help="search a collection")
    find.add_argument("collection")
    find.add_argument("query")
    find.add_argument("--top-k", type=int, default=5)
    find.add_argument("--mode", choices=MODES, default="hybrid")
    find.add_argument("--json", action="store_true")
    show = sub.add_parser("list", parents=[home], help="list the collections")
    show.add_argument("--json", action="store_true")
    # Parsed by their own modules (engine/docs/evaluate.py, engine/docs/bench.py): listed here for --help.
    sub.add_parser("eval", help="retrieval quality on the set in tests/data/retrieval (recall@5, MRR)")
    sub.add_parser("bench", help="indexing and search speed on generated files")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "eval":
        from engine.docs import evaluate

        return evaluate.main(argv[1:])
    if argv and argv[0] == "bench":
        from engine.docs import bench

        return bench.main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        conn = store.connect(args.home)
    except OSError as exc:
        print(f"error: cannot open the index in {args.home}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "index":
            return _index(conn, args)
        if args.command == "search":
            hits = search(conn, args.collection, args.query, top_k=args.top_k, mode=args.mode)
            if args.json:
                print(json.dumps([hit.to_json() for hit in hits], ensure_ascii=False, indent=1))
            else:
                for n, hit in enumerate(hits, start=1):
                    page = f" p.{hit.page}" if hit.page is not None else ""
                    print(f"[{n}] {hit.score:.4f} {hit.file}{page} [{hit.start}:{hit.end}]")
                    print("    " + " ".join(hit.text.split())[:200])
            return 0
        collections = store.list_collections(conn)
        if args.json:
            print(json.dumps(collections, indent=1))
        else:
            for c in collections:
                print(
                    f"{c['name']}: {c['files']} files, {c['chunks']} chunks, {c['skipped']} skipped, "
                    f"{c['queued']} queued, embedder {c['embedder']}"
                )
        return 0
    except (KeyError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    finally:
        conn.close()


def _index(conn: sqlite3.Connection, args: argparse.Namespace) -> int:
    def progress(done: int, total: int, path: str) -> None:
        if not args.json and path:
            print(f"[{done + 1}/{total}] {path}", file=sys.stderr, flush=True)

    report = index_collection(conn, args.collection, args.paths, args.embedder, progress)
    if args.json:
        print(json.dumps(report.__dict__, indent=1))
    else:
        print(f"embedder: {report.embedder_reason}")
        print(
            f"{len(report.indexed)} indexed ({report.chunks} chunks), {report.unchanged} unchanged, "
            f"{len(report.removed)} removed, {len(report.skipped)} skipped"
        )
        for path, reason in report.skipped:
            print(f"skipped {path}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
