// Matmuls against GGUF weights in their file's block bytes: Q4_0, Q4_1, Q8_0 (blocks of 32 weights) and Q4_K, Q5_K,
// Q6_K (super-blocks of 256). The weights are never widened to 16 or 32 bits: each call streams the blocks as the
// file holds them, so a model costs its file's bytes per token, not four times them.
//
// As llama.cpp does, each call first quantizes the activations to int8 per block, once per row, shared by every
// thread: blocks of 32 with d = max|x| / 127 (and the block's sum, for Q4_0's -8 and Q4_1's offsets) against the
// 32-weight types; blocks of 256 with the sums of each 16 (which carry the K types' offsets and minimums) against
// the K types. Each
// weight block then meets each activation block in one integer dot product (AVX2: VPMADDUBSW of unsigned weights by
// signed activations, VPMADDWD by the sub-block scales), scaled once per block in fp32. The only rounding beyond
// fp32 is the activations' to int8, which the tests reproduce exactly (tests/engine/model/test_gguf_kernels.py).
//
// A prompt is a GEMM: the activations are packed in groups of 8 rows, and one weight row meets a whole group at once
// (each weight block decoded once for 8 rows, each pair's accumulator in a register); the output channels are split
// across threads, in runs that stay in cache while every group passes over them. One row is a GEMV that streams the
// weights once. Each (weight row, activation row) pair takes the same operations in the same order whatever the
// tile, the row count or the thread split, so a row's output is the same bits whatever shares its call. Without
// AVX2 (and FMA and F16C), plain loops compute the same sums.
//
// A build with AVX512-BW/VL and VNNI runs the same tiles with their integer work in fewer instructions: the K types
// take 64 weights per VPMADDUBSW and scale and add the pairs in one VPDPWSSD; the 32-weight types' pair sums take
// one VPDPBUSD where several rows share a weight block. Every 32-bit lane still sums exactly the integers the AVX2
// tile's lane sums, and the fp32 code is the AVX2 tiles' own, so both give the same bits
// (torch.ops.hearth.gguf_mm_avx2 keeps the AVX2 tiles callable for that test and for the bench).

#include "gguf_kernels.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HEARTH_GGUF_AVX2 1
#include <immintrin.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define HEARTH_GGUF_AVX512 1
#endif
#endif

namespace hearth {
namespace {


// One block of quantized activations as the plain dot products read it: q ~ x / d, s = d * sum(q) (32-weight
// types), and the sums of each 16 q (K types).
struct ActBlock {
  const int8_t* q;
  float d;
  float s;
  const int16_t* bsums;
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
  static constexpr int64_t kActBlock = 32;
  static constexpr int64_t kWeights = 32, kBytes = 18;
  static void dequantize(const uint8_t* b, float* y) {
    const float d = half_at(b);
    for (int l = 0; l < 16; ++l) {
      y[l] = d * static_cast<float>((b[2 + l] & 0xF) - 8);
      y[l + 16] = d * static_cast<float>((b[2 + l] >> 4) - 8);
    }
  }
  static float dot(const uint8_t* b, const ActBlock& a) {
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += ((b[2 + l] & 0xF) - 8) * a.q[l] + ((b[2 + l] >> 4) - 8) * a.q[l + 16];
    return half_at(b) * a.d * static_cast<float>(s);
  }
};

struct Q4_1 {
  static constexpr int64_t kActBlock = 32;
  static constexpr int64_t kWeights = 32, kBytes = 20;
  static void dequantize(const uint8_t* b, float* y) {
    const float d = half_at(b), m = half_at(b + 2);
    for (int l = 0; l < 16; ++l) {
      const float lo = d * static_cast<float>(b[4 + l] & 0xF), hi = d * static_cast<float>(b[4 + l] >> 4);
      y[l] = lo + m;
      y[l + 16] = hi + m;
    }
  }
  static float dot(const uint8_t* b, const ActBlock& a) {
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += (b[4 + l] & 0xF) * a.q[l] + (b[4 + l] >> 4) * a.q[l + 16];
    return half_at(b) * a.d * static_cast<float>(s) + half_at(b + 2) * a.s;
  }
};

struct Q8_0 {
  static constexpr int64_t kActBlock = 32;
  static constexpr int64_t kWeights = 32, kBytes = 34;
  static void dequantize(const uint8_t* b, float* y) {
    const float d = half_at(b);
    for (int l = 0; l < 32; ++l) y[l] = static_cast<float>(static_cast<int8_t>(b[2 + l])) * d;
  }
  static float dot(const uint8_t* b, const ActBlock& a) {
    // w = (w + 128) - 128 as unsigned bytes: GCC 12 vectorizes a signed-by-signed byte dot product into VPDPBUSD,
    // which takes one operand as unsigned, and gets it wrong on CPUs with AVX-VNNI; unsigned-by-signed it gets right
    int32_t s = 0, t = 0;
    for (int l = 0; l < 32; ++l) {
      s += static_cast<uint8_t>(b[2 + l] ^ 0x80) * a.q[l];
      t += a.q[l];
    }
    return half_at(b) * a.d * static_cast<float>(s - 128 * t);
  }
};

// Q4_K: d, dmin (fp16), 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles: sub-block 2i holds the low
// nibbles of bytes 32i..32i+31, sub-block 2i+1 their high nibbles. Q5_K adds 32 bytes of fifth bits (bit j of byte
// l for weight l of sub-block j) before the nibbles.
template <bool kFifthBit>
struct QK45 {
  static constexpr int64_t kActBlock = 256;
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
  static float dot(const uint8_t* b, const ActBlock& a) {
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
  static constexpr int64_t kActBlock = 256;
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
  static float dot(const uint8_t* b, const ActBlock& a) {
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

// The plain loops are compiled into every build: the kernels on a CPU without AVX2, and on every other one the
// reference the AVX2 tiles are tested against (torch.ops.hearth.gguf_mm_plain).
namespace plain {
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
}  // namespace plain

#ifdef HEARTH_GGUF_AVX2
namespace avx2 {
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
}  // namespace avx2
#endif

// Every row's quantized activations, packed as the tiles read them: the rows in groups of `group` (the last one
// holds what is left), and in a group of R rows, block by block, the R rows side by side: q [block][row][values],
// d [block][row], the sums of each 16 q [block][row][16] (K types), and s = d * sum(q) in runs of eight blocks
// [run][row][8] (the 32-weight types; zero past the last block).
struct Acts {
  int64_t m, k, size, nb, nbp, group;
  bool wide_k;  // the K types' q in the 512-bit tiles' order (see tile_qk45); the sums stay in file order
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int16_t> bsums;

  Acts(int64_t m_, int64_t k_, int64_t size_, int64_t group_, bool wide_k_ = false)
      : m(m_), k(k_), size(size_), nb(k_ / size_), nbp((k_ / size_ + 7) / 8 * 8), group(group_), wide_k(wide_k_),
        q(static_cast<size_t>(m_ * k_)), d(static_cast<size_t>(m_ * nb)),
        s(size_ == 32 ? static_cast<size_t>(m_ * nbp) : 0), bsums(size_ == 256 ? static_cast<size_t>(m_ * k_ / 16) : 0) {}

  // Row r's group: its first row and its row count.
  int64_t first(int64_t r) const { return r / group * group; }
  int64_t rows(int64_t r) const { return std::min(group, m - first(r)); }

  template <bool kPlain, typename X>
  void quantize_row(const X* x, int64_t r) {
    const int64_t r0 = first(r), rr = rows(r), i = r - r0;
    for (int64_t b = 0; b < nb; ++b) {
      int8_t* qb = q.data() + r0 * k + (b * rr + i) * size;
      float* db = d.data() + r0 * nb + b * rr + i;
#ifdef HEARTH_GGUF_AVX2
      const int32_t sum = kPlain ? plain::quantize_block(x + size * b, size, db, qb)
                                 : avx2::quantize_block(x + size * b, size, db, qb);
#else
      const int32_t sum = plain::quantize_block(x + size * b, size, db, qb);
#endif
      if (size == 32) {
        s[static_cast<size_t>(r0 * nbp + (b / 8 * rr + i) * 8 + b % 8)] = *db * static_cast<float>(sum);
      } else {
        int16_t* sums = bsums.data() + r0 * (k / 16) + (b * rr + i) * 16;
        for (int g = 0; g < 16; ++g) {
          int32_t t = 0;
          for (int l = 0; l < 16; ++l) t += qb[16 * g + l];
          sums[g] = static_cast<int16_t>(t);
        }
        if (wide_k) {  // runs of 32 in the order 0 2 1 3 4 6 5 7: a 64-byte load meets a 64-byte nibble load's lows
          int8_t run[32];
          for (int h = 0; h < 2; ++h) {
            std::memcpy(run, qb + 128 * h + 32, 32);
            std::memcpy(qb + 128 * h + 32, qb + 128 * h + 64, 32);
            std::memcpy(qb + 128 * h + 64, run, 32);
          }
        }
      }
    }
  }

  ActBlock block(int64_t r, int64_t b) const {
    const int64_t r0 = first(r), rr = rows(r), i = r - r0;
    return {q.data() + r0 * k + (b * rr + i) * size, d[static_cast<size_t>(r0 * nb + b * rr + i)],
            size == 32 ? s[static_cast<size_t>(r0 * nbp + (b / 8 * rr + i) * 8 + b % 8)] : 0.f,
            size == 256 ? bsums.data() + r0 * (k / 16) + (b * rr + i) * 16 : nullptr};
  }
};

// The group of rows from r0 as a tile reads it.
struct ActView {
  const int8_t* q;
  const float* d;
  const float* s;
  const int16_t* bsums;
  ActView(const Acts& a, int64_t r0)
      : q(a.q.data() + r0 * a.k), d(a.d.data() + r0 * a.nb), s(a.s.empty() ? nullptr : a.s.data() + r0 * a.nbp),
        bsums(a.bsums.empty() ? nullptr : a.bsums.data() + r0 * (a.k / 16)) {}
};

// --- the AVX2 tiles: NR weight rows against MR activation rows ------------------------------------------------
// Each decoded weight block meets MR activation rows and each loaded activation block NR weight rows, in
// registers. Every (weight row, activation row) pair has its own accumulator and the same sequence of operations in
// every tile shape, so an output row's values are the same bits whatever else shares the call.
// w: weight row 0's blocks, each next row ws bytes on; a: a group of MR activation rows; y[i * ldy + j] receives
// activation row i times weight row j.

#ifdef HEARTH_GGUF_AVX2
namespace avx2 {
inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 bytes of nibbles as 32 bytes: the low nibbles, then the high ones.
inline __m256i nibbles(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

template <int NR, int MR>
inline void store_tile(const __m256 (&acc)[NR][MR], float* y, int64_t ldy) {
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum_ps(acc[j][i]);
  }
}

inline uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The fp16 values at p, p + stride, ... (count of them, the rest zero) as 8 floats.
inline __m256 halves8(const uint8_t* p, int64_t stride, int64_t count) {
  if (count == 8) {
    __m128i v = _mm_cvtsi32_si128(u16_at(p));
    v = _mm_insert_epi16(v, u16_at(p + stride), 1);
    v = _mm_insert_epi16(v, u16_at(p + 2 * stride), 2);
    v = _mm_insert_epi16(v, u16_at(p + 3 * stride), 3);
    v = _mm_insert_epi16(v, u16_at(p + 4 * stride), 4);
    v = _mm_insert_epi16(v, u16_at(p + 5 * stride), 5);
    v = _mm_insert_epi16(v, u16_at(p + 6 * stride), 6);
    v = _mm_insert_epi16(v, u16_at(p + 7 * stride), 7);
    return _mm256_cvtph_ps(v);
  }
  uint16_t h[8] = {};
  for (int64_t u = 0; u < count; ++u) h[u] = u16_at(p + u * stride);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

// Q4_0, Q4_1 and Q8_0, eight blocks at a time: their scales gathered into one vector (for Q4_1 also the
// minimums). Q4_0's and Q4_1's nibbles go in unsigned (VPMADDUBSW takes them as they are), and the offset (Q4_0's
// -8 times the scale, Q4_1's minimum) meets the eight activation blocks' sums in one multiply-add. Q8_0's weights
// are signed, so |w| meets x with w's sign (VPMADDUBSW takes one unsigned operand).
template <typename T, bool kWide, int NR, int MR>
void tile32(const uint8_t* w, int64_t ws, int64_t nb, ActView a, float* y, int64_t ldy) {
  constexpr bool kSigned = std::is_same_v<T, Q8_0>, kMin = std::is_same_v<T, Q4_1>;
  constexpr int64_t kQuants = kMin ? 4 : 2;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NR][MR];
  for (int j = 0; j < NR; ++j) {
    for (int i = 0; i < MR; ++i) acc[j][i] = _mm256_setzero_ps();
  }
  const int8_t* xq = a.q;
  const float* xd = a.d;
  const float* xs = a.s;
  for (int64_t g = 0; g < nb; g += 8, xs += 8 * MR) {
    const int64_t count = std::min<int64_t>(8, nb - g);
    __m256 scale[NR];
    for (int j = 0; j < NR; ++j) {
      const uint8_t* blk = w + j * ws + g * T::kBytes;
      scale[j] = halves8(blk, T::kBytes, count);
      if constexpr (!kSigned) {
        const __m256 o8 = kMin ? halves8(blk + 2, T::kBytes, count) : _mm256_mul_ps(scale[j], _mm256_set1_ps(-8.f));
        for (int i = 0; i < MR; ++i) acc[j][i] = _mm256_fmadd_ps(o8, _mm256_loadu_ps(xs + 8 * i), acc[j][i]);
      }
    }
    __m256i lane = _mm256_setzero_si256();
    for (int64_t u = 0; u < count; ++u, xq += 32 * MR, xd += MR) {
      const uint8_t* blk = w + (g + u) * T::kBytes;
      __m256i q[NR], aq[NR];
      __m256 dw[NR];
      for (int j = 0; j < NR; ++j) {
        if constexpr (kSigned) {
          q[j] = load32(blk + j * ws + kQuants);
          aq[j] = _mm256_sign_epi8(q[j], q[j]);
        } else {
          q[j] = nibbles(blk + j * ws + kQuants);
        }
        dw[j] = _mm256_permutevar8x32_ps(scale[j], lane);
      }
      lane = _mm256_add_epi32(lane, _mm256_set1_epi32(1));
      for (int i = 0; i < MR; ++i) {
        const __m256i x = load32(xq + 32 * i);
        const __m256 dx = _mm256_broadcast_ss(xd + i);
        for (int j = 0; j < NR; ++j) {
          const __m256i xs = kSigned ? _mm256_sign_epi8(x, q[j]) : x, wq = kSigned ? aq[j] : q[j];
#ifdef HEARTH_GGUF_AVX512
          // VPDPBUSD: the pairs' sums of VPMADDUBSW and VPMADDWD in one instruction (neither saturates here), the
          // same integers; faster where several activation rows share the weights (at one row it measured no
          // faster, and slower for Q8_0, on an AVX512 EPYC)
          const __m256 p = _mm256_cvtepi32_ps(kWide && MR > 1 ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xs)
                                                              : _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xs), ones));
#else
          const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wq, xs), ones));
#endif
          acc[j][i] = _mm256_fmadd_ps(_mm256_mul_ps(dw[j], dx), p, acc[j][i]);
        }
      }
    }
  }
  store_tile<NR, MR>(acc, y, ldy);
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

// The K types' end of a super-block: each pair's integer sum scaled by d and the activation's d, less (Q4_K, Q5_K)
// the minimums, the weights' per sub-block against the activations' sums of each 16, scaled by dmin.
template <int NR, int MR>
inline void k_accumulate(__m256 (&acc)[NR][MR], const __m256i (&sum)[NR][MR], const float (&d)[NR],
                         const float* dmin, const __m256i* mins, const float* xd, const int16_t* bsums) {
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      acc[j][i] = _mm256_fmadd_ps(_mm256_set1_ps(d[j] * xd[i]), _mm256_cvtepi32_ps(sum[j][i]), acc[j][i]);
      if (mins != nullptr) {
        const __m256i m = _mm256_madd_epi16(load32(bsums + 16 * i), mins[j]);
        acc[j][i] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin[j] * xd[i]), _mm256_cvtepi32_ps(m), acc[j][i]);
      }
    }
  }
}

// Every cache line of the block `ahead` blocks of `bytes` past p, into L1.
inline void prefetch_ahead(const uint8_t* p, int64_t bytes, int64_t ahead) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + ahead * bytes + o), _MM_HINT_T0);
}

#ifdef HEARTH_GGUF_AVX512
// The 512-bit tiles: the integer sums of the AVX2 tiles in half the instructions. A 64-byte load of nibbles holds
// two of the AVX2 tiles' 32-byte loads side by side; VPMADDUBSW meets 64 activations at once and VPDPWSSD scales
// the pairs and adds them in one instruction. The upper 256 bits' sums are added to the lower ones at the end of
// each super-block, so each 32-bit lane holds exactly the integers the AVX2 tile's lane holds, and everything from
// there on (the fp32 scaling and accumulation) is the AVX2 tile's own code: both give the same bits.
// (The zero-masked forms: GCC 12 warns that the unmasked ones read an undefined vector.)
inline __m512i zext512(__m256i v) { return _mm512_maskz_inserti64x4(0xFF, _mm512_setzero_si512(), v, 0); }
// The eight rows' integers of a vector whose lanes 2r and 2r + 1 both belong to row r: their sums, in row order.
inline __m256i fold_lane_pairs(__m512i v) {
  const __m512i evens = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i both = _mm512_add_epi32(v, _mm512_maskz_shuffle_epi32(0xFFFF, v, _MM_PERM_CDAB));
  return _mm512_maskz_extracti64x4_epi64(0xF, _mm512_maskz_permutexvar_epi32(0xFFFF, evens, both), 0);
}
inline __m512i pair512(__m256i lo, __m256i hi) { return _mm512_maskz_inserti64x4(0xFF, _mm512_castsi256_si512(lo), hi, 1); }
inline __m256i fold512(__m512i v) {
  return _mm256_add_epi32(_mm512_maskz_extracti64x4_epi64(0xF, v, 0), _mm512_maskz_extracti64x4_epi64(0xF, v, 1));
}
// int16 lanes 0-15 take lane a of v, lanes 16-31 lane b (v's int16 lanes 0-15).
inline __m512i two_scales(__m512i v, int a, int b) {
  return _mm512_permutexvar_epi16(
      pair512(_mm256_set1_epi16(static_cast<int16_t>(a)), _mm256_set1_epi16(static_cast<int16_t>(b))), v);
}
#endif

// Q4_K and Q5_K. kWide: the 512-bit tiles, with the activations of each super-block in runs of 32 ordered
// 0 2 1 3 4 6 5 7 (Acts::wide_k), so that one 64-byte nibble load's lows (sub-blocks 2c and 2c + 2) meet one
// 64-byte activation load, and its highs (2c + 1, 2c + 3) the next.
template <bool kFifthBit, bool kWide, int NR, int MR>
void tile_qk45(const uint8_t* w, int64_t ws, int64_t nb, ActView a, float* y, int64_t ldy) {
  using T = QK45<kFifthBit>;
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc[NR][MR];
  for (int j = 0; j < NR; ++j) {
    for (int i = 0; i < MR; ++i) acc[j][i] = _mm256_setzero_ps();
  }
  const int8_t* xq = a.q;
  for (int64_t b = 0; b < nb; ++b, xq += 256 * MR) {
    float d[NR], dmin[NR];
    __m256i scales[NR], mins[NR], high[NR];
    __m256i sum[NR][MR];
    for (int j = 0; j < NR; ++j) {
      const uint8_t* blk = w + j * ws + b * T::kBytes;
      d[j] = half_at(blk);
      dmin[j] = half_at(blk + 2);
      const __m256i both = _mm256_cvtepu8_epi16(k_scales_vec(blk + 4));
      const __m128i sc128 = _mm256_castsi256_si128(both), mn128 = _mm256_extracti128_si256(both, 1);
      scales[j] = _mm256_set_m128i(sc128, sc128);
      mins[j] = _mm256_set_m128i(_mm_unpackhi_epi16(mn128, mn128), _mm_unpacklo_epi16(mn128, mn128));
      high[j] = kFifthBit ? load32(blk + 16) : _mm256_setzero_si256();
      for (int i = 0; i < MR; ++i) sum[j][i] = _mm256_setzero_si256();
    }
#ifdef HEARTH_GGUF_AVX512
    if constexpr (kWide) {
      const __m512i low4w = _mm512_set1_epi8(0x0F), onew = _mm512_set1_epi8(1);
      __m512i wsum[NR][MR];
      for (int j = 0; j < NR; ++j) {
        for (int i = 0; i < MR; ++i) wsum[j][i] = _mm512_setzero_si512();
      }
      for (int c = 0; c < 4; c += 2) {
        __m512i lo[NR], hi[NR], s_lo[NR], s_hi[NR];
        for (int j = 0; j < NR; ++j) {
          const __m512i bits = _mm512_loadu_si512(w + j * ws + b * T::kBytes + T::kNibbles + 32 * c);
          lo[j] = _mm512_and_si512(bits, low4w);
          hi[j] = _mm512_and_si512(_mm512_srli_epi16(bits, 4), low4w);
          if constexpr (kFifthBit) {  // bits 2c, 2c + 1 of each byte (lower half), 2c + 2, 2c + 3 (upper half)
            const __m512i h5 = pair512(high[j], _mm256_srli_epi16(high[j], 2));
            lo[j] = _mm512_or_si512(lo[j], _mm512_slli_epi16(_mm512_and_si512(h5, onew), 4));
            hi[j] = _mm512_or_si512(hi[j], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h5, 1), onew), 4));
            high[j] = _mm256_srli_epi16(high[j], 4);
          }
          const __m512i sc = _mm512_castsi256_si512(scales[j]);
          s_lo[j] = two_scales(sc, 2 * c, 2 * c + 2);
          s_hi[j] = two_scales(sc, 2 * c + 1, 2 * c + 3);
        }
        for (int i = 0; i < MR; ++i) {
          const int8_t* x = xq + 256 * i + 64 * c;
          const __m512i x_lo = _mm512_loadu_si512(x), x_hi = _mm512_loadu_si512(x + 64);
          for (int j = 0; j < NR; ++j) {
            wsum[j][i] = _mm512_dpwssd_epi32(wsum[j][i], _mm512_maddubs_epi16(lo[j], x_lo), s_lo[j]);
            wsum[j][i] = _mm512_dpwssd_epi32(wsum[j][i], _mm512_maddubs_epi16(hi[j], x_hi), s_hi[j]);
          }
        }
      }
      for (int j = 0; j < NR; ++j) {
        for (int i = 0; i < MR; ++i) sum[j][i] = fold512(wsum[j][i]);
      }
    } else
#endif
    {
      for (int c = 0; c < 4; ++c) {
        __m256i lo[NR], hi[NR], s_lo[NR], s_hi[NR];
        for (int j = 0; j < NR; ++j) {
          const __m256i bits = load32(w + j * ws + b * T::kBytes + T::kNibbles + 32 * c);
          lo[j] = _mm256_and_si256(bits, low4);
          hi[j] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
          if (kFifthBit) {
            lo[j] = _mm256_or_si256(lo[j], _mm256_slli_epi16(_mm256_and_si256(high[j], one), 4));
            hi[j] = _mm256_or_si256(hi[j], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high[j], 1), one), 4));
            high[j] = _mm256_srli_epi16(high[j], 2);
          }
          s_lo[j] = lane16(scales[j], 2 * c);
          s_hi[j] = lane16(scales[j], 2 * c + 1);
        }
        for (int i = 0; i < MR; ++i) {
          const int8_t* x = xq + 256 * i + 64 * c;
          for (int j = 0; j < NR; ++j) {
            const __m256i p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[j], load32(x)), s_lo[j]);
            const __m256i p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[j], load32(x + 32)), s_hi[j]);
            sum[j][i] = _mm256_add_epi32(sum[j][i], _mm256_add_epi32(p_lo, p_hi));
          }
        }
      }
    }
    k_accumulate<NR, MR>(acc, sum, d, dmin, mins, a.d + b * MR, a.bsums + b * MR * 16);
  }
  store_tile<NR, MR>(acc, y, ldy);
}

// Q6_K. kWide: the 512-bit tiles, two runs of 32 at a time (runs 2p and 2p + 1 of a half: their ql bytes and their
// activations lie side by side).
template <bool kWide, int NR, int MR>
void tile_q6_k(const uint8_t* w, int64_t ws, int64_t nb, ActView a, float* y, int64_t ldy) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3);
  __m256 acc[NR][MR];
  for (int j = 0; j < NR; ++j) {
    for (int i = 0; i < MR; ++i) acc[j][i] = _mm256_setzero_ps();
  }
  const int8_t* xq = a.q;
  for (int64_t b = 0; b < nb; ++b, xq += 256 * MR) {
    __m256i sum[NR][MR];
    float d[NR];
    for (int j = 0; j < NR; ++j) {
      d[j] = half_at(w + j * ws + b * Q6_K::kBytes + 208);
      for (int i = 0; i < MR; ++i) sum[j][i] = _mm256_setzero_si256();
    }
#ifdef HEARTH_GGUF_AVX512
    if constexpr (kWide) {
      const __m512i low4w = _mm512_set1_epi8(0x0F), low2w = _mm512_set1_epi8(3);
      __m512i wsum[NR][MR];
      for (int j = 0; j < NR; ++j) {
        for (int i = 0; i < MR; ++i) wsum[j][i] = _mm512_setzero_si512();
      }
      for (int h = 0; h < 2; ++h) {
        for (int p = 0; p < 2; ++p) {  // runs 2p (lower 256 bits) and 2p + 1 (upper)
          __m512i q[NR], s[NR];
          for (int j = 0; j < NR; ++j) {
            const uint8_t* blk = w + j * ws + b * Q6_K::kBytes;
            const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            const __m256i qh = load32(blk + 128 + 32 * h);
            const __m512i lo = _mm512_and_si512(p == 0 ? ql : _mm512_srli_epi16(ql, 4), low4w);
            const __m512i hi = _mm512_and_si512(
                pair512(_mm256_srli_epi16(qh, 4 * p), _mm256_srli_epi16(qh, 4 * p + 2)), low2w);
            q[j] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
            const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192))));
            const int r = 8 * h + 4 * p;  // the four scales of these 64 weights, 16 each
            s[j] = _mm512_permutexvar_epi16(
                _mm512_set_epi16(r + 3, r + 3, r + 3, r + 3, r + 3, r + 3, r + 3, r + 3, r + 2, r + 2, r + 2, r + 2,
                                 r + 2, r + 2, r + 2, r + 2, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1,
                                 r, r, r, r, r, r, r, r),
                sc);
          }
          for (int i = 0; i < MR; ++i) {
            const __m512i x = _mm512_loadu_si512(xq + 256 * i + 128 * h + 64 * p);
            for (int j = 0; j < NR; ++j) wsum[j][i] = _mm512_dpwssd_epi32(wsum[j][i], _mm512_maddubs_epi16(q[j], x), s[j]);
          }
        }
      }
      for (int j = 0; j < NR; ++j) {
        for (int i = 0; i < MR; ++i) sum[j][i] = fold512(wsum[j][i]);
      }
    } else
#endif
    {
      for (int h = 0; h < 2; ++h) {
        __m256i s16[NR];  // this half's 8 scales as int16, in both 128-bit halves: run r takes lanes 2r and 2r + 1
        for (int j = 0; j < NR; ++j) {
          const __m128i sc = _mm_cvtepi8_epi16(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + j * ws + b * Q6_K::kBytes + 192 + 8 * h)));
          s16[j] = _mm256_set_m128i(sc, sc);
        }
        for (int r = 0; r < 4; ++r) {  // run 4h + r: 32 weights, two scales of 16
          __m256i q[NR], s[NR];
          for (int j = 0; j < NR; ++j) {
            const uint8_t* blk = w + j * ws + b * Q6_K::kBytes;
            const __m256i ql = load32(blk + 64 * h + 32 * (r % 2)), qh = load32(blk + 128 + 32 * h);
            const __m256i lo = _mm256_and_si256(r < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
            const __m256i hi = _mm256_and_si256(r == 0 ? qh : _mm256_srli_epi16(qh, 2 * r), low2);
            q[j] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            const char l0 = static_cast<char>(4 * r), l1 = static_cast<char>(4 * r + 1),
                       h0 = static_cast<char>(4 * r + 2), h1 = static_cast<char>(4 * r + 3);
            s[j] = _mm256_shuffle_epi8(s16[j], _mm256_setr_epi8(l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, l0, l1,
                                                                l0, l1, h0, h1, h0, h1, h0, h1, h0, h1, h0, h1, h0, h1,
                                                                h0, h1, h0, h1));
          }
          for (int i = 0; i < MR; ++i) {
            const __m256i x = load32(xq + 256 * i + 128 * h + 32 * r);
            for (int j = 0; j < NR; ++j) {
              sum[j][i] = _mm256_add_epi32(sum[j][i], _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], x), s[j]));
            }
          }
        }
      }
    }
    const int16_t* bsums = a.bsums + b * MR * 16;
    for (int j = 0; j < NR; ++j) {  // the weights are q - 32: take 32 times the scaled block sums back off
      const __m256i scales = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j * ws + b * Q6_K::kBytes + 192)));
      for (int i = 0; i < MR; ++i) {
        const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(load32(bsums + 16 * i), scales), 5);
        sum[j][i] = _mm256_sub_epi32(sum[j][i], offset);
      }
    }
    k_accumulate<NR, MR>(acc, sum, d, nullptr, nullptr, a.d + b * MR, bsums);
  }
  store_tile<NR, MR>(acc, y, ldy);
}

template <typename T, bool kWide, int NR, int MR>
void tile(const uint8_t* w, int64_t ws, int64_t nb, ActView a, float* y, int64_t ldy) {
  if constexpr (T::kWeights == 32) {
    tile32<T, kWide, NR, MR>(w, ws, nb, a, y, ldy);
  } else if constexpr (std::is_same_v<T, Q4_K>) {
    tile_qk45<false, kWide, NR, MR>(w, ws, nb, a, y, ldy);
  } else if constexpr (std::is_same_v<T, Q5_K>) {
    tile_qk45<true, kWide, NR, MR>(w, ws, nb, a, y, ldy);
  } else {
    tile_q6_k<kWide, NR, MR>(w, ws, nb, a, y, ldy);
  }
}

// The tile shape per block type: NR weight rows by MR activation rows for several rows, NR1 weight rows for one.
// One weight row at a time streams the weights in order and leaves registers for 8 activation rows. At one row that
// is one stream through memory: four rows at once (four short streams, a row apart) ran a 1B Q8_0 file's matmuls at
// 60 ms a token against 32 ms with one, weights from memory, 2 threads (the four independent chains only won with
// the weights in cache).
template <typename T>
struct Shape {
  static constexpr int kNR = 1;
  static constexpr int kMR = 8;
  static constexpr int kNR1 = 1;
};

using View = ActView;
}  // namespace avx2
#endif

namespace plain {
// One weight row against one activation row, block by block.
struct View {
  const Acts& acts;
  int64_t r0;
  View(const Acts& a, int64_t r) : acts(a), r0(r) {}
};

template <typename T, int NR, int MR>
void tile(const uint8_t* w, int64_t ws, int64_t nb, View a, float* y, int64_t ldy) {
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) acc += T::dot(w + j * ws + b * T::kBytes, a.acts.block(a.r0 + i, b));
      y[i * ldy + j] = acc;
    }
  }
}

template <typename T>
struct Shape {
  static constexpr int kNR = 1, kMR = 1, kNR1 = 1;
};
}  // namespace plain

// The kernel families as template arguments of the drivers: the plain loops, the AVX2 tiles and the 512-bit tiles
// (the AVX2 tiles' sums in fewer instructions, the same bits).
struct PlainLoops {
  static constexpr bool kPlain = true, kWide = false;
  template <typename T>
  using Shape = plain::Shape<T>;
  using View = plain::View;
  template <typename T, int NR, int MR, typename... Args>
  static void tile(Args&&... args) { plain::tile<T, NR, MR>(std::forward<Args>(args)...); }
};

#ifdef HEARTH_GGUF_AVX2
template <bool kWide_>
struct Tiles {
  static constexpr bool kPlain = false, kWide = kWide_;
  template <typename T>
  using Shape = avx2::Shape<T>;
  using View = avx2::View;
  template <typename T, int NR, int MR, typename... Args>
  static void tile(Args&&... args) { avx2::tile<T, kWide, NR, MR>(std::forward<Args>(args)...); }
};
using Avx2Tiles = Tiles<false>;
#ifdef HEARTH_GGUF_AVX512
using FastKernels = Tiles<true>;
#else
using FastKernels = Avx2Tiles;
#endif
#else
using Avx2Tiles = PlainLoops;
using FastKernels = PlainLoops;
#endif


// --- the drivers -----------------------------------------------------------------------------------------------

// Calls tile<T, nr, mr> for run-time nr <= NR, mr <= MR.
template <typename K, typename T, int NR, int MR, typename... Args>
void dispatch(int nr, int mr, Args&&... args) {
  if constexpr (NR > 1) {
    if (nr < NR) return dispatch<K, T, NR - 1, MR>(nr, mr, std::forward<Args>(args)...);
  }
  if constexpr (MR > 1) {
    if (mr < MR) return dispatch<K, T, NR, MR - 1>(nr, mr, std::forward<Args>(args)...);
  }
  K::template tile<T, NR, MR>(std::forward<Args>(args)...);
}

template <typename K, typename T>
void matmul(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  using Shape = typename K::template Shape<T>;
  constexpr int kNR = Shape::kNR, kMR = Shape::kMR, kNR1 = Shape::kNR1;
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), nb = k / T::kWeights, row_bytes = w.size(1);
  Acts acts(m, k, T::kActBlock, kMR, K::kWide && (std::is_same_v<T, Q4_K> || std::is_same_v<T, Q5_K>));
  const auto quantize = [&](auto* xp) {
    at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) acts.template quantize_row<K::kPlain>(xp + r * k, r);
    });
  };
  if (x.scalar_type() == at::kFloat) {
    quantize(x.data_ptr<float>());
  } else {
    quantize(x.data_ptr<at::BFloat16>());
  }
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t nr_max = m == 1 ? kNR1 : kNR;
  // Output channels per chunk: their blocks stay in cache while every activation group passes over them.
  const int64_t chunk = std::max<int64_t>(nr_max, (m == 1 ? 24576 : 131072) / row_bytes / nr_max * nr_max);
  at::parallel_for(0, n, m == 1 ? 64 : 2 * nr_max, [&](int64_t n0, int64_t n1) {
    for (int64_t j0 = n0; j0 < n1; j0 += chunk) {
      const int64_t j1 = std::min(n1, j0 + chunk);
      for (int64_t i0 = 0; i0 < m; i0 += kMR) {
        const int mr = static_cast<int>(acts.rows(i0));
        const typename K::View a(acts, i0);
        for (int64_t j = j0; j < j1; j += nr_max) {
          const int nr = static_cast<int>(std::min(nr_max, j1 - j));
          if (m == 1) {
            dispatch<K, T, kNR1, 1>(nr, mr, wp + j * row_bytes, row_bytes, nb, a, yp + i0 * n + j, n);
          } else {
            dispatch<K, T, kNR, kMR>(nr, mr, wp + j * row_bytes, row_bytes, nb, a, yp + i0 * n + j, n);
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


// --- Q4_0, Q8_0, Q4_K and Q6_K in groups of eight interleaved rows (types kQ4_0_X8 ... kQ6_K_X8) -----------------
// gguf_repack turns Q4_0, Q8_0, Q4_K or Q6_K rows into groups of eight, as llama.cpp's repacked layouts do (it has
// none for Q6_K on x86): block b of a group holds the eight rows' block b, the fp16 scales of the eight rows side by
// side (one vector), then the quant bytes in chunks of 32: chunk c holds bytes 4c..4c+3 of each row's quants, row r
// at 4r (see scatter). One 256-bit load
// is then 4 bytes of 8 rows, one 32-bit lane per row; the activation's 4 matching bytes, broadcast to every lane,
// meet all eight rows in one VPDPBUSD (AVX2: VPMADDUBSW, summed in int16, then VPMADDWD), with no horizontal sum.
// A partial group of rows at the end (n not a multiple of 8) stays in the file's layout and runs the file-order
// tiles above. The tensor keeps the file's shape and bytes, only their order changes, so a load can repack in place.
//
// Each (weight row, activation row) pair takes, per block, exact integer sums (Q4_0: nibbles times activations less
// 8 times the activations' sum; Q8_0: quants times activations; Q4_K: the sub-blocks' dot products times their
// scales, and the minimums times the activations' sub-block sums; Q6_K: each 16's dot product less 32 times the
// activations' sum, times its scale), then fma(d_w * d_x, float(sum), acc) (Q4_K: and the minimums' fnmadd), block after
// block: the same bits whatever the row count, the tile or the thread split, and the same in the plain loops, the
// AVX2 tiles and the VNNI tiles. Several activation rows run as tiles of 4 rows by one group (the VNNI build: of 8
// rows, prefetching the weights ahead, so that a batch of decodes reads each weight byte from memory once; Q4_0 and
// Q4_K from 16 and 48 rows as tiles of 4 rows by two groups), the groups split across threads in runs that stay in
// cache while every tile of rows passes over them.
// The file's ggml type behind a grouped layout's number (any other number as it is).
inline int64_t grouped_file_type(int64_t type) {
  return type == kQ4_0_X8 ? kQ4_0 : type == kQ4_K_X8 ? kQ4_K : type == kQ6_K_X8 ? kQ6_K : type == kQ8_0_X8 ? kQ8_0 : type;
}

namespace x8 {

constexpr int64_t kGroup = 8;

// Where each byte of a block of row r goes in its group's block (kGroup times the block's bytes): Q4_0's scale to
// 2r, its nibble bytes 4c..4c+3 to 16 + 32c + 4r. Q4_K: d to 2r, dmin to 16 + 2r, its 12 bytes of packed scales
// as three 32-bit words, word t to 32 + 32t + 4r, its nibble bytes 32i + 4c.. to 128 + 256i + 32c + 4r. Q6_K: d
// to 2r, its 16 int8 scales as four words, word t to 16 + 32t + 4r, its 128 low-nibble bytes 4c.. to
// 144 + 32c + 4r, its 64 high-bit bytes 4c.. to 1168 + 32c + 4r (so two neighbouring chunks, 64 bytes, hold 8 bytes
// of each row). Q8_0: d to 2r, its quant bytes 4c.. to 16 + 32c + 4r.
template <typename T>
inline void scatter(const uint8_t* blk, uint8_t* out, int64_t r) {
  if constexpr (std::is_same_v<T, Q8_0>) {
    std::memcpy(out + 2 * r, blk, 2);
    for (int c = 0; c < 8; ++c) std::memcpy(out + 16 + 32 * c + 4 * r, blk + 2 + 4 * c, 4);
  } else if constexpr (std::is_same_v<T, Q6_K>) {
    std::memcpy(out + 2 * r, blk + 208, 2);
    for (int t = 0; t < 4; ++t) std::memcpy(out + 16 + 32 * t + 4 * r, blk + 192 + 4 * t, 4);
    for (int c = 0; c < 32; ++c) std::memcpy(out + 144 + 32 * c + 4 * r, blk + 4 * c, 4);
    for (int c = 0; c < 16; ++c) std::memcpy(out + 1168 + 32 * c + 4 * r, blk + 128 + 4 * c, 4);
  } else if constexpr (std::is_same_v<T, Q4_0>) {
    std::memcpy(out + 2 * r, blk, 2);
    for (int c = 0; c < 4; ++c) std::memcpy(out + 16 + 32 * c + 4 * r, blk + 2 + 4 * c, 4);
  } else {
    std::memcpy(out + 2 * r, blk, 2);
    std::memcpy(out + 16 + 2 * r, blk + 2, 2);
    for (int t = 0; t < 3; ++t) std::memcpy(out + 32 + 32 * t + 4 * r, blk + 4 + 4 * t, 4);
    for (int c = 0; c < 32; ++c) std::memcpy(out + 128 + 32 * c + 4 * r, blk + 16 + 4 * c, 4);
  }
}

template <typename T>
inline void gather(const uint8_t* in, uint8_t* blk, int64_t r) {
  if constexpr (std::is_same_v<T, Q8_0>) {
    std::memcpy(blk, in + 2 * r, 2);
    for (int c = 0; c < 8; ++c) std::memcpy(blk + 2 + 4 * c, in + 16 + 32 * c + 4 * r, 4);
  } else if constexpr (std::is_same_v<T, Q6_K>) {
    std::memcpy(blk + 208, in + 2 * r, 2);
    for (int t = 0; t < 4; ++t) std::memcpy(blk + 192 + 4 * t, in + 16 + 32 * t + 4 * r, 4);
    for (int c = 0; c < 32; ++c) std::memcpy(blk + 4 * c, in + 144 + 32 * c + 4 * r, 4);
    for (int c = 0; c < 16; ++c) std::memcpy(blk + 128 + 4 * c, in + 1168 + 32 * c + 4 * r, 4);
  } else if constexpr (std::is_same_v<T, Q4_0>) {
    std::memcpy(blk, in + 2 * r, 2);
    for (int c = 0; c < 4; ++c) std::memcpy(blk + 2 + 4 * c, in + 16 + 32 * c + 4 * r, 4);
  } else {
    std::memcpy(blk, in + 2 * r, 2);
    std::memcpy(blk + 2, in + 16 + 2 * r, 2);
    for (int t = 0; t < 3; ++t) std::memcpy(blk + 4 + 4 * t, in + 32 + 32 * t + 4 * r, 4);
    for (int c = 0; c < 32; ++c) std::memcpy(blk + 16 + 4 * c, in + 128 + 32 * c + 4 * r, 4);
  }
}

// src and dst may be the same bytes: each group is copied aside first. One thread: a 1B file's Q4_0 layers take
// about 0.1 s, and a loader's other threads are not kept waiting.
template <typename T>
void repack(const uint8_t* src, uint8_t* dst, int64_t n, int64_t row_bytes) {
  const int64_t groups = n / kGroup, nb = row_bytes / T::kBytes, group_bytes = kGroup * row_bytes;
  std::vector<uint8_t> copy(static_cast<size_t>(group_bytes));
  for (int64_t g = 0; g < groups; ++g) {
    std::memcpy(copy.data(), src + g * group_bytes, copy.size());
    uint8_t* out = dst + g * group_bytes;
    for (int64_t b = 0; b < nb; ++b, out += kGroup * T::kBytes) {
      for (int64_t r = 0; r < kGroup; ++r) scatter<T>(copy.data() + r * row_bytes + b * T::kBytes, out, r);
    }
  }
  if (dst != src) std::memcpy(dst + groups * group_bytes, src + groups * group_bytes, static_cast<size_t>((n - groups * kGroup) * row_bytes));
}

template <typename T>
void unpack(const uint8_t* src, uint8_t* dst, int64_t n, int64_t row_bytes) {
  const int64_t groups = n / kGroup, nb = row_bytes / T::kBytes, group_bytes = kGroup * row_bytes;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* in = src + g * group_bytes;
    for (int64_t b = 0; b < nb; ++b, in += kGroup * T::kBytes) {
      for (int64_t r = 0; r < kGroup; ++r) gather<T>(in, dst + g * group_bytes + r * row_bytes + b * T::kBytes, r);
    }
  }
  std::memcpy(dst + groups * group_bytes, src + groups * group_bytes, static_cast<size_t>((n - groups * kGroup) * row_bytes));
}

// Each activation row quantized per block (32 for Q4_0, 256 for Q4_K and Q6_K), row after row: q [m][k], d [m][nb];
// for Q4_0 8 * sum(q) [m][nb], for Q4_K the sums of each sub-block of 32 [m][nb][8] in the order 0 2 1 3 4 6 5 7 (so
// that one 32-bit broadcast pairs sub-blocks 2t and 2t + 2 against the minimums' byte pairs, see tile_k); for Q6_K
// (sixteenths) -32 times the sum of each 16 [m][nb][16] in off (the weights are q - 32); for Q8_0 128 * sum(q)
// (offset 128: the VNNI tile's weights are w + 128, unsigned).
constexpr int32_t kQ4Offset = 8, kQ8Offset = 128;
struct RowActs {
  int64_t m, k, size, nb;
  bool sixteenths;
  int32_t offset;
  bool paired;  // the VNNI build's 512-bit tiles: Q4_0, Q4_K and Q6_K quants in pairs of 4, Q4_0 and Q8_0 d2/off2
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> off;
  std::vector<int16_t> sums;
  // Q4_0 and Q8_0 paired: d and off of rows 2t and 2t + 1 side by side per block, [m / 2][nb][2] (see pair_block)
  std::vector<float> d2;
  std::vector<int32_t> off2;
  RowActs(int64_t m_, int64_t k_, int64_t size_, bool sixteenths_ = false, int32_t offset_ = kQ4Offset, bool paired_ = false)
      : m(m_), k(k_), size(size_), nb(k_ / size_), sixteenths(sixteenths_), offset(offset_), paired(paired_), q(static_cast<size_t>(m_ * k_)),
        d(static_cast<size_t>(m_ * nb)),
        off(size_ == 32 ? static_cast<size_t>(m_ * nb) : sixteenths_ ? static_cast<size_t>(m_ * nb * 16) : 0),
        sums(size_ == 256 && !sixteenths_ ? static_cast<size_t>(m_ * nb * 8) : 0),
        d2(size_ == 32 && paired_ ? static_cast<size_t>((m_ + 1) / 2 * 2 * nb) : 0),
        off2(size_ == 32 && paired_ ? static_cast<size_t>((m_ + 1) / 2 * 2 * nb) : 0) {}
  // Each 64 of a block of 256 in pairs of 4: 4c.. of its first 32, then 4c.. of its second (see tile_z_q4_k).
  static void pair_halves_of_64(int8_t* qb) {
    int8_t chunk[64];
    for (int p = 0; p < 4; ++p) {
      std::memcpy(chunk, qb + 64 * p, 64);
      for (int c = 0; c < 8; ++c) {
        std::memcpy(qb + 64 * p + 8 * c, chunk + 4 * c, 4);
        std::memcpy(qb + 64 * p + 8 * c + 4, chunk + 32 + 4 * c, 4);
      }
    }
  }
  template <bool kPlain, typename X>
  void quantize_row(const X* x, int64_t r) {
    for (int64_t b = 0; b < nb; ++b) {
      int8_t* qb = q.data() + r * k + size * b;
      float* db = d.data() + r * nb + b;
#ifdef HEARTH_GGUF_AVX2
      const int32_t sum = kPlain ? plain::quantize_block(x + size * b, size, db, qb) : avx2::quantize_block(x + size * b, size, db, qb);
#else
      const int32_t sum = plain::quantize_block(x + size * b, size, db, qb);
#endif
      if (size == 32) {
        off[static_cast<size_t>(r * nb + b)] = offset * sum;
        if (paired) {  // the scales and offsets of rows 2t and 2t + 1 side by side (see pair_block)
          const size_t pair = static_cast<size_t>(((r / 2) * nb + b) * 2 + r % 2);
          d2[pair] = *db;
          off2[pair] = offset * sum;
        }
        if (paired && offset == kQ4Offset) {  // Q4_0's in pairs of 4: 4c.. of the first 16, then 4c.. of the second
          int8_t block[32];
          std::memcpy(block, qb, 32);
          for (int c = 0; c < 4; ++c) {
            std::memcpy(qb + 8 * c, block + 4 * c, 4);
            std::memcpy(qb + 8 * c + 4, block + 16 + 4 * c, 4);
          }
        }
      } else if (sixteenths) {
        for (int g = 0; g < 16; ++g) {
          int32_t t = 0;
          for (int l = 0; l < 16; ++l) t += qb[16 * g + l];
          off[static_cast<size_t>((r * nb + b) * 16 + g)] = -32 * t;
        }
        if (paired) {  // the offsets of sub-blocks g and g + 2 side by side (see tile_z_q6_k)
          int32_t* o = off.data() + (r * nb + b) * 16;
          for (int j = 0; j < 16; j += 4) std::swap(o[j + 1], o[j + 2]);
          pair_halves_of_64(qb);
        }
      } else {
        static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
        for (int j = 0; j < 8; ++j) {
          int32_t t = 0;
          for (int l = 0; l < 32; ++l) t += qb[32 * kOrder[j] + l];
          sums[static_cast<size_t>((r * nb + b) * 8 + j)] = static_cast<int16_t>(t);
        }
        if (paired) pair_halves_of_64(qb);
      }
    }
  }
};

// --- the plain loops: a group of 8 weight rows (w: its first block) against MR activation rows from r0 ------------

template <int MR>
void tile_plain_q4_0(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q4_0::kBytes;
  for (int i = 0; i < MR; ++i) {
    const int8_t* xq = a.q.data() + (r0 + i) * a.k;
    const float* xd = a.d.data() + (r0 + i) * a.nb;
    const int32_t* xo = a.off.data() + (r0 + i) * a.nb;
    for (int j = 0; j < kGroup; ++j) {
      float acc = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* blk = w + b * kBlock;
        const int8_t* x = xq + 32 * b;
        int32_t s = 0;
        for (int c = 0; c < 4; ++c) {
          for (int t = 0; t < 4; ++t) {
            const uint8_t v = blk[16 + 32 * c + 4 * j + t];
            s += (v & 0xF) * x[4 * c + t] + (v >> 4) * x[16 + 4 * c + t];
          }
        }
        acc = std::fma(half_at(blk + 2 * j) * xd[b], static_cast<float>(s - xo[b]), acc);
      }
      y[i * ldy + j] = acc;
    }
  }
}

template <int MR>
void tile_plain_q4_k(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q4_K::kBytes;
  static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int i = 0; i < MR; ++i) {
    const int8_t* xq = a.q.data() + (r0 + i) * a.k;
    const float* xd = a.d.data() + (r0 + i) * a.nb;
    const int16_t* xs = a.sums.data() + (r0 + i) * a.nb * 8;
    for (int j = 0; j < kGroup; ++j) {
      float acc = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* blk = w + b * kBlock;
        const int8_t* x = xq + 256 * b;
        uint8_t packed[12], sc[8], mn[8];
        for (int t = 0; t < 3; ++t) std::memcpy(packed + 4 * t, blk + 32 + 32 * t + 4 * j, 4);
        k_scales(packed, sc, mn);
        int32_t sum = 0, mins = 0;
        for (int s = 0; s < 8; ++s) {
          int32_t dot = 0;
          for (int c = 0; c < 8; ++c) {
            for (int t = 0; t < 4; ++t) {
              const uint8_t v = blk[128 + 256 * (s / 2) + 32 * c + 4 * j + t];
              dot += ((s % 2 ? v >> 4 : v & 0xF)) * x[32 * s + 4 * c + t];
            }
          }
          sum += sc[s] * dot;
          mins += mn[kOrder[s]] * xs[b * 8 + s];
        }
        acc = std::fma(half_at(blk + 2 * j) * xd[b], static_cast<float>(sum), acc);
        acc = std::fma(-(half_at(blk + 16 + 2 * j) * xd[b]), static_cast<float>(mins), acc);
      }
      y[i * ldy + j] = acc;
    }
  }
}


// Q6_K: per super-block, each sub-block g of 16 (half 8h + 2i + e of run i, in half h) takes the dot product of its
// unsigned 6-bit quants with the activations, less 32 times the activations' sum (the weights are q - 32), times its
// int8 scale; their sum, an exact integer, meets d_w * d_x in one fma per block.
template <int MR>
void tile_plain_q6_k(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q6_K::kBytes;
  for (int i = 0; i < MR; ++i) {
    const int8_t* xq = a.q.data() + (r0 + i) * a.k;
    const float* xd = a.d.data() + (r0 + i) * a.nb;
    const int32_t* xo = a.off.data() + (r0 + i) * a.nb * 16;
    for (int j = 0; j < kGroup; ++j) {
      float acc = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* blk = w + b * kBlock;
        const int8_t* x = xq + 256 * b;
        int32_t sum = 0;
        for (int g = 0; g < 16; ++g) {
          const int h = g / 8, run = (g % 8) / 2, e = g % 2;
          int32_t dot = xo[b * 16 + g];
          for (int l = 16 * e; l < 16 * e + 16; ++l) {
            const uint8_t lo = blk[144 + 32 * ((64 * h + 32 * (run % 2) + l) / 4) + 4 * j + l % 4];
            const uint8_t hi = blk[1168 + 32 * ((32 * h + l) / 4) + 4 * j + l % 4];
            const int q = ((lo >> (4 * (run / 2))) & 0xF) | (((hi >> (2 * run)) & 3) << 4);
            dot += q * x[128 * h + 32 * run + l];
          }
          sum += static_cast<int8_t>(blk[16 + 32 * (g / 4) + 4 * j + g % 4]) * dot;
        }
        acc = std::fma(half_at(blk + 2 * j) * xd[b], static_cast<float>(sum), acc);
      }
      y[i * ldy + j] = acc;
    }
  }
}

// Q8_0: per block, the exact dot product of the signed quants with the activations, then fma(d_w * d_x, sum, acc).
template <int MR>
void tile_plain_q8_0(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q8_0::kBytes;
  for (int i = 0; i < MR; ++i) {
    const int8_t* xq = a.q.data() + (r0 + i) * a.k;
    const float* xd = a.d.data() + (r0 + i) * a.nb;
    for (int j = 0; j < kGroup; ++j) {
      float acc = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* blk = w + b * kBlock;
        const int8_t* x = xq + 32 * b;
        int32_t s = 0, t = 0;  // (w + 128) - 128 as unsigned bytes, as Q8_0::dot does (GCC 12's VPDPBUSD)
        for (int l = 0; l < 32; ++l) {
          s += static_cast<uint8_t>(blk[16 + 32 * (l / 4) + 4 * j + l % 4] ^ 0x80) * x[l];
          t += x[l];
        }
        acc = std::fma(half_at(blk + 2 * j) * xd[b], static_cast<float>(s - 128 * t), acc);
      }
      y[i * ldy + j] = acc;
    }
  }
}

#ifdef HEARTH_GGUF_AVX2
inline __m256i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

template <bool kVnni, int MR>
void tile_avx_q4_0(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q4_0::kBytes;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int32_t* xo = a.off.data() + r0 * nb;
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    if constexpr (kVnni) {  // about as far ahead as the K types' tiles (tile_z_q4_k)
      avx2::prefetch_ahead(w, kBlock, 48);
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    __m256i s[MR], t[MR];
    for (int i = 0; i < MR; ++i) s[i] = t[i] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * c));
      const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      for (int i = 0; i < MR; ++i) {
        const int8_t* x = xq + i * k + 32 * b + 4 * c;
#ifdef HEARTH_GGUF_AVX512
        if constexpr (kVnni) {
          s[i] = _mm256_dpbusd_epi32(s[i], lo, bcast4(x));
          t[i] = _mm256_dpbusd_epi32(t[i], hi, bcast4(x + 16));
        } else
#endif
        {  // pairs of nibble x activation: at most 2 * 15 * 127 each, eight of them fit int16
          s[i] = _mm256_add_epi16(s[i], _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(x)),
                                                         _mm256_maddubs_epi16(hi, bcast4(x + 16))));
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      __m256i sum = kVnni ? _mm256_add_epi32(s[i], t[i]) : _mm256_madd_epi16(s[i], _mm256_set1_epi16(1));
      sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(xo[i * nb + b]));
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd[i * nb + b])), _mm256_cvtepi32_ps(sum), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y + i * ldy, acc[i]);
}

// Q4_K: per super-block, the eight rows' packed scales unpack in four vectors (bytes 0-3 of each row's lane: the
// scales of sub-blocks 0-3, and so on), each sub-block's dot product of 32 nibbles times activations is one lane per
// row (VPDPBUSD; AVX2: VPMADDUBSW summed in int16), times its scale; the minimums' term pairs sub-blocks 2t, 2t + 2
// per VPMADDWD. The integers are those of the file-order tiles, and so is the fp32 code.
template <bool kVnni, int MR>
void tile_avx_q4_k(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q4_K::kBytes;
  const __m256i low4 = _mm256_set1_epi8(0x0F), low6 = _mm256_set1_epi8(0x3F), low2 = _mm256_set1_epi8(3);
  const __m256i byte0 = _mm256_set1_epi32(0xFF), even = _mm256_set1_epi16(0xFF);
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int16_t* xs = a.sums.data() + r0 * nb * 8;
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
    const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32));
    const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64));
    const __m256i u2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 96));
    const __m256i sc4[2] = {
        _mm256_and_si256(u0, low6),
        _mm256_or_si256(_mm256_and_si256(u2, low4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), low2), 4))};
    const __m256i mn_lo = _mm256_and_si256(u1, low6);
    const __m256i mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), low4),
                                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), low2), 4));
    // the minimums as int16 pairs: (0, 2), (1, 3), (4, 6), (5, 7)
    const __m256i mins[4] = {_mm256_and_si256(mn_lo, even), _mm256_srli_epi16(mn_lo, 8), _mm256_and_si256(mn_hi, even),
                             _mm256_srli_epi16(mn_hi, 8)};
    __m256i sum[MR];
    for (int i = 0; i < MR; ++i) sum[i] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles) and 2p + 1 (high)
      const __m256i s_lo = _mm256_and_si256(_mm256_srli_epi32(sc4[p / 2], 16 * (p % 2)), byte0);
      const __m256i s_hi = _mm256_and_si256(_mm256_srli_epi32(sc4[p / 2], 16 * (p % 2) + 8), byte0);
      __m256i lo_dot[MR], hi_dot[MR];
      for (int i = 0; i < MR; ++i) lo_dot[i] = hi_dot[i] = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 256 * p + 32 * c));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int i = 0; i < MR; ++i) {
          const int8_t* x = xq + i * k + 256 * b + 64 * p + 4 * c;
#ifdef HEARTH_GGUF_AVX512
          if constexpr (kVnni) {
            lo_dot[i] = _mm256_dpbusd_epi32(lo_dot[i], lo, bcast4(x));
            hi_dot[i] = _mm256_dpbusd_epi32(hi_dot[i], hi, bcast4(x + 32));
          } else
#endif
          {
            lo_dot[i] = _mm256_add_epi16(lo_dot[i], _mm256_maddubs_epi16(lo, bcast4(x)));
            hi_dot[i] = _mm256_add_epi16(hi_dot[i], _mm256_maddubs_epi16(hi, bcast4(x + 32)));
          }
        }
      }
      for (int i = 0; i < MR; ++i) {
        if constexpr (kVnni) {
          sum[i] = _mm256_add_epi32(sum[i], _mm256_add_epi32(_mm256_mullo_epi32(lo_dot[i], s_lo),
                                                             _mm256_mullo_epi32(hi_dot[i], s_hi)));
        } else {  // the int16 pair sums times the scale in both halves of the lane
          const __m256i p_lo = _mm256_madd_epi16(lo_dot[i], _mm256_or_si256(s_lo, _mm256_slli_epi32(s_lo, 16)));
          const __m256i p_hi = _mm256_madd_epi16(hi_dot[i], _mm256_or_si256(s_hi, _mm256_slli_epi32(s_hi, 16)));
          sum[i] = _mm256_add_epi32(sum[i], _mm256_add_epi32(p_lo, p_hi));
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      const int16_t* bs = xs + (i * nb + b) * 8;
      __m256i m = _mm256_madd_epi16(mins[0], bcast4(bs));
      m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[1], bcast4(bs + 2)));
      m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[2], bcast4(bs + 4)));
      m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[3], bcast4(bs + 6)));
      const __m256 dx = _mm256_set1_ps(xd[i * nb + b]);
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(sum[i]), acc[i]);
      acc[i] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(m), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y + i * ldy, acc[i]);
}

// Q8_0, 4 quant bytes of the eight rows per vector: |w| times the broadcast activations with w's sign (VPMADDUBSW,
// at most 2 * 128 * 127 per pair), summed per lane (VPMADDWD): tile_plain_q8_0's integers, and its fp32 code.
template <int MR>
void tile_avx_q8_0(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q8_0::kBytes;
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    __m256i s[MR];
    for (int i = 0; i < MR; ++i) s[i] = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * c));
      const __m256i av = _mm256_sign_epi8(v, v);
      for (int i = 0; i < MR; ++i) {
        const __m256i x = _mm256_sign_epi8(bcast4(xq + i * k + 32 * b + 4 * c), v);
        s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(av, x), ones));
      }
    }
    for (int i = 0; i < MR; ++i) {
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd[i * nb + b])), _mm256_cvtepi32_ps(s[i]), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y + i * ldy, acc[i]);
}

// Q6_K, 4 bytes of the eight rows per vector: the 6-bit quants of four runs from two low-nibble chunks and one
// high-bit chunk, each run's dot product with the broadcast activations one lane per row (VPDPBUSD; AVX2: VPMADDUBSW
// and VPMADDWD), started from -32 times the activations' sum and times the sub-block's int8 scale per lane. The
// integers are tile_plain_q6_k's, and so is the fp32 code.
template <bool kVnni, int MR>
void tile_avx_q6_k(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q6_K::kBytes;
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int32_t* xo = a.off.data() + r0 * nb * 16;
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    // the block's 1680 bytes are read out of order: prefetched, or the weights stream at a quarter of the speed
    avx2::prefetch_ahead(w, kBlock, 4);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    __m256i sum[MR];
    for (int i = 0; i < MR; ++i) sum[i] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      for (int e = 0; e < 2; ++e) {  // sub-blocks 8h + 2run + e: bytes 16e.. of each run
        __m256i dot[MR][4];
        for (int i = 0; i < MR; ++i) {
          for (int run = 0; run < 4; ++run) dot[i][run] = _mm256_set1_epi32(xo[(i * nb + b) * 16 + 8 * h + 2 * run + e]);
        }
        for (int c = 0; c < 4; ++c) {
          const int l = 16 * e + 4 * c;
          const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 144 + 32 * ((64 * h + l) / 4)));
          const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 144 + 32 * ((64 * h + 32 + l) / 4)));
          const __m256i vh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 1168 + 32 * ((32 * h + l) / 4)));
          const __m256i q[4] = {
              _mm256_or_si256(_mm256_and_si256(v0, low4), _mm256_and_si256(_mm256_slli_epi16(vh, 4), bits45)),
              _mm256_or_si256(_mm256_and_si256(v1, low4), _mm256_and_si256(_mm256_slli_epi16(vh, 2), bits45)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low4), _mm256_and_si256(vh, bits45)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low4),
                              _mm256_and_si256(_mm256_srli_epi16(vh, 2), bits45))};
          for (int i = 0; i < MR; ++i) {
            for (int run = 0; run < 4; ++run) {
              const __m256i x = bcast4(xq + i * k + 256 * b + 128 * h + 32 * run + l);
#ifdef HEARTH_GGUF_AVX512
              if constexpr (kVnni) {
                dot[i][run] = _mm256_dpbusd_epi32(dot[i][run], q[run], x);
                continue;
              }
#endif
              // a pair of 6-bit quants times activations: at most 2 * 63 * 127, no saturation
              dot[i][run] = _mm256_add_epi32(dot[i][run], _mm256_madd_epi16(_mm256_maddubs_epi16(q[run], x),
                                                                            _mm256_set1_epi16(1)));
            }
          }
        }
        for (int run = 0; run < 4; ++run) {
          const int g = 8 * h + 2 * run + e;
          const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * (g / 4)));
          const __m256i sc = _mm256_srai_epi32(_mm256_slli_epi32(words, 24 - 8 * (g % 4)), 24);
          for (int i = 0; i < MR; ++i) sum[i] = _mm256_add_epi32(sum[i], _mm256_mullo_epi32(dot[i][run], sc));
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xd[i * nb + b])), _mm256_cvtepi32_ps(sum[i]), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y + i * ldy, acc[i]);
}
#endif

#ifdef HEARTH_GGUF_AVX512
// The VNNI build's tiles for two neighbouring groups at once (16 weight rows, one 32-bit lane each in a 512-bit
// vector: the first group's rows in the lower half). Every lane takes the 256-bit VNNI tile's operations on the same
// integers, so the bits are the same whether a group runs alone or in a pair.
inline __m512i pair_load(const uint8_t* a, const uint8_t* b) {
  return _mm512_maskz_inserti64x4(0xFF, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}
inline __m512 pair_halves(const uint8_t* a, const uint8_t* b) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)),
                                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a))));
}
inline __m512i bcast4w(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

template <int MR>
void tile_pair_q4_0(const uint8_t* w0, const uint8_t* w1, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q4_0::kBytes;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int32_t* xo = a.off.data() + r0 * nb;
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w0 += kBlock, w1 += kBlock) {
    const __m512 dw = pair_halves(w0, w1);
    __m512i s[MR], t[MR];
    for (int i = 0; i < MR; ++i) s[i] = t[i] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i v = pair_load(w0 + 16 + 32 * c, w1 + 16 + 32 * c);
      const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      for (int i = 0; i < MR; ++i) {
        const int8_t* x = xq + i * k + 32 * b + 4 * c;
        s[i] = _mm512_dpbusd_epi32(s[i], lo, bcast4w(x));
        t[i] = _mm512_dpbusd_epi32(t[i], hi, bcast4w(x + 16));
      }
    }
    for (int i = 0; i < MR; ++i) {
      const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(s[i], t[i]), _mm512_set1_epi32(xo[i * nb + b]));
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xd[i * nb + b])), _mm512_maskz_cvtepi32_ps(0xFFFF, sum), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(y + i * ldy, acc[i]);
}

template <int MR>
void tile_pair_q4_k(const uint8_t* w0, const uint8_t* w1, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q4_K::kBytes;
  const __m512i low4 = _mm512_set1_epi8(0x0F), low6 = _mm512_set1_epi8(0x3F), low2 = _mm512_set1_epi8(3);
  const __m512i byte0 = _mm512_set1_epi32(0xFF), even = _mm512_set1_epi16(0xFF);
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int16_t* xs = a.sums.data() + r0 * nb * 8;
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w0 += kBlock, w1 += kBlock) {
    const __m512 d = pair_halves(w0, w1), dmin = pair_halves(w0 + 16, w1 + 16);
    const __m512i u0 = pair_load(w0 + 32, w1 + 32), u1 = pair_load(w0 + 64, w1 + 64), u2 = pair_load(w0 + 96, w1 + 96);
    const __m512i sc4[2] = {
        _mm512_and_si512(u0, low6),
        _mm512_or_si512(_mm512_and_si512(u2, low4), _mm512_maskz_slli_epi32(0xFFFF, _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u0, 6), low2), 4))};
    const __m512i mn_lo = _mm512_and_si512(u1, low6);
    const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u2, 4), low4),
                                          _mm512_maskz_slli_epi32(0xFFFF, _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u1, 6), low2), 4));
    const __m512i mins[4] = {_mm512_and_si512(mn_lo, even), _mm512_srli_epi16(mn_lo, 8), _mm512_and_si512(mn_hi, even),
                             _mm512_srli_epi16(mn_hi, 8)};
    __m512i sum[MR];
    for (int i = 0; i < MR; ++i) sum[i] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      const __m512i s_lo = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, sc4[p / 2], 16 * (p % 2)), byte0);
      const __m512i s_hi = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, sc4[p / 2], 16 * (p % 2) + 8), byte0);
      __m512i lo_dot[MR], hi_dot[MR];
      for (int i = 0; i < MR; ++i) lo_dot[i] = hi_dot[i] = _mm512_setzero_si512();
      for (int c = 0; c < 8; ++c) {
        const __m512i v = pair_load(w0 + 128 + 256 * p + 32 * c, w1 + 128 + 256 * p + 32 * c);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        for (int i = 0; i < MR; ++i) {
          const int8_t* x = xq + i * k + 256 * b + 64 * p + 4 * c;
          lo_dot[i] = _mm512_dpbusd_epi32(lo_dot[i], lo, bcast4w(x));
          hi_dot[i] = _mm512_dpbusd_epi32(hi_dot[i], hi, bcast4w(x + 32));
        }
      }
      for (int i = 0; i < MR; ++i) {
        sum[i] = _mm512_add_epi32(sum[i], _mm512_add_epi32(_mm512_mullo_epi32(lo_dot[i], s_lo),
                                                           _mm512_mullo_epi32(hi_dot[i], s_hi)));
      }
    }
    for (int i = 0; i < MR; ++i) {
      const int16_t* bs = xs + (i * nb + b) * 8;
      __m512i m = _mm512_madd_epi16(mins[0], bcast4w(bs));
      m = _mm512_add_epi32(m, _mm512_madd_epi16(mins[1], bcast4w(bs + 2)));
      m = _mm512_add_epi32(m, _mm512_madd_epi16(mins[2], bcast4w(bs + 4)));
      m = _mm512_add_epi32(m, _mm512_madd_epi16(mins[3], bcast4w(bs + 6)));
      const __m512 dx = _mm512_set1_ps(xd[i * nb + b]);
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_maskz_cvtepi32_ps(0xFFFF, sum[i]), acc[i]);
      acc[i] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_maskz_cvtepi32_ps(0xFFFF, m), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(y + i * ldy, acc[i]);
}

// The fp32 work of a block for two activation rows at once (tile_z_q4_0, tile_z_q8_0): u holds row i's integers,
// v row i + 1's, each row's sum for weight row j split over lanes 2j and 2j + 1. They are folded into one vector
// (lane 2j: row i's sum for weight row j, lane 2j + 1: row i + 1's), the pair's offsets (xo2) are taken off, and it
// is scaled by the pair's block scales (xd2) times dw2 (weight row j's scale in lanes 2j and 2j + 1) into acc. Every
// lane takes the one-row tiles' integer and fp32 code.
inline __m512 pair_block(__m512i u, __m512i v, const int32_t* xo2, const float* xd2, __m512 dw2, __m512 acc) {
  const __m512i sum = _mm512_add_epi32(_mm512_mask_shuffle_epi32(u, 0xAAAA, v, _MM_PERM_CDAB),
                                       _mm512_mask_shuffle_epi32(v, 0x5555, u, _MM_PERM_CDAB));
  int64_t o2, d2;
  std::memcpy(&o2, xo2, sizeof o2);
  std::memcpy(&d2, xd2, sizeof d2);
  const __m512i s = _mm512_sub_epi32(sum, _mm512_set1_epi64(o2));
  const __m512 dx = _mm512_castsi512_ps(_mm512_set1_epi64(d2));
  return _mm512_fmadd_ps(_mm512_mul_ps(dw2, dx), _mm512_maskz_cvtepi32_ps(0xFFFF, s), acc);
}

// The eight fp16 scales of a group block's weight rows, each in both lanes of its pair (see pair_block).
inline __m512 pair_scales(const uint8_t* w) {
  const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm512_maskz_permutexvar_ps(0xFFFF, twice, _mm512_castsi512_ps(avx2::zext512(_mm256_castps_si256(dw))));
}

// One row's fp32 work of a block (an odd last row): its lane pairs folded, its offset taken off, scaled into acc.
inline __m256 row_block(__m512i dot, int32_t xo, float xd, const uint8_t* w, __m256 acc) {
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  const __m256i sum = _mm256_sub_epi32(avx2::fold_lane_pairs(dot), _mm256_set1_epi32(xo));
  return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd)), _mm256_cvtepi32_ps(sum), acc);
}

// The pairs' accumulators (see pair_block) back to rows of eight outputs, then an odd last row's.
template <int MR>
inline void store_pairs(const __m512 (&acc2)[MR / 2 > 0 ? MR / 2 : 1], __m256 acc1, float* y, int64_t ldy) {
  const __m512i rows_apart = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
  for (int t = 0; t < MR / 2; ++t) {
    const __m512i rows = _mm512_castps_si512(_mm512_maskz_permutexvar_ps(0xFFFF, rows_apart, acc2[t]));
    _mm256_storeu_ps(y + 2 * t * ldy, _mm256_castsi256_ps(_mm512_maskz_extracti64x4_epi64(0xF, rows, 0)));
    _mm256_storeu_ps(y + (2 * t + 1) * ldy, _mm256_castsi256_ps(_mm512_maskz_extracti64x4_epi64(0xF, rows, 1)));
  }
  if constexpr (MR % 2 == 1) _mm256_storeu_ps(y + (MR - 1) * ldy, acc1);
}

// The loop of tile_z_q4_0 and tile_z_q8_0 over a group's blocks: for each block, dots(w, xb, dot) adds each
// activation row's integers to dot[i] (xb: the block's first activation byte of row 0, rows k apart), then the
// fp32 work follows, two rows at once (pair_block) and an odd last row alone (row_block).
template <int MR, int64_t kBlock, int64_t kAhead, typename Dots>
inline void tile_z_pairs(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy, Dots&& dots) {
  constexpr int kPairs = MR / 2;
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int32_t* xo = a.off.data() + r0 * nb;
  const float* xd2 = a.d2.data() + r0 * nb;  // r0 is even: pair t of this tile is rows r0 + 2t, r0 + 2t + 1
  const int32_t* xo2 = a.off2.data() + r0 * nb;
  __m512 acc2[kPairs > 0 ? kPairs : 1];
  for (int t = 0; t < kPairs; ++t) acc2[t] = _mm512_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();  // an odd last row
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    avx2::prefetch_ahead(w, kBlock, kAhead);
    __m512i dot[MR];
    for (int i = 0; i < MR; ++i) dot[i] = _mm512_setzero_si512();
    dots(w, xq + 32 * b, dot);
    if constexpr (kPairs > 0) {
      const __m512 dw2 = pair_scales(w);
      for (int t = 0; t < kPairs; ++t)
        acc2[t] = pair_block(dot[2 * t], dot[2 * t + 1], xo2 + (t * nb + b) * 2, xd2 + (t * nb + b) * 2, dw2, acc2[t]);
    }
    if constexpr (MR % 2 == 1) acc1 = row_block(dot[MR - 1], xo[(MR - 1) * nb + b], xd[(MR - 1) * nb + b], w, acc1);
  }
  store_pairs<MR>(acc2, acc1, y, ldy);
}

// Q4_0 in the VNNI build, as tile_z_q4_k: each 512-bit vector holds 4 nibble bytes of the eight rows twice, the low
// nibbles (weights 4c..) in lane 2r and the high ones (16 + 4c..) in lane 2r + 1, against 8 activation bytes (the
// paired layout) broadcast to every lane pair: one VPDPBUSD per row takes what two 256-bit ones took in
// tile_avx_q4_0. Each block's fp32 work is done for two activation rows at once: the lanes of rows i and i + 1 are
// folded into one vector (lane 2j: row i's sum for weight row j, lane 2j + 1: row i + 1's), so the offsets, the
// scales and the accumulators take one 512-bit operation per two rows (with eight rows, the per-row 256-bit code
// took more instructions than the dot products). Every lane still takes tile_avx_q4_0's integer and fp32 code.
template <int MR>
void tile_z_q4_0(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int64_t k = a.k;
  tile_z_pairs<MR, kGroup * Q4_0::kBytes, 48>(w, a, r0, y, ldy, [&](const uint8_t* wb, const int8_t* xb, __m512i* dot) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_maskz_cvtepu32_epi64(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 16 + 32 * c)));
      const __m512i q = _mm512_ternarylogic_epi64(v, _mm512_maskz_slli_epi64(0xFF, v, 28), low4, 0xA8);  // (v | v << 28) & 0x0F
      for (int i = 0; i < MR; ++i) {
        int64_t x8;
        std::memcpy(&x8, xb + i * k + 8 * c, sizeof x8);
        dot[i] = _mm512_dpbusd_epi32(dot[i], q, _mm512_set1_epi64(x8));
      }
    }
  });
}

// Q4_K in the VNNI build, one group, up to eight activation rows at once: each 512-bit vector holds 4 nibble bytes
// of the eight rows twice, the low nibbles (sub-block 2p) in lane 2r and the high ones (sub-block 2p + 1) in lane
// 2r + 1, against 8 activation bytes (the paired layout: 4 of sub-block 2p, then the same 4 of 2p + 1) broadcast to
// every lane pair, so one VPDPBUSD per row does both sub-blocks. Each lane is scaled by its own sub-block's scale and
// the two lanes of a row are added at the end of the super-block: each row then holds exactly tile_avx_q4_k's
// integer, and the minimums' term and the fp32 code are that tile's own. With every row of a tile in one pass, each
// weight byte is read from memory once for up to eight rows: two passes of four (the pair tiles) ran the 1B Q4_K
// layers at 8 rows at about 0.6x this speed (AVX512 EPYC, two threads, weights from memory).
// Blocks ahead that the 8-row tiles prefetch: without it the weights' stream stalled at every page and an 8-row
// call took about the tile's arithmetic plus the memory's time, not the larger of the two (a 1B file's Q4_K layers
// at 8 rows: 38-40 ms without, 21-22 ms at 4-8 blocks ahead, 22-27 ms at 16; AVX512 EPYC, two threads)
constexpr int64_t kPrefetchZ = 6;
// The decoding tile_z_q4_k does and the panels store (unpack_panel_q4_k), in one place. A Q4_K group block's scales:
// the 6-bit scales of each row, widened to qwords (sc4[0]: sub-blocks 0-3, sc4[1]: 4-7), and its four minimum
// vectors (mins[j]: the minimums of sub-blocks 2j' and 2j' + 1 side by side, in the order of the activations' sums).
inline void z_scales_q4_k(const uint8_t* w, __m512i sc4[2], __m256i mins[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low6 = _mm256_set1_epi8(0x3F), low2 = _mm256_set1_epi8(3);
  const __m256i even = _mm256_set1_epi16(0xFF);
  const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32));
  const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64));
  const __m256i u2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 96));
  sc4[0] = _mm512_maskz_cvtepu32_epi64(0xFF, _mm256_and_si256(u0, low6));
  sc4[1] = _mm512_maskz_cvtepu32_epi64(0xFF, _mm256_or_si256(
      _mm256_and_si256(u2, low4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), low2), 4)));
  const __m256i mn_lo = _mm256_and_si256(u1, low6);
  const __m256i mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), low4),
                                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), low2), 4));
  mins[0] = _mm256_and_si256(mn_lo, even);
  mins[1] = _mm256_srli_epi16(mn_lo, 8);
  mins[2] = _mm256_and_si256(mn_hi, even);
  mins[3] = _mm256_srli_epi16(mn_hi, 8);
}
// The scales of sub-blocks 2p (lane 2r) and 2p + 1 (lane 2r + 1) of each row r, from z_scales_q4_k's sc4.
inline __m512i z_scale_q4_k(const __m512i sc4[2], int p) {
  // byte 2(p % 2) of each row's scale word to lane 2r, byte 2(p % 2) + 1 to lane 2r + 1 (VPSHUFB in 128-bit lanes)
  const __m512i pick[2] = {_mm512_set4_epi32(static_cast<int>(0x80808009), static_cast<int>(0x80808008),
                                             static_cast<int>(0x80808001), static_cast<int>(0x80808000)),
                           _mm512_set4_epi32(static_cast<int>(0x8080800B), static_cast<int>(0x8080800A),
                                             static_cast<int>(0x80808003), static_cast<int>(0x80808002))};
  return _mm512_shuffle_epi8(sc4[p / 2], pick[p % 2]);
}
// Chunk c of part p of a Q4_K group block: row r's 4 bytes in the low half of qword r, shifted by 28 into its high
// half as well, so the low nibbles stay in the low dword and the high ones land in the high dword.
inline __m512i z_quants_q4_k(const uint8_t* w, int p, int c) {
  const __m512i v = _mm512_maskz_cvtepu32_epi64(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 256 * p + 32 * c)));
  return _mm512_ternarylogic_epi64(v, _mm512_maskz_slli_epi64(0xFF, v, 28), _mm512_set1_epi8(0x0F), 0xA8);  // (v | v << 28) & 0x0F
}
template <int MR>
void tile_z_q4_k(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q4_K::kBytes;
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int16_t* xs = a.sums.data() + r0 * nb * 8;
  // the accumulators live in memory, touched once per super-block: in registers, eight rows' would spill the dot
  // products the inner loop keeps
  alignas(32) float acc[MR][8] = {};
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    avx2::prefetch_ahead(w, kBlock, kPrefetchZ);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
    __m512i sc4[2];
    __m256i mins[4];
    z_scales_q4_k(w, sc4, mins);
    __m512i sum[MR];
    for (int i = 0; i < MR; ++i) sum[i] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      const __m512i s = z_scale_q4_k(sc4, p);
      __m512i dot[MR];
      for (int i = 0; i < MR; ++i) dot[i] = _mm512_setzero_si512();
      // unrolled: rolled, GCC copied each dot product out and back around its VPDPBUSD (8 rows from memory: 17-24
      // ms against 22-34 rolled, in alternating runs)
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i q = z_quants_q4_k(w, p, c);
        for (int i = 0; i < MR; ++i) {
          int64_t x8;
          std::memcpy(&x8, xq + i * k + 256 * b + 64 * p + 8 * c, sizeof x8);
          dot[i] = _mm512_dpbusd_epi32(dot[i], q, _mm512_set1_epi64(x8));
        }
      }
      for (int i = 0; i < MR; ++i) sum[i] = _mm512_add_epi32(sum[i], _mm512_mullo_epi32(dot[i], s));
    }
    for (int i = 0; i < MR; ++i) {
      const __m256i rows = avx2::fold_lane_pairs(sum[i]);
      const int16_t* bs = xs + (i * nb + b) * 8;
      __m256i m = _mm256_madd_epi16(mins[0], bcast4(bs));
      m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[1], bcast4(bs + 2)));
      m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[2], bcast4(bs + 4)));
      m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[3], bcast4(bs + 6)));
      const __m256 dx = _mm256_set1_ps(xd[i * nb + b]);
      __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(rows), _mm256_load_ps(acc[i]));
      _mm256_store_ps(acc[i], _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(m), t));
    }
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y + i * ldy, _mm256_load_ps(acc[i]));
}

// Q6_K in the VNNI build, one group, 8 bytes of the eight rows per 512-bit vector: two neighbouring chunks, their
// 32-bit words interleaved (lane 2r the first 4 bytes of row r, lane 2r + 1 the next 4), against 8 broadcast
// activation bytes (VPDPBUSD; no shuffle per activation row). The -32 offsets start the even lanes only, the scales
// multiply both lanes of a row, and the two are added at the end of each super-block: each row then holds exactly
// tile_avx_q6_k's integer, and the fp32 code is its own. The next blocks are prefetched: the group's block reads
// its 1680 bytes out of order, and from memory (a 1B head, 8192 x 2048) it ran at a quarter of the file order's
// speed without (AVX512 EPYC, one thread).
template <int MR>
void tile_wide_q6_k(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q6_K::kBytes;
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  constexpr int64_t kPrefetch = 4;
  const __m512i interleave = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int32_t* xo = a.off.data() + r0 * nb * 16;
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    avx2::prefetch_ahead(w, kBlock, kPrefetch);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    __m512i sum[MR];
    for (int i = 0; i < MR; ++i) sum[i] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      for (int e = 0; e < 2; ++e) {
        __m512i dot[MR][4];
        for (int i = 0; i < MR; ++i) {
          for (int run = 0; run < 4; ++run) {
            dot[i][run] = _mm512_maskz_set1_epi32(0x5555, xo[(i * nb + b) * 16 + 8 * h + 2 * run + e]);
          }
        }
        for (int c = 0; c < 4; c += 2) {
          const int l = 16 * e + 4 * c;
          const __m512i v0 = _mm512_maskz_permutexvar_epi32(0xFFFF, interleave, _mm512_loadu_si512(w + 144 + 32 * ((64 * h + l) / 4)));
          const __m512i v1 = _mm512_maskz_permutexvar_epi32(0xFFFF, interleave, _mm512_loadu_si512(w + 144 + 32 * ((64 * h + 32 + l) / 4)));
          const __m512i vh = _mm512_maskz_permutexvar_epi32(0xFFFF, interleave, _mm512_loadu_si512(w + 1168 + 32 * ((32 * h + l) / 4)));
          const __m512i q[4] = {
              _mm512_or_si512(_mm512_and_si512(v0, low4), _mm512_and_si512(_mm512_slli_epi16(vh, 4), bits45)),
              _mm512_or_si512(_mm512_and_si512(v1, low4), _mm512_and_si512(_mm512_slli_epi16(vh, 2), bits45)),
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low4), _mm512_and_si512(vh, bits45)),
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low4),
                              _mm512_and_si512(_mm512_srli_epi16(vh, 2), bits45))};
          for (int i = 0; i < MR; ++i) {
            for (int run = 0; run < 4; ++run) {  // activation bytes 0-3 to the even lanes, 4-7 to the odd ones
              int64_t x8;
              std::memcpy(&x8, xq + i * k + 256 * b + 128 * h + 32 * run + l, sizeof x8);
              dot[i][run] = _mm512_dpbusd_epi32(dot[i][run], q[run], _mm512_set1_epi64(x8));
            }
          }
        }
        for (int run = 0; run < 4; ++run) {
          const int g = 8 * h + 2 * run + e;
          const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * (g / 4)));
          const __m256i sc = _mm256_srai_epi32(_mm256_slli_epi32(words, 24 - 8 * (g % 4)), 24);
          const __m512i sc2 = _mm512_maskz_permutexvar_epi32(0xFFFF, twice, avx2::pair512(sc, sc));
          for (int i = 0; i < MR; ++i) sum[i] = _mm512_add_epi32(sum[i], _mm512_mullo_epi32(dot[i][run], sc2));
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      const __m256i rows = avx2::fold_lane_pairs(sum[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xd[i * nb + b])), _mm256_cvtepi32_ps(rows), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y + i * ldy, acc[i]);
}

// The decoding tile_z_q6_k does and the panels store (unpack_panel_q6_k), in one place. The quants of chunk c of
// sub-blocks 8h + 4p + e (lane 2r) and 8h + 4p + 2 + e (lane 2r + 1) of each row r, 0..63: sub-block g's low bits
// (v0) in the lower half, g + 2's (v1) in the upper; their high bits, vh shifted into bits 4-5 by a per-half count;
// then row r's dword of each half to lanes 2r and 2r + 1.
inline __m512i z_quants_q6_k(const uint8_t* w, int h, int p, int e, int c) {
  const __m512i zip = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
  // the high bits' shifts, per 16-bit lane of each half: p = 0 left by 4 (g) and 2 (g + 2), p = 1 right by 0 and 2
  const __m512i up[2] = {_mm512_mask_blend_epi16(0xFFFF0000, _mm512_set1_epi16(4), _mm512_set1_epi16(2)),
                         _mm512_maskz_mov_epi16(0xFFFF0000, _mm512_set1_epi16(2))};
  const int l = 16 * e + 4 * c;
  const __m512i v = avx2::pair512(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 144 + 32 * (16 * h + l / 4))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 144 + 32 * (16 * h + 8 + l / 4))));
  const __m512i vh = _mm512_maskz_broadcast_i64x4(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 1168 + 32 * (8 * h + l / 4))));
  const __m512i low = p == 0 ? v : _mm512_srli_epi16(v, 4);
  const __m512i high = _mm512_and_si512(p == 0 ? _mm512_sllv_epi16(vh, up[0]) : _mm512_srlv_epi16(vh, up[1]),
                                        _mm512_set1_epi8(0x30));
  return _mm512_maskz_permutexvar_epi32(0xFFFF, zip, _mm512_ternarylogic_epi32(low, _mm512_set1_epi8(0x0F), high, 0xEA));  // (low & 0x0F) | high
}
// The scales of those two sub-blocks of each row, in lanes 2r and 2r + 1.
inline __m512i z_scale_q6_k(const uint8_t* w, int h, int p, int e) {
  // byte e of row r's scale word to the top byte of lane 2r, byte e + 2 to that of lane 2r + 1 (then >> 24)
  const __m512i pick[2] = {
      _mm512_set4_epi32(0x0A808080, 0x08808080, 0x02808080, 0x00808080),
      _mm512_set4_epi32(0x0B808080, 0x09808080, 0x03808080, 0x01808080)};
  const __m512i words = _mm512_maskz_cvtepu32_epi64(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * (2 * h + p))));
  return _mm512_maskz_srai_epi32(0xFFFF, _mm512_shuffle_epi8(words, pick[e]), 24);
}

// Q6_K in the VNNI build, one group, up to eight activation rows: each 512-bit vector holds 4 quant bytes of the
// eight rows for two sub-blocks, g (run 2p of a half) in lane 2r and g + 2 (run 2p + 1) in lane 2r + 1, against 8
// activation bytes (paired as Q4_K's) broadcast to every lane pair. Each lane starts from -32 times its sub-block's
// activation sum and ends times its own sub-block's scale, so one 32-bit multiply per row scales two sub-blocks of
// 16 (tile_wide_q6_k: one); the two lanes of a row are added per super-block: tile_avx_q6_k's integer, and its
// fp32 code.
template <int MR>
void tile_z_q6_k(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q6_K::kBytes;
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int32_t* xo = a.off.data() + r0 * nb * 16;
  alignas(32) float acc[MR][8] = {};
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    avx2::prefetch_ahead(w, kBlock, kPrefetchZ);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    __m512i sum[MR];
    for (int i = 0; i < MR; ++i) sum[i] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      for (int p = 0; p < 2; ++p) {
        for (int e = 0; e < 2; ++e) {  // sub-blocks 8h + 4p + e and 8h + 4p + 2 + e
          __m512i dot[MR];
          for (int i = 0; i < MR; ++i) {
            int64_t o2;
            std::memcpy(&o2, xo + (i * nb + b) * 16 + 8 * h + 4 * p + 2 * e, sizeof o2);
            dot[i] = _mm512_set1_epi64(o2);
          }
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {
            const __m512i q = z_quants_q6_k(w, h, p, e, c);
            for (int i = 0; i < MR; ++i) {
              int64_t x8;
              std::memcpy(&x8, xq + i * k + 256 * b + 128 * h + 64 * p + 32 * e + 8 * c, sizeof x8);
              dot[i] = _mm512_dpbusd_epi32(dot[i], q, _mm512_set1_epi64(x8));
            }
          }
          const __m512i sc = z_scale_q6_k(w, h, p, e);
          for (int i = 0; i < MR; ++i) sum[i] = _mm512_add_epi32(sum[i], _mm512_mullo_epi32(dot[i], sc));
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      const __m256i rows = avx2::fold_lane_pairs(sum[i]);
      const __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xd[i * nb + b])), _mm256_cvtepi32_ps(rows), _mm256_load_ps(acc[i]));
      _mm256_store_ps(acc[i], t);
    }
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y + i * ldy, _mm256_load_ps(acc[i]));
}

// Q8_0 in the VNNI build: 8 quant bytes of the eight rows per 512-bit vector, interleaved as tile_wide_q6_k's, made
// unsigned (w + 128) for VPDPBUSD against 8 broadcast activation bytes; 128 times the activations' sum starts the
// even lanes negative, and the two lanes of a row are added per block: tile_avx_q8_0's integers and fp32 code.
template <int MR>
void tile_wide_q8_0(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t kBlock = kGroup * Q8_0::kBytes;
  const __m512i interleave = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int32_t* xo = a.off.data() + r0 * nb;
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kBlock) {
    avx2::prefetch_ahead(w, kBlock, 24);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    __m512i s[MR];
    for (int i = 0; i < MR; ++i) s[i] = _mm512_maskz_set1_epi32(0x5555, -xo[i * nb + b]);
    for (int c = 0; c < 8; c += 2) {
      const __m512i v = _mm512_xor_si512(
          _mm512_maskz_permutexvar_epi32(0xFFFF, interleave, _mm512_loadu_si512(w + 16 + 32 * c)), flip);
      for (int i = 0; i < MR; ++i) {
        int64_t x8;
        std::memcpy(&x8, xq + i * k + 32 * b + 4 * c, sizeof x8);
        s[i] = _mm512_dpbusd_epi32(s[i], v, _mm512_set1_epi64(x8));
      }
    }
    for (int i = 0; i < MR; ++i) {
      const __m256i rows = avx2::fold_lane_pairs(s[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd[i * nb + b])), _mm256_cvtepi32_ps(rows), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y + i * ldy, acc[i]);
}

// Q8_0 in the VNNI build from two activation rows: tile_wide_q8_0's integers, with tile_z_q4_0's fp32 work, two
// rows at once (pair_block). With the one-row code per block (fold, convert, scale, accumulate), eight rows took
// about as many other instructions as VPDPBUSD, and Q8_0 ran eight rows at 0.7x Q4_0's rate.
template <int MR>
void tile_z_q8_0(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  const __m512i interleave = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t k = a.k;
  tile_z_pairs<MR, kGroup * Q8_0::kBytes, 24>(w, a, r0, y, ldy, [&](const uint8_t* wb, const int8_t* xb, __m512i* dot) {
#pragma GCC unroll 4
    for (int c = 0; c < 8; c += 2) {
      const __m512i v = _mm512_xor_si512(
          _mm512_maskz_permutexvar_epi32(0xFFFF, interleave, _mm512_loadu_si512(wb + 16 + 32 * c)), flip);
      for (int i = 0; i < MR; ++i) {
        int64_t x8;
        std::memcpy(&x8, xb + i * k + 4 * c, sizeof x8);
        dot[i] = _mm512_dpbusd_epi32(dot[i], v, _mm512_set1_epi64(x8));
      }
    }
  });
}

// --- the prefill panels (VNNI build): a run of groups decoded once into the vectors VPDPBUSD takes -----------------
// From kPanelRows activation rows, Q4_K and Q6_K groups are first decoded, a few at a time, into a per-thread panel:
// the nibble or 6-bit vectors tile_z_q4_k and tile_z_q6_k build inside their loops, their scale vectors, and the
// fp32 block scales. Every tile of activation rows then passes over that panel, two groups (16 weight rows) and up
// to six activation rows at a time: each broadcast activation word feeds two VPDPBUSD and each weight vector six,
// with no decoding in the loop. The tiles of z repeated the decoding for every tile of rows (at 512 rows, 64 times
// per weight byte) and took a load per VPDPBUSD; the Q4_K pair tiles took 1.25. Each row still sums the z tiles'
// integers and runs their fp32 code, so its bits are theirs.
// Q4_K's panel block (one group, one super-block): the 32 nibble vectors (p, c), the 4 scale vectors (p), d and
// dmin in fp32, and the 4 minimum vectors of tile_z_q4_k.
struct PanelQ4K {
  static constexpr int64_t kS = 32 * 64, kD = kS + 4 * 64, kDmin = kD + 32, kMins = kDmin + 32, kBytes = kMins + 4 * 32;
};
// Q6_K's: the 32 quant vectors (h, p, e, c), the 8 scale vectors (h, p, e) and d in fp32 (padded to 64 bytes).
struct PanelQ6K {
  static constexpr int64_t kS = 32 * 64, kD = kS + 8 * 64, kBytes = kD + 64;
};

inline void store64(uint8_t* p, __m512i v) { _mm512_storeu_si512(p, v); }
inline __m512 pair_floats(const uint8_t* a, const uint8_t* b) {
  return _mm512_castsi512_ps(pair_load(a, b));
}
// fold_lane_pairs of two groups' vectors: the first group's eight rows, then the second's.
inline __m512i fold_two_groups(__m512i v0, __m512i v1) {
  const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return _mm512_permutex2var_epi32(_mm512_add_epi32(v0, _mm512_maskz_shuffle_epi32(0xFFFF, v0, _MM_PERM_CDAB)), evens,
                                   _mm512_add_epi32(v1, _mm512_maskz_shuffle_epi32(0xFFFF, v1, _MM_PERM_CDAB)));
}
inline __m512i load64(const uint8_t* p) { return _mm512_loadu_si512(p); }

// One Q4_K group block (w) into its panel block (out): tile_z_q4_k's vectors.
inline void unpack_panel_q4_k(const uint8_t* w, uint8_t* out) {
  _mm256_storeu_ps(reinterpret_cast<float*>(out + PanelQ4K::kD), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + PanelQ4K::kDmin), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16))));
  __m512i sc4[2];
  __m256i mins[4];
  z_scales_q4_k(w, sc4, mins);
  for (int j = 0; j < 4; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + PanelQ4K::kMins + 32 * j), mins[j]);
  for (int p = 0; p < 4; ++p) {
    store64(out + PanelQ4K::kS + 64 * p, z_scale_q4_k(sc4, p));
    for (int c = 0; c < 8; ++c) store64(out + 64 * (8 * p + c), z_quants_q4_k(w, p, c));
  }
}

// One Q6_K group block into its panel block: tile_z_q6_k's vectors.
inline void unpack_panel_q6_k(const uint8_t* w, uint8_t* out) {
  _mm256_storeu_ps(reinterpret_cast<float*>(out + PanelQ6K::kD), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
  for (int run = 0; run < 8; ++run) {  // (h, p, e), as panel_q6_k reads them
    const int h = run / 4, p = run / 2 % 2, e = run % 2;
    store64(out + PanelQ6K::kS + 64 * run, z_scale_q6_k(w, h, p, e));
    for (int c = 0; c < 4; ++c) store64(out + 64 * (4 * run + c), z_quants_q6_k(w, h, p, e, c));
  }
}

// MR activation rows from r0 against NG neighbouring groups of a Q4_K panel (pw: the first group's, ps apart).
template <int MR, int NG>
void panel_q4_k(const uint8_t* pw, int64_t ps, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int16_t* xs = a.sums.data() + r0 * nb * 8;
  alignas(64) float acc[MR][NG][8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb[NG];
    for (int g = 0; g < NG; ++g) wb[g] = pw + g * ps + b * PanelQ4K::kBytes;
    __m512i sum[MR][NG];
    for (int i = 0; i < MR; ++i) {
      for (int g = 0; g < NG; ++g) sum[i][g] = _mm512_setzero_si512();
    }
    for (int p = 0; p < 4; ++p) {
      __m512i dot[MR][NG];
      for (int i = 0; i < MR; ++i) {
        for (int g = 0; g < NG; ++g) dot[i][g] = _mm512_setzero_si512();
      }
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        __m512i q[NG];
        for (int g = 0; g < NG; ++g) q[g] = load64(wb[g] + 64 * (8 * p + c));
        for (int i = 0; i < MR; ++i) {
          int64_t x8;
          std::memcpy(&x8, xq + i * k + 256 * b + 64 * p + 8 * c, sizeof x8);
          const __m512i xb = _mm512_set1_epi64(x8);
          for (int g = 0; g < NG; ++g) dot[i][g] = _mm512_dpbusd_epi32(dot[i][g], q[g], xb);
        }
      }
      for (int g = 0; g < NG; ++g) {
        const __m512i s = load64(wb[g] + PanelQ4K::kS + 64 * p);
        for (int i = 0; i < MR; ++i) sum[i][g] = _mm512_add_epi32(sum[i][g], _mm512_mullo_epi32(dot[i][g], s));
      }
    }
    if constexpr (NG == 2) {  // both groups' 16 rows a vector: each lane's operations are those below
      const __m512 d = pair_floats(wb[0] + PanelQ4K::kD, wb[1] + PanelQ4K::kD);
      const __m512 dmin = pair_floats(wb[0] + PanelQ4K::kDmin, wb[1] + PanelQ4K::kDmin);
      __m512i mins[4];
      for (int j = 0; j < 4; ++j) mins[j] = pair_load(wb[0] + PanelQ4K::kMins + 32 * j, wb[1] + PanelQ4K::kMins + 32 * j);
      for (int i = 0; i < MR; ++i) {
        const __m512i rows = fold_two_groups(sum[i][0], sum[i][1]);
        const int16_t* bs = xs + (i * nb + b) * 8;
        __m512i m = _mm512_madd_epi16(mins[0], bcast4w(bs));
        m = _mm512_add_epi32(m, _mm512_madd_epi16(mins[1], bcast4w(bs + 2)));
        m = _mm512_add_epi32(m, _mm512_madd_epi16(mins[2], bcast4w(bs + 4)));
        m = _mm512_add_epi32(m, _mm512_madd_epi16(mins[3], bcast4w(bs + 6)));
        const __m512 dx = _mm512_set1_ps(xd[i * nb + b]);
        float* ai = acc[i][0];
        const __m512 t = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_maskz_cvtepi32_ps(0xFFFF, rows), _mm512_load_ps(ai));
        _mm512_store_ps(ai, _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_maskz_cvtepi32_ps(0xFFFF, m), t));
      }
      continue;
    }
    for (int g = 0; g < NG; ++g) {
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(wb[g] + PanelQ4K::kD));
      const __m256 dmin = _mm256_loadu_ps(reinterpret_cast<const float*>(wb[g] + PanelQ4K::kDmin));
      const __m256i* mins = reinterpret_cast<const __m256i*>(wb[g] + PanelQ4K::kMins);
      for (int i = 0; i < MR; ++i) {
        const __m256i rows = avx2::fold_lane_pairs(sum[i][g]);
        const int16_t* bs = xs + (i * nb + b) * 8;
        __m256i m = _mm256_madd_epi16(_mm256_loadu_si256(mins), bcast4(bs));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_loadu_si256(mins + 1), bcast4(bs + 2)));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_loadu_si256(mins + 2), bcast4(bs + 4)));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_loadu_si256(mins + 3), bcast4(bs + 6)));
        const __m256 dx = _mm256_set1_ps(xd[i * nb + b]);
        __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(rows), _mm256_load_ps(acc[i][g]));
        _mm256_store_ps(acc[i][g], _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(m), t));
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int g = 0; g < NG; ++g) _mm256_storeu_ps(y + i * ldy + kGroup * g, _mm256_load_ps(acc[i][g]));
  }
}

// The same for a Q6_K panel.
template <int MR, int NG>
void panel_q6_k(const uint8_t* pw, int64_t ps, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  const int64_t k = a.k, nb = a.nb;
  const int8_t* xq = a.q.data() + r0 * k;
  const float* xd = a.d.data() + r0 * nb;
  const int32_t* xo = a.off.data() + r0 * nb * 16;
  alignas(64) float acc[MR][NG][8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb[NG];
    for (int g = 0; g < NG; ++g) wb[g] = pw + g * ps + b * PanelQ6K::kBytes;
    __m512i sum[MR][NG];
    for (int i = 0; i < MR; ++i) {
      for (int g = 0; g < NG; ++g) sum[i][g] = _mm512_setzero_si512();
    }
    for (int run = 0; run < 8; ++run) {  // (h, p, e): sub-blocks 8h + 4p + e and 8h + 4p + 2 + e
      const int h = run / 4, p = run / 2 % 2, e = run % 2;
      __m512i dot[MR][NG];
      for (int i = 0; i < MR; ++i) {
        int64_t o2;
        std::memcpy(&o2, xo + (i * nb + b) * 16 + 8 * h + 4 * p + 2 * e, sizeof o2);
        const __m512i ob = _mm512_set1_epi64(o2);
        for (int g = 0; g < NG; ++g) dot[i][g] = ob;
      }
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        __m512i q[NG];
        for (int g = 0; g < NG; ++g) q[g] = load64(wb[g] + 64 * (4 * run + c));
        for (int i = 0; i < MR; ++i) {
          int64_t x8;
          std::memcpy(&x8, xq + i * k + 256 * b + 128 * h + 64 * p + 32 * e + 8 * c, sizeof x8);
          const __m512i xb = _mm512_set1_epi64(x8);
          for (int g = 0; g < NG; ++g) dot[i][g] = _mm512_dpbusd_epi32(dot[i][g], q[g], xb);
        }
      }
      for (int g = 0; g < NG; ++g) {
        const __m512i s = load64(wb[g] + PanelQ6K::kS + 64 * run);
        for (int i = 0; i < MR; ++i) sum[i][g] = _mm512_add_epi32(sum[i][g], _mm512_mullo_epi32(dot[i][g], s));
      }
    }
    if constexpr (NG == 2) {
      const __m512 d = pair_floats(wb[0] + PanelQ6K::kD, wb[1] + PanelQ6K::kD);
      for (int i = 0; i < MR; ++i) {
        const __m512i rows = fold_two_groups(sum[i][0], sum[i][1]);
        float* ai = acc[i][0];
        _mm512_store_ps(ai, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xd[i * nb + b])), _mm512_maskz_cvtepi32_ps(0xFFFF, rows), _mm512_load_ps(ai)));
      }
      continue;
    }
    for (int g = 0; g < NG; ++g) {
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(wb[g] + PanelQ6K::kD));
      for (int i = 0; i < MR; ++i) {
        const __m256i rows = avx2::fold_lane_pairs(sum[i][g]);
        const __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xd[i * nb + b])), _mm256_cvtepi32_ps(rows), _mm256_load_ps(acc[i][g]));
        _mm256_store_ps(acc[i][g], t);
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int g = 0; g < NG; ++g) _mm256_storeu_ps(y + i * ldy + kGroup * g, _mm256_load_ps(acc[i][g]));
  }
}

constexpr int kPanelMR = 6;

template <typename T, int NG>
void panel_tile(int mr, const uint8_t* pw, int64_t ps, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  const auto run = [&](auto rows) {
    constexpr int MR = decltype(rows)::value;
    if constexpr (std::is_same_v<T, Q4_K>) {
      panel_q4_k<MR, NG>(pw, ps, a, r0, y, ldy);
    } else {
      panel_q6_k<MR, NG>(pw, ps, a, r0, y, ldy);
    }
  };
  switch (mr) {
    case 1: return run(std::integral_constant<int, 1>{});
    case 2: return run(std::integral_constant<int, 2>{});
    case 3: return run(std::integral_constant<int, 3>{});
    case 4: return run(std::integral_constant<int, 4>{});
    case 5: return run(std::integral_constant<int, 5>{});
    default: return run(std::integral_constant<int, kPanelMR>{});
  }
}

// The panel matmul over groups [g0, g1): runs of them decoded into this thread's panel, then every tile of rows.
template <typename T>
void panel_groups(int64_t g0, int64_t g1, const uint8_t* wp, int64_t group_bytes, const RowActs& a, float* yp, int64_t n) {
  using P = std::conditional_t<std::is_same_v<T, Q4_K>, PanelQ4K, PanelQ6K>;
  constexpr int64_t kBlock = kGroup * T::kBytes;
  const int64_t nb = a.nb, ps = nb * P::kBytes, m = a.m;
  // about 256 KB of panel a run, an even number of groups: it stays in L2 while every tile of rows passes over it
  const int64_t run = std::max<int64_t>(2, 262144 / ps / 2 * 2);
  thread_local std::vector<uint8_t> panel;
  if (static_cast<int64_t>(panel.size()) < run * ps) panel.resize(static_cast<size_t>(run * ps));
  for (int64_t c0 = g0; c0 < g1; c0 += run) {
    const int64_t c1 = std::min(g1, c0 + run);
    for (int64_t g = c0; g < c1; ++g) {
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* w = wp + g * group_bytes + b * kBlock;
        uint8_t* out = panel.data() + (g - c0) * ps + b * P::kBytes;
        if constexpr (std::is_same_v<T, Q4_K>) {
          unpack_panel_q4_k(w, out);
        } else {
          unpack_panel_q6_k(w, out);
        }
      }
    }
    for (int64_t i0 = 0; i0 < m; i0 += kPanelMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kPanelMR, m - i0));
      int64_t g = c0;
      for (; g + 2 <= c1; g += 2) panel_tile<T, 2>(mr, panel.data() + (g - c0) * ps, ps, a, i0, yp + i0 * n + g * kGroup, n);
      if (g < c1) panel_tile<T, 1>(mr, panel.data() + (g - c0) * ps, ps, a, i0, yp + i0 * n + g * kGroup, n);
    }
  }
}
template <typename T, int MR>
void pair_mr(const uint8_t* w0, const uint8_t* w1, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  if constexpr (std::is_same_v<T, Q4_0>) {
    tile_pair_q4_0<MR>(w0, w1, a, r0, y, ldy);
  } else {
    tile_pair_q4_k<MR>(w0, w1, a, r0, y, ldy);
  }
}

// Two neighbouring groups (w1 = w0 + a group's bytes) for mr <= 4 activation rows.
template <typename T>
void tile_pair(int mr, const uint8_t* w0, const uint8_t* w1, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  switch (mr) {
    case 1: return pair_mr<T, 1>(w0, w1, a, r0, y, ldy);
    case 2: return pair_mr<T, 2>(w0, w1, a, r0, y, ldy);
    case 3: return pair_mr<T, 3>(w0, w1, a, r0, y, ldy);
    default: return pair_mr<T, 4>(w0, w1, a, r0, y, ldy);
  }
}
#endif

// Whether the tiles take up to eight activation rows a pass (else four): the VNNI build's.
template <typename K>
constexpr bool eight_rows() {
#ifdef HEARTH_GGUF_AVX512
  return K::kWide;
#else
  return false;
#endif
}

template <typename T, typename K, int MR>
void tile_mr(const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
#ifdef HEARTH_GGUF_AVX2
  if constexpr (!K::kPlain) {
    if constexpr (std::is_same_v<T, Q8_0>) {
#ifdef HEARTH_GGUF_AVX512
      if constexpr (K::kWide) {
        if (a.paired) return tile_z_q8_0<MR>(w, a, r0, y, ldy);
        return tile_wide_q8_0<MR>(w, a, r0, y, ldy);
      }
#endif
      return tile_avx_q8_0<MR>(w, a, r0, y, ldy);
    } else if constexpr (std::is_same_v<T, Q6_K>) {
#ifdef HEARTH_GGUF_AVX512
      if constexpr (K::kWide) {
        if (a.paired) return tile_z_q6_k<MR>(w, a, r0, y, ldy);
      }
      if constexpr (K::kWide) return tile_wide_q6_k<MR>(w, a, r0, y, ldy);
#endif
      return tile_avx_q6_k<K::kWide, MR>(w, a, r0, y, ldy);
    } else if constexpr (std::is_same_v<T, Q4_0>) {
#ifdef HEARTH_GGUF_AVX512
      if constexpr (K::kWide) {
        if (a.paired) return tile_z_q4_0<MR>(w, a, r0, y, ldy);
      }
#endif
      return tile_avx_q4_0<K::kWide, MR>(w, a, r0, y, ldy);
    } else {
#ifdef HEARTH_GGUF_AVX512
      if constexpr (K::kWide) {
        if (a.paired) return tile_z_q4_k<MR>(w, a, r0, y, ldy);
      }
#endif
      if constexpr (MR <= 4) return tile_avx_q4_k<K::kWide, MR>(w, a, r0, y, ldy);
    }
  }
#endif
  if constexpr (std::is_same_v<T, Q8_0>) {
    tile_plain_q8_0<MR>(w, a, r0, y, ldy);
  } else if constexpr (std::is_same_v<T, Q6_K>) {
    tile_plain_q6_k<MR>(w, a, r0, y, ldy);
  } else if constexpr (std::is_same_v<T, Q4_0>) {
    tile_plain_q4_0<MR>(w, a, r0, y, ldy);
  } else {
    tile_plain_q4_k<MR>(w, a, r0, y, ldy);
  }
}

// The group tile for mr activation rows: at most 8 where eight_rows<K>(), else 4.
template <typename T, typename K>
void tile(int mr, const uint8_t* w, const RowActs& a, int64_t r0, float* y, int64_t ldy) {
  switch (mr) {
    case 1: return tile_mr<T, K, 1>(w, a, r0, y, ldy);
    case 2: return tile_mr<T, K, 2>(w, a, r0, y, ldy);
    case 3: return tile_mr<T, K, 3>(w, a, r0, y, ldy);
    default: break;
  }
  if constexpr (eight_rows<K>()) {
    switch (mr) {
      case 5: return tile_mr<T, K, 5>(w, a, r0, y, ldy);
      case 6: return tile_mr<T, K, 6>(w, a, r0, y, ldy);
      case 7: return tile_mr<T, K, 7>(w, a, r0, y, ldy);
      case 8: return tile_mr<T, K, 8>(w, a, r0, y, ldy);
      default: break;
    }
  }
  tile_mr<T, K, 4>(w, a, r0, y, ldy);
}

constexpr int64_t kMR = 4;
// the row counts below which the VNNI build runs Q4_K and Q4_0 eight rows a pass (Q4_K in tile_z_q4_k); from them,
// in pairs of groups.
// A 1B file's Q4_K layers, weights from memory (AVX512 EPYC, two threads): at 16 rows 43 ms against the pairs'
// 63, at 32 rows 82 against 86, at 64 rows 160 against 156, at 256 rows 768 against 578.
// Q4_0 (1B layers, the same machine): at 8 rows 25.5-27 ms (tile_z_q4_0) against the pairs' 28-35, at 16 and 32
// rows about even (55 and 105 ms against 58 and 97).
constexpr int64_t kZRows = 48, kZRowsQ4_0 = 16;
constexpr int64_t kPanelRows = 48;

template <typename K, typename T>
void matmul(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), row_bytes = w.size(1), groups = n / kGroup;
  // Q4_0 and Q4_K: in pairs of groups four rows a pass from kZRows rows, else (and the other types) eight a pass
  constexpr bool kPairs = K::kWide && (std::is_same_v<T, Q4_0> || std::is_same_v<T, Q4_K>);
  // Q6_K: tile_z_q6_k from 5 rows; at one row it ran 5-10 % slower than tile_wide_q6_k (1B Q4_K_M's Q6_K layers,
  // weights from memory), at 8 rows 7-9 % faster than the one-run-at-a-time eight-row tile it replaced
  constexpr bool kZ6 = K::kWide && std::is_same_v<T, Q6_K>;
  // Q8_0: tile_z_q8_0 from 2 rows (its fp32 work two rows at once); one row keeps tile_wide_q8_0
  constexpr bool kZ8 = K::kWide && std::is_same_v<T, Q8_0>;
  // Q4_K and Q6_K: from kPanelRows rows, decoded into panels (see panel_groups)
  constexpr bool kPanels = K::kWide && (std::is_same_v<T, Q4_K> || std::is_same_v<T, Q6_K>);
  const bool panels = kPanels && m >= kPanelRows;
  const bool pairs = kPairs && !panels && m >= (std::is_same_v<T, Q4_0> ? kZRowsQ4_0 : kZRows);
  RowActs acts(m, k, T::kActBlock, std::is_same_v<T, Q6_K>, std::is_same_v<T, Q8_0> ? kQ8Offset : kQ4Offset,
               (kPairs && !pairs) || (kZ6 && m > 4) || (kZ8 && m > 1));
  const int64_t mr_max = eight_rows<K>() && !pairs ? 8 : kMR;
  const auto quantize = [&](auto* xp) {
    at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) acts.template quantize_row<K::kPlain>(xp + r * k, r);
    });
  };
  if (x.scalar_type() == at::kFloat) {
    quantize(x.data_ptr<float>());
  } else {
    quantize(x.data_ptr<at::BFloat16>());
  }
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t group_bytes = kGroup * row_bytes;
  // groups per chunk: their blocks stay in cache while every tile of activation rows passes over them
  const int64_t chunk = std::max<int64_t>(1, 131072 / group_bytes);
  at::parallel_for(0, groups, m == 1 ? 8 : 2, [&](int64_t g0, int64_t g1) {
#ifdef HEARTH_GGUF_AVX512
    if constexpr (kPanels) {
      if (panels) return panel_groups<T>(g0, g1, wp, group_bytes, acts, yp, n);
    }
#endif
    for (int64_t c0 = g0; c0 < g1; c0 += chunk) {
      const int64_t c1 = std::min(g1, c0 + chunk);
      for (int64_t i0 = 0; i0 < m; i0 += mr_max) {
        const int mr = static_cast<int>(std::min(mr_max, m - i0));
        int64_t g = c0;
#ifdef HEARTH_GGUF_AVX512
        // two groups at a time in 512-bit vectors, the same bits as one at a time, where several rows make the
        // tiles arithmetic-bound: at one row the two streams a group apart ran a 1B Q4_K file's layers at 0.6x the
        // one-group tiles' speed (weights from memory) and at 4 rows at about 0.8x, at 512 rows 2.1-2.5x faster
        // (AVX512 EPYC, one thread)
        if constexpr (kPairs) {
          for (; pairs && g + 1 < c1; g += 2) {
            tile_pair<T>(mr, wp + g * group_bytes, wp + (g + 1) * group_bytes, acts, i0, yp + i0 * n + g * kGroup, n);
          }
        }
#endif
        for (; g < c1; ++g) tile<T, K>(mr, wp + g * group_bytes, acts, i0, yp + i0 * n + g * kGroup, n);
      }
    }
  });
  if (groups * kGroup < n) {  // the last rows, in the file's layout: the file-order tiles
    const at::Tensor tail = w.narrow(0, groups * kGroup, n - groups * kGroup);
    at::Tensor yt = at::empty({m, tail.size(0)}, y.options());
    hearth::matmul<K, T>(x, tail, yt);
    y.narrow(1, groups * kGroup, tail.size(0)).copy_(yt);
  }
}

}  // namespace x8

}  // namespace

namespace {
template <typename K>
at::Tensor gguf_mm_with(const at::Tensor& x_in, const at::Tensor& w_in, int64_t type) {
  const int64_t file_type = grouped_file_type(type);
  const bool grouped = file_type != type;
  return with_block_type(file_type, "gguf_mm", [&](auto block) {
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
    if (y.numel()) {
      if constexpr (std::is_same_v<T, Q4_0> || std::is_same_v<T, Q4_K> || std::is_same_v<T, Q6_K> ||
                    std::is_same_v<T, Q8_0>) {
        if (grouped) {
          x8::matmul<K, T>(x, w, y);
        } else {
          matmul<K, T>(x, w, y);
        }
      } else {
        matmul<K, T>(x, w, y);
      }
    }
    return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
  });
}
}  // namespace

at::Tensor gguf_mm(const at::Tensor& x, const at::Tensor& w, int64_t type) { return gguf_mm_with<FastKernels>(x, w, type); }

at::Tensor gguf_mm_plain(const at::Tensor& x, const at::Tensor& w, int64_t type) {
  return gguf_mm_with<PlainLoops>(x, w, type);
}

at::Tensor gguf_mm_avx2(const at::Tensor& x, const at::Tensor& w, int64_t type) {
  return gguf_mm_with<Avx2Tiles>(x, w, type);
}

std::string gguf_kernel_family() {
#if defined(HEARTH_GGUF_AVX512)
  return "avx512";
#elif defined(HEARTH_GGUF_AVX2)
  return "avx2";
#else
  return "plain";
#endif
}

namespace {
void check_repack(const at::Tensor& w, int64_t type, const char* op) {
  check_weights(w, op);
  TORCH_CHECK(type == kQ4_0 || type == kQ4_K || type == kQ6_K || type == kQ8_0, op, ": ggml type ", type,
              " has no grouped layout here (Q4_0=2, Q8_0=8, Q4_K=12, Q6_K=14)");
  const int64_t block = type == kQ4_0 ? Q4_0::kBytes : type == kQ4_K ? Q4_K::kBytes : type == kQ6_K ? Q6_K::kBytes : Q8_0::kBytes;
  TORCH_CHECK(w.size(1) % block == 0, op, ": a row of ", w.size(1), " bytes is not a whole number of ", block,
              "-byte blocks of ggml type ", type);
}

// from and to may be the same bytes
void repack_rows(const uint8_t* from, uint8_t* to, int64_t n, int64_t row_bytes, int64_t type) {
  if (type == kQ4_0) {
    x8::repack<Q4_0>(from, to, n, row_bytes);
  } else if (type == kQ4_K) {
    x8::repack<Q4_K>(from, to, n, row_bytes);
  } else if (type == kQ6_K) {
    x8::repack<Q6_K>(from, to, n, row_bytes);
  } else {
    x8::repack<Q8_0>(from, to, n, row_bytes);
  }
}
}  // namespace

at::Tensor gguf_repack(const at::Tensor& w_in, int64_t type) {
  check_repack(w_in, type, "gguf_repack");
  const at::Tensor w = w_in.contiguous();
  at::Tensor out = at::empty_like(w);
  if (w.numel()) repack_rows(w.data_ptr<uint8_t>(), out.data_ptr<uint8_t>(), w.size(0), w.size(1), type);
  return out;
}

int64_t gguf_repack_(at::Tensor& w, int64_t type) {
  check_repack(w, type, "gguf_repack_");
  TORCH_CHECK(w.is_contiguous(), "gguf_repack_: w must be contiguous");
  if (w.numel()) repack_rows(w.data_ptr<uint8_t>(), w.data_ptr<uint8_t>(), w.size(0), w.size(1), type);
  return gguf_grouped_type(type);
}

int64_t gguf_grouped_type(int64_t type) {
  return type == kQ4_0 ? kQ4_0_X8 : type == kQ4_K ? kQ4_K_X8 : type == kQ6_K ? kQ6_K_X8 : type == kQ8_0 ? kQ8_0_X8 : -1;
}

at::Tensor gguf_dequantize(const at::Tensor& w_in, int64_t type) {
  if (grouped_file_type(type) != type) {  // the file's row order back, then as the file's type
    const int64_t file_type = grouped_file_type(type);
    check_repack(w_in, file_type, "gguf_dequantize");
    const at::Tensor w = w_in.contiguous();
    at::Tensor rows = at::empty_like(w);
    if (w.numel()) {
      if (file_type == kQ4_0) {
        x8::unpack<Q4_0>(w.data_ptr<uint8_t>(), rows.data_ptr<uint8_t>(), w.size(0), w.size(1));
      } else if (file_type == kQ6_K) {
        x8::unpack<Q6_K>(w.data_ptr<uint8_t>(), rows.data_ptr<uint8_t>(), w.size(0), w.size(1));
      } else if (file_type == kQ8_0) {
        x8::unpack<Q8_0>(w.data_ptr<uint8_t>(), rows.data_ptr<uint8_t>(), w.size(0), w.size(1));
      } else {
        x8::unpack<Q4_K>(w.data_ptr<uint8_t>(), rows.data_ptr<uint8_t>(), w.size(0), w.size(1));
      }
    }
    return gguf_dequantize(rows, file_type);
  }
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

TORCH_LIBRARY_FRAGMENT(hearth, m) {
  m.def("gguf_repack(Tensor w, int type) -> Tensor", &hearth::gguf_repack);
  m.def("gguf_repack_(Tensor(a!) w, int type) -> int", &hearth::gguf_repack_);
  m.def("gguf_grouped_type(int type) -> int", &hearth::gguf_grouped_type);
}
