// Matmuls against GGUF weights kept in their file's block bytes (gguf_kernels.cpp), registered as
// torch.ops.hearth.gguf_mm and torch.ops.hearth.gguf_dequantize by decode_step.cpp and called by linear.cpp.

#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace hearth {

// The ggml type numbers of the block types these kernels read (gguf.GGMLQuantizationType).
enum GgmlType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

// Not ggml types: the layouts gguf_repack makes, which gguf_mm and gguf_dequantize also take (128 + the ggml type,
// so that a type still fits the byte the native step's spec gives it): Q4_0, Q8_0, Q4_K and Q6_K rows in groups of eight
// interleaved rows (gguf_kernels.cpp, namespace x8).
enum GroupedType : int64_t {
  kQ4_0_X8 = 128 + kQ4_0, kQ8_0_X8 = 128 + kQ8_0, kQ4_K_X8 = 128 + kQ4_K, kQ6_K_X8 = 128 + kQ6_K
};

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

// w: uint8 [n, row_bytes] of ggml type `type` -> the same rows in the grouped layout gguf_grouped_type(type) names,
// the same shape and bytes in another order (Q4_0, Q8_0, Q4_K and Q6_K).
at::Tensor gguf_repack(const at::Tensor& w, int64_t type);

// gguf_repack in place (w contiguous); returns the grouped layout's type number.
int64_t gguf_repack_(at::Tensor& w, int64_t type);

// The grouped layout's type number for a ggml type, or -1 where there is none.
int64_t gguf_grouped_type(int64_t type);

// w: uint8 [n, row_bytes] -> fp32 [n, k], the values gguf's numpy dequantize gives.
at::Tensor gguf_dequantize(const at::Tensor& w, int64_t type);

}  // namespace hearth
