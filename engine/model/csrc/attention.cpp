// Decode attention over the paged fp32 KV pool: see attention.h.

#include "attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"

namespace hearth {
namespace {

// Explicit 16-float vectors (GCC/Clang vector extensions: AVX-512 registers here, pairs or quads of narrower
// ones elsewhere), for head sizes known at compile time; other head sizes take plain loops.
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

// Vectors pass by reference: by value, a 64-byte vector's calling convention would differ between builds with and
// without AVX-512 (GCC warns of it), though every one of these calls is inlined.
inline void load16(v16& out, const float* p) { out = *reinterpret_cast<const v16u*>(p); }
inline void store16(float* p, const v16& v) { *reinterpret_cast<v16u*>(p) = v; }
inline float hsum16(const v16& v) {
  const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// scores[i * len + j] = scale * (q_i . key_j) for G query heads that share one KV head
template <int D, int G>
void group_scores(const float* q, const float* k_base, const int64_t* slots, int64_t stride, int64_t len,
                  float scale, float* scores) {
  constexpr int C = D / 16;
  v16 qv[G][C];
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < C; ++c) load16(qv[i][c], q + i * D + c * 16);
  for (int64_t j = 0; j < len; ++j) {
    const float* key = k_base + slots[j] * stride;
    v16 kv[C];
    for (int c = 0; c < C; ++c) load16(kv[c], key + c * 16);
    for (int i = 0; i < G; ++i) {
      v16 acc = qv[i][0] * kv[0];
      for (int c = 1; c < C; ++c) acc += qv[i][c] * kv[c];
      scores[i * len + j] = hsum16(acc) * scale;
    }
  }
}

// out_i = sum_j p[i * len + j] * value_j, for G query heads that share one KV head
template <int D, int G>
void group_values(const float* p, const float* v_base, const int64_t* slots, int64_t stride, int64_t len,
                  float* out) {
  constexpr int C = D / 16;
  v16 acc[G][C];
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = v16{};
  for (int64_t j = 0; j < len; ++j) {
    const float* value = v_base + slots[j] * stride;
    v16 vv[C];
    for (int c = 0; c < C; ++c) load16(vv[c], value + c * 16);
    for (int i = 0; i < G; ++i) {
      const float w = p[i * len + j];
      for (int c = 0; c < C; ++c) acc[i][c] += w * vv[c];
    }
  }
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < C; ++c) store16(out + i * D + c * 16, acc[i][c]);
}

// the same for any head size and group, in plain loops
void any_scores(const float* q, int64_t group, int64_t d, const float* k_base, const int64_t* slots, int64_t stride,
                int64_t len, float scale, float* scores) {
  for (int64_t j = 0; j < len; ++j) {
    const float* key = k_base + slots[j] * stride;
    for (int64_t i = 0; i < group; ++i) {
      float dot = 0.f;
      for (int64_t e = 0; e < d; ++e) dot += q[i * d + e] * key[e];
      scores[i * len + j] = dot * scale;
    }
  }
}

void any_values(const float* p, int64_t group, int64_t d, const float* v_base, const int64_t* slots, int64_t stride,
                int64_t len, float* out) {
  std::fill(out, out + group * d, 0.f);
  for (int64_t j = 0; j < len; ++j) {
    const float* value = v_base + slots[j] * stride;
    for (int64_t i = 0; i < group; ++i) {
      const float w = p[i * len + j];
      for (int64_t e = 0; e < d; ++e) out[i * d + e] += w * value[e];
    }
  }
}

template <int D>
void chunk_scores(int64_t g, const float* q, const float* k, const int64_t* s, int64_t st, int64_t len, float sc,
                  float* out) {
  switch (g) {
    case 1: return group_scores<D, 1>(q, k, s, st, len, sc, out);
    case 2: return group_scores<D, 2>(q, k, s, st, len, sc, out);
    case 3: return group_scores<D, 3>(q, k, s, st, len, sc, out);
    default: return group_scores<D, 4>(q, k, s, st, len, sc, out);
  }
}

template <int D>
void chunk_values(int64_t g, const float* p, const float* v, const int64_t* s, int64_t st, int64_t len, float* out) {
  switch (g) {
    case 1: return group_values<D, 1>(p, v, s, st, len, out);
    case 2: return group_values<D, 2>(p, v, s, st, len, out);
    case 3: return group_values<D, 3>(p, v, s, st, len, out);
    default: return group_values<D, 4>(p, v, s, st, len, out);
  }
}

// softmax of each of `group` rows of `len` scores, in place; returns nothing, writes each row's sum to total
void softmax_rows(float* scores, int64_t group, int64_t len, float* total) {
  for (int64_t i = 0; i < group; ++i) {
    float* __restrict s = scores + i * len;
    float top[kLanes];
    std::fill(top, top + kLanes, -INFINITY);
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) top[l] = std::max(top[l], s[j + l]);
    }
    float m = -INFINITY;
    for (int l = 0; l < kLanes; ++l) m = std::max(m, top[l]);
    for (; j < len; ++j) m = std::max(m, s[j]);
    for (j = 0; j < len; ++j) s[j] = exp_neg(s[j] - m);
    float part[kLanes] = {0.f};
    for (j = 0; j + kLanes <= len; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) part[l] += s[j + l];
    }
    float sum = hsum(part);
    for (; j < len; ++j) sum += s[j];
    total[i] = sum;
  }
}

}  // namespace

// Decode attention over the paged pool: row r's query heads attend to the keys at slots[r, :lens[r]].
// Work items are (row, KV head); each item's query heads (HF's repeat_kv order) share one pass over the keys,
// four at a time.
template <typename T>
void decode_attention(const float* q, const float* k_pool, const float* v_pool, const int64_t* slots,
                      int64_t max_len, const int64_t* lens, int64_t rows, int64_t nh, int64_t kvh, int64_t d,
                      float scale, T* out) {
  const int64_t group = nh / kvh, stride = kvh * d;
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) longest = std::max(longest, lens[r]);
  // run inline below ~64k multiply-adds per thread: a fork costs more than it saves there
  const int64_t per_item = std::max<int64_t>(1, longest * group * d * 2);
  const int64_t grain = std::max<int64_t>(1, 65536 / per_item);
  at::parallel_for(0, rows * kvh, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(group * d);
    std::vector<float> total(group);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / kvh, g = item % kvh, len = lens[r];
      const int64_t* row_slots = slots + r * max_len;
      const float* k_base = k_pool + g * d;
      const float* v_base = v_pool + g * d;
      const float* qg = q + (r * nh + g * group) * d;
      scores.resize(group * len);
      for (int64_t i = 0; i < group; i += 4) {
        const int64_t n = std::min<int64_t>(4, group - i);
        float* s = scores.data() + i * len;
        if (d == 64) chunk_scores<64>(n, qg + i * d, k_base, row_slots, stride, len, scale, s);
        else if (d == 128) chunk_scores<128>(n, qg + i * d, k_base, row_slots, stride, len, scale, s);
        else any_scores(qg + i * d, n, d, k_base, row_slots, stride, len, scale, s);
      }
      softmax_rows(scores.data(), group, len, total.data());
      for (int64_t i = 0; i < group; i += 4) {
        const int64_t n = std::min<int64_t>(4, group - i);
        const float* p = scores.data() + i * len;
        if (d == 64) chunk_values<64>(n, p, v_base, row_slots, stride, len, acc.data() + i * d);
        else if (d == 128) chunk_values<128>(n, p, v_base, row_slots, stride, len, acc.data() + i * d);
        else any_values(p, n, d, v_base, row_slots, stride, len, acc.data() + i * d);
      }
      T* o = out + (r * nh + g * group) * d;
      for (int64_t i = 0; i < group; ++i) {
        const float inv = 1.f / total[i];
        for (int64_t e = 0; e < d; ++e) o[i * d + e] = rounded<T>(acc[i * d + e] * inv);
      }
    }
  });
}

#define HEARTH_INSTANTIATE(T)                                                                                       \
  template void decode_attention<T>(const float*, const float*, const float*, const int64_t*, int64_t,             \
                                    const int64_t*, int64_t, int64_t, int64_t, int64_t, float, T*);
HEARTH_FOR_EACH_ACTIVATION_TYPE(HEARTH_INSTANTIATE)
#undef HEARTH_INSTANTIATE

}  // namespace hearth
