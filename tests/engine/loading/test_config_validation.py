"""Impossible configs are refused at load, in words, for HF folders and GGUF files alike; nothing but ModelLoadError
comes out of ``LLM()``; a token id past the embedding is refused at load and, per request, ends only its own request.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.api import ModelLoadError, SamplingParams
from engine.loading.validate import inspect_model
from tests.reliability.crafted_folders import tiny_folder

CONFIG: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 49152,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False,
}  # fmt: skip
OPTIONS: dict[str, Any] = {"dtype": "float32", "quantization": "fp32", "start_loop": False, "kv_cache_bytes": 4 << 20}


def _folder(tmp_path: Path, tokenizer_dir: Path, **changes: Any) -> Path:
    """A small llama folder with the default model's tokenizer and ``changes`` made to its config.json only."""
    folder = tiny_folder(CONFIG, tokenizer_dir).write(tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.fixture
def folder(tmp_path: Path, default_model_dir: Path) -> Path:
    return _folder(tmp_path, default_model_dir)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"num_attention_heads": 3, "num_key_value_heads": 1}, "3 attention heads do not divide its hidden size of 64"),
        ({"num_key_value_heads": 3}, "not a multiple of its 3 key/value heads"),
        ({"num_attention_heads": 1, "num_key_value_heads": 1, "hidden_size": 63}, "head size"),
        ({"head_dim": 15}, "rotary head size is 15"),
        ({"rms_norm_eps": math.nan}, "rms_norm_eps is nan, not a positive finite number"),
        ({"rms_norm_eps": -1e-6}, "not a positive finite number"),
        ({"rms_norm_eps": math.inf}, "not a positive finite number"),
        ({"rope_theta": 0}, "rope_theta is 0"),
        ({"rope_theta": 1e-45}, "rope_theta (the rotary base) is 1e-45; a base under 1 makes the position frequencies"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}, "rope factor is -2.0"),
        ({"rope_scaling": [1, 2]}, "not a JSON object"),
        ({"intermediate_size": 0}, "intermediate_size is 0, not a positive whole number"),
        ({"vocab_size": "49152"}, "vocab_size is '49152', not a positive whole number"),
        ({"max_position_embeddings": 4}, "its context holds 4 tokens"),
        ({"architectures": 2}, "'architectures' is '2', not a list of names"),
    ],
)
def test_an_impossible_folder_config_is_refused_in_words(folder: Path, changes: dict[str, Any], words: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(ModelLoadError, match="(?i)re-download") as caught:
        inspect_model(folder)
    assert words in str(caught.value)


def test_a_config_nested_too_deep_is_refused(folder: Path) -> None:
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelLoadError, match="nests its JSON too deeply"):
        inspect_model(folder)


def _gguf(path: Path, *, heads: int = 4, kv_heads: int = 2, eps: float = 1e-5, tokens: int = 8,
          alignment: Any = None) -> Path:  # fmt: skip
    """A llama GGUF of hidden size 8 (8 embedding rows, one layer) with the given heads, epsilon and token count."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_context_length(64)
    writer.add_layer_norm_rms_eps(eps)
    if isinstance(alignment, int):
        writer.add_uint32("general.alignment", alignment)  # add_custom_alignment refuses what a crafted file holds
    elif alignment is not None:
        writer.add_string("general.alignment", alignment)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(tokens)])
    writer.add_tensor("token_embd.weight", np.zeros((8, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"heads": 3, "kv_heads": 1}, "3 attention heads do not divide its hidden size of 8"),
        ({"heads": 4, "kv_heads": 3}, "not a multiple of its 3 key/value heads"),
        ({"heads": 8, "kv_heads": 8}, "rotary head size is 1"),
        ({"eps": math.nan}, "rms_norm_eps is nan"),
        ({"eps": -1.0}, "rms_norm_eps is -1.0"),
        ({"tokens": 9}, "its tokenizer has 9 tokens but its vocabulary (the embedding) only 8"),
    ],
)
def test_an_impossible_gguf_is_refused_in_words(tmp_path: Path, options: dict[str, Any], words: str) -> None:
    path = _gguf(tmp_path / "model.gguf", **options)
    with pytest.raises(ModelLoadError, match="Re-download it") as caught:
        inspect_model(path)
    assert words in str(caught.value)


def test_the_same_gguf_with_a_possible_shape_passes(tmp_path: Path) -> None:
    assert inspect_model(_gguf(tmp_path / "model.gguf")).format == "gguf"


@pytest.mark.parametrize("alignment", ["32", 3])
def test_a_gguf_alignment_of_the_wrong_type_or_not_a_power_of_two_is_refused(tmp_path: Path, alignment: Any) -> None:
    path = _gguf(tmp_path / "model.gguf", alignment=alignment)
    with pytest.raises(ModelLoadError, match="general.alignment"):
        inspect_model(path)


def test_a_gguf_alignment_of_infinity_is_refused(tmp_path: Path) -> None:
    raw = bytearray(_gguf(tmp_path / "model.gguf").read_bytes())
    key = b"general.alignment"
    entry = struct.pack("<Q", len(key)) + key + struct.pack("<Id", 12, math.inf)
    n_kvs = struct.unpack_from("<Q", raw, 16)[0]
    struct.pack_into("<Q", raw, 16, n_kvs + 1)
    path = tmp_path / "inf.gguf"
    path.write_bytes(bytes(raw[:24]) + entry + bytes(raw[24:]))
    with pytest.raises(ModelLoadError, match="general.alignment is 'inf'"):
        inspect_model(path)


# --- what LLM() lets out ----------------------------------------------------------------------------------------


def test_llm_turns_a_deeply_nested_config_into_a_model_load_error(folder: Path) -> None:
    from engine import LLM

    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelLoadError, match="too deeply"):
        LLM(folder, **OPTIONS)


def test_llm_refuses_weights_that_make_every_request_fail(tmp_path: Path, default_model_dir: Path) -> None:
    from engine import LLM

    base = tiny_folder(CONFIG, default_model_dir)
    header = base.header["model.norm.weight"]
    begin, end = header["data_offsets"]
    data = bytearray(base.data)
    data[begin:end] = np.full((end - begin) // 4, np.nan, dtype=np.float32).tobytes()
    base.data = bytes(data)
    with pytest.raises(ModelLoadError, match="first request failed .*NaN"):
        LLM(base.write(tmp_path / "nan"), **OPTIONS)


def test_llm_refuses_an_embedding_row_of_nan(tmp_path: Path, default_model_dir: Path) -> None:
    from engine import LLM

    base = tiny_folder(CONFIG, default_model_dir)
    begin = base.header["model.embed_tokens.weight"]["data_offsets"][0]
    data = bytearray(base.data)
    row = 30000 * CONFIG["hidden_size"] * 4
    data[begin + row : begin + row + 4] = np.float32(np.inf).tobytes()
    base.data = bytes(data)
    with pytest.raises(ModelLoadError, match="embedding holds NaN or infinite values"):
        LLM(base.write(tmp_path / "inf-row"), **OPTIONS)


# --- token ids past the embedding (item 5) ----------------------------------------------------------------------


def test_a_tokenizer_with_ids_past_the_embedding_is_refused_at_load(tmp_path: Path, default_model_dir: Path) -> None:
    from engine import LLM

    base = tiny_folder(CONFIG, default_model_dir)
    base.tokenizer["added_tokens"].append({"id": 60000, "content": "<|beyond|>", "single_word": False,
                                          "lstrip": False, "rstrip": False, "normalized": False, "special": True})  # fmt: skip
    with pytest.raises(ModelLoadError, match=r"token ids up to \d+ but its embedding has only 49152 rows"):
        LLM(base.write(tmp_path / "beyond"), **OPTIONS)


class _Beyond:
    """The model's tokenizer, except that a prompt with "BEYOND" in it gets a token id past the embedding."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def __call__(self, text: str, **kwargs: Any) -> dict[str, list[int]]:
        ids = list(self._tokenizer(text, **kwargs)["input_ids"])
        return {"input_ids": [*ids, 10**6] if "BEYOND" in text else ids}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def test_a_prompt_id_past_the_embedding_fails_only_its_own_request(folder: Path) -> None:
    from engine import LLM

    llm = LLM(folder, **OPTIONS)
    try:
        llm.engine.intake.tokenizer = _Beyond(llm.engine.intake.tokenizer)
        greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        other = llm.engine.submit("Hello there", greedy)
        with pytest.raises(ValueError, match="token id 1000000, outside the model's vocabulary of 49152"):
            llm.engine.submit("Hello BEYOND", greedy)
        while not other.done():
            llm.engine.step()
        assert other.result().finish_reason == "length"
    finally:
        llm.close()


def test_llm_turns_a_path_that_cannot_be_looked_at_into_a_model_load_error(tmp_path: Path) -> None:
    from engine import LLM

    with pytest.raises(ModelLoadError, match="Cannot look at .*too long"):
        LLM(tmp_path / ("x" * 300), **OPTIONS)
