// The small ops between a layer's matmuls, each a fused loop over the step's rows: RMSNorm, the rotary embedding
// with the K/V writes, and SiLU-and-multiply. Each rounds to the activation type T where the eager layer
// (engine/model/llama.py) rounds, with fp32 statistics. Instantiated for HEARTH_FOR_EACH_ACTIVATION_TYPE.

#pragma once

#include <cstdint>

namespace hearth {

// RMSNorm as HF's LlamaRMSNorm: fp32 statistics, normalized value rounded to T, then times the weight
template <typename T>
void rms_norm(const T* x, const T* w, T* out, int64_t rows, int64_t n, float eps);

// Rotates queries into q_out (fp32 [B, H*D]) and keys, and writes keys and values into the pool at each row's slot.
// q_norm, k_norm: Qwen3's per-head RMSNorm weights, or null.
template <typename T>
void rope_and_store(const T* qkv, int64_t rows, int64_t nh, int64_t kvh, int64_t d, const T* q_norm,
                    const T* k_norm, float eps, const float* cos, const float* sin, const int64_t* slot_mapping,
                    float* k_pool, float* v_pool, float* q_out);

// silu(gate) * up, each rounded to T as eager rounds it; gate_up is [B, 2I], out [B, I]
template <typename T>
void silu_mul(const T* gate_up, int64_t rows, int64_t inter, T* out);

}  // namespace hearth
