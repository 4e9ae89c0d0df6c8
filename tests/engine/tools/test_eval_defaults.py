"""The defaults eval's scoring on canned replies: the loop detector, the answer rules, the pick of the best preset,
and the prompt set itself. No model runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.tools.eval_defaults import (
    CANDIDATES,
    PROMPTS_PATH,
    Prompt,
    Score,
    best,
    find_loop,
    is_right,
    load_prompts,
    markdown,
    presets_for,
    score,
)

LOOPING = ("Mix the flour and the milk in a bowl. " + "Add one egg and stir the batter well. " * 3).split()
PLAIN_TEXT = ("Mix the flour, milk and one egg in a bowl. Heat a pan, pour in some batter and cook each side until "
              "golden. Serve warm with syrup.")
PLAIN = PLAIN_TEXT.split()


def test_a_window_repeated_three_times_is_a_loop() -> None:
    assert find_loop(LOOPING)
    assert not find_loop(PLAIN)


def test_twice_is_a_loop_only_in_a_reply_cut_at_the_limit() -> None:
    twice = ("Start here. " + "one two three four five six seven eight " * 2).split()
    assert not find_loop(twice)
    assert find_loop(twice, is_cut=True)
    assert not find_loop(PLAIN, is_cut=True)


def test_a_short_reply_has_no_loop() -> None:
    assert not find_loop([])
    assert not find_loop([1, 1, 1])  # shorter than one window
    assert find_loop([7] * 10)  # one token over and over: windows at 0, 1 and 2 are the same


def test_rules_need_every_group_and_take_any_alternative_case_aside() -> None:
    expect = [["flour"], ["egg", "eggs"]]
    assert is_right("Whisk FLOUR with two Eggs.", expect)
    assert not is_right("Whisk flour with milk.", expect)
    assert is_right("Buenos Días", [["buenos días", "buenos dias"]])
    assert is_right("anything", [])  # an open prompt has nothing to miss


def test_a_presets_score_counts_right_loops_cut_and_the_median_length() -> None:
    prompts = [Prompt("a", "facts", "capital?", [["paris"]]), Prompt("b", "advice", "sleep?")]
    replies = [(0, "Paris.", ["Paris", "."], False), (0, "Lyon.", ["Lyon", "."], False),
               (1, " ".join(LOOPING), LOOPING, True)]
    result = score("x", {"temperature": 0.3}, prompts, replies)
    assert (result.replies, result.graded, result.right, result.loops, result.cut) == (3, 2, 1, 1, 1)
    assert result.median_tokens == 2.0
    assert result.wrong == ["a"] and result.looped == ["b"]


def test_the_best_preset_has_most_right_then_fewest_loops() -> None:
    a = Score("a", {}, right=10, loops=3, cut=3)
    b = Score("b", {}, right=10, loops=1, cut=2)
    c = Score("c", {}, right=9, loops=0, cut=0)
    assert best([a, b, c]).name == "b"
    windows = {"a": {"repeat_last_n": 64}, "b": {}, "c": {"repeat_last_n": -1}}
    report = {"best": "b", "presets": [{"name": s.name, "params": {"temperature": 0.2, **windows[s.name]},
                                        "right": s.right, "graded": 12, "loops": s.loops, "cut": s.cut,
                                        "replies": 14, "median_tokens": 40.0} for s in (a, b, c)]}
    table = markdown(report)
    assert "| b (best) | 0.2 | 1 | 1 | all | 0 | 10/12 | 1/14 | 2/14 | 40 |" in table
    assert "| a | 0.2 | 1 | 1 | 64 | 0 | 10/12 | 3/14 | 3/14 | 40 |" in table
    assert "| c | 0.2 | 1 | 1 | all | 0 | 9/12 | 0/14 | 0/14 | 40 |" in table
    assert len(table.splitlines()) == 5


def test_presets_start_with_the_current_one_and_skip_repeats(tmp_path: Path) -> None:
    current = dict(next(iter(CANDIDATES.values())))
    found = presets_for(tmp_path, current)
    assert next(iter(found)) == "hearth" and current not in list(found.values())[1:]
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9}))
    assert presets_for(tmp_path, current)["model's own"] == {"temperature": 0.6, "top_p": 0.9}
    assert list(presets_for(tmp_path, current, only=["hearth"])) == ["hearth"]


def test_the_prompt_set_covers_everyday_tasks() -> None:
    prompts = load_prompts(PROMPTS_PATH)
    assert len(prompts) >= 30
    assert {"facts", "recipe", "code", "translation", "summary", "advice", "lists"} <= {p.category for p in prompts}
    assert len({p.id for p in prompts}) == len(prompts)
    assert sum(bool(p.expect) for p in prompts) >= 25


def test_a_malformed_prompt_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"prompts": [{"id": "a", "prompt": "hi", "expect": ["paris"]}]}))
    with pytest.raises(ValueError, match="prompt 0"):
        load_prompts(path)
    path.write_text(json.dumps({"prompts": []}))
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(path)
