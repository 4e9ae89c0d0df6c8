// Hearth's AVX512-VNNI matmul kernels (vnni.cpp), registered as torch.ops.hearth.* by decode_step.cpp.

#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hearth {

// Whether this build carries the kernels (it was compiled for a CPU with AVX512-VNNI and VBMI).
bool vnni_available();

// x: [rows, K] bf16 or fp32; packed: torch's int4 layout of [N, K]; scales_zeros: [K / group, N, 2] in x's dtype.
at::Tensor int4_vnni_mm(const at::Tensor& x_in, const at::Tensor& packed_in, int64_t group, const at::Tensor& sz_in);

// x: [rows, K] bf16 or fp32; w: int8 [N, K]; scales: fp32 [N]; gemv: which of the two ways (see vnni.cpp).
at::Tensor int8_vnni_mm(const at::Tensor& x_in, const at::Tensor& w_in, const at::Tensor& scales_in, bool gemv);

// The int8 multiply rate of every thread at once, in GMAC/s: `iterations` rounds of 12 independent VPDPBUSD on
// 512-bit vectors per thread, the best of five timings (0 in a build without AVX512-VNNI).
double int8_peak_gmacs(int64_t iterations);

}  // namespace hearth
