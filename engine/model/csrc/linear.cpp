// The native step's matmul dispatch: see linear.h.

#include "linear.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_weight_int4pack_mm_for_cpu.h>
#include <ATen/ops/_weight_int8pack_mm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/zeros.h>

#include "gguf_kernels.h"
#include "vnni.h"

namespace hearth {

at::Tensor linear(const at::Tensor& x_in, const int64_t* spec, const at::Tensor& w, const at::Tensor& s,
                  const at::Tensor& bias) {
  const int64_t kind = spec[0], group = spec[1], multiple = spec[2];
  const int64_t rows = x_in.size(0), extra = multiple > 1 ? (multiple - rows % multiple) % multiple : 0;
  if (extra) {  // a row-invariant plan: every call on a multiple of `multiple` rows, the padding's outputs dropped
    at::Tensor padded = at::cat({x_in, at::zeros({extra, x_in.size(1)}, x_in.options())});
    const int64_t unpadded[3] = {kind, group, 1};
    return linear(padded, unpadded, w, s, bias).slice(0, 0, rows);
  }
  const at::Tensor& x = x_in;
  at::Tensor y;
  if (kind == kInt4) {
    y = at::_weight_int4pack_mm_for_cpu(x, w, group, s);
  } else if (kind == kInt4Vnni) {
    y = int4_vnni_mm(x, w, group, s);
  } else if (kind == kGguf) {
    // the spec's second field is the ggml type; a second run of blocks of another type (a Q4_K_M file's Q6_K V
    // rows after its Q4_K Q and K rows) comes in `s`, its type in the field's second byte
    y = gguf_mm(x, w, group & 0xff);
    if (s.numel()) y = at::cat({y, gguf_mm(x, s, group >> 8)}, 1);
  } else if (kind == kInt8) {
    y = at::_weight_int8pack_mm(x, w, s);
  } else {
    return bias.numel() ? at::linear(x, w, bias) : at::linear(x, w);
  }
  return bias.numel() ? y.add_(bias) : y;
}

}  // namespace hearth
