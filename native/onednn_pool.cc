// oneDNN 2D max pooling (forward_training with its workspace, and the backward) as XLA FFI
// handlers, for NHWC activations in float32 or bfloat16.
//
// oneDNN's max keeps the first maximum of a window (strict comparison) but skips NaN and
// starts from the lowest finite value, so a window holding a NaN, or only -inf, would differ
// from layoutlab's max_pool (NaN out, gradient to the last NaN; -inf out). The forward
// therefore scans the input for non-finite values first; where it finds one it computes the
// output and the window indices itself, in layoutlab's semantics (a plain loop: such an
// input means a diverged step), and marks the workspace so that the backward scatters by
// those indices too. The workspace is oneDNN's, plus one trailing flag byte.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "oneapi/dnnl/dnnl.hpp"
#include "onednn_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace layoutlab {
namespace {

using dnnl::memory;

struct PoolParams {
  int64_t backward, bf16, n, h, w, c, oh, ow, kh, kw, sh, sw, plh, plw, prh, prw;
};

struct PoolEntry {
  dnnl::primitive prim;
  memory::desc src_md, dst_md, ws_md;
  size_t scratch_bytes = 0;
};

std::unique_ptr<PoolEntry> CreatePool(const PoolParams& p) {
  auto& eng = Engine();
  auto e = std::make_unique<PoolEntry>();
  const auto dt = p.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  e->src_md = memory::desc({p.n, p.c, p.h, p.w}, dt, memory::format_tag::nhwc);
  e->dst_md = memory::desc({p.n, p.c, p.oh, p.ow}, dt, memory::format_tag::nhwc);
  const memory::dims strides{p.sh, p.sw}, kernel{p.kh, p.kw}, dilation{0, 0};
  const memory::dims pad_l{p.plh, p.plw}, pad_r{p.prh, p.prw};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::pooling_forward::primitive_desc fwd(
      eng, dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, e->src_md,
      e->dst_md, strides, kernel, dilation, pad_l, pad_r, attr);
  e->ws_md = fwd.workspace_desc();
  if (!p.backward) {
    e->prim = dnnl::pooling_forward(fwd);
    e->scratch_bytes = fwd.scratchpad_desc().get_size();
    return e;
  }
  dnnl::pooling_backward::primitive_desc bwd(eng, dnnl::algorithm::pooling_max, e->src_md,
                                             e->dst_md, strides, kernel, dilation, pad_l,
                                             pad_r, fwd, attr);
  e->prim = dnnl::pooling_backward(bwd);
  e->scratch_bytes = bwd.scratchpad_desc().get_size();
  return e;
}

const PoolEntry& LookupPool(const PoolParams& p) {
  static PrimitiveCache<PoolParams, PoolEntry> cache(CreatePool);
  return cache.Get(p);
}

void ExecutePool(const PoolEntry& e, DnnlArgs& args) {
  thread_local Buffer scratch;  // each thread's own, shared by the forward and the backward
  Execute(e.prim, args, scratch, e.scratch_bytes);
}

PoolParams MakePoolParams(int64_t backward, ffi::DataType t, ffi::AnyBuffer::Dimensions x,
                          ffi::AnyBuffer::Dimensions y, int64_t kh, int64_t kw, int64_t sh,
                          int64_t sw, int64_t plh, int64_t plw, int64_t prh, int64_t prw) {
  if (x.size() != 4 || y.size() != 4) throw std::invalid_argument("pool operands: rank 4");
  const PoolParams p{backward, IsBf16(t), x[0], x[1], x[2], x[3], y[1], y[2],
                     kh,       kw,        sh,   sw,   plh,  plw,  prh,  prw};
  if (kh * kw > 255) throw std::invalid_argument("windows of more than 255 elements");
  return p;
}

float Load(const void* base, size_t i, bool bf16) {
  if (!bf16) return static_cast<const float*>(base)[i];
  const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

void Store(void* base, size_t i, float v, bool bf16) {
  if (!bf16) {
    static_cast<float*>(base)[i] = v;
    return;
  }
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);  // v is an input element: exact in bfloat16
  static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(bits >> 16);
}

// Whether any element's exponent is all ones (NaN or an infinity). One OR-reduction the
// compiler vectorizes; an infinity of either sign sends the input to the plain loop too.
bool AnyNonFinite(const void* x, size_t count, bool bf16) {
  uint32_t hit = 0;
  if (bf16) {
    const uint16_t* v = static_cast<const uint16_t*>(x);
    for (size_t i = 0; i < count; ++i) hit |= ((v[i] & 0x7f80u) == 0x7f80u);
  } else {
    const uint32_t* v = static_cast<const uint32_t*>(x);
    for (size_t i = 0; i < count; ++i) hit |= ((v[i] & 0x7f800000u) == 0x7f800000u);
  }
  return hit != 0;
}

// layoutlab's max_pool over the padded window (padding is -inf): the first maximum in
// row-major window order, or the last NaN; ws gets the window offset kh*KW+kw it chose.
void PlainForward(const PoolParams& p, const void* x, void* y, uint8_t* ws) {
  const bool bf16 = p.bf16;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < p.n; ++b)
    for (int64_t i = 0; i < p.oh; ++i)
      for (int64_t j = 0; j < p.ow; ++j)
        for (int64_t ch = 0; ch < p.c; ++ch) {
          float best = ninf;
          int best_k = -1, nan_k = -1;
          for (int64_t u = 0; u < p.kh; ++u)
            for (int64_t v = 0; v < p.kw; ++v) {
              const int64_t r = i * p.sh - p.plh + u, s = j * p.sw - p.plw + v;
              const bool inside = r >= 0 && r < p.h && s >= 0 && s < p.w;
              const float val =
                  inside ? Load(x, ((b * p.h + r) * p.w + s) * p.c + ch, bf16) : ninf;
              const int k = static_cast<int>(u * p.kw + v);
              if (std::isnan(val)) nan_k = k;
              if (best_k < 0 || val > best) best = val, best_k = k;
            }
          // best_k is the first offset holding the maximum (offset 0 for an all -inf window,
          // where every element equals it).
          const int k = nan_k >= 0 ? nan_k : best_k;
          const size_t o = ((b * p.oh + i) * p.ow + j) * p.c + ch;
          Store(y, o, nan_k >= 0 ? std::numeric_limits<float>::quiet_NaN() : best, bf16);
          ws[o] = static_cast<uint8_t>(k);
        }
}

// The backward of PlainForward: each output gradient to its window's chosen offset (dropped
// where that offset is padding, as max_pool's backward drops it).
void PlainBackward(const PoolParams& p, const void* dy, const uint8_t* ws, void* dx) {
  const bool bf16 = p.bf16;
  const size_t nx = static_cast<size_t>(p.n * p.h * p.w * p.c);
  std::unique_ptr<float[]> acc(new float[nx]());
  for (int64_t b = 0; b < p.n; ++b)
    for (int64_t i = 0; i < p.oh; ++i)
      for (int64_t j = 0; j < p.ow; ++j)
        for (int64_t ch = 0; ch < p.c; ++ch) {
          const size_t o = ((b * p.oh + i) * p.ow + j) * p.c + ch;
          const int64_t u = ws[o] / p.kw, v = ws[o] % p.kw;
          const int64_t r = i * p.sh - p.plh + u, s = j * p.sw - p.plw + v;
          if (r < 0 || r >= p.h || s < 0 || s >= p.w) continue;
          acc[((b * p.h + r) * p.w + s) * p.c + ch] += Load(dy, o, bf16);
        }
  for (size_t i = 0; i < nx; ++i) {
    if (!bf16) {
      static_cast<float*>(dx)[i] = acc[i];
      continue;
    }
    // Round to nearest even, as a float32 sum converted to bfloat16 by XLA is.
    uint32_t bits;
    std::memcpy(&bits, &acc[i], sizeof bits);
    if (std::isnan(acc[i])) {
      static_cast<uint16_t*>(dx)[i] = static_cast<uint16_t>((bits >> 16) | 0x40);
      continue;
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);
    static_cast<uint16_t*>(dx)[i] = static_cast<uint16_t>(bits >> 16);
  }
}

ffi::Error PoolForward(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::AnyBuffer> ws, int64_t kh, int64_t kw, int64_t sh,
                       int64_t sw, int64_t plh, int64_t plw, int64_t prh, int64_t prw) {
  return FfiGuard("max pool", [&] {
    const PoolParams p = MakePoolParams(0, x.element_type(), x.dimensions(), y->dimensions(),
                                        kh, kw, sh, sw, plh, plw, prh, prw);
    const PoolEntry& e = LookupPool(p);
    CheckWorkspace(ws->dimensions(), e.ws_md.get_size() + 1);
    uint8_t* flag = static_cast<uint8_t*>(ws->untyped_data()) + e.ws_md.get_size();
    if (e.ws_md.get_data_type() != memory::data_type::u8)
      throw std::invalid_argument("oneDNN's workspace is not one byte per element");
    if (AnyNonFinite(x.untyped_data(), x.element_count(), p.bf16)) {
      PlainForward(p, x.untyped_data(), y->untyped_data(),
                   static_cast<uint8_t*>(ws->untyped_data()));
      *flag = 1;
      return;
    }
    auto& eng = Engine();
    DnnlArgs args{
        {DNNL_ARG_SRC, memory(e.src_md, eng, x.untyped_data())},
        {DNNL_ARG_DST, memory(e.dst_md, eng, y->untyped_data())},
        {DNNL_ARG_WORKSPACE, memory(e.ws_md, eng, ws->untyped_data())}};
    ExecutePool(e, args);
    *flag = 0;
  });
}

ffi::Error PoolBackward(ffi::AnyBuffer dy, ffi::AnyBuffer ws, ffi::Result<ffi::AnyBuffer> dx,
                        int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t plh,
                        int64_t plw, int64_t prh, int64_t prw) {
  return FfiGuard("max pool", [&] {
    const PoolParams p = MakePoolParams(1, dy.element_type(), dx->dimensions(),
                                        dy.dimensions(), kh, kw, sh, sw, plh, plw, prh, prw);
    const PoolEntry& e = LookupPool(p);
    CheckWorkspace(ws.dimensions(), e.ws_md.get_size() + 1);
    const uint8_t* w = static_cast<const uint8_t*>(ws.untyped_data());
    if (w[e.ws_md.get_size()]) {
      PlainBackward(p, dy.untyped_data(), w, dx->untyped_data());
      return;
    }
    auto& eng = Engine();
    DnnlArgs args{
        {DNNL_ARG_DIFF_DST, memory(e.dst_md, eng, dy.untyped_data())},
        {DNNL_ARG_DIFF_SRC, memory(e.src_md, eng, dx->untyped_data())},
        {DNNL_ARG_WORKSPACE, memory(e.ws_md, eng, ws.untyped_data())}};
    ExecutePool(e, args);
  });
}

}  // namespace

// The implementation oneDNN picks for a max pooling and its workspace bytes (without the
// flag byte), for the Python side's trace-time checks; throws on failure.
std::string PoolImplInfo(const int64_t* values, size_t* ws_bytes) {
  PoolParams p;
  std::memcpy(&p, values, sizeof p);
  if (p.kh * p.kw > 255) throw std::invalid_argument("windows of more than 255 elements");
  const PoolEntry& e = LookupPool(p);
  *ws_bytes = e.ws_md.get_size();
  if (e.ws_md.get_data_type() != memory::data_type::u8) return "ref:ws-not-u8";
  return ImplInfoStr(e.prim);
}

}  // namespace layoutlab

#define POOL_ATTRS                                                                       \
  .Attr<int64_t>("kh").Attr<int64_t>("kw").Attr<int64_t>("sh").Attr<int64_t>("sw")        \
      .Attr<int64_t>("plh").Attr<int64_t>("plw").Attr<int64_t>("prh").Attr<int64_t>("prw")

XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnPoolFwd, layoutlab::PoolForward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>() POOL_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnPoolBwd, layoutlab::PoolBackward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>() POOL_ATTRS);
