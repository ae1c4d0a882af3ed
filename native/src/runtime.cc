// Runtime family: ISA selection, thread count, and a parallel memory copy for bandwidth probes.
//
// JS entry points (wrapped by native/src/runtime.ts):
//   isa() -> { isa: "avx512" | "portable", avx512Available: boolean, amxAvailable: boolean,
//              threads: number, parallelMinWork: number }
//   setIsa(name: "auto" | "portable" | "avx512") -> undefined
//   setNumThreads(threads: integer >= 1) -> undefined
//   setParallelMinWork(units: integer in [1, 2^30]) -> undefined  (threadpool.h MinWorkPerThread; at load
//            SPECD_PARALLEL_MIN_WORK when set)
//   parallelCopy(dst: Float32Array, src: Float32Array [same length]) -> undefined  (memcpy per thread)
//   guardedFloat32Array(n: integer >= 0) -> Float32Array [n] whose last element ends exactly where
//            a PROT_NONE page begins (tests: a kernel reading past its input faults at once)
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common.h"
#include "families.h"
#include "isa.h"
#include "threadpool.h"

namespace specd {
namespace {

Napi::Value IsaBinding(const Napi::CallbackInfo& info) {
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("isa", IsaName(CurrentIsa()));
  o.Set("avx512Available", Avx512Available());
  o.Set("amxAvailable", AmxAvailable());
  o.Set("threads", PoolSize());
  o.Set("parallelMinWork", static_cast<double>(MinWorkPerThread()));
  return o;
}

Napi::Value SetIsaBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "setIsa");
  const std::string name = args.String(0, "name");
  try {
    SetIsaByName(name, "setIsa: name");
  } catch (const std::runtime_error& e) {
    throw MakeError(info.Env(), ErrorKind::kRangeError, "ERR_SPECD_INVALID_ARG", e.what());
  }
  return info.Env().Undefined();
}

Napi::Value SetNumThreadsBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "setNumThreads");
  SetPoolSize(static_cast<int>(args.Int(0, "threads", 1, 1024)));
  return info.Env().Undefined();
}

Napi::Value SetParallelMinWorkBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "setParallelMinWork");
  SetMinWorkPerThread(args.Int(0, "units", 1, kMaxMinWorkPerThread));
  return info.Env().Undefined();
}

Napi::Value ParallelCopyBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "parallelCopy");
  auto src = args.F32(1, "src");
  auto dst = args.F32(0, "dst", src.ElementLength(), "src.length");
  const float* s = src.Data();
  float* d = dst.Data();
  const int64_t n = static_cast<int64_t>(src.ElementLength());
  const int64_t chunk = 4096;  // floats: 16 KiB units keep every thread's range line-aligned
  ParallelFor((n + chunk - 1) / chunk,
              [&](int64_t b, int64_t e) {
                const int64_t lo = b * chunk, hi = e * chunk < n ? e * chunk : n;
                std::memcpy(d + lo, s + lo, static_cast<size_t>(hi - lo) * sizeof(float));
              },
              2 * chunk);
  return info.Env().Undefined();
}

struct GuardedMapping {
  void* base;
  size_t bytes;
};

Napi::Value GuardedFloat32ArrayBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "guardedFloat32Array");
  const int64_t n = args.Int(0, "n", 0, int64_t{1} << 28);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t data = static_cast<size_t>(n) * sizeof(float);
  const size_t data_pages = (data + page - 1) / page;
  const size_t bytes = (data_pages + 1) * page;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED)
    throw MakeError(info.Env(), ErrorKind::kError, "ERR_SPECD_ALLOC", "guardedFloat32Array: mmap failed");
  char* guard = static_cast<char*>(base) + data_pages * page;
  if (mprotect(guard, page, PROT_NONE) != 0) {
    munmap(base, bytes);
    throw MakeError(info.Env(), ErrorKind::kError, "ERR_SPECD_ALLOC", "guardedFloat32Array: mprotect failed");
  }
  auto* mapping = new GuardedMapping{base, bytes};
  auto buffer = Napi::ArrayBuffer::New(
      info.Env(), guard - data, data,
      [](Napi::Env, void*, GuardedMapping* m) {
        munmap(m->base, m->bytes);
        delete m;
      },
      mapping);
  return Napi::Float32Array::New(info.Env(), static_cast<size_t>(n), buffer, 0);
}

}  // namespace

void RegisterRuntime(Napi::Env env, Napi::Object exports) {
  if (const char* isa = std::getenv("SPECD_ISA"); isa != nullptr) SetIsaByName(isa, "SPECD_ISA");
  (void)PoolSize();  // builds the pool now; throws on a malformed SPECD_NUM_THREADS
  // SPECD_PARALLEL_MIN_WORK: checked at every load (a malformed value fails each), applied at the first only, so a
  // worker thread loading the addon later keeps what setParallelMinWork set since
  const int64_t min_work = DefaultMinWorkPerThread();
  static std::atomic<bool> applied{false};
  if (!applied.exchange(true)) SetMinWorkPerThread(min_work);
  exports.Set("isa", Napi::Function::New(env, Guarded<IsaBinding>, "isa"));
  exports.Set("setIsa", Napi::Function::New(env, Guarded<SetIsaBinding>, "setIsa"));
  exports.Set("setNumThreads", Napi::Function::New(env, Guarded<SetNumThreadsBinding>, "setNumThreads"));
  exports.Set("setParallelMinWork", Napi::Function::New(env, Guarded<SetParallelMinWorkBinding>, "setParallelMinWork"));
  exports.Set("parallelCopy", Napi::Function::New(env, Guarded<ParallelCopyBinding>, "parallelCopy"));
  exports.Set("guardedFloat32Array",
              Napi::Function::New(env, Guarded<GuardedFloat32ArrayBinding>, "guardedFloat32Array"));
}

}  // namespace specd
