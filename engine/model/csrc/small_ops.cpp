// RMSNorm, rotary embedding with the K/V writes, SiLU-and-multiply: see small_ops.h.

#include "small_ops.h"

#include <cmath>

#include "common.h"

namespace hearth {
namespace {

template <typename T>
inline float sum_squares(const T* __restrict x, int64_t n) {
  float acc[kLanes] = {0.f};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = f32(x[i + j]);
      acc[j] += v * v;
    }
  }
  float s = hsum(acc);
  for (; i < n; ++i) s += f32(x[i]) * f32(x[i]);
  return s;
}

inline float silu(float x) {
  // x * sigmoid(x) with the exponent of a non-positive argument only
  const float e = exp_neg(-std::fabs(x));
  const float sig = x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
  return x * sig;
}

// One head's vector: optional RMSNorm (Qwen3's q/k norms), then the rotary embedding in rotate-half layout
// (x * cos + rotate_half(x) * sin, each product rounded to T as eager rounds it). Result rounded to T.
template <typename T>
void rotate_head(const T* in, const T* norm, float eps, const float* cos, const float* sin, int64_t d, float* out) {
  float buf[512];
  for (int64_t i = 0; i < d; ++i) buf[i] = f32(in[i]);
  if (norm != nullptr) {
    float ss = 0.f;
    for (int64_t i = 0; i < d; ++i) ss += buf[i] * buf[i];
    const float rstd = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) buf[i] = f32(rounded<T>(f32(rounded<T>(buf[i] * rstd)) * f32(norm[i])));
  }
  const int64_t half = d / 2;
  for (int64_t i = 0; i < d; ++i) {
    const float rot = i < half ? -buf[i + half] : buf[i - half];
    const float a = f32(rounded<T>(buf[i] * cos[i]));
    out[i] = f32(rounded<T>(a + rot * sin[i]));
  }
}

}  // namespace

template <typename T>
void rms_norm(const T* x, const T* w, T* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* o = out + r * n;
    const float rstd = 1.f / std::sqrt(sum_squares(xr, n) / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) o[i] = rounded<T>(f32(rounded<T>(f32(xr[i]) * rstd)) * f32(w[i]));
  }
}

template <typename T>
void rope_and_store(const T* qkv, int64_t rows, int64_t nh, int64_t kvh, int64_t d, const T* q_norm,
                    const T* k_norm, float eps, const float* cos, const float* sin, const int64_t* slot_mapping,
                    float* k_pool, float* v_pool, float* q_out) {
  const int64_t width = (nh + 2 * kvh) * d;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = qkv + r * width;
    const float* c = cos + r * d;
    const float* s = sin + r * d;
    for (int64_t h = 0; h < nh; ++h) rotate_head(row + h * d, q_norm, eps, c, s, d, q_out + (r * nh + h) * d);
    float* k_dst = k_pool + slot_mapping[r] * kvh * d;
    float* v_dst = v_pool + slot_mapping[r] * kvh * d;
    for (int64_t h = 0; h < kvh; ++h) rotate_head(row + (nh + h) * d, k_norm, eps, c, s, d, k_dst + h * d);
    const T* v = row + (nh + kvh) * d;
    for (int64_t i = 0; i < kvh * d; ++i) v_dst[i] = f32(v[i]);
  }
}

template <typename T>
void silu_mul(const T* gate_up, int64_t rows, int64_t inter, T* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * inter;
    const T* u = g + inter;
    T* o = out + r * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float act = f32(rounded<T>(silu(f32(g[i]))));
      o[i] = rounded<T>(act * f32(u[i]));
    }
  }
}

#define HEARTH_INSTANTIATE(T)                                                                                       \
  template void rms_norm<T>(const T*, const T*, T*, int64_t, int64_t, float);                                      \
  template void rope_and_store<T>(const T*, int64_t, int64_t, int64_t, int64_t, const T*, const T*, float,         \
                                  const float*, const float*, const int64_t*, float*, float*, float*);             \
  template void silu_mul<T>(const T*, int64_t, int64_t, T*);
HEARTH_FOR_EACH_ACTIVATION_TYPE(HEARTH_INSTANTIATE)
#undef HEARTH_INSTANTIATE

}  // namespace hearth
