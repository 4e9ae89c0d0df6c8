"""engine/loading/tokenizer.py against transformers' AutoTokenizer on the same files, and loads without transformers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.loading import native
from engine.loading.tokenizer import Tokenizer, is_plain
from tests.engine.conftest import TOKENIZER_FILES, build_tiny_model

TEXTS = [
    "Hello, world!",
    "  leading,  double  spaces\n\n\ttabs and trailing   ",
    "héllo wörld ünïcödé 日本語 中文 עברית",
    "emoji 🎉🔥 and a family 👩‍👩‍👧 done",
    "def f(x):\n    return {'a': x ** 2}  # code\n",
    "<|im_start|>user\nforged<|im_end|> and a<|endoftext|>b",
    "w1 w2 <unk> w300 <extra_0> w3",
    "",
    " ",
    "\n",
    "They 're here , aren 't they ? Yes !",
]
CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "Four"},
        {"role": "user", "content": "And émoji 🎉 in ``` code ```?"},
    ],
    [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": "Once upon a "}],
    [{"role": "user", "content": "a", "name": None}, {"role": "assistant", "content": "b", "tool_calls": None}],
]
#: Exercises what transformers' sandbox offers templates: namespace, loop controls, tojson, raise_exception.
TEMPLATE = (
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('bad role') }}"
    "{% endif %}{% set ns.n = ns.n + 1 %}{% if loop.index > 8 %}{% break %}{% endif %}"
    "<s>{{ m.role }}\n{{ m.content | trim }}{% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %}"
    "</s>\n{% endfor %}{% if tools %}{{ tools | tojson(indent=1) }}{% endif %}{{ ns.n }}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def _words_folder(folder: Path, config: dict[str, Any], files: dict[str, Any] | None = None) -> Path:
    """A folder with a 300-word word-level tokenizer (``<unk>`` in the vocabulary, not an added token; no decoder, so
    words decode joined by spaces and the clean-up of spaces before punctuation applies)."""
    from tokenizers import AddedToken, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    folder.mkdir(parents=True)
    words = [f"w{i}" for i in range(1, 290)] + [".", ",", "?", "!", "'", "re", "s", "t", "n", "They", "aren"]
    backend = Backend(models.WordLevel({"<unk>": 0, **{w: i for i, w in enumerate(words, 1)}}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_tokens([AddedToken("<extra_0>", special=False)])
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))
    for name, content in (files or {}).items():
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    legacy = {  # no added_tokens_decoder: special_tokens_map.json wins, additional_special_tokens become extra ones
        "unk_token": "<unk>", "bos_token": "w1", "pad_token": "w2", "chat_template": TEMPLATE,
        "clean_up_tokenization_spaces": True, "additional_special_tokens": ["<tool>"],
    }  # fmt: skip
    # fmt: off
    added = {  # a v4-style config: added tokens with their flags, serialized AddedTokens, several templates
        "added_tokens_decoder": {
            "300": {"content": "<extra_0>", "lstrip": False, "normalized": False, "rstrip": True,
                    "single_word": False, "special": True},
        },
        "eos_token": {"__type": "AddedToken", "content": "<eos>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False},
        "unk_token": "<unk>", "add_bos_token": True, "padding_side": "left", "image_token": "<image>",
        "chat_template": [{"name": "default", "template": TEMPLATE},
                          {"name": "tool_use", "template": "tools: {{ tools | tojson }} " + TEMPLATE}],
    }
    # fmt: on
    return {
        "default": default_model_dir,
        "tiny llama": build_tiny_model("llama", root / "tiny-llama", default_model_dir),
        "legacy words": _words_folder(
            root / "legacy", legacy, {"special_tokens_map.json": {"eos_token": {"content": "w3"}}}
        ),
        "added words": _words_folder(root / "added", added),
    }


@pytest.fixture(scope="module", params=["default", "tiny llama", "legacy words", "added words"])
def pair(request: pytest.FixtureRequest, folders: dict[str, Path]) -> tuple[Tokenizer, Any]:
    from transformers import AutoTokenizer

    folder = folders[request.param]
    assert is_plain(folder)
    return Tokenizer(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def test_special_tokens_and_vocabulary_match(pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = pair
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "image_token",
                 "all_special_tokens", "all_special_ids", "special_tokens_map", "vocab_size",
                 "chat_template", "padding_side", "clean_up_tokenization_spaces"):  # fmt: skip
        assert getattr(ours, name, None) == getattr(hf, name, None), name
        if name.endswith("_token"):
            assert getattr(ours, f"{name}_id", None) == getattr(hf, f"{name}_id", None), name
    assert len(ours) == len(hf)
    assert ours.get_vocab() == hf.get_vocab()
    assert {i: repr(t) for i, t in ours.added_tokens_decoder.items()} == {
        i: repr(t) for i, t in hf.added_tokens_decoder.items()
    }
    assert ours.convert_tokens_to_ids(["w1", "<|im_end|>", "no-such-token"]) == hf.convert_tokens_to_ids(
        ["w1", "<|im_end|>", "no-such-token"]
    )


def test_encode_and_decode_match(pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = pair
    for text in TEXTS:
        for special in (True, False):
            expected = hf(text, add_special_tokens=special)
            assert ours(text, add_special_tokens=special) == dict(expected), text
            assert ours.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special)
            split = hf(text, add_special_tokens=special, split_special_tokens=True)["input_ids"]
            assert ours(text, add_special_tokens=special, split_special_tokens=True)["input_ids"] == split, text
        ids = hf(text)["input_ids"]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
    sample = [*range(0, len(hf), max(1, len(hf) // 300)), *hf.all_special_ids]
    for skip in (True, False):
        assert ours.decode(sample, skip_special_tokens=skip) == hf.decode(sample, skip_special_tokens=skip)
        assert ours.convert_ids_to_tokens(sample, skip) == hf.convert_ids_to_tokens(sample, skip)
    assert ours.decode([sample[:5], sample[5:9]]) == hf.decode([sample[:5], sample[5:9]])
    assert ours(TEXTS[:3]) == dict(hf(TEXTS[:3]))


def test_padded_batches_match(pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = pair
    if hf.pad_token is None:
        return
    for side in ("left", "right"):
        got = ours(TEXTS[:4], padding=True, padding_side=side, return_tensors="pt")
        want = hf(TEXTS[:4], padding=True, padding_side=side, return_tensors="pt")
        assert set(got) == set(want) and all(bool((got[k] == want[k]).all()) for k in want)


def test_chat_templates_render_alike(pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = pair
    for chat in CHATS:
        options = [{"add_generation_prompt": True}, {"add_generation_prompt": False}]
        if chat[-1]["role"] == "assistant" and chat[-1]["content"].endswith(" "):
            options.append({"continue_final_message": True})
        for kw in options:
            assert ours.apply_chat_template(chat, tokenize=False, **kw) == hf.apply_chat_template(chat, tokenize=False, **kw)
            assert ours.apply_chat_template(chat, **kw) == dict(hf.apply_chat_template(chat, **kw))
            assert ours.apply_chat_template(chat, return_dict=False, **kw) == hf.apply_chat_template(
                chat, return_dict=False, **kw
            )
    tools = [{"type": "function", "function": {"name": "now", "description": "é", "parameters": {}}}]
    chat = CHATS[1]
    assert ours.apply_chat_template(chat, tools=tools, tokenize=False) == hf.apply_chat_template(
        chat, tools=tools, tokenize=False
    )


def test_template_errors_and_sandbox_match(folders: dict[str, Path]) -> None:
    import jinja2
    from transformers import AutoTokenizer

    folder = folders["legacy words"]
    ours, hf = Tokenizer(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    for tokenizer in (ours, hf):
        with pytest.raises(jinja2.exceptions.TemplateError, match="bad role"):
            tokenizer.apply_chat_template([{"role": "bad", "content": "x"}], tokenize=False)
        with pytest.raises(jinja2.exceptions.SecurityError):
            tokenizer.apply_chat_template(CHATS[0], chat_template="{{ messages.append(1) }}", tokenize=False)
        with pytest.raises(jinja2.exceptions.SecurityError):
            tokenizer.apply_chat_template(CHATS[0], chat_template="{% set n = namespace(_x=1) %}", tokenize=False)
        with pytest.raises(ValueError, match="empty conversation"):
            tokenizer.apply_chat_template([], tokenize=False)


def test_other_tokenizer_classes_still_load_through_transformers(default_model_dir: Path, tmp_path: Path) -> None:
    for name in (*TOKENIZER_FILES, "config.json"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizer"}))
    assert not is_plain(tmp_path)
    assert type(native.load_tokenizer(tmp_path)).__module__.startswith("transformers.")
    assert isinstance(native.load_tokenizer(default_model_dir), Tokenizer)


@pytest.mark.slow  # loads the default model in a fresh interpreter
def test_default_model_starts_without_importing_transformers(default_model_dir: Path, repo_root: Path) -> None:
    """transformers costs most of a second of every start; the default model (the native path) never imports it."""
    code = (
        "import sys\nfrom engine.core.llm import LLM\n"
        "llm = LLM('default', start_loop=False, kv_cache_bytes=16 << 20)\n"
        "ids = llm.engine.tokenize([{'role': 'user', 'content': 'Hi <|im_end|>'}])\n"
        "assert ids and llm.tokenizer.decode(ids), ids\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HEARTH_DATA_DIR": str(default_model_dir.parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, env=env, capture_output=True, text=True,
                         timeout=300, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
