// Decode attention over the paged fp32 KV pool, for the native step's decode rows.

#pragma once

#include <cstdint>

namespace hearth {

// Row r's query heads (q: fp32 [rows, nh * d]) attend to the keys and values at slots[r, :lens[r]] of the pools
// ([slots, kvh, d]); the result, rounded to T, goes to out ([rows, nh * d]). Attention runs in fp32, each row on
// its own. Instantiated for HEARTH_FOR_EACH_ACTIVATION_TYPE.
template <typename T>
void decode_attention(const float* q, const float* k_pool, const float* v_pool, const int64_t* slots,
                      int64_t max_len, const int64_t* lens, int64_t rows, int64_t nh, int64_t kvh, int64_t d,
                      float scale, T* out);

}  // namespace hearth
