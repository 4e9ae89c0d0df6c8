"""``python -m engine.tools.eval_defaults``: sampling presets scored on everyday prompts, run the way the app runs.

A preset chosen on one question can loop or go wrong on the next, so Hearth's default preset is chosen here over a
set of everyday prompts (``tests/data/defaults_eval.json``: facts, recipes, code, translations, summaries, advice,
lists). Each prompt runs as a new chat of the app: the default model at the level the app recommends for this
machine (``engine.loading.recommend``), repeatable replies and n-gram speculation (``LoadSettings``), the app's
reply limit of 512 tokens, the user's message alone (the app adds no system prompt unless the chat has one; the
chat template adds the model's own) and the app's overflow policy. Each preset is sampled with fixed seeds, and
all its replies are submitted together and stepped in one batch: repeatable replies do not depend on what else
shares a step, so the batch answers as single chats would.

Each preset is scored on right answers (a prompt's ``expect`` groups: each must match one of its strings, case
aside), loops (:func:`find_loop`), replies cut at the token limit, and the median reply length in tokens. The
best preset has the most right answers, then the fewest loops, then the fewest cut replies.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The prompts, with their rules (see the file's "about").
PROMPTS_PATH = Path(__file__).resolve().parents[2] / "tests" / "data" / "defaults_eval.json"
#: The app's reply limit (``app/data/settings.py``, ``DEFAULT_GENERATION``) and chat context (``LoadSettings``).
APP_MAX_TOKENS = 512
APP_CONTEXT = 4096
APP_OVERFLOW = "truncate_middle"
#: A loop: the same window of LOOP_WINDOW tokens LOOP_TIMES times in a reply (twice in one cut at the limit).
LOOP_WINDOW = 8
LOOP_TIMES = 3
#: The presets tried besides the model's own (its ``generation_config.json``) and Hearth's current one.
CANDIDATES: dict[str, dict[str, float]] = {
    "t0.3 p0.3 r1.1": {"temperature": 0.3, "top_p": 0.3, "repetition_penalty": 1.1},
    "t0.3 p0.3 r1.1 w64": {"temperature": 0.3, "top_p": 0.3, "repetition_penalty": 1.1, "repeat_last_n": 64},
    "t0.7 p0.95": {"temperature": 0.7, "top_p": 0.95, "repetition_penalty": 1.0},
    "t0.2 p0.9": {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.0},
    "t0.2 p0.9 r1.1": {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1},
    "t0.3 p0.3 r1.1 f0.3": {"temperature": 0.3, "top_p": 0.3, "repetition_penalty": 1.1, "frequency_penalty": 0.3},
    "t0.5 p0.9 r1.15": {"temperature": 0.5, "top_p": 0.9, "repetition_penalty": 1.15},
}
DEFAULT_SEEDS = (0, 1)
#: Most replies stepped together, and how often (in steps) progress goes to stderr.
MAX_BATCH = 128
PROGRESS_EVERY = 25


@dataclass(slots=True)
class Prompt:
    """One everyday prompt; ``expect`` holds groups of alternatives (empty: an open prompt, not graded)."""

    id: str
    category: str
    prompt: str
    expect: list[list[str]] = field(default_factory=list)


@dataclass(slots=True)
class Score:
    """One preset's results over every prompt and seed."""

    name: str
    params: dict[str, float]
    replies: int = 0
    graded: int = 0
    right: int = 0
    loops: int = 0
    cut: int = 0
    median_tokens: float = 0.0
    wrong: list[str] = field(default_factory=list)
    looped: list[str] = field(default_factory=list)


def load_prompts(path: Path = PROMPTS_PATH) -> list[Prompt]:
    """The prompts of ``path``; ``ValueError`` naming the entry that is malformed."""
    data = json.loads(path.read_text(encoding="utf-8"))
    prompts = []
    for n, entry in enumerate(data.get("prompts", []) if isinstance(data, dict) else []):
        expect = entry.get("expect", []) if isinstance(entry, dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("id"), str) and isinstance(entry.get("prompt"), str)
                and isinstance(expect, list)
                and all(isinstance(g, list) and g and all(isinstance(s, str) and s for s in g) for g in expect)):
            raise ValueError(f"{path}: prompt {n} needs an id, a prompt and 'expect' as lists of strings")
        prompts.append(Prompt(entry["id"], str(entry.get("category", "")), entry["prompt"], expect))
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def is_right(reply: str, expect: Sequence[Sequence[str]]) -> bool:
    """Whether every group of ``expect`` has a string that ``reply`` contains, case aside."""
    text = reply.casefold()
    return all(any(s.casefold() in text for s in group) for group in expect)


def find_loop(tokens: Sequence[object], is_cut: bool = False, window: int = LOOP_WINDOW,
              times: int = LOOP_TIMES) -> bool:
    """Whether ``tokens`` loop: one window of ``window`` tokens occurs ``times`` times (twice, in a reply cut at the
    token limit: it was going round when it was stopped)."""
    counts = Counter(tuple(tokens[i:i + window]) for i in range(len(tokens) - window + 1))
    most = max(counts.values(), default=0)
    return most >= times or (is_cut and most >= 2)


def score(name: str, params: dict[str, float], prompts: Sequence[Prompt],
          replies: Sequence[tuple[int, str, Sequence[object], bool]]) -> Score:
    """Score one preset's replies: (prompt index, text, tokens, cut at the limit) each."""
    result = Score(name, dict(params), replies=len(replies))
    lengths = []
    for index, text, tokens, is_cut in replies:
        prompt = prompts[index]
        lengths.append(len(tokens))
        result.cut += is_cut
        if find_loop(tokens, is_cut):
            result.loops += 1
            result.looped.append(prompt.id)
        if prompt.expect:
            result.graded += 1
            if is_right(text, prompt.expect):
                result.right += 1
            else:
                result.wrong.append(prompt.id)
    result.median_tokens = float(statistics.median(lengths)) if lengths else 0.0
    return result


def best(scores: Sequence[Score]) -> Score:
    """The most right answers, then the fewest loops, then the fewest cut replies, then the shorter median."""
    return min(scores, key=lambda s: (-s.right, s.loops, s.cut, s.median_tokens))


def own_defaults(folder: Path) -> dict[str, float]:
    """The sampling settings the model folder's ``generation_config.json`` sets itself ({} when none)."""
    from engine.loading.default_model import SAMPLING_KEYS

    try:
        config = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    if config.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: config[k] for k in SAMPLING_KEYS if isinstance(config.get(k), int | float)}


def presets_for(model_folder: Path, hearth: dict[str, float], only: Sequence[str] = ()) -> dict[str, dict[str, float]]:
    """The presets to try: Hearth's current one, the model's own (if it sets any), then :data:`CANDIDATES`, each
    once (the first name wins); ``only`` keeps those names."""
    found: dict[str, dict[str, float]] = {}
    named = [("hearth", hearth), ("model's own", own_defaults(model_folder)), *CANDIDATES.items()]
    for name, params in named:
        if params and params not in found.values() and (not only or name in only):
            found[name] = dict(params)
    return found


class _LoopWatch:
    """An ``on_output`` that stops its request once its reply loops (``--stop-loops``): the reply counts as a
    loop either way, and the rest of its tokens would only repeat."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.tokens: list[int] = []

    def __call__(self, out: Any) -> None:
        before = len(self.tokens)
        self.tokens.extend(out.new_token_ids)
        if (self.handle is not None and not out.finished and len(self.tokens) // 16 > before // 16
                and find_loop(self.tokens)):
            self.handle.cancel()


def run(prompts: Sequence[Prompt], seeds: Sequence[int], only: Sequence[str] = (),
        max_tokens: int = APP_MAX_TOKENS, stop_loops: bool = False) -> dict[str, Any]:
    """Load the default model as the app does, sample every prompt with every preset and seed; the report.
    ``stop_loops`` stops a reply once it loops (counted as a loop, its length where it stopped)."""
    from engine import LLM, SamplingParams
    from engine.loading.recommend import recommend

    rec = recommend("default", device="auto", context_length=APP_CONTEXT, num_chats=1)
    num_replies_guess = len(prompts) * len(seeds) * (len(only) or len(CANDIDATES) + 2)
    # Up to MAX_BATCH replies at once, at a few hundred tokens each (a longer batch preempts and recomputes).
    batch = min(num_replies_guess, MAX_BATCH)
    kv_bytes = max(batch * 384, APP_CONTEXT) * rec.kv_bytes_per_token
    with LLM("default", device="auto", dtype="auto", quantization=rec.quantization, deterministic=True,
             speculative="ngram", max_model_len=APP_CONTEXT, max_batch_size=batch,
             kv_cache_bytes=kv_bytes, start_loop=False) as llm:
        presets = presets_for(Path(llm.path), dict(llm.sampling_defaults), only)
        handles: list[tuple[str, int, Any]] = []
        for name, params in presets.items():
            # as the app's Generation form fills them (a penalty window of -1: the whole history)
            options: dict[str, Any] = {"repetition_penalty": 1.0, "top_p": 1.0, "repeat_last_n": -1, **params}
            for seed in seeds:
                for index, prompt in enumerate(prompts):
                    sampling = SamplingParams(max_tokens=max_tokens, seed=seed, **options)
                    watch = _LoopWatch() if stop_loops else None
                    handle = llm.engine.submit([{"role": "user", "content": prompt.prompt}], sampling,
                                               overflow=APP_OVERFLOW, on_output=watch)
                    if watch is not None:
                        watch.handle = handle
                    handles.append((name, index, handle))
        num_steps = 0
        while not all(h.done() for _, _, h in handles):
            llm.engine.step()
            num_steps += 1
            if num_steps % PROGRESS_EVERY == 0:
                done = sum(h.done() for _, _, h in handles)
                print(f"step {num_steps}: {done} of {len(handles)} replies done", file=sys.stderr, flush=True)
        scores = []
        for name, params in presets.items():
            outs = [(index, h.result()) for n, index, h in handles if n == name]
            scores.append(score(name, params, prompts, [(i, o.text, list(o.token_ids), o.finish_reason == "length")
                                                       for i, o in outs]))
        return {
            "date": datetime.date.today().isoformat(), "model": llm.model_name, "device": llm.device,
            "quantization": llm.quantization, "speculative": "ngram", "deterministic": True,
            "max_tokens": max_tokens, "seeds": list(seeds), "num_prompts": len(prompts), "stop_loops": stop_loops,
            "best": best(scores).name, "presets": [asdict(s) for s in scores],
        }


def markdown(report: dict[str, Any]) -> str:
    """The report's table in Markdown: one row per preset."""
    lines = [("| preset | temperature | top-p | repetition | penalty window | freq. penalty | right | loops | "
              "cut at limit | median tokens |"), "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in report["presets"]:
        p = s["params"]
        mark = " (best)" if s["name"] == report["best"] else ""
        lines.append(f"| {s['name']}{mark} | {p.get('temperature', 1.0):g} | {p.get('top_p', 1.0):g} | "
                     f"{p.get('repetition_penalty', 1.0):g} | {_window(p.get('repeat_last_n'))} | "
                     f"{p.get('frequency_penalty', 0.0):g} | "
                     f"{s['right']}/{s['graded']} | {s['loops']}/{s['replies']} | {s['cut']}/{s['replies']} | "
                     f"{s['median_tokens']:g} |")
    return "\n".join(lines)


def _window(last_n: Any) -> str:
    """A penalty window as the table writes it: its token count, or "all" for the whole history."""
    return "all" if last_n is None or last_n < 0 else str(last_n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.eval_defaults",
                                     description="Score sampling presets of the default model on everyday prompts.")
    parser.add_argument("--prompts", type=Path, default=PROMPTS_PATH, help="the prompts file (JSON)")
    parser.add_argument("--seeds", type=int, default=len(DEFAULT_SEEDS), help="seeds per preset (0, 1, ...)")
    parser.add_argument("--preset", action="append", default=[], help="only this preset (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=APP_MAX_TOKENS, help="the reply limit")
    parser.add_argument("--stop-loops", action="store_true",
                        help="stop a reply once it loops (it still counts as a loop); a faster run")
    parser.add_argument("--markdown", action="store_true", help="print the table in Markdown after the JSON")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.max_tokens < 1:
        parser.error("--seeds and --max-tokens must be at least 1")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        prompts = load_prompts(args.prompts)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    report = run(prompts, range(args.seeds), args.preset, args.max_tokens, args.stop_loops)
    print(json.dumps(report, indent=2))
    if args.markdown:
        print()
        print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
