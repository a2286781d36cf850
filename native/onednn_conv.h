// oneDNN 2D convolution primitives for layoutlab's XLA FFI handlers (onednn_ffi.cc): what
// decides a primitive (Params), running one on XLA's buffers, and what oneDNN picked for it.
#ifndef LAYOUTLAB_NATIVE_ONEDNN_CONV_H_
#define LAYOUTLAB_NATIVE_ONEDNN_CONV_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace layoutlab {

enum Op : int64_t { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };
enum Dt : int64_t { kF32 = 0, kBF16 = 1 };

// Everything that decides a primitive. src/wei/dst are the conv's roles: for the backward
// ops they are the gradients' dtypes (diff_src, diff_weights, diff_dst). Python builds the
// same tuple (conv_algos/onednn.py: _params), so the field order is part of the interface.
struct Params {
  int64_t op, src_dt, wei_dt, dst_dt, nchw;
  int64_t n, c, h, w, o, kh, kw, oh, ow;
  int64_t sh, sw, plh, plw, prh, prw, dh, dw, groups;
  int64_t plain_weights;  // 1: the primitive reads and writes HWIO itself (no reorder)
  // 1 (weight gradient of bfloat16 activations only): src and diff_dst are converted to
  // float32 and the float32 primitive runs; the products of bfloat16 values are exact in
  // float32, so this changes only the summation order.
  int64_t f32_compute;
};
constexpr int kNumParams = sizeof(Params) / sizeof(int64_t);

struct PrimitiveInfo {
  std::string impl;  // oneDNN's impl_info_str
  bool reorder_wei;
  size_t scratch_bytes;
  size_t wei_bytes;  // the kernel in the primitive's own format
};

// Both create the primitive on first use (cached for the process) and throw dnnl::error or
// std::exception on failure.
PrimitiveInfo Describe(const Params& p);
// src, wei and dst are XLA's buffers in the conv's roles (see Params). `packed` (forward
// only): wei already holds the kernel in the primitive's format (Pack's output).
void Run(const Params& p, void* src, void* wei, void* dst, bool packed = false);
// The forward's kernel reorder alone: the HWIO kernel `wei` into `out` (wei_bytes), so an
// inference program that calls the forward many times on one kernel reorders it once.
void Pack(const Params& p, void* wei, void* out);

}  // namespace layoutlab

#endif  // LAYOUTLAB_NATIVE_ONEDNN_CONV_H_
