"""The random-weight GGUF generator (``engine/tools/make_gguf.py``, ``engine/tools/random_blocks.py``).

Files here keep 512 tokens of the default tokenizer (``vocab=``): ``gguf.GGUFReader`` and transformers' conversion
then open them at once, where the full 49152-token tokenizer takes them seconds.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import Q4_K, dequantize

from engine.loading.default_model import source_gguf_path
from engine.tools.make_gguf import (
    FILE_TYPES,
    SHAPES,
    main,
    plan,
    tokenizer_fields,
    truncate_vocab,
    write_gguf,
)
from engine.tools.random_blocks import BLOCK_TYPES, pack_k_scales, random_tensor

Q = GGMLQuantizationType
SMALL_VOCAB = 512


def _sane(values: np.ndarray, what: str) -> None:
    assert np.isfinite(values).all(), what
    assert 0.016 < float(values.std()) < 0.025, (what, float(values.std()))
    assert abs(float(values.mean())) < 0.004, (what, float(values.mean()))
    assert float(np.abs(values).max()) < 0.15, what


@pytest.mark.parametrize("qtype", [*BLOCK_TYPES, Q.F16], ids=lambda t: t.name)
def test_random_blocks_dequantize_to_weights_of_a_trained_scale(qtype: GGMLQuantizationType) -> None:
    data = random_tensor(np.random.default_rng(7), qtype, 64, 512)
    values = dequantize(data, qtype) if data.dtype == np.uint8 else data.astype(np.float32)
    assert values.shape == (64, 512)
    _sane(values, qtype.name)


def test_k_scales_are_packed_as_ggml_unpacks_them() -> None:
    rng = np.random.default_rng(3)
    sc, m = (rng.integers(0, 64, (100, 8), dtype=np.uint8) for _ in range(2))
    got_sc, got_m = Q4_K.get_scale_min(pack_k_scales(sc, m))
    assert np.array_equal(got_sc.reshape(100, 8), sc)
    assert np.array_equal(got_m.reshape(100, 8), m)


def _expected_type(file_type: str, name: str) -> GGMLQuantizationType:
    """The tiny shape's mix, spelled out (2 layers: use_more_bits holds for layer 1 only; embeddings tied)."""
    if name.endswith("norm.weight"):
        return Q.F32
    if file_type in ("Q4_K_M", "Q4_0") and name == "token_embd.weight":
        return Q.Q6_K
    if file_type == "Q4_K_M":
        return Q.Q6_K if name in ("blk.1.attn_v.weight", "blk.1.ffn_down.weight") else Q.Q4_K
    return Q.__members__[file_type]


@pytest.mark.parametrize("file_type", list(FILE_TYPES))
def test_each_type_reads_back_with_llama_quantizes_mix(file_type: str, tmp_path: Path) -> None:
    out = tmp_path / f"tiny-{file_type}.gguf"
    specs = write_gguf(out, "tiny", file_type, vocab=SMALL_VOCAB)
    reader = GGUFReader(out)
    field = {key: f.contents() for key, f in reader.fields.items()}
    assert field["general.architecture"] == "llama"
    assert field["general.file_type"] == int(FILE_TYPES[file_type])
    assert (field["llama.block_count"], field["llama.embedding_length"], field["llama.feed_forward_length"]) == \
        (2, 256, 768)  # fmt: skip
    assert (field["llama.attention.head_count"], field["llama.attention.head_count_kv"]) == (4, 2)
    assert field["llama.vocab_size"] == len(field["tokenizer.ggml.tokens"]) == SMALL_VOCAB
    source = {key: value for key, value, *_ in tokenizer_fields(source_gguf_path())}
    assert field["tokenizer.chat_template"] == source["tokenizer.chat_template"]
    assert field["tokenizer.ggml.tokens"] == source["tokenizer.ggml.tokens"][:SMALL_VOCAB]

    assert [t.name for t in reader.tensors] == [s.name for s in specs]
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied, as Llama 3.2 1B
    shapes = {"token_embd.weight": (SMALL_VOCAB, 256), "attn_k.weight": (128, 256), "attn_v.weight": (128, 256),
              "attn_q.weight": (256, 256), "attn_output.weight": (256, 256), "ffn_gate.weight": (768, 256),
              "ffn_up.weight": (768, 256), "ffn_down.weight": (256, 768)}
    for tensor in reader.tensors:
        assert tensor.tensor_type == _expected_type(file_type, tensor.name), tensor.name
        values = dequantize(tensor.data, tensor.tensor_type)
        assert tuple(int(n) for n in tensor.shape) == values.shape[::-1]  # ggml's ne: columns first
        if tensor.name.endswith("norm.weight"):
            assert values.shape == (256,) and np.all(np.abs(values - 1) < 0.15), tensor.name
            continue
        assert values.shape == shapes[tensor.name.split(".", 2)[-1] if tensor.name.startswith("blk.") else tensor.name], tensor.name
        _sane(values, tensor.name)


def _use_more_bits_layers(specs: list, role: str) -> list[int]:
    return [int(s.name.split(".")[1]) for s in specs if s.name.endswith(f".{role}.weight") and s.qtype == Q.Q6_K]


def test_q4_k_m_at_the_real_shapes_follows_llama_quant() -> None:
    one_b = plan(SHAPES["llama-1b"], "Q4_K_M")
    assert Counter(s.qtype.name for s in one_b) == {"Q4_K": 96, "Q6_K": 17, "F32": 33}
    assert _use_more_bits_layers(one_b, "attn_v") == _use_more_bits_layers(one_b, "ffn_down") == \
        [0, 1, 4, 7, 10, 13, 14, 15]  # fmt: skip
    types = {s.name: s.qtype for s in one_b}
    assert types["token_embd.weight"] == Q.Q6_K  # tied: the embedding is the output head
    eight_b = {s.name: s.qtype for s in plan(SHAPES["llama-8b"], "Q4_K_M")}
    assert (eight_b["token_embd.weight"], eight_b["output.weight"]) == (Q.Q4_K, Q.Q6_K)
    assert _use_more_bits_layers(plan(SHAPES["llama-8b"], "Q4_K_M"), "attn_v") == \
        [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]  # fmt: skip
    q4_0 = {s.name: s.qtype for s in plan(SHAPES["llama-8b"], "Q4_0")}
    assert (q4_0["token_embd.weight"], q4_0["output.weight"], q4_0["blk.0.attn_v.weight"]) == \
        (Q.Q4_0, Q.Q6_K, Q.Q4_0)  # fmt: skip
    assert {s.qtype for s in plan(SHAPES["llama-8b"], "Q8_0") if len(s.shape) == 2} == {Q.Q8_0}
    qwen = {s.name: s for s in plan(SHAPES["qwen-1.5b"], "Q4_K_M")}
    assert qwen["blk.27.attn_k.bias"].shape == (256,) and qwen["blk.27.attn_q.bias"].shape == (1536,)
    assert "blk.0.attn_output.bias" not in qwen and qwen["blk.0.ffn_down.weight"].shape == (1536, 8960)


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.gguf" for i in range(3)]
    for path, seed in zip(paths, (3, 3, 4), strict=True):
        write_gguf(path, "tiny", "Q4_0", seed=seed, vocab=SMALL_VOCAB)
    assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "one-layer.gguf"
    assert main(["--shape", "tiny", "--type", "Q8_0", "--layers", "1", "--vocab", "256", "--out", str(out)]) == 0
    assert "Q8_0" in capsys.readouterr().out
    assert GGUFReader(out).fields["llama.block_count"].contents() == 1
    assert main(["--shape", "tiny", "--type", "Q8_0", "--layers", "0", "--out", str(out)]) == 2
    assert "at least 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown type"):
        write_gguf(out, "tiny", "Q3_K")
    assert [p.name for p in tmp_path.iterdir()] == ["one-layer.gguf"]  # no partial file left behind
    with pytest.raises(ValueError, match="special tokens"):
        truncate_vocab([("tokenizer.ggml.tokens", ["a", "b", "c"], GGUFValueType.ARRAY, GGUFValueType.STRING),
                        ("tokenizer.ggml.eos_token_id", 2, GGUFValueType.UINT32, None)], 2)


def test_hearth_loads_the_file_and_generates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine import LLM, SamplingParams

    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))  # the converted config and tokenizer go here
    out = tmp_path / "tiny-Q4_K_M.gguf"
    write_gguf(out, "tiny", "Q4_K_M", vocab=1024)
    llm = LLM(str(out), dtype="float32", start_loop=False, kv_cache_bytes=8 << 20)
    try:
        reply = llm.generate("Hello there", SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    finally:
        llm.close()
    assert len(reply.token_ids) == 4 and all(0 <= t < 1024 for t in reply.token_ids)
