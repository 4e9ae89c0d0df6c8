"""``python -m engine.hub search QUERY | files REPO | download REPO FILE``: the hub from a terminal.

``--json`` prints machine-readable output; errors print one sentence on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.hub.download import Progress, download_all
from engine.hub.errors import HubError
from engine.hub.files import list_files
from engine.hub.search import search

__all__ = ["main"]


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def _print_progress(p: Progress) -> None:
    if p.stage == "done":
        print(f"\r{p.filename}: done, {_gib(p.done_bytes)}".ljust(80), file=sys.stderr)
        return
    eta = f", {p.eta_s:.0f} s left" if p.eta_s is not None else ""
    total = f" of {_gib(p.total_bytes)}" if p.total_bytes else ""
    speed = f" at {p.speed_bps / 2**20:.1f} MiB/s" if p.stage == "download" else ""
    print(f"\r{p.filename}: {p.stage} {_gib(p.done_bytes)}{total}{speed}{eta}".ljust(80), end="", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.hub", description="Search and download models.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_search = sub.add_parser("search", help="find models by keyword, owner/name or a hub link")
    p_search.add_argument("query")
    p_search.add_argument("--limit", type=int, default=20)
    p_search.add_argument("--json", action="store_true")
    p_files = sub.add_parser("files", help="a repository's files, grouped, with their fit on this machine")
    p_files.add_argument("repo")
    p_files.add_argument("--context", type=int, help="tokens of context to judge fit at")
    p_files.add_argument("--json", action="store_true")
    p_down = sub.add_parser("download", help="download files (resumes unfinished ones; a split GGUF's first part "
                                             "brings all its parts)")
    p_down.add_argument("repo")
    p_down.add_argument("file", nargs="+")
    p_down.add_argument("--dest", type=Path, help="a folder instead of the Hugging Face cache")
    args = parser.parse_args(argv)
    try:
        if args.command == "search":
            hits = search(args.query, limit=args.limit)
            for hit in hits:
                print(json.dumps(hit.to_json()) if args.json else
                      f"{hit.repo_id}  downloads={hit.downloads}  likes={hit.likes}{'  gated' if hit.gated else ''}")
            if not hits and not args.json:
                print("No models found.")
        elif args.command == "files":
            repo = list_files(args.repo, context=args.context)
            if args.json:
                print(json.dumps(repo.to_json()))
            else:
                print(f"{repo.repo_id}: judged at {repo.context} tokens, {_gib(repo.available_bytes)} available")
                for e in repo.entries:
                    label = e.fit.label if e.fit else "?"
                    print(f"{'*' if e.recommended else ' '} {e.format:11} {e.quant:8} {_gib(e.size_bytes):>10}  "
                          f"{label:30} {e.name}")
                    if e.recommended:
                        print(f"    recommended: {e.why}")
        else:
            for name in args.file:
                for path in download_all(args.repo, name, dest=args.dest, on_progress=_print_progress):
                    print(path)
    except HubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
