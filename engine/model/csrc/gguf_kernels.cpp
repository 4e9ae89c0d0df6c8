// Matmuls against GGUF weights in their file's block bytes: Q4_0, Q4_1, Q8_0 (blocks of 32 weights) and Q4_K, Q5_K,
// Q6_K (super-blocks of 256). The weights are never widened to 16 or 32 bits: each call streams the blocks as the
// file holds them, so a model costs its file's bytes per token, not four times them.
//
// As llama.cpp does, each call first quantizes the activations to int8 per block, once per row, shared by every
// thread: blocks of 32 with d = max|x| / 127 (and, for Q4_1's offsets, the block's sum) against the 32-weight types;
// blocks of 256 with the sums of each 16 (which carry the K types' offsets and minimums) against the K types. Each
// weight block then meets each activation block in one integer dot product (AVX2: VPMADDUBSW of unsigned weights by
// signed activations, VPMADDWD by the sub-block scales), scaled once per block in fp32. The only rounding beyond
// fp32 is the activations' to int8, which the tests reproduce exactly (tests/engine/model/test_gguf_kernels.py).
//
// One weight row meets up to 4 activation rows at once (each block decoded once for all of them), and the output
// channels are split across threads in runs that stay in cache while every 4-row tile of the activations passes
// over them: one row is a GEMV that streams the weights once; a prompt is a GEMM. Without AVX2 (and FMA and F16C),
// plain loops compute the same sums.

#include "gguf_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HEARTH_GGUF_AVX2 1
#include <immintrin.h>
#endif

namespace hearth {
namespace {

constexpr int64_t kTile = 4;       // activation rows per kernel call
constexpr int64_t kRowRun = 32;    // output channels a thread finishes against every tile before the next run

// Activations quantized against the 32-weight types: q ~ x / d, and s = d * sum(q) for Q4_1's offsets.
struct Act32 {
  float d;
  float s;
  int8_t q[32];
};

// Activations quantized against the K types: q ~ x / d, with the sum of each 16 q.
struct Act256 {
  float d;
  int16_t bsums[16];
  int8_t q[256];
};

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
#ifdef HEARTH_GGUF_AVX2
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// The 6-bit scales and minimums of a Q4_K or Q5_K super-block's 8 sub-blocks, as 8 bytes each.
inline void k_scales(const uint8_t* packed, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = packed[j] & 63;
    mn[j] = packed[j + 4] & 63;
    sc[j + 4] = (packed[j + 8] & 0xF) | ((packed[j] >> 6) << 4);
    mn[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4);
  }
}

// --- the block types: layout, exact dequantization, and the plain dot product ---------------------------------
// Each dequantize follows gguf's numpy arithmetic step by step (same operations, same order, fp32), so the values
// are bit-identical; the build contracts no multiply-add across statements (ISO C++ mode).

struct Q4_0 {
  using Act = Act32;
  static constexpr int64_t kWeights = 32, kBytes = 18;
  static void dequantize(const uint8_t* b, float* y) {
    const float d = half_at(b);
    for (int l = 0; l < 16; ++l) {
      y[l] = d * static_cast<float>((b[2 + l] & 0xF) - 8);
      y[l + 16] = d * static_cast<float>((b[2 + l] >> 4) - 8);
    }
  }
  static float dot(const uint8_t* b, const Act& a) {
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += ((b[2 + l] & 0xF) - 8) * a.q[l] + ((b[2 + l] >> 4) - 8) * a.q[l + 16];
    return half_at(b) * a.d * static_cast<float>(s);
  }
};

struct Q4_1 {
  using Act = Act32;
  static constexpr int64_t kWeights = 32, kBytes = 20;
  static void dequantize(const uint8_t* b, float* y) {
    const float d = half_at(b), m = half_at(b + 2);
    for (int l = 0; l < 16; ++l) {
      const float lo = d * static_cast<float>(b[4 + l] & 0xF), hi = d * static_cast<float>(b[4 + l] >> 4);
      y[l] = lo + m;
      y[l + 16] = hi + m;
    }
  }
  static float dot(const uint8_t* b, const Act& a) {
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += (b[4 + l] & 0xF) * a.q[l] + (b[4 + l] >> 4) * a.q[l + 16];
    return half_at(b) * a.d * static_cast<float>(s) + half_at(b + 2) * a.s;
  }
};

struct Q8_0 {
  using Act = Act32;
  static constexpr int64_t kWeights = 32, kBytes = 34;
  static void dequantize(const uint8_t* b, float* y) {
    const float d = half_at(b);
    for (int l = 0; l < 32; ++l) y[l] = static_cast<float>(static_cast<int8_t>(b[2 + l])) * d;
  }
  static float dot(const uint8_t* b, const Act& a) {
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) s += static_cast<int8_t>(b[2 + l]) * a.q[l];
    return half_at(b) * a.d * static_cast<float>(s);
  }
};

// Q4_K: d, dmin (fp16), 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles: sub-block 2i holds the low
// nibbles of bytes 32i..32i+31, sub-block 2i+1 their high nibbles. Q5_K adds 32 bytes of fifth bits (bit j of byte
// l for weight l of sub-block j) before the nibbles.
template <bool kFifthBit>
struct QK45 {
  using Act = Act256;
  static constexpr int64_t kWeights = 256, kBytes = kFifthBit ? 176 : 144;
  static constexpr int64_t kNibbles = kFifthBit ? 48 : 16;
  static int quant(const uint8_t* b, int j, int l) {
    const int q = (b[kNibbles + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
    return kFifthBit ? q | (((b[16 + l] >> j) & 1) << 4) : q;
  }
  static void dequantize(const uint8_t* b, float* y) {
    const float d = half_at(b), dmin = half_at(b + 2);
    uint8_t sc[8], mn[8];
    k_scales(b + 4, sc, mn);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(sc[j]), ml = dmin * static_cast<float>(mn[j]);
      for (int l = 0; l < 32; ++l) {
        const float v = dl * static_cast<float>(quant(b, j, l));
        y[32 * j + l] = v - ml;
      }
    }
  }
  static float dot(const uint8_t* b, const Act& a) {
    uint8_t sc[8], mn[8];
    k_scales(b + 4, sc, mn);
    int32_t sum = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t s = 0;
      for (int l = 0; l < 32; ++l) s += quant(b, j, l) * a.q[32 * j + l];
      sum += sc[j] * s;
      mins += mn[j] * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
    }
    return half_at(b) * a.d * static_cast<float>(sum) - half_at(b + 2) * a.d * static_cast<float>(mins);
  }
};
using Q4_K = QK45<false>;
using Q5_K = QK45<true>;

// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales (one per 16 weights), d (fp16). In each half
// h of 128 weights, the 32-weight run i takes nibble i / 2 of ql bytes 64h + 32(i % 2) + l and bits 2i of qh byte
// 32h + l; q - 32 is the weight.
struct Q6_K {
  using Act = Act256;
  static constexpr int64_t kWeights = 256, kBytes = 210;
  static int quant(const uint8_t* b, int e) {
    const int h = e / 128, i = (e % 128) / 32, l = e % 32;
    const int lo = (b[64 * h + 32 * (i % 2) + l] >> (4 * (i / 2))) & 0xF;
    const int hi = (b[128 + 32 * h + l] >> (2 * i)) & 3;
    return (lo | (hi << 4)) - 32;
  }
  static void dequantize(const uint8_t* b, float* y) {
    const float d = half_at(b + 208);
    for (int g = 0; g < 16; ++g) {
      const float dl = d * static_cast<float>(static_cast<int8_t>(b[192 + g]));
      for (int l = 0; l < 16; ++l) y[16 * g + l] = dl * static_cast<float>(quant(b, 16 * g + l));
    }
  }
  static float dot(const uint8_t* b, const Act& a) {
    int32_t sum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += quant(b, 16 * g + l) * a.q[16 * g + l];
      sum += static_cast<int8_t>(b[192 + g]) * s;
    }
    return half_at(b + 208) * a.d * static_cast<float>(sum);
  }
};

// --- activations ---------------------------------------------------------------------------------------------------
// Per block of n values: d = max|x| / 127, q = x * (1 / d) rounded to nearest even (0 where d is 0). Returns sum(q).

#ifdef HEARTH_GGUF_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <typename T>
int32_t quantize_block(const T* x, int64_t n, float* d_out, int8_t* q) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 mx = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, load8(x + i)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float d = _mm_cvtss_f32(m4) / 127.f;
  const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i sum = _mm256_setzero_si256();
  for (int64_t i = 0; i < n; i += 32) {
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x + i), id));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x + i + 8), id));
    const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x + i + 16), id));
    const __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x + i + 24), id));
    sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, e)));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(packed, order));
  }
  *d_out = d;
  return hsum_i32(sum);
}
#else
template <typename T>
int32_t quantize_block(const T* x, int64_t n, float* d_out, int8_t* q) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  int32_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]) * id;
    q[i] = static_cast<int8_t>(std::nearbyint(v));
    sum += q[i];
  }
  *d_out = d;
  return sum;
}
#endif

template <typename T>
void quantize_row(const T* x, int64_t k, Act32* out) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const int32_t sum = quantize_block(x + 32 * b, 32, &out[b].d, out[b].q);
    out[b].s = out[b].d * static_cast<float>(sum);
  }
}

template <typename T>
void quantize_row(const T* x, int64_t k, Act256* out) {
  for (int64_t b = 0; b < k / 256; ++b) {
    quantize_block(x + 256 * b, 256, &out[b].d, out[b].q);
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += out[b].q[16 * g + l];
      out[b].bsums[g] = static_cast<int16_t>(s);
    }
  }
}

// --- the AVX2 kernels: one weight row against R activation rows -----------------------------------------------
// w: the row's nb blocks; a: row 0's blocks, each next row nb blocks on; y[r * ys] receives row r's dot product.

#ifdef HEARTH_GGUF_AVX2
inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 bytes of nibbles as 32 bytes: the low nibbles, then the high ones.
inline __m256i nibbles(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

inline __m256 pairs_to_float(__m256i p) { return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1))); }

// Runs step(b, acc, off) over a row's blocks with U sets of R accumulators (vector and scalar), U > 1 for few rows
// so that successive blocks' multiply-adds do not wait on each other; then sums each row's into y.
template <int R, typename Step>
inline void over_blocks(int64_t nb, float* y, int64_t ys, Step&& step) {
  constexpr int U = R == 1 ? 4 : (R == 2 ? 2 : 1);
  __m256 acc[U][R];
  float off[U][R] = {};
  for (int u = 0; u < U; ++u) {
    for (int r = 0; r < R; ++r) acc[u][r] = _mm256_setzero_ps();
  }
  int64_t b = 0;
  for (; b + U <= nb; b += U) {
    for (int u = 0; u < U; ++u) step(b + u, acc[u], off[u]);
  }
  for (; b < nb; ++b) step(b, acc[0], off[0]);
  for (int r = 0; r < R; ++r) {
    __m256 total = acc[0][r];
    float offset = off[0][r];
    for (int u = 1; u < U; ++u) {
      total = _mm256_add_ps(total, acc[u][r]);
      offset += off[u][r];
    }
    y[r * ys] = hsum_ps(total) + offset;
  }
}

// Q4_0 and Q8_0: signed weights, so |w| times x with w's sign (VPMADDUBSW takes one unsigned operand).
template <typename T, int R>
void kernel_signed32(const uint8_t* w, int64_t nb, const Act32* a, float* y, int64_t ys) {
  over_blocks<R>(nb, y, ys, [&](int64_t b, __m256* acc, float*) {
    const uint8_t* blk = w + b * T::kBytes;
    const __m256 dw = _mm256_set1_ps(half_at(blk));
    __m256i q;
    if constexpr (std::is_same_v<T, Q4_0>) {
      q = _mm256_sub_epi8(nibbles(blk + 2), _mm256_set1_epi8(8));
    } else {
      q = load32(blk + 2);
    }
    const __m256i aq = _mm256_sign_epi8(q, q);
    for (int r = 0; r < R; ++r) {
      const Act32& x = a[r * nb + b];
      const __m256 p = pairs_to_float(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(load32(x.q), q)));
      acc[r] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(x.d)), acc[r]);
    }
  });
}

template <int R>
void kernel_q4_1(const uint8_t* w, int64_t nb, const Act32* a, float* y, int64_t ys) {
  over_blocks<R>(nb, y, ys, [&](int64_t b, __m256* acc, float* off) {
    const uint8_t* blk = w + b * Q4_1::kBytes;
    const __m256 dw = _mm256_set1_ps(half_at(blk));
    const float mw = half_at(blk + 2);
    const __m256i q = nibbles(blk + 4);
    for (int r = 0; r < R; ++r) {
      const Act32& x = a[r * nb + b];
      const __m256 p = pairs_to_float(_mm256_maddubs_epi16(q, load32(x.q)));
      acc[r] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, _mm256_set1_ps(x.d)), acc[r]);
      off[r] += mw * x.s;
    }
  });
}

// k_scales in one vector: the 8 scales, then the 8 minimums (bytes), unpacked in 32-bit words.
inline __m128i k_scales_vec(const uint8_t* packed) {
  uint32_t u[3];
  std::memcpy(u, packed, sizeof u);
  constexpr uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, low2 = 0x03030303;
  const uint32_t sc_lo = u[0] & low6, sc_hi = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);
  const uint32_t mn_lo = u[1] & low6, mn_hi = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);
  return _mm_set_epi32(static_cast<int>(mn_hi), static_cast<int>(mn_lo), static_cast<int>(sc_hi),
                       static_cast<int>(sc_lo));
}

// Broadcasts int16 lane i of each 128-bit half.
inline __m256i lane16(__m256i v, int i) {
  return _mm256_shuffle_epi8(v, _mm256_set1_epi16(static_cast<int16_t>(((2 * i + 1) << 8) | (2 * i))));
}

template <bool kFifthBit, int R>
void kernel_qk45(const uint8_t* w, int64_t nb, const Act256* a, float* y, int64_t ys) {
  using T = QK45<kFifthBit>;
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * T::kBytes;
    const float d = half_at(blk), dmin = half_at(blk + 2);
    const __m256i both = _mm256_cvtepu8_epi16(k_scales_vec(blk + 4));
    const __m128i sc128 = _mm256_castsi256_si128(both), mn128 = _mm256_extracti128_si256(both, 1);
    const __m256i scales = _mm256_set_m128i(sc128, sc128);
    const __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(mn128, mn128), _mm_unpacklo_epi16(mn128, mn128));
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    __m256i high = kFifthBit ? load32(blk + 16) : _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = load32(blk + T::kNibbles + 32 * j);
      __m256i lo = _mm256_and_si256(bits, low4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
      if (kFifthBit) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(high, one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 1), one), 4));
        high = _mm256_srli_epi16(high, 2);
      }
      const __m256i s_lo = lane16(scales, 2 * j), s_hi = lane16(scales, 2 * j + 1);
      for (int r = 0; r < R; ++r) {
        const int8_t* xq = a[r * nb + b].q + 64 * j;
        const __m256i p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32(xq)), s_lo);
        const __m256i p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load32(xq + 32)), s_hi);
        sum[r] = _mm256_add_epi32(sum[r], _mm256_add_epi32(p_lo, p_hi));
      }
    }
    for (int r = 0; r < R; ++r) {
      const Act256& x = a[r * nb + b];
      const __m256i m = _mm256_madd_epi16(load32(x.bsums), mins);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d), _mm256_cvtepi32_ps(sum[r]), acc[r]);
      acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * x.d), _mm256_cvtepi32_ps(m), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * ys] = hsum_ps(acc[r]);
}

template <int R>
void kernel_q6_k(const uint8_t* w, int64_t nb, const Act256* a, float* y, int64_t ys) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * Q6_K::kBytes;
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qa = load32(blk + 64 * h), qb = load32(blk + 64 * h + 32), qh = load32(blk + 128 + 32 * h);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(qa, low4), _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(qb, low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4));
      __m256i s[4];
      for (int i = 0; i < 4; ++i) {  // run 4h + i covers scales 2(4h + i) and the next, 8 lanes each
        const int64_t g = 2 * (4 * h + i);
        const __m128i pick = _mm_set_epi64x(static_cast<int64_t>(0x0101010101010101ULL * (g + 1)),
                                            static_cast<int64_t>(0x0101010101010101ULL * g));
        s[i] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* xq = a[r * nb + b].q + 128 * h;
        for (int i = 0; i < 4; ++i) {
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[i], load32(xq + 32 * i)), s[i]);
          sum[r] = _mm256_add_epi32(sum[r], p);
        }
      }
    }
    const __m256i scales = _mm256_cvtepi8_epi16(sc8);
    const __m256 d = _mm256_set1_ps(half_at(blk + 208));
    for (int r = 0; r < R; ++r) {  // the weights are q - 32: take 32 times the scaled block sums back off
      const Act256& x = a[r * nb + b];
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(load32(x.bsums), scales), 5);
      const __m256i total = _mm256_sub_epi32(sum[r], offset);
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x.d)), _mm256_cvtepi32_ps(total), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * ys] = hsum_ps(acc[r]);
}

template <typename T, int R>
void kernel(const uint8_t* w, int64_t nb, const typename T::Act* a, float* y, int64_t ys) {
  if constexpr (std::is_same_v<T, Q4_0>) {
    kernel_signed32<Q4_0, R>(w, nb, a, y, ys);
  } else if constexpr (std::is_same_v<T, Q4_1>) {
    kernel_q4_1<R>(w, nb, a, y, ys);
  } else if constexpr (std::is_same_v<T, Q8_0>) {
    kernel_signed32<Q8_0, R>(w, nb, a, y, ys);
  } else if constexpr (std::is_same_v<T, Q4_K>) {
    kernel_qk45<false, R>(w, nb, a, y, ys);
  } else if constexpr (std::is_same_v<T, Q5_K>) {
    kernel_qk45<true, R>(w, nb, a, y, ys);
  } else {
    kernel_q6_k<R>(w, nb, a, y, ys);
  }
}
#else
template <typename T, int R>
void kernel(const uint8_t* w, int64_t nb, const typename T::Act* a, float* y, int64_t ys) {
  for (int r = 0; r < R; ++r) {
    float acc = 0.f;
    for (int64_t b = 0; b < nb; ++b) acc += T::dot(w + b * T::kBytes, a[r * nb + b]);
    y[r * ys] = acc;
  }
}
#endif

// --- the drivers -----------------------------------------------------------------------------------------------

template <typename T>
void matmul(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  using Act = typename T::Act;
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), nb = k / T::kWeights, row_bytes = w.size(1);
  std::vector<Act> acts(static_cast<size_t>(m * nb));
  const auto quantize = [&](auto* xp) {
    at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) quantize_row(xp + r * k, k, acts.data() + r * nb);
    });
  };
  if (x.scalar_type() == at::kFloat) {
    quantize(x.data_ptr<float>());
  } else {
    quantize(x.data_ptr<at::BFloat16>());
  }
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const Act* ap = acts.data();
  at::parallel_for(0, n, m == 1 ? 64 : kRowRun, [&](int64_t n0, int64_t n1) {
    for (int64_t j0 = n0; j0 < n1; j0 += kRowRun) {
      const int64_t j1 = std::min(n1, j0 + kRowRun);
      for (int64_t r = 0; r < m; r += kTile) {
        const int64_t rows = std::min(kTile, m - r);
        for (int64_t j = j0; j < j1; ++j) {
          const uint8_t* wr = wp + j * row_bytes;
          const Act* ar = ap + r * nb;
          float* yr = yp + r * n + j;
          switch (rows) {
            case 4: kernel<T, 4>(wr, nb, ar, yr, n); break;
            case 3: kernel<T, 3>(wr, nb, ar, yr, n); break;
            case 2: kernel<T, 2>(wr, nb, ar, yr, n); break;
            default: kernel<T, 1>(wr, nb, ar, yr, n); break;
          }
        }
      }
    }
  });
}

template <typename T>
void dequantize_rows(const at::Tensor& w, at::Tensor& y) {
  const int64_t n = w.size(0), row_bytes = w.size(1), nb = row_bytes / T::kBytes;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      for (int64_t b = 0; b < nb; ++b) T::dequantize(wp + j * row_bytes + b * T::kBytes, yp + (j * nb + b) * T::kWeights);
    }
  });
}

// Calls f with a value of the block type `type` names; an unknown type raises.
template <typename F>
at::Tensor with_block_type(int64_t type, const char* op, F&& f) {
  switch (type) {
    case kQ4_0: return f(Q4_0{});
    case kQ4_1: return f(Q4_1{});
    case kQ8_0: return f(Q8_0{});
    case kQ4_K: return f(Q4_K{});
    case kQ5_K: return f(Q5_K{});
    case kQ6_K: return f(Q6_K{});
    default: break;
  }
  TORCH_CHECK(false, op, ": ggml type ", type, " has no kernel here (Q4_0=2, Q4_1=3, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14)");
  return at::Tensor();
}

void check_weights(const at::Tensor& w, const char* op) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.device().is_cpu(), op,
              ": w must be a 2-D uint8 CPU tensor of GGUF block bytes, got ", w.scalar_type(), " ", w.sizes());
}

}  // namespace

at::Tensor gguf_mm(const at::Tensor& x_in, const at::Tensor& w_in, int64_t type) {
  return with_block_type(type, "gguf_mm", [&](auto block) {
    using T = decltype(block);
    check_weights(w_in, "gguf_mm");
    TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), "gguf_mm: x must be a 2-D CPU tensor [m, k], got ",
                x_in.sizes());
    TORCH_CHECK(x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16,
                "gguf_mm: x must be float32 or bfloat16, got ", x_in.scalar_type());
    const int64_t k = x_in.size(1);
    TORCH_CHECK(k % T::kWeights == 0, "gguf_mm: k = ", k, " is not a multiple of the block of ", T::kWeights,
                " weights of ggml type ", type);
    TORCH_CHECK(w_in.size(1) == k / T::kWeights * T::kBytes, "gguf_mm: w has ", w_in.size(1),
                " bytes per row, but a row of ", k, " weights of ggml type ", type, " takes ",
                k / T::kWeights * T::kBytes);
    const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
    at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options().dtype(at::kFloat));
    if (y.numel()) matmul<T>(x, w, y);
    return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
  });
}

at::Tensor gguf_dequantize(const at::Tensor& w_in, int64_t type) {
  return with_block_type(type, "gguf_dequantize", [&](auto block) {
    using T = decltype(block);
    check_weights(w_in, "gguf_dequantize");
    TORCH_CHECK(w_in.size(1) % T::kBytes == 0, "gguf_dequantize: a row of ", w_in.size(1),
                " bytes is not a whole number of ", T::kBytes, "-byte blocks of ggml type ", type);
    const at::Tensor w = w_in.contiguous();
    at::Tensor y = at::empty({w.size(0), w.size(1) / T::kBytes * T::kWeights}, w.options().dtype(at::kFloat));
    if (y.numel()) dequantize_rows<T>(w, y);
    return y;
  });
}

}  // namespace hearth
