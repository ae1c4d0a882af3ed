// Shared helpers for kernel family files: argument readers that never abort, error types.
//
// Error policy (STYLE.md 9): native code never exits or aborts. Bad arguments raise a JS
// TypeError/RangeError whose message starts with the call name and names the argument, e.g.
//   "gemmBf16: x: expected Float32Array of length 4096 (m*k), got length 4095"
// and whose `code` is "ERR_SPECD_INVALID_ARG". Failures inside a kernel (worker thread, no Env)
// are thrown as specd::KernelError and turned into a JS Error with code "ERR_SPECD_KERNEL" by
// Guarded<> (synchronous calls) or by the AsyncWorker's OnError (asynchronous calls).
#pragma once
#include <napi.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bf16.h"

namespace specd {

/** A failure inside a kernel; the message already names the call. */
class KernelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/** Largest scratch buffer a thread keeps between calls (KeptScratch), in bytes. */
constexpr int64_t kKeptScratchBytes = INT64_C(16) << 20;

/**
 * Scratch of n elements for one call: `kept` (declare it thread_local; grown, never shrunk) up to kKeptScratchBytes,
 * else `own` (the caller's local vector, freed with the call). Contents unspecified: the caller writes before it
 * reads. Why: a fresh vector of 128 KiB or more is an mmap whose pages fault on every call; in a 16-token verify
 * that cost more than the kernels themselves (docs/BENCHMARKS.md, "A 16-token verify outside the GEMMs").
 */
template <typename T>
T* KeptScratch(std::vector<T>& kept, std::vector<T>& own, int64_t n) {
  std::vector<T>& v = n * static_cast<int64_t>(sizeof(T)) > kKeptScratchBytes ? own : kept;
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

/** Builds a JS error object carrying `code`. `kind` selects Error/TypeError/RangeError. */
enum class ErrorKind { kError, kTypeError, kRangeError };
Napi::Error MakeError(Napi::Env env, ErrorKind kind, const std::string& code, const std::string& message);

/**
 * Wraps a binding so that any C++ exception becomes a JS exception instead of std::terminate.
 * Register every synchronous entry point as Napi::Function::New(env, Guarded<Fn>, "name").
 */
template <Napi::Value (*F)(const Napi::CallbackInfo&)>
Napi::Value Guarded(const Napi::CallbackInfo& info) {
  try {
    return F(info);
  } catch (const Napi::Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw MakeError(info.Env(), ErrorKind::kError, "ERR_SPECD_NO_MEMORY", "specd native: out of memory");
  } catch (const std::exception& e) {
    throw MakeError(info.Env(), ErrorKind::kError, "ERR_SPECD_KERNEL", e.what());
  }
}

/**
 * Reads positional arguments of one call and validates them; every failure throws a JS error
 * naming `call` and the argument. Typed arrays are returned as views: Data() points into the
 * caller's ArrayBuffer (no copy). kAnyLength skips the length check.
 */
class ArgReader {
 public:
  static constexpr size_t kAnyLength = static_cast<size_t>(-1);

  ArgReader(const Napi::CallbackInfo& info, const char* call) : info_(info), call_(call) {}

  Napi::Env Env() const { return info_.Env(); }
  const char* call() const { return call_; }

  /** Float32Array argument; `what` describes the expected length (e.g. "m*k"). */
  Napi::Float32Array F32(size_t i, const char* name, size_t length = kAnyLength, const char* what = "");
  /** Uint16Array argument (bf16 raw bits). */
  Napi::Uint16Array U16(size_t i, const char* name, size_t length = kAnyLength, const char* what = "");
  /** Int32Array argument. */
  Napi::Int32Array I32(size_t i, const char* name, size_t length = kAnyLength, const char* what = "");
  /** Integer in [min, max] (JS number without fractional part). */
  int64_t Int(size_t i, const char* name, int64_t min, int64_t max = INT64_C(1) << 40);
  /** Finite number (any sign unless checked by the caller). */
  double Number(size_t i, const char* name);
  /** String argument. */
  std::string String(size_t i, const char* name);
  /** Boolean argument. */
  bool Bool(size_t i, const char* name);
  /** True when argument i is missing, undefined or null. */
  bool IsAbsent(size_t i) const { return i >= info_.Length() || info_[i].IsUndefined() || info_[i].IsNull(); }

  /** Throws "call: name: expected <expected>, got <got>" as a RangeError. */
  [[noreturn]] void Fail(const char* name, const std::string& expected, const std::string& got) const;

 private:
  Napi::TypedArray Typed(size_t i, const char* name, napi_typedarray_type type, const char* type_name, size_t length,
                         const char* what);
  const Napi::CallbackInfo& info_;
  const char* call_;
};

/** Product of sizes with overflow detection (throws KernelError naming `call`). */
size_t CheckedProduct(const char* call, std::initializer_list<int64_t> dims);

/**
 * The async pattern of every kernel family: queues fn on a libuv worker thread and returns a
 * Promise that resolves when it returns (rejects with code ERR_SPECD_KERNEL naming `call` if it
 * throws). `keep` (the typed arrays fn reads and writes) stay referenced until then, so nothing is
 * copied.
 */
Napi::Promise QueueKernel(Napi::Env env, const char* call, std::function<void()> fn, std::vector<Napi::Object> keep);

}  // namespace specd
