// oneDNN batch normalization (training: batch statistics) as XLA FFI handlers, for NHWC
// activations in float32 or bfloat16 with float32 statistics, scale and shift.
//
// The forward writes y, the per-channel mean and biased variance, and, with `relu`, oneDNN's
// workspace (the ReLU mask the backward reads): oneDNN's fuse_norm_relu applies the ReLU in
// the same pass. The backward takes x, dy, scale, mean, variance and that workspace and
// writes dx, dscale and dshift. Primitives are created once per shape (a mutex-guarded cache
// keyed by every parameter); the scratchpad lives in a per-thread buffer that only grows.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "oneapi/dnnl/dnnl.hpp"
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

dnnl::engine& NormEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

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
  auto& eng = NormEngine();
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
  static std::mutex mu;
  static std::unordered_map<std::string, std::unique_ptr<NormEntry>> cache;
  const std::string key(reinterpret_cast<const char*>(&p), sizeof(NormParams));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto entry = CreateNorm(p);
  return *cache.emplace(key, std::move(entry)).first->second;
}

struct NormBuffer {
  void* data = nullptr;
  size_t size = 0;
  ~NormBuffer() { std::free(data); }
  void* Get(size_t bytes) {
    if (bytes <= size) return data;
    std::free(data);
    size = (bytes + 4095) / 4096 * 4096;
    data = std::aligned_alloc(64, size);
    if (data == nullptr) {
      size = 0;
      throw std::bad_alloc();
    }
    return data;
  }
};

NormParams MakeNormParams(int64_t backward, ffi::AnyBuffer::Dimensions x, ffi::DataType t,
                          int64_t relu, float eps) {
  if (x.size() != 4) throw std::invalid_argument("batch norm operands must have rank 4");
  NormParams p{};
  p.backward = backward;
  if (t == ffi::DataType::BF16) {
    p.bf16 = 1;
  } else if (t != ffi::DataType::F32) {
    throw std::invalid_argument("only float32 and bfloat16 activations are supported");
  }
  p.relu = relu;
  p.n = x[0];
  p.h = x[1];
  p.w = x[2];
  p.c = x[3];
  int32_t bits;
  std::memcpy(&bits, &eps, sizeof bits);
  p.eps_bits = bits;
  return p;
}

void CheckWorkspace(const NormEntry& e, const ffi::AnyBuffer::Dimensions& dims) {
  size_t n = 1;
  for (auto d : dims) n *= static_cast<size_t>(d);
  if (n < e.ws_md.get_size()) throw std::invalid_argument("workspace buffer too small");
}

void Execute(const NormEntry& e, std::unordered_map<int, memory>& args) {
  auto& eng = NormEngine();
  thread_local dnnl::stream stream(eng);
  thread_local NormBuffer scratch;
  if (e.scratch_bytes) {
    memory::desc md({static_cast<int64_t>(e.scratch_bytes)}, memory::data_type::u8,
                    memory::format_tag::x);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(md, eng, scratch.Get(e.scratch_bytes)));
  }
  e.prim.execute(stream, args);
  stream.wait();
}

template <typename F>
ffi::Error NormGuard(F&& f) {
  try {
    f();
    return ffi::Error::Success();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("oneDNN: ") + e.what() + " (status " +
                                std::to_string(static_cast<int>(e.status)) + ")");
  } catch (const std::exception& e) {
    return ffi::Error::InvalidArgument(std::string("layoutlab onednn batch norm: ") + e.what());
  }
}

ffi::Error NormForward(ffi::AnyBuffer x, ffi::AnyBuffer scale, ffi::AnyBuffer shift,
                       ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> mean,
                       ffi::Result<ffi::AnyBuffer> var, ffi::Result<ffi::AnyBuffer> ws,
                       float eps, int64_t relu) {
  return NormGuard([&] {
    const NormParams p = MakeNormParams(0, x.dimensions(), x.element_type(), relu, eps);
    const NormEntry& e = LookupNorm(p);
    auto& eng = NormEngine();
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, memory(e.act_md, eng, x.untyped_data())},
        {DNNL_ARG_DST, memory(e.act_md, eng, y->untyped_data())},
        {DNNL_ARG_SCALE, memory(e.stat_md, eng, scale.untyped_data())},
        {DNNL_ARG_SHIFT, memory(e.stat_md, eng, shift.untyped_data())},
        {DNNL_ARG_MEAN, memory(e.stat_md, eng, mean->untyped_data())},
        {DNNL_ARG_VARIANCE, memory(e.stat_md, eng, var->untyped_data())}};
    if (relu) {
      CheckWorkspace(e, ws->dimensions());
      args.emplace(DNNL_ARG_WORKSPACE, memory(e.ws_md, eng, ws->untyped_data()));
    }
    Execute(e, args);
  });
}

ffi::Error NormBackward(ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::AnyBuffer scale,
                        ffi::AnyBuffer mean, ffi::AnyBuffer var, ffi::AnyBuffer ws,
                        ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dscale,
                        ffi::Result<ffi::AnyBuffer> dshift, float eps, int64_t relu) {
  return NormGuard([&] {
    const NormParams p = MakeNormParams(1, x.dimensions(), x.element_type(), relu, eps);
    const NormEntry& e = LookupNorm(p);
    auto& eng = NormEngine();
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, memory(e.act_md, eng, x.untyped_data())},
        {DNNL_ARG_DIFF_DST, memory(e.act_md, eng, dy.untyped_data())},
        {DNNL_ARG_DIFF_SRC, memory(e.act_md, eng, dx->untyped_data())},
        {DNNL_ARG_SCALE, memory(e.stat_md, eng, scale.untyped_data())},
        {DNNL_ARG_MEAN, memory(e.stat_md, eng, mean.untyped_data())},
        {DNNL_ARG_VARIANCE, memory(e.stat_md, eng, var.untyped_data())},
        {DNNL_ARG_DIFF_SCALE, memory(e.stat_md, eng, dscale->untyped_data())},
        {DNNL_ARG_DIFF_SHIFT, memory(e.stat_md, eng, dshift->untyped_data())}};
    if (relu) {
      CheckWorkspace(e, ws.dimensions());
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
  NormParams p{};
  p.backward = backward;
  p.bf16 = bf16;
  p.relu = relu;
  p.n = n;
  p.c = c;
  p.h = h;
  p.w = w;
  int32_t bits;
  std::memcpy(&bits, &eps, sizeof bits);
  p.eps_bits = bits;
  const NormEntry& e = LookupNorm(p);
  *ws_bytes = relu ? e.ws_md.get_size() : 0;
  auto pd = e.prim.get_primitive_desc();
  const char* impl = nullptr;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  return impl ? impl : "";
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
