// Hearth's native decode step: every layer of the fused decoder, for a decode-only step, in one call.
//
// On a small model an eager decode step is mostly per-op overhead: some twenty torch calls per layer from Python,
// a few microseconds each. Here the layer loop runs in C++. The matmuls are torch's own kernels (packed int4,
// int8, or dense), called through ATen, or the AVX512-VNNI int4 kernel over torch's int4 bytes (vnni.cpp, also
// registered on its own, as torch.ops.hearth.int4_vnni_mm); the small ops between them (RMSNorm, rotary embedding,
// the K/V writes, paged decode attention, SiLU-and-multiply) are a few fused loops over the step's rows.
//
// Numerics follow the eager layer (engine/model/llama.py): activations rounded to the model dtype where eager
// rounds them, norms with fp32 statistics, attention in fp32 over the fp32 KV pool. Each row (sequence) is
// computed on its own, so a row's result does not depend on the other rows of the step.
//
// One file per op family, each with its header: linear.cpp (the matmul dispatch), small_ops.cpp (RMSNorm, rotary
// embedding and K/V writes, SiLU-and-multiply), attention.cpp (paged decode attention) and vnni.cpp (the
// AVX512-VNNI kernels); common.h holds what they share. This file pins the weights, runs the layer loop and
// registers the ops. Built by engine/model/native_build.py and loaded by engine/model/native.py; registered as
// torch.ops.hearth.decode_layers.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "attention.h"
#include "gguf_kernels.h"
#include "linear.h"
#include "small_ops.h"
#include "vnni.h"

namespace hearth {
namespace {

constexpr int64_t kTensorsPerLayer = 16;
constexpr int64_t kKindsPerLayer = 12;

const void* maybe_data(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

// --- pinned weights -----------------------------------------------------------------------------------------
// A tensor that Python also holds has a Python object attached: every reference count change an ATen call makes
// on it may take the GIL, and while another Python thread runs (the server's event loop, the app's GUI), each such
// hand-off waits for that thread's switch interval. So a model's weights are pinned once, as C++-owned aliases
// (views of the same memory, with no Python object), and every step's inputs are aliased on entry.
struct Pinned {
  std::vector<at::Tensor> weights;  // 16 per layer (see decode_layers)
  std::vector<int64_t> kinds;       // 12 per layer
};

std::mutex g_pinned_mutex;
std::unordered_map<int64_t, std::shared_ptr<const Pinned>> g_pinned;
int64_t g_next_handle = 1;

int64_t pin_weights(at::TensorList weights, at::IntArrayRef kinds) {
  TORCH_CHECK(weights.size() % kTensorsPerLayer == 0 && kinds.size() == weights.size() / kTensorsPerLayer * kKindsPerLayer,
              "expected ", kTensorsPerLayer, " weight tensors and ", kKindsPerLayer, " kinds per layer");
  auto pinned = std::make_shared<Pinned>();
  pinned->weights.reserve(weights.size());
  for (const at::Tensor& w : weights) {
    TORCH_CHECK(w.device().is_cpu(), "weights must be on the CPU");
    pinned->weights.push_back(w.alias());
  }
  pinned->kinds.assign(kinds.begin(), kinds.end());
  for (size_t i = 0; i < pinned->kinds.size(); i += 3) {
    TORCH_CHECK(pinned->kinds[i] >= kInt4 && pinned->kinds[i] <= kGguf, "unknown linear kind");
    TORCH_CHECK(pinned->kinds[i + 2] >= 1 && pinned->kinds[i + 2] <= 64, "bad row multiple");
  }
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  const int64_t handle = g_next_handle++;
  g_pinned[handle] = std::move(pinned);
  return handle;
}

void unpin_weights(int64_t handle) {
  std::shared_ptr<const Pinned> gone;  // released outside the lock
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned.find(handle);
  if (it != g_pinned.end()) {
    gone = it->second;
    g_pinned.erase(it);
  }
}

}  // namespace

// handle: weights pinned by pin_weights: 16 per layer (input_norm, q_norm, k_norm, post_norm, then weight, scales,
// bias of qkv, o, gate_up, down; an absent one is an empty tensor) and 12 integers per layer (kind, group size
// and row multiple of each linear).
// x: [B, hidden] embedded tokens; cos, sin: [B, head_dim]; k_pool, v_pool: fp32 [layers, slots, kv_heads, head_dim];
// slot_mapping: [B] slot each row writes; slots: [B, L] slots each row reads, lens: [B] how many of them.
// Returns the hidden states after the last layer (before the final norm).
at::Tensor decode_layers(int64_t handle, const at::Tensor& x_py, const at::Tensor& cos_py, const at::Tensor& sin_py,
                         const at::Tensor& k_py, const at::Tensor& v_py, const at::Tensor& slot_mapping,
                         const at::Tensor& slots_in, const at::Tensor& lens_in, double eps_d, double scale_d,
                         int64_t nh) {
  std::shared_ptr<const Pinned> pinned;
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    auto it = g_pinned.find(handle);
    TORCH_CHECK(it != g_pinned.end(), "unknown weights handle ", handle);
    pinned = it->second;
  }
  const at::Tensor x_in = x_py.alias(), cos_in = cos_py.alias(), sin_in = sin_py.alias();
  const at::Tensor k_pool = k_py.alias(), v_pool = v_py.alias();
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), "x must be a CPU tensor [rows, hidden]");
  TORCH_CHECK(k_pool.scalar_type() == at::kFloat && v_pool.scalar_type() == at::kFloat, "the KV pool must be fp32");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.sizes() == v_pool.sizes() &&
                  k_pool.dim() == 4,
              "K and V pools must be contiguous [layers, slots, kv_heads, head_dim]");
  const int64_t layers = k_pool.size(0), num_slots = k_pool.size(1), kvh = k_pool.size(2), d = k_pool.size(3);
  TORCH_CHECK(static_cast<int64_t>(pinned->weights.size()) == layers * kTensorsPerLayer,
              "the pinned weights are for another number of layers");
  TORCH_CHECK(nh % kvh == 0 && d % 2 == 0 && d <= 512, "unsupported attention shape");
  const int64_t rows = x_in.size(0);
  at::Tensor slot_map = slot_mapping.alias().to(at::kLong).contiguous();
  at::Tensor slots = slots_in.alias().to(at::kLong).contiguous();
  at::Tensor lens = lens_in.alias().to(at::kLong).contiguous();
  TORCH_CHECK(slot_map.numel() == rows && lens.numel() == rows && slots.dim() == 2 && slots.size(0) == rows,
              "one slot, one context length and one row of slots per row");
  const int64_t max_len = slots.size(1);
  {  // indices come from the block manager; a bad one would read or write outside the pool
    const int64_t* sm = slot_map.data_ptr<int64_t>();
    const int64_t* sl = slots.data_ptr<int64_t>();
    const int64_t* ln = lens.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      TORCH_CHECK(sm[r] >= 0 && sm[r] < num_slots, "slot out of range");
      TORCH_CHECK(ln[r] >= 1 && ln[r] <= max_len, "context length out of range");
      for (int64_t j = 0; j < ln[r]; ++j) TORCH_CHECK(sl[r * max_len + j] >= 0 && sl[r * max_len + j] < num_slots,
                                                      "slot out of range");
    }
  }
  at::Tensor cos = cos_in.to(at::kFloat).reshape({rows, d}).contiguous();
  at::Tensor sin = sin_in.to(at::kFloat).reshape({rows, d}).contiguous();
  const float eps = static_cast<float>(eps_d), scale = static_cast<float>(scale_d);
  const int64_t hidden = x_in.size(1), qd = nh * d;
  const std::vector<at::Tensor>& weights = pinned->weights;
  const std::vector<int64_t>& kinds = pinned->kinds;

  at::Tensor x = x_in.contiguous().clone();
  at::Tensor h = at::empty_like(x);
  at::Tensor q = at::empty({rows, qd}, x.options().dtype(at::kFloat));
  at::Tensor attn = at::empty({rows, qd}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "decode_layers", [&] {
    using T = scalar_t;
    for (int64_t l = 0; l < layers; ++l) {
      const at::Tensor* w = weights.data() + l * kTensorsPerLayer;
      const int64_t* k = kinds.data() + l * kKindsPerLayer;
      float* k_layer = k_pool.data_ptr<float>() + l * num_slots * kvh * d;
      float* v_layer = v_pool.data_ptr<float>() + l * num_slots * kvh * d;
      for (int i = 0; i < 4; ++i) {
        TORCH_CHECK(w[i].numel() == 0 || (w[i].scalar_type() == x.scalar_type() && w[i].is_contiguous()),
                    "norm weights must be contiguous in the activation dtype");
      }
      TORCH_CHECK(w[0].numel() == hidden && w[3].numel() == hidden, "norm weights must be [hidden]");
      TORCH_CHECK(w[1].numel() == 0 || w[1].numel() == d, "q/k norm weights must be [head_dim]");
      TORCH_CHECK(w[2].numel() == 0 || w[2].numel() == d, "q/k norm weights must be [head_dim]");
      rms_norm(x.data_ptr<T>(), w[0].data_ptr<T>(), h.data_ptr<T>(), rows, hidden, eps);
      at::Tensor qkv = linear(h, k + 0, w[4], w[5], w[6]).contiguous();
      TORCH_CHECK(qkv.size(1) == (nh + 2 * kvh) * d && qkv.scalar_type() == x.scalar_type(), "qkv has the wrong shape");
      rope_and_store(qkv.data_ptr<T>(), rows, nh, kvh, d, static_cast<const T*>(maybe_data(w[1])),
                     static_cast<const T*>(maybe_data(w[2])), eps, cos.data_ptr<float>(), sin.data_ptr<float>(),
                     slot_map.data_ptr<int64_t>(), k_layer, v_layer, q.data_ptr<float>());
      decode_attention(q.data_ptr<float>(), k_layer, v_layer,
                       slots.data_ptr<int64_t>(), max_len, lens.data_ptr<int64_t>(), rows, nh, kvh, d, scale,
                       attn.data_ptr<T>());
      x.add_(linear(attn, k + 3, w[7], w[8], w[9]));
      rms_norm(x.data_ptr<T>(), w[3].data_ptr<T>(), h.data_ptr<T>(), rows, hidden, eps);
      at::Tensor gate_up = linear(h, k + 6, w[10], w[11], w[12]).contiguous();
      TORCH_CHECK(gate_up.scalar_type() == x.scalar_type() && gate_up.size(1) % 2 == 0, "gate_up has the wrong shape");
      const int64_t inter = gate_up.size(1) / 2;
      at::Tensor act = at::empty({rows, inter}, x.options());
      silu_mul(gate_up.data_ptr<T>(), rows, inter, act.data_ptr<T>());
      x.add_(linear(act, k + 9, w[13], w[14], w[15]));
    }
  });
  return x;
}

}  // namespace hearth

TORCH_LIBRARY(hearth, m) {
  m.def("pin_weights(Tensor[] weights, int[] kinds) -> int", &hearth::pin_weights);
  m.def("unpin_weights(int handle) -> ()", &hearth::unpin_weights);
  m.def("vnni_available() -> bool", &hearth::vnni_available);
  m.def("int4_vnni_mm(Tensor x, Tensor packed, int group, Tensor scales_zeros) -> Tensor", &hearth::int4_vnni_mm);
  m.def("int8_vnni_mm(Tensor x, Tensor w, Tensor scales, bool gemv) -> Tensor", &hearth::int8_vnni_mm);
  m.def("gguf_mm(Tensor x, Tensor w, int type) -> Tensor", &hearth::gguf_mm);
  m.def("gguf_mm_plain(Tensor x, Tensor w, int type) -> Tensor", &hearth::gguf_mm_plain);
  m.def("gguf_mm_avx2(Tensor x, Tensor w, int type) -> Tensor", &hearth::gguf_mm_avx2);
  m.def("gguf_kernel_family() -> str", &hearth::gguf_kernel_family);
  m.def("gguf_dequantize(Tensor w, int type) -> Tensor", &hearth::gguf_dequantize);
  m.def("int8_peak_gmacs(int iterations) -> float", &hearth::int8_peak_gmacs);
  m.def(
      "decode_layers(int handle, Tensor x, Tensor cos, Tensor sin, Tensor(a!) k_pool, Tensor(b!) v_pool, "
      "Tensor slot_mapping, Tensor slots, Tensor lens, float eps, float scale, int num_heads) -> Tensor",
      &hearth::decode_layers);
}
