// oneDNN 2D convolutions as XLA FFI handlers: forward, backward data (input gradient) and
// backward weights (weight gradient), built as the CPython extension `layoutlab._onednn`.
//
// Activations are NHWC or NCHW (attribute `nchw`) and kernels HWIO, exactly as XLA holds them:
// src/dst wrap XLA's buffers, so only the kernel may be reordered, into the blocked format the
// primitive picked (weights are declared `format_tag::any`, or HWIO itself with the
// `plain_weights` attribute, which layoutlab sets where the reorder would cost more than the
// conv: float32 forwards of few output pixels). Primitives are created once per
// shape (a mutex-guarded cache keyed by every parameter); scratchpads are user-managed and
// live in per-thread buffers that only grow, so a steady-state call allocates nothing but
// oneDNN's small memory handles. Errors come back as ffi::Error, never an abort.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using dnnl::memory;

namespace {

enum Op : int64_t { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };
enum Dt : int64_t { kF32 = 0, kBF16 = 1 };

// Everything that decides a primitive. src/wei/dst are the conv's roles: for the backward
// ops they are the gradients' dtypes (diff_src, diff_weights, diff_dst).
struct Params {
  int64_t op, src_dt, wei_dt, dst_dt, nchw;
  int64_t n, c, h, w, o, kh, kw, oh, ow;
  int64_t sh, sw, plh, plw, prh, prw, dh, dw, groups;
  int64_t plain_weights;  // 1: the primitive reads and writes HWIO itself (no reorder)
};
constexpr int kNumParams = sizeof(Params) / sizeof(int64_t);

struct Entry {
  dnnl::primitive prim;
  memory::desc src_md, wei_md, dst_md;  // what the primitive reads and writes
  memory::desc user_wei_md;             // HWIO, as XLA holds it
  bool reorder_wei = false;
  dnnl::reorder wei_reorder;  // user -> primitive (forward, backward data), else back
  size_t scratch_bytes = 0;
  std::string impl;
};

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

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
memory::desc UserWeiDesc(const Params& p) {
  const int64_t g = p.groups, ig = p.c / g, o = p.o;
  const int64_t s_kw = ig * o, s_kh = p.kw * s_kw;
  if (g == 1) return memory::desc(WeiDims(p), ToDnnl(p.wei_dt), {1, o, s_kh, s_kw});
  return memory::desc(WeiDims(p), ToDnnl(p.wei_dt), {o / g, 1, o, s_kh, s_kw});
}

std::string Key(const Params& p) {
  return std::string(reinterpret_cast<const char*>(&p), sizeof(Params));
}

std::unique_ptr<Entry> Create(const Params& p) {
  if (p.groups < 1 || p.c % p.groups || p.o % p.groups)
    throw std::invalid_argument("channels not divisible by groups");
  auto& eng = Engine();
  const memory::dims strides = {p.sh, p.sw};
  const memory::dims dil = {p.dh - 1, p.dw - 1};  // oneDNN counts dilation from 0
  const memory::dims pad_l = {p.plh, p.plw}, pad_r = {p.prh, p.prw};
  memory::desc src = ActDesc(p, p.src_dt, p.c, p.h, p.w);
  memory::desc dst = ActDesc(p, p.dst_dt, p.o, p.oh, p.ow);
  memory::desc wei_any(WeiDims(p), ToDnnl(p.wei_dt), memory::format_tag::any);
  if (p.plain_weights) wei_any = UserWeiDesc(p);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

  auto entry = std::make_unique<Entry>();
  entry->user_wei_md = UserWeiDesc(p);
  const auto algo = dnnl::algorithm::convolution_direct;
  if (p.op == kForward) {
    dnnl::convolution_forward::primitive_desc pd(eng, dnnl::prop_kind::forward_training, algo,
                                                 src, wei_any, dst, strides, dil, pad_l,
                                                 pad_r, attr);
    entry->prim = dnnl::convolution_forward(pd);
    entry->wei_md = pd.weights_desc();
    entry->scratch_bytes = pd.scratchpad_desc().get_size();
    entry->impl = pd.impl_info_str();
  } else {
    // The backward primitives take a forward descriptor as a hint. It holds every tensor in
    // the cotangent's dtype: a forward of bf16 src and weights into bf16 dst exists where a
    // bf16 weight gradient does, while one with the f32 weights of an f32 weight gradient
    // does not.
    const auto hint_dt = ToDnnl(p.dst_dt);
    dnnl::convolution_forward::primitive_desc hint(
        eng, dnnl::prop_kind::forward_training, algo,
        memory::desc(src.get_dims(), hint_dt, src.get_strides()),
        memory::desc(WeiDims(p), hint_dt, memory::format_tag::any), dst, strides, dil, pad_l,
        pad_r);
    if (p.op == kBackwardData) {
      dnnl::convolution_backward_data::primitive_desc pd(eng, algo, src, wei_any, dst, strides,
                                                         dil, pad_l, pad_r, hint, attr);
      entry->prim = dnnl::convolution_backward_data(pd);
      entry->wei_md = pd.weights_desc();
      entry->scratch_bytes = pd.scratchpad_desc().get_size();
      entry->impl = pd.impl_info_str();
    } else if (p.op == kBackwardWeights) {
      dnnl::convolution_backward_weights::primitive_desc pd(eng, algo, src, wei_any, dst,
                                                            strides, dil, pad_l, pad_r, hint,
                                                            attr);
      entry->prim = dnnl::convolution_backward_weights(pd);
      entry->wei_md = pd.diff_weights_desc();
      entry->scratch_bytes = pd.scratchpad_desc().get_size();
      entry->impl = pd.impl_info_str();
    } else {
      throw std::invalid_argument("unknown op " + std::to_string(p.op));
    }
  }
  entry->src_md = src;
  entry->dst_md = dst;
  entry->reorder_wei = entry->wei_md != entry->user_wei_md;
  if (entry->reorder_wei) {
    entry->wei_reorder = p.op == kBackwardWeights
                             ? dnnl::reorder(dnnl::reorder::primitive_desc(
                                   eng, entry->wei_md, eng, entry->user_wei_md))
                             : dnnl::reorder(dnnl::reorder::primitive_desc(
                                   eng, entry->user_wei_md, eng, entry->wei_md));
  }
  return entry;
}

// Primitives live as long as the process: a model has a few dozen distinct convs.
const Entry& Lookup(const Params& p) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::unique_ptr<Entry>> cache;
  const std::string key = Key(p);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto entry = Create(p);
  return *cache.emplace(key, std::move(entry)).first->second;
}

// A per-thread buffer that only grows: XLA may run custom calls from several threads at once,
// and each one's scratchpad and reordered kernel must be its own.
struct Buffer {
  void* data = nullptr;
  size_t size = 0;
  ~Buffer() { std::free(data); }
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

void Run(const Params& p, void* src, void* wei, void* dst) {
  const Entry& e = Lookup(p);
  auto& eng = Engine();
  thread_local dnnl::stream stream(eng);
  thread_local Buffer scratch, wei_buf;
  memory src_m(e.src_md, eng, src), dst_m(e.dst_md, eng, dst);
  memory user_wei(e.user_wei_md, eng, wei);
  memory wei_m = e.reorder_wei ? memory(e.wei_md, eng, wei_buf.Get(e.wei_md.get_size()))
                               : user_wei;
  std::unordered_map<int, memory> args;
  if (e.scratch_bytes) {
    memory::desc scratch_md({static_cast<int64_t>(e.scratch_bytes)}, memory::data_type::u8,
                            memory::format_tag::x);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(scratch_md, eng, scratch.Get(e.scratch_bytes)));
  }
  if (p.op == kForward) {
    if (e.reorder_wei) e.wei_reorder.execute(stream, user_wei, wei_m);
    args.insert({{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}});
    e.prim.execute(stream, args);
  } else if (p.op == kBackwardData) {
    if (e.reorder_wei) e.wei_reorder.execute(stream, user_wei, wei_m);
    args.insert(
        {{DNNL_ARG_DIFF_DST, dst_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DIFF_SRC, src_m}});
    e.prim.execute(stream, args);
  } else {
    args.insert(
        {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_DIFF_DST, dst_m}, {DNNL_ARG_DIFF_WEIGHTS, wei_m}});
    e.prim.execute(stream, args);
    if (e.reorder_wei) e.wei_reorder.execute(stream, wei_m, user_wei);
  }
  stream.wait();
}

int64_t DtCode(ffi::DataType t) {
  if (t == ffi::DataType::F32) return kF32;
  if (t == ffi::DataType::BF16) return kBF16;
  throw std::invalid_argument("only float32 and bfloat16 buffers are supported");
}

// Fills the shapes from the activation (x or dx), kernel (HWIO) and output (y or dy) dims.
Params MakeParams(int64_t op, ffi::AnyBuffer::Dimensions act, ffi::AnyBuffer::Dimensions wei,
                  ffi::AnyBuffer::Dimensions out, int64_t src_dt, int64_t wei_dt, int64_t dst_dt,
                  int64_t nchw, int64_t sh, int64_t sw, int64_t plh, int64_t plw, int64_t prh,
                  int64_t prw, int64_t dh, int64_t dw, int64_t groups, int64_t plain_weights) {
  if (act.size() != 4 || wei.size() != 4 || out.size() != 4)
    throw std::invalid_argument("conv operands must have rank 4");
  Params p{};
  p.op = op;
  p.src_dt = src_dt;
  p.wei_dt = wei_dt;
  p.dst_dt = dst_dt;
  p.nchw = nchw;
  p.n = act[0];
  p.c = nchw ? act[1] : act[3];
  p.h = nchw ? act[2] : act[1];
  p.w = nchw ? act[3] : act[2];
  p.kh = wei[0];
  p.kw = wei[1];
  p.o = wei[3];
  p.oh = nchw ? out[2] : out[1];
  p.ow = nchw ? out[3] : out[2];
  p.sh = sh;
  p.sw = sw;
  p.plh = plh;
  p.plw = plw;
  p.prh = prh;
  p.prw = prw;
  p.dh = dh;
  p.dw = dw;
  p.groups = groups;
  p.plain_weights = plain_weights;
  if (wei[2] * groups != p.c) throw std::invalid_argument("kernel in-channels * groups != C");
  return p;
}

template <typename F>
ffi::Error Guard(F&& f) {
  try {
    f();
    return ffi::Error::Success();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("oneDNN: ") + e.what() +
                                " (status " + std::to_string(static_cast<int>(e.status)) + ")");
  } catch (const std::exception& e) {
    return ffi::Error::InvalidArgument(std::string("layoutlab onednn conv: ") + e.what());
  }
}

#define CONV_ATTRS(X)                                                                   \
  X(int64_t, nchw) X(int64_t, sh) X(int64_t, sw) X(int64_t, plh) X(int64_t, plw)      \
      X(int64_t, prh) X(int64_t, prw) X(int64_t, dh) X(int64_t, dw) X(int64_t, groups) \
          X(int64_t, plain_weights)
#define GEOM nchw, sh, sw, plh, plw, prh, prw, dh, dw, groups, plain_weights

ffi::Error Forward(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y,
                   int64_t nchw, int64_t sh, int64_t sw, int64_t plh, int64_t plw, int64_t prh,
                   int64_t prw, int64_t dh, int64_t dw, int64_t groups,
                   int64_t plain_weights) {
  return Guard([&] {
    Params p = MakeParams(kForward, x.dimensions(), w.dimensions(), y->dimensions(),
                          DtCode(x.element_type()), DtCode(w.element_type()),
                          DtCode(y->element_type()), GEOM);
    Run(p, x.untyped_data(), w.untyped_data(), y->untyped_data());
  });
}

ffi::Error BackwardData(ffi::AnyBuffer dy, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> dx,
                        int64_t nchw, int64_t sh, int64_t sw, int64_t plh, int64_t plw,
                        int64_t prh, int64_t prw, int64_t dh, int64_t dw, int64_t groups,
                   int64_t plain_weights) {
  return Guard([&] {
    Params p = MakeParams(kBackwardData, dx->dimensions(), w.dimensions(), dy.dimensions(),
                          DtCode(dx->element_type()), DtCode(w.element_type()),
                          DtCode(dy.element_type()), GEOM);
    Run(p, dx->untyped_data(), w.untyped_data(), dy.untyped_data());
  });
}

ffi::Error BackwardWeights(ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dw_out,
                           int64_t nchw, int64_t sh, int64_t sw, int64_t plh, int64_t plw,
                           int64_t prh, int64_t prw, int64_t dh, int64_t dw, int64_t groups,
                   int64_t plain_weights) {
  return Guard([&] {
    Params p = MakeParams(kBackwardWeights, x.dimensions(), dw_out->dimensions(), dy.dimensions(),
                          DtCode(x.element_type()), DtCode(dw_out->element_type()),
                          DtCode(dy.element_type()), GEOM);
    Run(p, x.untyped_data(), dw_out->untyped_data(), dy.untyped_data());
  });
}

#define BIND_ATTR(type, name) .Attr<type>(#name)

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnConvFwd, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>() CONV_ATTRS(BIND_ATTR));
XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnConvBwdData, BackwardData,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>() CONV_ATTRS(BIND_ATTR));
XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnConvBwdWeights, BackwardWeights,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>() CONV_ATTRS(BIND_ATTR));

// ---- the Python module: the handlers as capsules, oneDNN's version, and a trace-time query
// of the implementation a shape gets (so `supports` can refuse oneDNN's reference kernels).

namespace {

PyObject* ImplInfo(PyObject*, PyObject* args) {
  PyObject* seq = nullptr;
  if (!PyArg_ParseTuple(args, "O", &seq)) return nullptr;
  PyObject* fast = PySequence_Fast(seq, "impl_info takes a sequence of ints");
  if (fast == nullptr) return nullptr;
  if (PySequence_Fast_GET_SIZE(fast) != kNumParams) {
    Py_DECREF(fast);
    PyErr_Format(PyExc_ValueError, "impl_info takes %d ints", kNumParams);
    return nullptr;
  }
  int64_t values[kNumParams];
  for (int i = 0; i < kNumParams; ++i) {
    values[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
  }
  Py_DECREF(fast);
  if (PyErr_Occurred()) return nullptr;
  Params p;
  std::memcpy(&p, values, sizeof(Params));
  try {
    const Entry& e = Lookup(p);
    return Py_BuildValue("(sNn)", e.impl.c_str(), PyBool_FromLong(e.reorder_wei),
                         static_cast<Py_ssize_t>(e.scratch_bytes));
  } catch (const dnnl::error& e) {
    PyErr_Format(PyExc_RuntimeError, "oneDNN: %s (status %d)", e.what(),
                 static_cast<int>(e.status));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyObject* Version(PyObject*, PyObject*) {
  const dnnl_version_t* v = dnnl_version();
  return Py_BuildValue("(iiis)", v->major, v->minor, v->patch, v->hash);
}

PyObject* Capsule(void* fn) { return PyCapsule_New(fn, nullptr, nullptr); }

PyObject* Handlers(PyObject*, PyObject*) {
  return Py_BuildValue("{sNsNsN}", "fwd",
                       Capsule(reinterpret_cast<void*>(LayoutlabOnednnConvFwd)), "bwd_data",
                       Capsule(reinterpret_cast<void*>(LayoutlabOnednnConvBwdData)),
                       "bwd_weights",
                       Capsule(reinterpret_cast<void*>(LayoutlabOnednnConvBwdWeights)));
}

PyMethodDef kMethods[] = {
    {"handlers", Handlers, METH_NOARGS, "The FFI handlers as PyCapsules, by name."},
    {"version", Version, METH_NOARGS, "oneDNN's (major, minor, patch, commit hash)."},
    {"impl_info", ImplInfo, METH_VARARGS,
     "(impl_info_str, weights reordered, scratchpad bytes) of the primitive for a parameter "
     "tuple (op, src_dt, wei_dt, dst_dt, nchw, n, c, h, w, o, kh, kw, oh, ow, sh, sw, plh, plw, "
     "prh, prw, dh, dw, groups, plain_weights)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_onednn",
                       "oneDNN convolutions as XLA FFI handlers (layoutlab).", -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__onednn(void) {
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  if (PyModule_AddIntConstant(m, "NUM_PARAMS", kNumParams) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
