// What the native step's op families share: the rounding helpers that make them follow the eager layer's
// numerics, a 16-lane sum and a polynomial e^x, and the activation types their templates are built for.

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

// The activation types decode_layers dispatches on (fp32, fp64, bf16, fp16): each op family's .cpp instantiates
// its templates for every one of them.
#define HEARTH_FOR_EACH_ACTIVATION_TYPE(X) X(float) X(double) X(c10::BFloat16) X(c10::Half)

namespace hearth {

template <typename T>
inline float f32(T v) {
  return static_cast<float>(v);
}

template <typename T>
inline T rounded(float v) {
  return static_cast<T>(v);
}

constexpr int kLanes = 16;  // one AVX-512 register of floats; written as plain loops the compiler vectorizes

inline float hsum(const float* acc) {
  float s = 0.f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// e^x for x <= 0 to within ~2e-7 relative (Cephes' exp2f polynomial), in plain arithmetic that vectorizes
inline float exp_neg(float x) {
  x = std::max(x, -87.f);
  const float t = x * 1.44269504088896341f;
  const float n = (t + 12582912.f) - 12582912.f;  // round to nearest (1.5 * 2^23)
  const float f = t - n;                           // [-0.5, 0.5]
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += static_cast<int32_t>(n) * (1 << 23);
  std::memcpy(&p, &bits, sizeof p);
  return p;
}

}  // namespace hearth
