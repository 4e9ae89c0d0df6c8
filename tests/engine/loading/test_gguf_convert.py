"""A GGUF's config, tokenizer and (default model) weights, converted by ``engine/loading/gguf_convert.py``, are
the files transformers' GGUF loader and ``save_pretrained`` write: key by key, token by token, bit by bit.

The files: the default model's GGUF, and tiny ones from ``engine.tools.make_gguf`` (llama and qwen2 shapes), with
variants of their metadata for what the converter must follow: qwen3 and mistral, BOS/EOS added, no unknown or
padding token and no chat template, the llama-bpe and qwen2 splits, token types (a normal EOS, user-defined
tokens, a control token outside the byte alphabet) and an untied head.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.loading import gguf_convert
from engine.loading.default_model import source_gguf_path
from engine.tools.make_gguf import write_gguf

TEXTS = [
    "Hello, world! What is the capital of France?",
    "  leading spaces,\ttabs\t\tand\n\n\nnewlines   \r\n trailing  ",
    "Ünïcödé: café, naïve, Straße, 日本語のテキスト, 한국어, русский, emoji 🙂👍🏽 and € signs",
    "def f(x):\n    return [i ** 2 for i in range(x) if i % 3 != 0]  # squares\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|><repo_name>x<file_sep>",
    "numbers 1234567 3.14159 1e-9 0x1F and don't, we'll, I'M, it's",
    "",
    " ",
    "!!!???... --- ***",
]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bonjour 🙂\n  code: `x = 1`"},
            {"role": "assistant", "content": "Salut !"}, {"role": "user", "content": "Encore"}]  # fmt: skip


def _variant(src: Path, dst: Path, arch: str | None = None, replace: dict[str, Any] | None = None,
             drop: tuple[str, ...] = (), add: dict[str, Any] | None = None, untie: bool = False) -> Path:
    """A copy of ``src`` with another architecture (its keys renamed) and changed metadata; ``untie`` adds an
    output.weight (a copy of the embedding)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    old = reader.fields["general.architecture"].contents()
    new = arch or old
    writer = GGUFWriter(dst, new)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        value = (replace or {}).get(key, field.contents())
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(new + key[len(old):] if key.startswith(old + ".") else key, value, field.types[0],
                             sub_type=sub)  # fmt: skip
    for key, (value, vtype) in (add or {}).items():
        writer.add_key_value(key, value, vtype)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_shape=tensor.data.shape,
                          raw_dtype=tensor.tensor_type)  # fmt: skip
        if untie and tensor.name == "token_embd.weight":
            writer.add_tensor("output.weight", np.asarray(tensor.data), raw_shape=tensor.data.shape,
                              raw_dtype=tensor.tensor_type)  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _typed_tokens(src: Path) -> dict[str, Any]:
    """Token types to test: a normal EOS, user-defined tokens, a control token and a plain one respelled."""
    from gguf import GGUFReader

    reader = GGUFReader(src)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    used = {part for merge in merges for part in (*merge.split(" "), merge.replace(" ", ""))}
    free = [i for i in range(17, len(tokens)) if tokens[i] not in used]  # renaming these breaks no merge
    types[2], types[5], types[free[0]] = 1, 4, 4
    tokens[6], tokens[free[1]] = "<|é€|>", "€x"
    return {"tokenizer.ggml.token_type": types, "tokenizer.ggml.tokens": tokens}


def _reference(path: Path, out: Path) -> Any:
    """transformers' conversion of the GGUF's config and tokenizer into ``out``; returns its tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True).save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    tokenizer.save_pretrained(out)
    return tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Any]]:
    """Each tiny GGUF: (our folder, transformers' folder, transformers' GGUF tokenizer)."""
    from gguf import GGUFValueType

    root = tmp_path_factory.mktemp("gguf")
    llama, qwen2 = root / "llama.gguf", root / "qwen2.gguf"
    write_gguf(llama, "tiny", "Q4_0", layers=1, vocab=2000)
    write_gguf(qwen2, "qwen-1.5b", "Q4_0", layers=1, vocab=2000)
    files = {"llama": llama, "qwen2": qwen2}
    variants: dict[str, dict[str, Any]] = {
        "qwen3": {"arch": "qwen3"},
        "mistral": {"replace": {"general.name": "mistral"}},
        "bos": {"replace": {"tokenizer.ggml.add_bos_token": True}},
        "eos": {"add": {"tokenizer.ggml.add_eos_token": (True, GGUFValueType.BOOL)}},
        "bare": {"drop": ("tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                          "tokenizer.chat_template", "tokenizer.ggml.add_bos_token", "llama.rope.freq_base")},
        "llama-bpe": {"replace": {"tokenizer.ggml.pre": "llama-bpe"}},
        "qwen3-split": {"arch": "qwen3", "replace": {"tokenizer.ggml.pre": "qwen2"}},
        "types": {"replace": _typed_tokens(llama)},
        "untied": {"untie": True},
    }  # fmt: skip
    for name, change in variants.items():
        files[name] = _variant(llama, root / f"{name}.gguf", **change)
    out = {}
    for name, path in files.items():
        ours, theirs = root / f"ours-{name}", root / f"theirs-{name}"
        ours.mkdir()
        theirs.mkdir()
        gguf_convert.write_side_files(path, ours)
        out[name] = (ours, theirs, _reference(path, theirs))
    return out


def _reference_model(source: Path, out: Path, cache: Any) -> None:
    """transformers' conversion of the default model's GGUF (dequantized to bf16, ``save_pretrained``) into ``out``.

    Loading the GGUF through transformers is most of this module's time (about 20 s on a quiet machine), and the same
    versions of transformers, gguf and torch write the same files from the same GGUF: so a run keeps a copy in
    pytest's cache (``.pytest_cache``, keyed by those versions and the GGUF's sha256) and a later run copies it. A
    fresh clone, or ``-p no:cacheprovider``, makes it here.
    """
    from importlib.metadata import version

    from transformers import AutoModelForCausalLM, GgufConfig

    from engine.loading.default_model import GGUF_SHA256

    def make(folder: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.bfloat16,
                                                     quantization_config=GgufConfig(dequantize=True))  # fmt: skip
        model.save_pretrained(folder)

    if cache is None:
        make(out)
        return
    key = "-".join([GGUF_SHA256[:16], *(f"{name}{version(name)}" for name in ("transformers", "gguf", "torch"))])
    root = Path(cache.mkdir("gguf-convert-reference"))
    kept = root / key
    if not kept.is_dir():
        scratch = Path(tempfile.mkdtemp(dir=root, prefix=".making-"))
        make(scratch)
        try:
            scratch.rename(kept)  # whole or not at all
        except OSError:  # another run kept it first
            shutil.rmtree(scratch)
    shutil.copytree(kept, out, dirs_exist_ok=True)


@pytest.fixture(scope="module")
def default(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> tuple[Path, Path, list[tuple[float, str]], Any]:
    """The default model converted by us and by transformers (dequantized to bf16, saved); our progress reports;
    transformers' GGUF tokenizer."""
    from transformers import AutoTokenizer

    source = source_gguf_path()
    ours, theirs = tmp_path_factory.mktemp("ours"), tmp_path_factory.mktemp("theirs")
    reports: list[tuple[float, str]] = []
    gguf_convert.write_model(source, ours, lambda fraction, stage: reports.append((fraction, stage)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # as default_model converted it before
        _reference_model(source, theirs, getattr(pytestconfig, "cache", None))
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        tokenizer.save_pretrained(theirs)
    return ours, theirs, reports, tokenizer


def _same_files(ours: Path, theirs: Path, skip: tuple[str, ...] = ()) -> None:
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
    for path in theirs.iterdir():
        if path.name in skip:
            continue
        if path.suffix == ".json":  # key by key first, for a readable failure
            assert json.loads((ours / path.name).read_text()) == json.loads(path.read_text()), path.name
        assert (ours / path.name).read_bytes() == path.read_bytes(), path.name


def _same_tokens(folder: Path, reference: Any) -> None:
    from transformers import AutoTokenizer

    from engine.loading.native import load_tokenizer

    for tokenizer in (AutoTokenizer.from_pretrained(str(folder), local_files_only=True), load_tokenizer(folder)):
        for text in TEXTS:
            ids = reference(text)["input_ids"]
            assert tokenizer(text)["input_ids"] == ids, text
            assert tokenizer.decode(ids) == reference.decode(ids), text
            assert tokenizer.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
        if reference.chat_template:
            expected = reference.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
            assert tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True) == expected


def test_tiny_files_equal_transformers(tiny: dict[str, tuple[Path, Path, Any]]) -> None:
    for name, (ours, theirs, _) in tiny.items():
        try:
            _same_files(ours, theirs)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


# Not "qwen2"/"qwen3": a folder of a Qwen type loads as Qwen2Tokenizer, which splits text as Qwen does whatever the
# folder says, so a Qwen file with another vocabulary's split (here SmolLM's) reads its own saved folder differently
# from its GGUF (transformers' saved folder too: the files above are the same bytes). "qwen3-split" is a real one.
@pytest.mark.parametrize("name", ["llama", "mistral", "bos", "eos", "bare", "llama-bpe", "qwen3-split", "types"])
def test_tiny_tokenizers_encode_as_transformers(tiny: dict[str, tuple[Path, Path, Any]], name: str) -> None:
    ours, _, reference = tiny[name]
    _same_tokens(ours, reference)


def test_default_model_equals_transformers(default: tuple[Path, Path, list[tuple[float, str]], Any]) -> None:
    from safetensors.torch import load_file

    from engine.loading.native import load_tokenizer

    ours, theirs, reports, reference_tokenizer = default
    _same_files(ours, theirs, skip=("model.safetensors",))
    mine, reference = load_file(ours / "model.safetensors"), load_file(theirs / "model.safetensors")
    assert sorted(mine) == sorted(reference) and "lm_head.weight" not in mine  # tied: no head of its own
    for name, expected in reference.items():
        assert mine[name].dtype == expected.dtype == torch.bfloat16, name
        assert torch.equal(mine[name].view(torch.int16), expected.view(torch.int16)), name  # bit for bit
    stages = [stage for _, stage in reports]
    assert stages[0] == "convert" and "convert 272/272" in stages and stages[-1] == "save"
    assert [f for f, _ in reports] == sorted(f for f, _ in reports) and reports[-1][0] == 1.0
    _same_tokens(ours, reference_tokenizer)
    assert load_tokenizer(ours)("<|im_start|>assistant\n")["input_ids"] == [1, 520, 9531, 198]


def test_side_files_need_no_transformers(tiny: dict[str, tuple[Path, Path, Any]], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it now fails
    llama_folder = tiny["llama"][0]
    gguf = llama_folder.parent / "llama.gguf"
    gguf_convert.write_side_files(gguf, tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() == (llama_folder / "tokenizer.json").read_bytes()


def test_other_tokenizers_fall_back_to_transformers(
    tiny: dict[str, tuple[Path, Path, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    import transformers

    calls: list[str] = []

    class Saved:
        def save_pretrained(self, out: Path) -> None:
            (Path(out) / "tokenizer_config.json").write_text("{}")

    def fake(where: str, gguf_file: str, **_: Any) -> Saved:
        calls.append(gguf_file)
        return Saved()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake)
    metadata, _ = gguf_convert.read(tiny["llama"][0].parent / "llama.gguf")
    assert not gguf_convert.write_tokenizer({**metadata, "tokenizer.ggml.model": "llama"}, "llama", tmp_path)
    assert not gguf_convert.write_tokenizer(metadata, "gemma", tmp_path)
    assert list(tmp_path.iterdir()) == []
    spm = _variant(tiny["llama"][0].parent / "llama.gguf", tmp_path / "spm.gguf",
                   replace={"tokenizer.ggml.model": "llama"})  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    with caplog.at_level(logging.INFO, logger="engine"):
        gguf_convert.write_side_files(spm, out)
    assert calls == ["spm.gguf"] and "converted by transformers" in caplog.text
    assert (out / "config.json").is_file()

