// What the oneDNN XLA FFI sources (onednn_conv.cc, onednn_norm.cc, onednn_pool.cc) share: the
// engine and each thread's stream, the per-shape primitive cache, the per-thread buffers that
// only grow, running a primitive with its scratchpad, and turning exceptions into FFI errors.
#ifndef LAYOUTLAB_NATIVE_ONEDNN_COMMON_H_
#define LAYOUTLAB_NATIVE_ONEDNN_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace layoutlab {

using DnnlArgs = std::unordered_map<int, dnnl::memory>;

inline dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// XLA may run custom calls from several threads at once: each thread executes on its own stream.
inline dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

// Primitives, created once per shape by `create` and kept for the process (a model has a few
// dozen distinct shapes). The key is every byte of Params, so Params must have no padding.
template <typename Params, typename Entry>
class PrimitiveCache {
  static_assert(std::has_unique_object_representations_v<Params>,
                "the cache key is the bytes of Params: it must have no padding");

 public:
  using Create = std::unique_ptr<Entry> (*)(const Params&);
  explicit PrimitiveCache(Create create) : create_(create) {}

  // Creates under the lock, so threads racing for a new shape create it once.
  const Entry& Get(const Params& p) {
    const std::string key(reinterpret_cast<const char*>(&p), sizeof(Params));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return *it->second;
    auto entry = create_(p);
    return *entries_.emplace(key, std::move(entry)).first->second;
  }

 private:
  Create create_;
  std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Entry>> entries_;
};

// A buffer that only grows, held thread_local by its user (a scratchpad, a reordered kernel,
// converted activations): a steady-state call allocates nothing.
struct Buffer {
  void* data = nullptr;
  size_t size = 0;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
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

// Primitives are created with scratchpad_mode::user: the scratchpad comes from `scratch`.
inline void AddScratchpad(DnnlArgs& args, Buffer& scratch, size_t bytes) {
  if (!bytes) return;
  dnnl::memory::desc md({static_cast<int64_t>(bytes)}, dnnl::memory::data_type::u8,
                        dnnl::memory::format_tag::x);
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(md, Engine(), scratch.Get(bytes)));
}

// Runs `prim` on this thread's stream and waits for it.
inline void Execute(const dnnl::primitive& prim, DnnlArgs& args, Buffer& scratch,
                    size_t scratch_bytes) {
  AddScratchpad(args, scratch, scratch_bytes);
  dnnl::stream& stream = Stream();
  prim.execute(stream, args);
  stream.wait();
}

inline std::string ImplInfoStr(const dnnl::primitive& prim) {
  const char* impl = nullptr;
  dnnl_primitive_desc_query(prim.get_primitive_desc(), dnnl_query_impl_info_str, 0, &impl);
  return impl ? impl : "";
}

// Whether an activation buffer is bfloat16 (else float32); throws for any other dtype.
inline bool IsBf16(xla::ffi::DataType t) {
  if (t == xla::ffi::DataType::BF16) return true;
  if (t == xla::ffi::DataType::F32) return false;
  throw std::invalid_argument("only float32 and bfloat16 activations are supported");
}

// XLA sizes the workspace operand in bytes (a u8 buffer); it must hold at least `bytes`.
inline void CheckWorkspace(const xla::ffi::AnyBuffer::Dimensions& dims, size_t bytes) {
  size_t n = 1;
  for (auto d : dims) n *= static_cast<size_t>(d);
  if (n < bytes) throw std::invalid_argument("workspace buffer too small");
}

inline std::string DnnlErrorMessage(const dnnl::error& e) {
  return std::string("oneDNN: ") + e.what() + " (status " +
         std::to_string(static_cast<int>(e.status)) + ")";
}

// Runs a handler's body: oneDNN's failures come back as Internal errors and the rest (bad
// operands, allocation) as InvalidArgument naming `op`, never an exception through XLA.
template <typename F>
xla::ffi::Error FfiGuard(const char* op, F&& f) {
  try {
    f();
    return xla::ffi::Error::Success();
  } catch (const dnnl::error& e) {
    return xla::ffi::Error::Internal(DnnlErrorMessage(e));
  } catch (const std::exception& e) {
    return xla::ffi::Error::InvalidArgument(std::string("layoutlab onednn ") + op + ": " +
                                            e.what());
  }
}

}  // namespace layoutlab

#endif  // LAYOUTLAB_NATIVE_ONEDNN_COMMON_H_
