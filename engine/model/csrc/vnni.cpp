// Hearth's AVX512-VNNI matmul kernels: int4 weights (torch's packed layout) and int8 weights (torch's [N, K]
// layout) against activations split into two int8 planes. A library of its own: the native step's linear()
// calls int4_vnni_mm, and the eager layers call both through their torch.ops.hearth registrations
// (engine/model/vnni.py). In a build without AVX512-VNNI each is there and raises (vnni_available() says so).

#include "vnni.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define HEARTH_VNNI 1
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics start from a self-initialized "undefined" vector (_mm512_undefined_ps and kin) and,
// once inlined here, report it as (maybe) uninitialized (GCC bug 105593, fixed in 12.3 and 13): a false alarm from
// the compiler's own header, silenced for this file's kernels only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

namespace hearth {
namespace {

// --- int4 weights x int8-plane activations (AVX512-VNNI) --------------------------------------------------------
// torch's int4 CPU kernel dequantizes each weight to fp32 and multiplies in fp32: one product per 32-bit lane, so
// its arithmetic grows with the rows while its weight reads do not. This one reads the very same bytes (torch's
// packed layout, its [groups, N, 2] scales and zeros), splits each row's activations per 32 values into two int8
// planes (see quantize_activations), and sums 4 products per 32-bit lane with VPDPBUSD, one pass per plane: fewer
// instructions per weight even with two passes, which pays once a few rows share the step (docs/BENCHMARKS.md),
// agreeing with torch's kernel to the activation dtype's rounding. With w = scale * q + (zero - 8 * scale) per
// weight group, and x ~ act_scale * (q1 + q2 / 254) per 32 activations:
//   y[n] = sum over 32-value groups g of  scale * act_scale_g * sum_k q[n,k] * (q1[k] + q2[k] / 254)
//                                         + (zero - 8 * scale) * sum_k x[k]
// (the zero term takes the exact sum of the activations). Each row is computed alone, in the same order whatever
// else shares the call, so the kernel is row-invariant.
//
// torch's layout (AVX-512 build, torch 2.13; checked by a probe matmul against torch's kernel before the kernel is
// offered, engine/model/native.py): blocks of 64 output channels, each [K][32 bytes]; for input k, byte d (0..15)
// holds channel d (low nibble) and d + 32 (high), byte 16 + d holds d + 16 and d + 48. Four consecutive k rows
// (128 bytes) are gathered by one byte permute into 32-bit lanes of 4 k values per channel: VPDPBUSD's operand.
#ifdef HEARTH_VNNI
constexpr int64_t kActGroup = 32;
constexpr int64_t kBlockN = 64;

template <typename T>
inline __m512 load16(const T* p);
template <>
inline __m512 load16<float>(const float* p) { return _mm512_loadu_ps(p); }
template <>
inline __m512 load16<c10::BFloat16>(const c10::BFloat16* p) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

template <typename T>
inline void store16(T* p, __m512 v);
template <>
inline void store16<float>(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
template <>
inline void store16<c10::BFloat16>(c10::BFloat16* p, __m512 v) {  // round to nearest even, as torch's casts
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

// Calls f with a null pointer of the C++ type of `dtype`, bf16 or fp32 (the activation types the VNNI kernels take).
template <typename F>
void with_activation_type(at::ScalarType dtype, F&& f) {
  if (dtype == at::kFloat) {
    f(static_cast<float*>(nullptr));
  } else {
    f(static_cast<c10::BFloat16*>(nullptr));
  }
}

// One scale and zero pair per lane, for 16 channels: (scale, zero - 8 * scale) in fp32.
inline void scale_pairs(const float* p, __m512& scale, __m512& offset) {
  const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  scale = _mm512_permutex2var_ps(a, even, b);
  const __m512 zero = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
  offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.f), scale, zero);
}
inline void scale_pairs(const c10::BFloat16* p, __m512& scale, __m512& offset) {
  const __m512i v = _mm512_loadu_si512(p);  // 16 x (scale bf16 | zero bf16 << 16)
  scale = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  const __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.f), scale, zero);
}

// Each row's 32-value groups as two int8 planes, x ~ scale * (q1 + q2 / 254): q1 = round(x / scale) with
// scale = max|x| / 127, and q2 the rounded remainder (|x / scale - q1| <= 1/2, so |q2| <= 127). Together they
// keep about 16 bits of each value: one plane alone (8 bits, as llama.cpp's Q8 activations) cost the default
// model clearly more perplexity than two (docs/BENCHMARKS.md), mostly in gate_up and down, whose inputs carry a
// few large channels.
// Also each group's scale and its exact sum.
template <typename T>
void quantize_activations(const T* x, int64_t rows, int64_t k, int8_t* q1, int8_t* q2, float* scale, float* sum) {
  const int64_t groups = k / kActGroup;
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const T* xs = x + r * k + g * kActGroup;
        const __m512 v[2] = {load16(xs), load16(xs + 16)};
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
        const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
        for (int i = 0; i < 2; ++i) {
          const __m512 u = _mm512_mul_ps(v[i], inv);  // x / scale, in [-127, 127]
          const __m512i a = _mm512_cvtps_epi32(u);
          const __m512 rest = _mm512_mul_ps(_mm512_sub_ps(u, _mm512_cvtepi32_ps(a)), _mm512_set1_ps(254.f));
          const int64_t at = r * k + g * kActGroup + 16 * i;
          _mm_storeu_si128(reinterpret_cast<__m128i*>(q1 + at), _mm512_cvtsepi32_epi8(a));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + at), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rest)));
        }
        scale[r * groups + g] = amax / 127.f;
        sum[r * groups + g] = _mm512_reduce_add_ps(_mm512_add_ps(v[0], v[1]));
      }
    }
  });
}

// R rows of H halves of a 64-channel block, from half `half` on: half h is channels 16h..16h+15 and 32+16h..32+16h+15.
// One half at a time keeps 4 rows' accumulators in registers; both at once read the block once (few rows).
template <typename T, int R, int H>
inline void int4_vnni_rows(const uint8_t* block, const T* sz, int64_t sz_group_stride, int64_t group, int half,
                           const int8_t* q1, const int8_t* q2, const float* act_scale, const float* act_sum,
                           int64_t k, T* y, int64_t n_total) {
  const int64_t groups = k / kActGroup;
  __m512i gather[H];
  for (int h = 0; h < H; ++h) {
    alignas(64) uint8_t idx[64];
    for (int j = 0; j < 64; ++j) idx[j] = static_cast<uint8_t>((j % 4) * 32 + 16 * (half + h) + j / 4);
    gather[h] = _mm512_load_si512(idx);
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 out[R][2 * H];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * H; ++j) out[r][j] = _mm512_setzero_ps();
  const __m512 fine = _mm512_set1_ps(1.f / 254.f);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i acc[R][2 * H], acc2[R][2 * H];  // sums over q1 and over q2
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 2 * H; ++j) acc[r][j] = acc2[r][j] = _mm512_setzero_si512();
    const uint8_t* p = block + g * kActGroup * 32;
    const T* s = sz + (g * kActGroup / group) * sz_group_stride;
    if (g + 2 < groups) {  // the stream two groups ahead: 1 KB of weights, their scales
      for (int c = 0; c < 1024; c += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 2048 + c), _MM_HINT_T0);
      const T* s2 = sz + ((g + 2) * kActGroup / group) * sz_group_stride;
      for (int c = 0; c < static_cast<int>(128 * sizeof(T)); c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(s2) + c, _MM_HINT_T0);
    }
    for (int t = 0; t < kActGroup / 4; ++t) {
      const __m512i z0 = _mm512_loadu_si512(p + t * 128), z1 = _mm512_loadu_si512(p + t * 128 + 64);
      __m512i lo[H], hi[H];
      for (int h = 0; h < H; ++h) {
        const __m512i w = _mm512_permutex2var_epi8(z0, gather[h], z1);
        lo[h] = _mm512_and_si512(w, low);
        hi[h] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
      }
      for (int r = 0; r < R; ++r) {
        int32_t a, b;
        std::memcpy(&a, q1 + r * k + g * kActGroup + t * 4, 4);
        std::memcpy(&b, q2 + r * k + g * kActGroup + t * 4, 4);
        const __m512i av = _mm512_set1_epi32(a), bv = _mm512_set1_epi32(b);
        for (int h = 0; h < H; ++h) {
          acc[r][2 * h] = _mm512_dpbusd_epi32(acc[r][2 * h], lo[h], av);
          acc[r][2 * h + 1] = _mm512_dpbusd_epi32(acc[r][2 * h + 1], hi[h], av);
          acc2[r][2 * h] = _mm512_dpbusd_epi32(acc2[r][2 * h], lo[h], bv);
          acc2[r][2 * h + 1] = _mm512_dpbusd_epi32(acc2[r][2 * h + 1], hi[h], bv);
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      __m512 s0, m0, s1, m1;
      scale_pairs(s + 2 * 16 * (half + h), s0, m0);
      scale_pairs(s + 2 * (32 + 16 * (half + h)), s1, m1);
      for (int r = 0; r < R; ++r) {
        const __m512 d = _mm512_set1_ps(act_scale[r * groups + g]), sx = _mm512_set1_ps(act_sum[r * groups + g]);
        __m512& o0 = out[r][2 * h];
        __m512& o1 = out[r][2 * h + 1];
        const __m512 dot0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc2[r][2 * h]), fine, _mm512_cvtepi32_ps(acc[r][2 * h]));
        const __m512 dot1 =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc2[r][2 * h + 1]), fine, _mm512_cvtepi32_ps(acc[r][2 * h + 1]));
        o0 = _mm512_fmadd_ps(m0, sx, _mm512_fmadd_ps(dot0, _mm512_mul_ps(s0, d), o0));
        o1 = _mm512_fmadd_ps(m1, sx, _mm512_fmadd_ps(dot1, _mm512_mul_ps(s1, d), o1));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < H; ++h) {
      store16(y + r * n_total + 16 * (half + h), out[r][2 * h]);
      store16(y + r * n_total + 32 + 16 * (half + h), out[r][2 * h + 1]);
    }
  }
}

constexpr int kRowTile = 3;
//: up to this many rows, a task runs a whole block in one pass (both halves)
constexpr int64_t kWholeBlockRows = 2;

// Rows of a block's halves [half, half + halves): 4 rows at a time, one half at a time; or, for up to
// kWholeBlockRows rows, every row in one pass over both halves.
template <typename T>
void int4_vnni_block(const uint8_t* block, const T* sz, int64_t n_total, int64_t group, int half, const int8_t* q1,
                     const int8_t* q2, const float* act_scale, const float* act_sum, int64_t rows, int64_t k, T* y) {
  const int64_t groups = k / kActGroup, stride = 2 * n_total;
  auto run = [&](auto tile, auto halves, int64_t r) {
    constexpr int R = decltype(tile)::value, H = decltype(halves)::value;
    int4_vnni_rows<T, R, H>(block, sz, stride, group, H == 2 ? 0 : half, q1 + r * k, q2 + r * k,
                            act_scale + r * groups, act_sum + r * groups, k, y + r * n_total, n_total);
  };
  using One = std::integral_constant<int, 1>;
  if (rows <= kWholeBlockRows) {
    for (int64_t r = 0; r < rows; ++r) run(One{}, std::integral_constant<int, 2>{}, r);
    return;
  }
  int64_t r = 0;
  for (; r + kRowTile <= rows; r += kRowTile) run(std::integral_constant<int, kRowTile>{}, One{}, r);
  for (; r < rows; ++r) run(One{}, One{}, r);
}
#endif

}  // namespace

bool vnni_available() {
#ifdef HEARTH_VNNI
  return true;
#else
  return false;
#endif
}

// x: [rows, K] bf16 or fp32; packed: torch's int4 layout of [N, K]; scales_zeros: [K / group, N, 2] in x's dtype.
at::Tensor int4_vnni_mm(const at::Tensor& x_in, const at::Tensor& packed_in, int64_t group, const at::Tensor& sz_in) {
  TORCH_CHECK(vnni_available(), "this build of the native step has no AVX512-VNNI int4 kernel");
  const at::Tensor x = x_in.alias().contiguous(), packed = packed_in.alias(), sz = sz_in.alias().contiguous();
  TORCH_CHECK(x.dim() == 2 && sz.dim() == 3 && sz.size(2) == 2, "x must be [rows, K], scales_zeros [groups, N, 2]");
  const int64_t rows = x.size(0), k = x.size(1), n = sz.size(1);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "x must be bf16 or fp32");
  TORCH_CHECK(sz.scalar_type() == x.scalar_type(), "scales_zeros must be in x's dtype");
  TORCH_CHECK(n % 64 == 0 && k % 32 == 0 && group % 32 == 0 && k % group == 0 && sz.size(0) == k / group,
              "int4 VNNI needs N % 64 == 0 and K, group multiples of 32");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == n * k / 2,
              "packed weights must be torch's [N, K / 2] uint8 layout");
  at::Tensor y = at::empty({rows, n}, x.options());
#ifdef HEARTH_VNNI
  if (rows == 0) return y;
  const int64_t groups = k / kActGroup;
  std::vector<int8_t> q1(rows * k), q2(rows * k);
  std::vector<float> act_scale(rows * groups), act_sum(rows * groups);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  auto run = [&](auto* type_tag) {
    using T = std::remove_pointer_t<decltype(type_tag)>;
    quantize_activations(x.data_ptr<T>(), rows, k, q1.data(), q2.data(), act_scale.data(), act_sum.data());
    const T* s = sz.data_ptr<T>();
    T* out = y.data_ptr<T>();
    const int64_t per_block = rows <= kWholeBlockRows ? 1 : 2;  // tasks per 64-channel block
    at::parallel_for(0, n / kBlockN * per_block, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t nb = task / per_block;
        int4_vnni_block<T>(w + nb * kBlockN * k / 2, s + 2 * nb * kBlockN, n, group, static_cast<int>(task % per_block),
                           q1.data(), q2.data(), act_scale.data(), act_sum.data(), rows, k, out + nb * kBlockN);
      }
    });
  };
  with_activation_type(x.scalar_type(), run);
#endif
  return y;
}

namespace {

// --- int8 weights x int8-plane activations (AVX512-VNNI): the lm_head -------------------------------------------
// torch's int8 kernel ([N, K] row-major int8, one fp32 scale per output channel), read as it is. torch's int8
// kernel loses to a tied lm_head's dense embedding once a few rows share the step, though it reads half the
// bytes; this one keeps the int8 bytes and multiplies them as integers, so it can beat both (the tuner decides;
// docs/BENCHMARKS.md).
// VPDPBUSD multiplies unsigned by signed bytes: the weights go in as unsigned (w + 128, one XOR), the activation
// planes as they are, and the +128 comes back off through each activation group's sum, which depends on the row
// only:  sum_k (w + 128) * q - 128 * sum_k q.  Activations take the two int8 planes of quantize_activations; each
// row is computed alone (row-invariant).
// Two ways, each row-invariant on its own (they round differently, so a caller keeps to one where that matters):
//   * `gemv`: each output channel's row of weights is streamed in 64-byte pieces, 64 products per instruction per
//     activation row, summed across lanes at the end, for up to 4 rows at a time: one row reads every weight once;
//   * lanes: 16 rows share each instruction, one per lane, each lane holding 4 consecutive activations of its row,
//     with the weights' 4 bytes broadcast to every lane.
#ifdef HEARTH_VNNI
constexpr int kLaneRows = 16;  // rows per pass: one per 32-bit lane
constexpr int kInt8Tile = 8;   // output channels per register tile
constexpr int64_t kGemvRows = 4;
constexpr uint32_t kFlip = 0x80808080u;  // + 128 in each byte of a signed int8 quad

// A pass's rows as the lanes read them: plane[kq][lane] holds row `lane`'s values 4kq..4kq+3, scale[g][lane] its
// group scales, qsum[g][lane] 128 x the sum of its group's values (per plane); lanes past the last row hold zeros.
struct LanePlanes {
  std::vector<uint32_t> p1, p2;
  std::vector<float> scale;
  std::vector<int32_t> qsum1, qsum2;
};

template <typename T>
LanePlanes lane_planes(const T* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kActGroup, quads = k / 4;
  std::vector<int8_t> q1(kLaneRows * k, 0), q2(kLaneRows * k, 0);
  std::vector<float> s(kLaneRows * groups, 0.f), sums(kLaneRows * groups, 0.f);
  quantize_activations(x, rows, k, q1.data(), q2.data(), s.data(), sums.data());
  LanePlanes out{std::vector<uint32_t>(quads * kLaneRows), std::vector<uint32_t>(quads * kLaneRows),
                 std::vector<float>(groups * kLaneRows), std::vector<int32_t>(groups * kLaneRows),
                 std::vector<int32_t>(groups * kLaneRows)};
  for (int lane = 0; lane < kLaneRows; ++lane) {
    for (int64_t kq = 0; kq < quads; ++kq) {
      std::memcpy(&out.p1[kq * kLaneRows + lane], q1.data() + lane * k + 4 * kq, 4);
      std::memcpy(&out.p2[kq * kLaneRows + lane], q2.data() + lane * k + 4 * kq, 4);
    }
    for (int64_t g = 0; g < groups; ++g) {
      int32_t a = 0, b = 0;
      for (int64_t i = 0; i < kActGroup; ++i) {
        a += q1[lane * k + g * kActGroup + i];
        b += q2[lane * k + g * kActGroup + i];
      }
      out.scale[g * kLaneRows + lane] = s[lane * groups + g];
      out.qsum1[g * kLaneRows + lane] = 128 * a;
      out.qsum2[g * kLaneRows + lane] = 128 * b;
    }
  }
  return out;
}

// Output channels [n0, n0 + 8) for a pass's rows.
template <typename T>
void int8_vnni_tile(const int8_t* w, const float* wscale, const LanePlanes& a, int64_t k, int64_t n0, int64_t rows,
                    T* y, int64_t n_total) {
  const int64_t groups = k / kActGroup;
  const __m512 fine = _mm512_set1_ps(1.f / 254.f);
  __m512 out[kInt8Tile];
  for (int j = 0; j < kInt8Tile; ++j) out[j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i acc1[kInt8Tile], acc2[kInt8Tile];
    for (int j = 0; j < kInt8Tile; ++j) acc1[j] = acc2[j] = _mm512_setzero_si512();
    if (n0 + 2 * kInt8Tile <= n_total) {  // the next tile's rows, a group ahead
      for (int j = 0; j < kInt8Tile; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + kInt8Tile + j) * k + g * kActGroup), _MM_HINT_T0);
    }
    for (int t = 0; t < kActGroup / 4; ++t) {
      const int64_t kq = g * kActGroup / 4 + t;
      const __m512i x1 = _mm512_loadu_si512(a.p1.data() + kq * kLaneRows);
      const __m512i x2 = _mm512_loadu_si512(a.p2.data() + kq * kLaneRows);
      for (int j = 0; j < kInt8Tile; ++j) {
        uint32_t wq;
        std::memcpy(&wq, w + (n0 + j) * k + 4 * kq, 4);
        const __m512i wv = _mm512_set1_epi32(static_cast<int32_t>(wq ^ kFlip));
        acc1[j] = _mm512_dpbusd_epi32(acc1[j], wv, x1);
        acc2[j] = _mm512_dpbusd_epi32(acc2[j], wv, x2);
      }
    }
    const __m512 d = _mm512_loadu_ps(a.scale.data() + g * kLaneRows);
    const __m512i c1 = _mm512_loadu_si512(a.qsum1.data() + g * kLaneRows);
    const __m512i c2 = _mm512_loadu_si512(a.qsum2.data() + g * kLaneRows);
    for (int j = 0; j < kInt8Tile; ++j) {
      const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc2[j], c2)), fine,
                                         _mm512_cvtepi32_ps(_mm512_sub_epi32(acc1[j], c1)));
      out[j] = _mm512_fmadd_ps(dot, d, out[j]);
    }
  }
  alignas(64) float tile[kInt8Tile][kLaneRows];
  for (int j = 0; j < kInt8Tile; ++j) _mm512_store_ps(tile[j], _mm512_mul_ps(out[j], _mm512_set1_ps(wscale[n0 + j])));
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < kInt8Tile; ++j) y[r * n_total + n0 + j] = static_cast<T>(tile[j][r]);
}

// Up to kGemvRows rows, as planes in input order: per 16-lane piece of 64 inputs, each lane's group scale (plane 2's
// already / 254), and per row the +128 correction: 128 * sum over groups of scale * (sum q1 + sum q2 / 254).
struct GemvRows {
  std::vector<int8_t> q1, q2;
  std::vector<float> d1, d2, correction;
};

template <typename T>
GemvRows gemv_rows(const T* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kActGroup, quads = k / 4;
  const int64_t padded = (k + 63) / 64 * 64;  // whole 64-byte pieces; the tail's activations are zero
  GemvRows out{std::vector<int8_t>(rows * padded, 0), std::vector<int8_t>(rows * padded, 0),
               std::vector<float>(rows * padded / 4, 0.f), std::vector<float>(rows * padded / 4, 0.f),
               std::vector<float>(rows, 0.f)};
  std::vector<int8_t> q1(rows * k), q2(rows * k);
  std::vector<float> s(rows * groups), sums(rows * groups);
  quantize_activations(x, rows, k, q1.data(), q2.data(), s.data(), sums.data());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out.q1.data() + r * padded, q1.data() + r * k, k);
    std::memcpy(out.q2.data() + r * padded, q2.data() + r * k, k);
    for (int64_t kq = 0; kq < quads; ++kq) {
      const float d = s[r * groups + kq * 4 / kActGroup];
      out.d1[r * padded / 4 + kq] = d;
      out.d2[r * padded / 4 + kq] = d / 254.f;
    }
    double c = 0.0;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t a = 0, b = 0;
      for (int64_t i = 0; i < kActGroup; ++i) {
        a += q1[r * k + g * kActGroup + i];
        b += q2[r * k + g * kActGroup + i];
      }
      c += static_cast<double>(s[r * groups + g]) * (a + b / 254.0);
    }
    out.correction[r] = static_cast<float>(128.0 * c);
  }
  return out;
}

// Output channels [n0, n1) for R rows, each channel's weights streamed once.
template <typename T, int R>
void int8_vnni_gemv(const int8_t* w, const float* wscale, const GemvRows& a, int64_t k, int64_t n0, int64_t n1, T* y,
                    int64_t n_total) {
  const int64_t padded = (k + 63) / 64 * 64, pieces = padded / 64;
  const __m512i flip = _mm512_set1_epi32(static_cast<int32_t>(kFlip));
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* wn = w + n * k;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < pieces; ++c) {
      const int64_t left = k - 64 * c;
      const __mmask64 mask = left >= 64 ? ~__mmask64{0} : ((__mmask64{1} << left) - 1);
      const __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, wn + 64 * c), flip);
      for (int r = 0; r < R; ++r) {
        const __m512i t1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv,
                                               _mm512_loadu_si512(a.q1.data() + r * padded + 64 * c));
        const __m512i t2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv,
                                               _mm512_loadu_si512(a.q2.data() + r * padded + 64 * c));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1), _mm512_loadu_ps(a.d1.data() + r * padded / 4 + 16 * c), acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t2), _mm512_loadu_ps(a.d2.data() + r * padded / 4 + 16 * c), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r)
      y[r * n_total + n] = static_cast<T>(wscale[n] * (_mm512_reduce_add_ps(acc[r]) - a.correction[r]));
  }
}
#endif

}  // namespace

// x: [rows, K] bf16 or fp32; w: int8 [N, K]; scales: fp32 [N]; gemv: which way (see above).
at::Tensor int8_vnni_mm(const at::Tensor& x_in, const at::Tensor& w_in, const at::Tensor& scales_in, bool gemv) {
  TORCH_CHECK(vnni_available(), "this build of the native step has no AVX512-VNNI kernels");
  const at::Tensor x = x_in.alias().contiguous(), w = w_in.alias(), scales = scales_in.alias();
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x must be [rows, K] and w [N, K]");
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "x must be bf16 or fp32");
  TORCH_CHECK(n % 8 == 0 && k % 32 == 0, "int8 VNNI needs N % 8 == 0 and K % 32 == 0");
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous(), "w must be contiguous int8");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == n,
              "scales must be fp32 [N]");
  at::Tensor y = at::empty({rows, n}, x.options());
#ifdef HEARTH_VNNI
  auto run = [&](auto* type_tag) {
    using T = std::remove_pointer_t<decltype(type_tag)>;
    const T* xs = x.data_ptr<T>();
    T* out = y.data_ptr<T>();
    const int8_t* wd = w.data_ptr<int8_t>();
    const float* sd = scales.data_ptr<float>();
    for (int64_t r0 = 0; gemv && r0 < rows; r0 += kGemvRows) {
      const int64_t pass = std::min<int64_t>(kGemvRows, rows - r0);
      const GemvRows planes = gemv_rows(xs + r0 * k, pass, k);
      T* o = out + r0 * n;
      at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
        switch (pass) {
          case 1: int8_vnni_gemv<T, 1>(wd, sd, planes, k, begin, end, o, n); break;
          case 2: int8_vnni_gemv<T, 2>(wd, sd, planes, k, begin, end, o, n); break;
          case 3: int8_vnni_gemv<T, 3>(wd, sd, planes, k, begin, end, o, n); break;
          default: int8_vnni_gemv<T, 4>(wd, sd, planes, k, begin, end, o, n); break;
        }
      });
    }
    if (gemv) return;
    for (int64_t r0 = 0; r0 < rows; r0 += kLaneRows) {
      const int64_t pass = std::min<int64_t>(kLaneRows, rows - r0);
      const LanePlanes planes = lane_planes(xs + r0 * k, pass, k);
      at::parallel_for(0, n / kInt8Tile, 16, [&](int64_t begin, int64_t end) {
        for (int64_t tile = begin; tile < end; ++tile)
          int8_vnni_tile<T>(wd, sd, planes, k, tile * kInt8Tile, pass, out + r0 * n, n);
      });
    }
  };
  if (rows == 0) return y;
  with_activation_type(x.scalar_type(), run);
#endif
  return y;
}

// --- the machine's int8 rate (engine/tools/machine_bounds.py) -------------------------------------------------------
// What the VNNI tiles work against: independent chains of VPDPBUSD on 512-bit vectors on every thread, the
// instruction they are built on, with nothing else in the loop. A decode step of many rows cannot run faster than
// its multiplies at this rate.
double int8_peak_gmacs(int64_t iterations) {
#ifdef HEARTH_VNNI
  constexpr int kChains = 12;
  const int64_t threads = at::get_num_threads();
  std::vector<int32_t> sink(threads * 16 * kChains);
  auto pass = [&] {
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        __m512i acc[kChains];
        __m512i a = _mm512_set1_epi8(static_cast<char>(t + 1)), b = _mm512_set1_epi8(2);
        for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_epi32(j);
        for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
          for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
          __asm__ volatile("" : "+v"(a));  // a fresh operand each round: the loop cannot be folded away
        }
        for (int j = 0; j < kChains; ++j) _mm512_storeu_si512(sink.data() + (t * kChains + j) * 16, acc[j]);
      }
    });
  };
  double best = 0.0;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(threads) * iterations * kChains * 64 / s / 1e9);
  }
  volatile int32_t keep = 0;  // the chains' results are used: the loop cannot be left out
  for (int32_t v : sink) keep = keep + v;
  return best;
#else
  (void)iterations;
  return 0.0;
#endif
}

}  // namespace hearth
