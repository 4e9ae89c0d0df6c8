// The native step's matmul dispatch: each linear runs the kernel its plan chose (engine/model/autotune.py).

#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hearth {

// The kernel of one linear, as engine/model/native.py's _KINDS numbers them.
enum LinearKind : int64_t { kInt4 = 0, kInt8 = 1, kDense = 2, kInt4Vnni = 3, kGguf = 4 };

// x @ w.T (+ bias) with the kernel spec names: spec = {kind, group size, row multiple}. w and s are the kernel's
// weight and scales (s empty for dense), bias empty where there is none. For kGguf, spec = {kind, ggml type, row
// multiple}, w the GGUF block bytes (uint8 [N, row bytes]) and s empty, or a second run of output rows in
// another block type, whose ggml type is then the type field's second byte. A row multiple above 1 pads the call
// with zero rows to a multiple of it (a row-invariant plan), and drops their outputs.
at::Tensor linear(const at::Tensor& x_in, const int64_t* spec, const at::Tensor& w, const at::Tensor& s,
                  const at::Tensor& bias);

}  // namespace hearth
