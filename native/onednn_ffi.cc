// The CPython extension `layoutlab._onednn`: the conv primitives (onednn_conv.h) as XLA FFI
// handlers, exposed as PyCapsules, plus oneDNN's version and a trace-time query of the
// implementation a shape gets. Errors come back as ffi::Error, never an abort.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "oneapi/dnnl/dnnl.hpp"
#include "onednn_common.h"
#include "onednn_conv.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using layoutlab::kBackwardData;
using layoutlab::kBackwardWeights;
using layoutlab::kBF16;
using layoutlab::kF32;
using layoutlab::kForward;
using layoutlab::kNumParams;
using layoutlab::Params;

// The batch-normalization handlers and their query (onednn_norm.cc).
extern "C" XLA_FFI_Error* LayoutlabOnednnNormFwd(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* LayoutlabOnednnNormBwd(XLA_FFI_CallFrame* call_frame);
// The max-pooling handlers and their query (onednn_pool.cc).
extern "C" XLA_FFI_Error* LayoutlabOnednnPoolFwd(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* LayoutlabOnednnPoolBwd(XLA_FFI_CallFrame* call_frame);
namespace layoutlab {
std::string PoolImplInfo(const int64_t* values, size_t* ws_bytes);
std::string NormImplInfo(int64_t backward, int64_t bf16, int64_t relu, int64_t n, int64_t c,
                         int64_t h, int64_t w, float eps, size_t* ws_bytes);
}  // namespace layoutlab

namespace {

int64_t DtCode(ffi::DataType t) {
  if (t == ffi::DataType::F32) return kF32;
  if (t == ffi::DataType::BF16) return kBF16;
  throw std::invalid_argument("only float32 and bfloat16 buffers are supported");
}

// Fills the shapes from the activation (x or dx), kernel (HWIO) and output (y or dy) dims.
Params MakeParams(int64_t op, ffi::AnyBuffer::Dimensions act, ffi::AnyBuffer::Dimensions wei,
                  ffi::AnyBuffer::Dimensions out, int64_t src_dt, int64_t wei_dt, int64_t dst_dt,
                  int64_t nchw, int64_t sh, int64_t sw, int64_t plh, int64_t plw, int64_t prh,
                  int64_t prw, int64_t dh, int64_t dw, int64_t groups, int64_t plain_weights,
                  int64_t f32_compute) {
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
  p.f32_compute = f32_compute;
  if (wei[2] * groups != p.c) throw std::invalid_argument("kernel in-channels * groups != C");
  return p;
}

#define CONV_ATTRS(X)                                                                   \
  X(int64_t, nchw) X(int64_t, sh) X(int64_t, sw) X(int64_t, plh) X(int64_t, plw)      \
      X(int64_t, prh) X(int64_t, prw) X(int64_t, dh) X(int64_t, dw) X(int64_t, groups) \
          X(int64_t, plain_weights) X(int64_t, f32_compute)
#define GEOM nchw, sh, sw, plh, plw, prh, prw, dh, dw, groups, plain_weights, f32_compute

ffi::Error Forward(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y,
                   int64_t nchw, int64_t sh, int64_t sw, int64_t plh, int64_t plw, int64_t prh,
                   int64_t prw, int64_t dh, int64_t dw, int64_t groups,
                   int64_t plain_weights, int64_t f32_compute) {
  return layoutlab::FfiGuard("conv", [&] {
    Params p = MakeParams(kForward, x.dimensions(), w.dimensions(), y->dimensions(),
                          DtCode(x.element_type()), DtCode(w.element_type()),
                          DtCode(y->element_type()), GEOM);
    layoutlab::Run(p, x.untyped_data(), w.untyped_data(), y->untyped_data());
  });
}

ffi::Error BackwardData(ffi::AnyBuffer dy, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> dx,
                        int64_t nchw, int64_t sh, int64_t sw, int64_t plh, int64_t plw,
                        int64_t prh, int64_t prw, int64_t dh, int64_t dw, int64_t groups,
                   int64_t plain_weights, int64_t f32_compute) {
  return layoutlab::FfiGuard("conv", [&] {
    Params p = MakeParams(kBackwardData, dx->dimensions(), w.dimensions(), dy.dimensions(),
                          DtCode(dx->element_type()), DtCode(w.element_type()),
                          DtCode(dy.element_type()), GEOM);
    layoutlab::Run(p, dx->untyped_data(), w.untyped_data(), dy.untyped_data());
  });
}

ffi::Error BackwardWeights(ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dw_out,
                           int64_t nchw, int64_t sh, int64_t sw, int64_t plh, int64_t plw,
                           int64_t prh, int64_t prw, int64_t dh, int64_t dw, int64_t groups,
                   int64_t plain_weights, int64_t f32_compute) {
  return layoutlab::FfiGuard("conv", [&] {
    Params p = MakeParams(kBackwardWeights, x.dimensions(), dw_out->dimensions(), dy.dimensions(),
                          DtCode(x.element_type()), DtCode(dw_out->element_type()),
                          DtCode(dy.element_type()), GEOM);
    layoutlab::Run(p, x.untyped_data(), dw_out->untyped_data(), dy.untyped_data());
  });
}

// A packed forward's parameters come whole, as Python built them for the pack (the
// primitive is the one the plain forward would run); the buffers must have their sizes.
Params ParamsFrom(ffi::Span<const int64_t> values) {
  if (values.size() != static_cast<size_t>(kNumParams))
    throw std::invalid_argument("params must hold " + std::to_string(kNumParams) + " ints");
  Params p;
  std::memcpy(&p, values.begin(), sizeof(Params));
  if (p.op != kForward) throw std::invalid_argument("a packed kernel is a forward's");
  return p;
}

// `at_least`: a packed kernel's buffer is rounded up to whole bytes per kernel element.
void CheckBytes(const ffi::AnyBuffer& b, size_t want, const char* what, bool at_least = false) {
  if (at_least ? b.size_bytes() < want : b.size_bytes() != want)
    throw std::invalid_argument(std::string(what) + " has " + std::to_string(b.size_bytes()) +
                                " bytes, the conv's takes " + std::to_string(want));
}

size_t ActBytes(const Params& p, int64_t dt, int64_t c, int64_t h, int64_t w) {
  return static_cast<size_t>(p.n * c * h * w) * (dt == kBF16 ? 2 : 4);
}

ffi::Error Pack(ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out,
                ffi::Span<const int64_t> params) {
  return layoutlab::FfiGuard("conv pack", [&] {
    const Params p = ParamsFrom(params);
    CheckBytes(w, static_cast<size_t>(p.kh * p.kw * (p.c / p.groups) * p.o) *
                      (p.wei_dt == kBF16 ? 2 : 4), "the kernel");
    CheckBytes(*out, layoutlab::Describe(p).wei_bytes, "the packed kernel", true);
    layoutlab::Pack(p, w.untyped_data(), out->untyped_data());
  });
}

ffi::Error ForwardPacked(ffi::AnyBuffer x, ffi::AnyBuffer packed, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Span<const int64_t> params) {
  return layoutlab::FfiGuard("conv", [&] {
    const Params p = ParamsFrom(params);
    CheckBytes(x, ActBytes(p, p.src_dt, p.c, p.h, p.w), "the input");
    CheckBytes(*y, ActBytes(p, p.dst_dt, p.o, p.oh, p.ow), "the output");
    CheckBytes(packed, layoutlab::Describe(p).wei_bytes, "the packed kernel", true);
    layoutlab::Run(p, x.untyped_data(), packed.untyped_data(), y->untyped_data(), true);
  });
}

#define BIND_ATTR(type, name) .Attr<type>(#name)

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnConvPack, Pack,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("params"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(LayoutlabOnednnConvFwdPacked, ForwardPacked,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("params"));

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

// Runs a query's body, which returns a new reference: its exceptions become RuntimeError.
template <typename F>
PyObject* PyGuard(F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    PyErr_SetString(PyExc_RuntimeError, layoutlab::DnnlErrorMessage(e).c_str());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

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
  return PyGuard([&] {
    const layoutlab::PrimitiveInfo info = layoutlab::Describe(p);
    return Py_BuildValue("(sNnn)", info.impl.c_str(), PyBool_FromLong(info.reorder_wei),
                         static_cast<Py_ssize_t>(info.scratch_bytes),
                         static_cast<Py_ssize_t>(info.wei_bytes));
  });
}

PyObject* NormInfo(PyObject*, PyObject* args) {
  long long backward, bf16, relu, n, c, h, w;
  float eps;
  if (!PyArg_ParseTuple(args, "LLLLLLLf", &backward, &bf16, &relu, &n, &c, &h, &w, &eps))
    return nullptr;
  return PyGuard([&] {
    size_t ws = 0;
    const std::string impl = layoutlab::NormImplInfo(backward, bf16, relu, n, c, h, w, eps, &ws);
    return Py_BuildValue("(sn)", impl.c_str(), static_cast<Py_ssize_t>(ws));
  });
}

PyObject* PoolInfo(PyObject*, PyObject* args) {
  long long v[16];
  if (!PyArg_ParseTuple(args, "LLLLLLLLLLLLLLLL", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                        &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12], &v[13], &v[14],
                        &v[15]))
    return nullptr;
  int64_t values[16];
  for (int i = 0; i < 16; ++i) values[i] = v[i];
  return PyGuard([&] {
    size_t ws = 0;
    const std::string impl = layoutlab::PoolImplInfo(values, &ws);
    return Py_BuildValue("(sn)", impl.c_str(), static_cast<Py_ssize_t>(ws));
  });
}

PyObject* Version(PyObject*, PyObject*) {
  const dnnl_version_t* v = dnnl_version();
  return Py_BuildValue("(iiis)", v->major, v->minor, v->patch, v->hash);
}

PyObject* Capsule(void* fn) { return PyCapsule_New(fn, nullptr, nullptr); }

PyObject* Handlers(PyObject*, PyObject*) {
  return Py_BuildValue("{sNsNsNsNsNsNsNsNsN}", "conv_pack",
                       Capsule(reinterpret_cast<void*>(LayoutlabOnednnConvPack)),
                       "fwd_packed", Capsule(reinterpret_cast<void*>(LayoutlabOnednnConvFwdPacked)),
                       "fwd",
                       Capsule(reinterpret_cast<void*>(LayoutlabOnednnConvFwd)), "bwd_data",
                       Capsule(reinterpret_cast<void*>(LayoutlabOnednnConvBwdData)),
                       "bwd_weights",
                       Capsule(reinterpret_cast<void*>(LayoutlabOnednnConvBwdWeights)),
                       "norm_fwd", Capsule(reinterpret_cast<void*>(LayoutlabOnednnNormFwd)),
                       "norm_bwd", Capsule(reinterpret_cast<void*>(LayoutlabOnednnNormBwd)),
                       "pool_fwd", Capsule(reinterpret_cast<void*>(LayoutlabOnednnPoolFwd)),
                       "pool_bwd", Capsule(reinterpret_cast<void*>(LayoutlabOnednnPoolBwd)));
}

PyMethodDef kMethods[] = {
    {"handlers", Handlers, METH_NOARGS, "The FFI handlers as PyCapsules, by name."},
    {"norm_info", NormInfo, METH_VARARGS,
     "(impl_info_str, workspace bytes) of the batch-norm primitive for (backward, bf16, relu, "
     "n, c, h, w, eps)."},
    {"pool_info", PoolInfo, METH_VARARGS,
     "(impl_info_str, workspace bytes) of the max-pooling primitive for (backward, bf16, n, h, "
     "w, c, oh, ow, kh, kw, sh, sw, plh, plw, prh, prw)."},
    {"version", Version, METH_NOARGS, "oneDNN's (major, minor, patch, commit hash)."},
    {"impl_info", ImplInfo, METH_VARARGS,
     "(impl_info_str, weights reordered, scratchpad bytes, packed kernel bytes) of the "
     "primitive for a parameter "
     "tuple (op, src_dt, wei_dt, dst_dt, nchw, n, c, h, w, o, kh, kw, oh, ow, sh, sw, plh, plw, "
     "prh, prw, dh, dw, groups, plain_weights, f32_compute)."},
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
