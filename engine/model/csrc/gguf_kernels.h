// Matmuls against GGUF weights kept in their file's block bytes (gguf_kernels.cpp), registered as
// torch.ops.hearth.gguf_mm and torch.ops.hearth.gguf_dequantize by decode_step.cpp and called by linear.cpp.

#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace hearth {

// The ggml type numbers of the block types these kernels read (gguf.GGMLQuantizationType).
enum GgmlType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

// x: [m, k] fp32 or bf16; w: uint8 [n, row_bytes], each row the GGUF blocks of one output channel.
// Returns x @ W.T as [m, n] in x's dtype: activations quantized to int8 per block, integer dot products per
// block, scaled and accumulated in fp32.
at::Tensor gguf_mm(const at::Tensor& x, const at::Tensor& w, int64_t type);

// gguf_mm by the plain loops every build has (the AVX2 tiles' reference; the kernel where AVX2 is missing).
at::Tensor gguf_mm_plain(const at::Tensor& x, const at::Tensor& w, int64_t type);

// gguf_mm by the AVX2 tiles (the plain loops where the build has no AVX2): the 512-bit tiles must give the same bits.
at::Tensor gguf_mm_avx2(const at::Tensor& x, const at::Tensor& w, int64_t type);

// Which tiles gguf_mm runs in this build: "avx512" (AVX512-BW and VNNI), "avx2" or "plain".
std::string gguf_kernel_family();

// w: uint8 [n, row_bytes] -> fp32 [n, k], the values gguf's numpy dequantize gives.
at::Tensor gguf_dequantize(const at::Tensor& w, int64_t type);

}  // namespace hearth
