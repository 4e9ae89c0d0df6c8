"""The model registry: its formulas against real HF models, the path each config takes, its GGUF layouts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.architectures import (
    ARCHITECTURES,
    TESTED_MODEL_TYPES,
    attention_shape,
    count_parameters,
    execution_path,
    gguf_layout,
    kv_bytes_per_token,
    qk_order,
)

TINY = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@pytest.mark.parametrize("extra", [{}, {"attention_bias": True, "mlp_bias": True}, {"tie_word_embeddings": True}])
@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_parameter_count_matches_hf(model_type: str, extra: dict[str, bool]) -> None:
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **TINY, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in model.parameters())
    assert count_parameters(config) == expected
    # config.json as written with only the non-default fields: the registry fills in the type's defaults
    assert count_parameters(config.to_diff_dict() | {"model_type": model_type}) == expected


def test_attention_shape_reads_dicts_and_type_defaults() -> None:
    assert attention_shape({"num_attention_heads": 8, "hidden_size": 512}) == (8, 8, 64)
    assert attention_shape({"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}) == (8, 2, 64)
    gemma = {"model_type": "gemma", "num_attention_heads": 16, "hidden_size": 3072}
    assert attention_shape(gemma) == (16, 16, 256)
    assert attention_shape(gemma | {"head_dim": 128}) == (16, 16, 128)
    assert kv_bytes_per_token({"num_parameters": 10}) == 0
    assert kv_bytes_per_token(gemma | {"num_hidden_layers": 28}, 2) == 2 * 28 * 16 * 256 * 2


def test_execution_path_falls_back_to_hf_for_features_the_fused_decoder_lacks() -> None:
    assert execution_path({"model_type": "qwen3"}) == "fused"
    assert execution_path({"model_type": "gemma"}) == "hf"
    assert execution_path({"model_type": "unknown"}) == "hf"
    assert execution_path({"model_type": "llama", "mlp_bias": True}) == "hf"
    assert execution_path({"model_type": "llama", "attention_bias": True}) == "hf"  # bias on o_proj
    assert execution_path({"model_type": "qwen2", "attention_bias": True}) == "fused"  # Q/K/V biases only
    assert execution_path({"model_type": "llama", "hidden_act": "gelu"}) == "hf"
    assert execution_path({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]}) == "hf"
    assert set(TESTED_MODEL_TYPES) <= set(ARCHITECTURES)


def test_the_registry_imports_only_the_standard_library() -> None:
    """Every layer reads the registry (``engine.loading`` below ``engine.model`` too): it must not pull in torch."""
    tree = ast.parse((Path(__file__).parents[2] / "engine" / "architectures.py").read_text())
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"__future__", "collections", "dataclasses", "typing"}, imported


def test_gguf_layouts_name_every_tensor_llama_cpp_writes_and_back() -> None:
    """Each layout maps the tensors ``gguf`` lists for its architecture (but rope tables and MoE experts) to HF
    names and back; only the decoder's projections count as linear weights."""
    from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

    arch_of = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}
    with_layout = [t for t, a in ARCHITECTURES.items() if a.gguf is not None]
    assert {"llama", "qwen2", "qwen3"} <= set(with_layout)
    for model_type in with_layout:
        layout = gguf_layout(model_type)
        assert layout is not None and ARCHITECTURES[model_type].path == "fused"  # the fused path reads the blocks
        linear = set()
        for template in (TENSOR_NAMES[t] for t in MODEL_TENSORS[arch_of[model_type]]):
            if "rot_embd" in template or "rope" in template or "exps" in template or "gate_inp" in template:
                continue
            name = template.format(bid=3) + ".weight"
            hf = layout.hf_name(name)
            assert hf is not None, (model_type, name)
            assert layout.gguf_name(hf) == name
            if layout.is_linear(name):
                linear.add(name.split(".")[2])
        assert linear == {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
    assert gguf_layout("gemma") is None and gguf_layout("unknown") is None
    permuted = [t for t, a in ARCHITECTURES.items() if a.gguf is not None and a.gguf.permute_qk]
    assert permuted == ["llama"]
    assert sorted(qk_order(8, 2)) == list(range(8)) and qk_order(8, 2)[:4] == [0, 2, 1, 3]


def test_the_tested_types_are_those_with_a_tiny_config() -> None:
    assert set(TESTED_MODEL_TYPES) == {t for t, a in ARCHITECTURES.items() if a.tiny is not None}
    assert [ARCHITECTURES[t].path for t in TESTED_MODEL_TYPES] == sorted(
        (ARCHITECTURES[t].path for t in TESTED_MODEL_TYPES), key=lambda p: p != "fused"
    )
