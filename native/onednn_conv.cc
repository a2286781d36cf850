// oneDNN 2D convolution primitives on XLA's buffers: forward, backward data (input gradient)
// and backward weights (weight gradient).
//
// Activations are NHWC or NCHW (`nchw`) and kernels HWIO, exactly as XLA holds them. The
// kernel is declared `format_tag::any` and reordered into (or, for the weight gradient, out
// of) the blocked format the primitive picked, or read and written as HWIO itself with
// `plain_weights`, which layoutlab sets where that reorder would cost more than the conv
// (few output pixels; oneDNN then runs its GEMM-based kernels). With `f32_compute` a
// bfloat16 weight gradient converts its activations to float32 first: oneDNN 3.2's bfloat16
// weight-gradient kernel without AMX is several times slower than the float32 one at small
// batches (docs/performance/onednn_kernels.md). Primitives are created once per shape (a
// mutex-guarded cache keyed by every parameter); scratchpads, reordered kernels and
// converted activations live in per-thread buffers that only grow, so a steady-state call
// allocates nothing but oneDNN's small memory handles.
#include "onednn_conv.h"

#include <memory>
#include <stdexcept>
#include <utility>

#include "oneapi/dnnl/dnnl.hpp"
#include "onednn_common.h"

namespace layoutlab {
namespace {

using dnnl::memory;

struct Entry {
  dnnl::primitive prim;
  memory::desc src_md, wei_md, dst_md;     // what the primitive reads and writes
  memory::desc user_src_md, user_dst_md;   // the activations as XLA holds them
  memory::desc user_wei_md;                // HWIO, as XLA holds it
  bool reorder_wei = false, convert_acts = false;
  dnnl::reorder wei_reorder;  // user -> primitive (forward, backward data), else back
  dnnl::reorder src_convert, dst_convert;  // user -> primitive (f32_compute)
  PrimitiveInfo info;
};

memory::data_type ToDnnl(int64_t dt) {
  if (dt == kF32) return memory::data_type::f32;
  if (dt == kBF16) return memory::data_type::bf16;
  throw std::invalid_argument("unsupported dtype code " + std::to_string(dt));
}

memory::desc ActDesc(const Params& p, int64_t dt, int64_t c, int64_t h, int64_t w) {
  return memory::desc({p.n, c, h, w}, ToDnnl(dt),
                      p.nchw ? memory::format_tag::nchw : memory::format_tag::nhwc);
}

memory::dims WeiDims(const Params& p) {
  const int64_t g = p.groups;
  if (g == 1) return {p.o, p.c, p.kh, p.kw};
  return {g, p.o / g, p.c / g, p.kh, p.kw};
}

// The kernel as XLA holds it: HWIO with I = C / groups and O = all output channels, group
// major, so within a group the output channel is the fastest axis.
memory::desc UserWeiDesc(const Params& p, int64_t dt) {
  const int64_t g = p.groups, ig = p.c / g, o = p.o;
  const int64_t s_kw = ig * o, s_kh = p.kw * s_kw;
  if (g == 1) return memory::desc(WeiDims(p), ToDnnl(dt), {1, o, s_kh, s_kw});
  return memory::desc(WeiDims(p), ToDnnl(dt), {o / g, 1, o, s_kh, s_kw});
}

void Take(Entry& e, dnnl::primitive prim, const dnnl::primitive_desc_base& pd,
          const memory::desc& wei_md) {
  e.prim = std::move(prim);
  e.wei_md = wei_md;
  e.info.scratch_bytes = pd.scratchpad_desc().get_size();
  e.info.impl = pd.impl_info_str();
}

std::unique_ptr<Entry> Create(const Params& p) {
  if (p.groups < 1 || p.c % p.groups || p.o % p.groups)
    throw std::invalid_argument("channels not divisible by groups");
  if (p.f32_compute && (p.op != kBackwardWeights || p.src_dt != kBF16 || p.dst_dt != kBF16))
    throw std::invalid_argument("f32_compute is for bfloat16 weight gradients only");
  auto& eng = Engine();
  const memory::dims strides = {p.sh, p.sw};
  const memory::dims dil = {p.dh - 1, p.dw - 1};  // oneDNN counts dilation from 0
  const memory::dims pad_l = {p.plh, p.plw}, pad_r = {p.prh, p.prw};
  auto entry = std::make_unique<Entry>();
  entry->user_src_md = ActDesc(p, p.src_dt, p.c, p.h, p.w);
  entry->user_dst_md = ActDesc(p, p.dst_dt, p.o, p.oh, p.ow);
  entry->user_wei_md = UserWeiDesc(p, p.wei_dt);
  // f32_compute: a bfloat16 weight gradient comes out of the float32 primitive in float32
  // and is converted by the reorder back to HWIO.
  const int64_t src_dt = p.f32_compute ? kF32 : p.src_dt;
  const int64_t dst_dt = p.f32_compute ? kF32 : p.dst_dt;
  // The forward and the input gradient read the kernel in the activations' dtype: a float32
  // kernel beside bfloat16 activations (a mixed-precision layer's float32 parameter) is
  // rounded by the weight reorder, round-to-nearest-even as XLA's convert would, and the
  // convert pass in front of the call goes.
  const bool reads_wei = p.op != kBackwardWeights;
  const int64_t wei_dt = p.f32_compute ? kF32 : reads_wei ? p.src_dt : p.wei_dt;
  if (reads_wei && p.wei_dt != p.src_dt && (p.src_dt != kBF16 || p.wei_dt != kF32))
    throw std::invalid_argument("a conv's kernel is its activations' dtype, or float32");
  if (reads_wei && p.wei_dt != p.src_dt && p.plain_weights)
    throw std::invalid_argument("plain_weights reads the kernel as it is: same dtype only");
  memory::desc src = ActDesc(p, src_dt, p.c, p.h, p.w);
  memory::desc dst = ActDesc(p, dst_dt, p.o, p.oh, p.ow);
  memory::desc wei_any(WeiDims(p), ToDnnl(wei_dt), memory::format_tag::any);
  if (p.plain_weights) wei_any = UserWeiDesc(p, wei_dt);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

  const auto algo = dnnl::algorithm::convolution_direct;
  const auto training = dnnl::prop_kind::forward_training;
  if (p.op == kForward) {
    dnnl::convolution_forward::primitive_desc pd(eng, training, algo, src, wei_any, dst,
                                                 strides, dil, pad_l, pad_r, attr);
    Take(*entry, dnnl::convolution_forward(pd), pd, pd.weights_desc());
  } else {
    // The backward primitives take a forward descriptor as a hint. It holds every tensor in
    // the cotangent's dtype: a forward of bf16 src and weights into bf16 dst exists where a
    // bf16 weight gradient does, while one with the f32 weights of an f32 weight gradient
    // does not.
    const auto hint_dt = ToDnnl(dst_dt);
    dnnl::convolution_forward::primitive_desc hint(
        eng, training, algo, memory::desc(src.get_dims(), hint_dt, src.get_strides()),
        memory::desc(WeiDims(p), hint_dt, memory::format_tag::any), dst, strides, dil, pad_l,
        pad_r);
    if (p.op == kBackwardData) {
      dnnl::convolution_backward_data::primitive_desc pd(eng, algo, src, wei_any, dst, strides,
                                                         dil, pad_l, pad_r, hint, attr);
      Take(*entry, dnnl::convolution_backward_data(pd), pd, pd.weights_desc());
    } else if (p.op == kBackwardWeights) {
      dnnl::convolution_backward_weights::primitive_desc pd(
          eng, algo, src, wei_any, dst, strides, dil, pad_l, pad_r, hint, attr);
      Take(*entry, dnnl::convolution_backward_weights(pd), pd, pd.diff_weights_desc());
    } else {
      throw std::invalid_argument("unknown op " + std::to_string(p.op));
    }
  }
  entry->src_md = src;
  entry->dst_md = dst;
  entry->convert_acts = p.f32_compute != 0;
  if (entry->convert_acts) {
    using rpd = dnnl::reorder::primitive_desc;
    entry->src_convert = dnnl::reorder(rpd(eng, entry->user_src_md, eng, src));
    entry->dst_convert = dnnl::reorder(rpd(eng, entry->user_dst_md, eng, dst));
  }
  entry->reorder_wei = entry->wei_md != entry->user_wei_md;
  if (entry->reorder_wei) {
    entry->wei_reorder = p.op == kBackwardWeights
                             ? dnnl::reorder(dnnl::reorder::primitive_desc(
                                   eng, entry->wei_md, eng, entry->user_wei_md))
                             : dnnl::reorder(dnnl::reorder::primitive_desc(
                                   eng, entry->user_wei_md, eng, entry->wei_md));
  }
  entry->info.reorder_wei = entry->reorder_wei;
  entry->info.wei_bytes = entry->wei_md.get_size();
  return entry;
}

const Entry& Lookup(const Params& p) {
  static PrimitiveCache<Params, Entry> cache(Create);
  return cache.Get(p);
}

}  // namespace

PrimitiveInfo Describe(const Params& p) { return Lookup(p).info; }

void Pack(const Params& p, void* wei, void* out) {
  if (p.op != kForward) throw std::invalid_argument("only a forward's kernel is packed");
  const Entry& e = Lookup(p);
  if (!e.reorder_wei) throw std::invalid_argument("this forward reads its kernel as it is");
  auto& eng = Engine();
  dnnl::stream& stream = Stream();
  memory user_wei(e.user_wei_md, eng, wei), packed(e.wei_md, eng, out);
  e.wei_reorder.execute(stream, user_wei, packed);
  stream.wait();
}

void Run(const Params& p, void* src, void* wei, void* dst, bool packed) {
  const Entry& e = Lookup(p);
  if (packed && (p.op != kForward || !e.reorder_wei))
    throw std::invalid_argument("a packed kernel is for a forward that reorders its kernel");
  auto& eng = Engine();
  dnnl::stream& stream = Stream();
  // Each thread's own: XLA may run custom calls from several threads at once.
  thread_local Buffer scratch, wei_buf, src_buf, dst_buf;
  memory src_m(e.user_src_md, eng, src), dst_m(e.user_dst_md, eng, dst);
  memory user_wei(e.user_wei_md, eng, wei);
  memory wei_m = packed          ? memory(e.wei_md, eng, wei)
                 : e.reorder_wei ? memory(e.wei_md, eng, wei_buf.Get(e.wei_md.get_size()))
                                 : user_wei;
  DnnlArgs args;
  AddScratchpad(args, scratch, e.info.scratch_bytes);
  if (p.op == kForward) {
    if (e.reorder_wei && !packed) e.wei_reorder.execute(stream, user_wei, wei_m);
    args.insert({{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}});
    e.prim.execute(stream, args);
  } else if (p.op == kBackwardData) {
    if (e.reorder_wei) e.wei_reorder.execute(stream, user_wei, wei_m);
    args.insert(
        {{DNNL_ARG_DIFF_DST, dst_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DIFF_SRC, src_m}});
    e.prim.execute(stream, args);
  } else {
    if (e.convert_acts) {  // both are inputs here, so converting them in is all it takes
      memory src_f(e.src_md, eng, src_buf.Get(e.src_md.get_size()));
      memory dst_f(e.dst_md, eng, dst_buf.Get(e.dst_md.get_size()));
      e.src_convert.execute(stream, src_m, src_f);
      e.dst_convert.execute(stream, dst_m, dst_f);
      src_m = src_f;
      dst_m = dst_f;
    }
    args.insert(
        {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_DIFF_DST, dst_m}, {DNNL_ARG_DIFF_WEIGHTS, wei_m}});
    e.prim.execute(stream, args);
    if (e.reorder_wei) e.wei_reorder.execute(stream, wei_m, user_wei);
  }
  stream.wait();
}

}  // namespace layoutlab
