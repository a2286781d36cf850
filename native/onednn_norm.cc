// oneDNN batch normalization (training: batch statistics) as XLA FFI handlers, for NHWC
// activations in float32 or bfloat16 with float32 statistics, scale and shift.
//
// The forward writes y, the per-channel mean and biased variance, and, with `relu`, oneDNN's
// workspace (the ReLU mask the backward reads): oneDNN's fuse_norm_relu applies the ReLU in
// the same pass. The backward takes x, dy, scale, mean, variance and that workspace and
// writes dx, dscale and dshift. Primitives are created once per shape (a mutex-guarded cache
// keyed by every parameter); the scratchpad lives in a per-thread buffer that only grows.
#include <cstdint>
#include <cstring>
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

struct NormParams {
  int64_t backward, bf16, relu, n, c, h, w;
  int64_t eps_bits;  // the float epsilon's bits
};

struct NormEntry {
  dnnl::primitive prim;
  memory::desc act_md, stat_md, ws_md;
  size_t scratch_bytes = 0;
};

dnnl::normalization_flags Flags(const NormParams& p) {
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  if (p.relu) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
  return flags;
}

float Epsilon(const NormParams& p) {
  float eps;
  const int32_t bits = static_cast<int32_t>(p.eps_bits);
  std::memcpy(&eps, &bits, sizeof eps);
  return eps;
}

std::unique_ptr<NormEntry> CreateNorm(const NormParams& p) {
  auto& eng = Engine();
  auto e = std::make_unique<NormEntry>();
  const auto dt = p.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  e->act_md = memory::desc({p.n, p.c, p.h, p.w}, dt, memory::format_tag::nhwc);
  e->stat_md = memory::desc({p.c}, memory::data_type::f32, memory::format_tag::x);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::batch_normalization_forward::primitive_desc fwd(
      eng, dnnl::prop_kind::forward_training, e->act_md, e->act_md, Epsilon(p), Flags(p),
      attr);
  e->ws_md = fwd.workspace_desc();
  if (!p.backward) {
    e->prim = dnnl::batch_normalization_forward(fwd);
    e->scratch_bytes = fwd.scratchpad_desc().get_size();
    return e;
  }
  dnnl::batch_normalization_backward::primitive_desc bwd(
      eng, dnnl::prop_kind::backward, e->act_md, e->act_md, e->act_md, Epsilon(p), Flags(p),
      fwd, attr);
  e->prim = dnnl::batch_normalization_backward(bwd);
  e->scratch_bytes = bwd.scratchpad_desc().get_size();
  return e;
}

const NormEntry& LookupNorm(const NormParams& p) {
  static PrimitiveCache<NormParams, NormEntry> cache(CreateNorm);
  return cache.Get(p);
}

NormParams NormKey(int64_t backward, int64_t bf16, int64_t relu, int64_t n, int64_t c, int64_t h,
               int64_t w, float eps) {
  int32_t bits;
  std::memcpy(&bits, &eps, sizeof bits);
  return NormParams{backward, bf16, relu, n, c, h, w, bits};
}

NormParams MakeNormParams(int64_t backward, ffi::AnyBuffer::Dimensions x, ffi::DataType t,
                          int64_t relu, float eps) {
  if (x.size() != 4) throw std::invalid_argument("batch norm operands must have rank 4");
  return NormKey(backward, IsBf16(t), relu, x[0], x[3], x[1], x[2], eps);
}

void Execute(const NormEntry& e, DnnlArgs& args) {
  thread_local Buffer scratch;  // each thread's own, shared by the forward and the backward
  layoutlab::Execute(e.prim, args, scratch, e.scratch_bytes);
}

ffi::Error NormForward(ffi::AnyBuffer x, ffi::AnyBuffer scale, ffi::AnyBuffer shift,
                       ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> mean,
                       ffi::Result<ffi::AnyBuffer> var, ffi::Result<ffi::AnyBuffer> ws,
                       float eps, int64_t relu) {
  return FfiGuard("batch norm", [&] {
    const NormParams p = MakeNormParams(0, x.dimensions(), x.element_type(), relu, eps);
    const NormEntry& e = LookupNorm(p);
    auto& eng = Engine();
    DnnlArgs args{
        {DNNL_ARG_SRC, memory(e.act_md, eng, x.untyped_data())},
        {DNNL_ARG_DST, memory(e.act_md, eng, y->untyped_data())},
        {DNNL_ARG_SCALE, memory(e.stat_md, eng, scale.untyped_data())},
        {DNNL_ARG_SHIFT, memory(e.stat_md, eng, shift.untyped_data())},
        {DNNL_ARG_MEAN, memory(e.stat_md, eng, mean->untyped_data())},
        {DNNL_ARG_VARIANCE, memory(e.stat_md, eng, var->untyped_data())}};
    if (relu) {
      CheckWorkspace(ws->dimensions(), e.ws_md.get_size());
      args.emplace(DNNL_ARG_WORKSPACE, memory(e.ws_md, eng, ws->untyped_data()));
    }
    Execute(e, args);
  });
}

ffi::Error NormBackward(ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::AnyBuffer scale,
                        ffi::AnyBuffer mean, ffi::AnyBuffer var, ffi::AnyBuffer ws,
                        ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dscale,
                        ffi::Result<ffi::AnyBuffer> dshift, float eps, int64_t relu) {
  return FfiGuard("batch norm", [&] {
    const NormParams p = MakeNormParams(1, x.dimensions(), x.element_type(), relu, eps);
    const NormEntry& e = LookupNorm(p);
    auto& eng = Engine();
    DnnlArgs args{
        {DNNL_ARG_SRC, memory(e.act_md, eng, x.untyped_data())},
        {DNNL_ARG_DIFF_DST, memory(e.act_md, eng, dy.untyped_data())},
        {DNNL_ARG_DIFF_SRC, memory(e.act_md, eng, dx->untyped_data())},
        {DNNL_ARG_SCALE, memory(e.stat_md, eng, scale.untyped_data())},
        {DNNL_ARG_MEAN, memory(e.stat_md, eng, mean.untyped_data())},
        {DNNL_ARG_VARIANCE, memory(e.stat_md, eng, var.untyped_data())},
        {DNNL_ARG_DIFF_SCALE, memory(e.stat_md, eng, dscale->untyped_data())},
        {DNNL_ARG_DIFF_SHIFT, memory(e.stat_md, eng, dshift->untyped_data())}};
    if (relu) {
      CheckWorkspace(ws.dimensions(), e.ws_md.get_size());
      args.emplace(DNNL_ARG_WORKSPACE, memory(e.ws_md, eng, ws.untyped_data()));
    }
    Execute(e, args);
  });
}

}  // namespace

// The implementation oneDNN picks for a batch norm and its workspace bytes (0 without ReLU),
// for the Python side's trace-time checks; throws on failure.
std::string NormImplInfo(int64_t backward, int64_t bf16, int64_t relu, int64_t n, int64_t c,
                         int64_t h, int64_t w, float eps, size_t* ws_bytes) {
  const NormParams p = NormKey(backward, bf16, relu, n, c, h, w, eps);
  const NormEntry& e = LookupNorm(p);
  *ws_bytes = relu ? e.ws_md.get_size() : 0;
  return ImplInfoStr(e.prim);
}

}  // namespace layoutlab

XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnNormFwd, layoutlab::NormForward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("relu"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnNormBwd, layoutlab::NormBackward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("relu"));
