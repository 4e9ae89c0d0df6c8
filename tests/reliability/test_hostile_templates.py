"""Chat templates that would spend unbounded time or memory fail fast, in words, and normal ones render unchanged.

Each hostile template renders in a child process with a time limit and an address-space cap, so an unbounded
render fails its test instead of hanging the suite or exhausting the machine's memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.loading.chat_render import ChatTemplateLimitError, render_chat
from tests.engine.transformers_tokenizers import llama_folder, qwen2_folder

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "What is 2+2?"}]  # fmt: skip

HOSTILE = {
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested_loops_output": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "string_times": "{{ 'x' * 3000000000 }}",
    "list_times": "{% set l = [1] * 3000000000 %}{{ l | length }}",
    "huge_range": "{% for i in range(10**12) %}{{ i }}{% endfor %}",
    "power": "{% set n = 10 %}{{ n ** 3000000000 }}",
    "doubling_plus": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}{{ ns.s | length }}",
    "doubling_tilde": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                      "{% endfor %}{{ ns.s | length }}",
    "doubling_block": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set t %}{{ ns.s }}{{ ns.s }}"
                      "{% endset %}{% set ns.s = t %}{% endfor %}{{ ns.s | length }}",
    "recursive_macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "branching_macro": "{% macro f(n) %}{% if n < 60 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
    "center_filter": "{{ 'x' | center(3000000000) }}",
    "center_method": "{{ 'x'.center(3000000000) }}",
    "format_width": "{{ '{:>3000000000}'.format('x') }}",
    "percent_width": "{{ '%3000000000s' % 'x' }}",
    "replace_blowup": "{% set s = 'x' * 100000 %}{{ s.replace('x', s) | length }}",
    "join_blowup": "{% set s = 'x' * 1000000 %}{{ ([s] * 100000) | join('') | length }}",
    "list_repr": "{% set s = 'x' * 1000000 %}{{ [s] * 100000 }}",
    "string_loops": "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
}

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
    from engine.loading.chat_render import render_chat
    template = sys.stdin.read()
    start = time.monotonic()
    try:
        text = render_chat(template, [{"role": "user", "content": "hi"}], None, None, True, False, {})
        result = {"ok": len(text)}
    except Exception as e:
        result = {"error": type(e).__name__, "message": str(e)}
    result["seconds"] = time.monotonic() - start
    # this process's own peak (VmHWM): ru_maxrss would carry the parent's peak over fork and exec
    with open("/proc/self/status") as status:
        result["rss_kib"] = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(json.dumps(result))
""")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_fails_fast_in_words(name: str) -> None:
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD], input=HOSTILE[name], capture_output=True, text=True,
                              timeout=30, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: the render still ran after 30 s")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.get("error") == "ChatTemplateLimitError", result
    assert "chat template exceeded a limit" in result["message"]
    assert "override the chat template" in result["message"]
    assert result["seconds"] < 5, result
    assert result["rss_kib"] < 1024 * 1024, result  # under 1 GiB


# The same templates in the engine's path for tokenizers that load through transformers (Qwen2Tokenizer,
# LlamaTokenizer): one child loads each and renders the cases in turn, each case's peak memory on its own
# (clear_refs resets VmHWM), under a cap of 3 GiB past what loading took. The cases that spend a whole step or time
# budget (seconds each) run through the first tokenizer only: the budgets are the renderer's, whatever the tokenizer.
_BUDGET_CASES = ("nested_loops", "nested_loops_output", "branching_macro", "string_loops")
_TOKENIZER_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from pathlib import Path
    from engine.core.chat_template import chat_token_ids
    from engine.loading.native import load_tokenizer

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

    given = json.loads(sys.stdin.read())
    tokenizers = {kind: load_tokenizer(Path(folder)) for kind, folder in given["folders"].items()}
    for kind, tokenizer in tokenizers.items():
        print(json.dumps({"kind": kind, "class": type(tokenizer).__name__}), flush=True)
    cap = status("VmSize") * 1024 + 3 * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    for kind, tokenizer in tokenizers.items():
        for name, template in given["templates"][kind].items():
            tokenizer.chat_template = template
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            start = time.monotonic()
            try:
                ids = chat_token_ids(tokenizer, [{"role": "user", "content": "hi"}], True, False)
                result = {"ok": len(ids)}
            except Exception as e:
                result = {"error": type(e).__name__, "message": str(e)}
            result.update(kind=kind, name=name, seconds=time.monotonic() - start, rss_kib=status("VmHWM"))
            print(json.dumps(result), flush=True)
""")


def test_hostile_templates_fail_fast_through_transformers_tokenizers(
    default_model_dir: Path, tmp_path: Path, repo_root: Path
) -> None:
    """A Qwen2 GGUF's tokenizer, a SentencePiece one and other non-plain ones load through transformers, whose own
    render has no bounds: the engine renders their templates within the same bounds."""
    folders = {"Qwen2Tokenizer": qwen2_folder(default_model_dir, tmp_path / "qwen2"),
               "LlamaTokenizer": llama_folder(tmp_path / "llama")}  # fmt: skip
    cases = [(kind, name) for kind in folders for name in HOSTILE
             if kind == "Qwen2Tokenizer" or name not in _BUDGET_CASES]  # fmt: skip
    templates = {kind: {name: HOSTILE[name] for k, name in cases if k == kind} for kind in folders}
    given = {"folders": {k: str(v) for k, v in folders.items()}, "templates": templates}
    try:
        done = subprocess.run([sys.executable, "-c", _TOKENIZER_CHILD], input=json.dumps(given), capture_output=True,
                              text=True, timeout=60, check=False, cwd=repo_root)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        finished = max(len(out.strip().splitlines()) - len(folders), 0)
        pytest.fail(f"{cases[min(finished, len(cases) - 1)]} still rendered after 60 s ({finished} cases done)")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert {line["kind"]: line["class"] for line in lines[: len(folders)]} == {k: k for k in folders}
    results = lines[len(folders) :]
    assert [(r["kind"], r["name"]) for r in results] == cases
    for result in results:
        assert result.get("error") == "ChatTemplateLimitError", result
        assert "chat template exceeded a limit" in result["message"]
        assert result["seconds"] < 5, result
        assert result["rss_kib"] < 1024 * 1024, result  # under 1 GiB, the loaded tokenizers and torch included


def test_limit_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="exceeded a limit"):
        render_chat(HOSTILE["string_times"], CHAT, None, None, True, False, {})
    assert issubclass(ChatTemplateLimitError, ValueError)


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set system = false %}{% set loop_messages = messages %}"
    "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{% if loop.first and system %}{{ '[INST] ' + system + '\\n\\n' + "
    "message['content'] + ' [/INST]' }}{% else %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)
TOOLS_TEMPLATE = (
    "{%- set ns = namespace(n=0) -%}{%- if tools %}{{ 'Tools: ' ~ (tools | tojson) ~ '\\n' }}{%- endif %}"
    "{%- for m in messages %}{%- set ns.n = ns.n + 1 %}{{ '%d. %s: %s' | format(ns.n, m.role, m.content) }}\n"
    "{%- if not loop.last %}{{ '-' * 3 }}{% endif %}{%- endfor %}{{ ', '.join(['a', 'b']) ~ ' ' ~ 'x'.upper() }}"
    "{%- for i in range(3) %}{{ i }}{% endfor %}{{ 'a b'.split() | join('|') | center(9) }}"
)


@pytest.mark.parametrize("template", [CHATML, LLAMA3, MISTRAL, TOOLS_TEMPLATE], ids=["chatml", "llama3", "mistral",
                                                                                  "tools"])  # fmt: skip
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_normal_templates_render_as_transformers_does(template: str, add_generation_prompt: bool) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    tools: list[Any] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    values: dict[str, Any] = {"bos_token": "<s>", "eos_token": "</s>"}
    ours = render_chat(template, CHAT, tools, None, add_generation_prompt, False, values)
    theirs = render_jinja_template([CHAT], tools=tools, chat_template=template,
                                   add_generation_prompt=add_generation_prompt, **values)  # fmt: skip
    theirs = theirs[0][0] if isinstance(theirs, tuple) else theirs
    assert ours == theirs


def test_long_conversation_stays_within_bounds() -> None:
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 50} for i in range(2000)]
    text = render_chat(CHATML, chat, None, None, True, False, {})
    assert text.count("<|im_start|>") == 2001
