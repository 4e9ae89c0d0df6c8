"""The model registry: its formulas against real HF models, and the path each config takes."""

from __future__ import annotations

import pytest

from engine.model.architectures import (
    ARCHITECTURES,
    TESTED_MODEL_TYPES,
    attention_shape,
    count_parameters,
    execution_path,
    kv_bytes_per_token,
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
