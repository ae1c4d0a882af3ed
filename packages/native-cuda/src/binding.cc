// @specd/native-cuda: the Node binding (node-addon-api) of kernels.cu. Device memory is owned here: `alloc` returns
// an opaque handle (a napi External over a cudaMalloc'd buffer, freed by its finalizer or `free`); JavaScript never
// sees a device pointer. Every call checks its buffers' sizes and throws a RangeError naming the argument, or an
// Error naming the failed CUDA / cuBLAS call; nothing aborts the process. One device (0), the default stream.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <napi.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "kernels.h"
#include "sampler.h"

namespace {
std::mutex lentMutex;
std::map<uintptr_t, size_t> lentRows;  // start → bytes of the registered buffers
}  // namespace

void specdRegisterDeviceRows(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(lentMutex);
  lentRows[reinterpret_cast<uintptr_t>(p)] = bytes;
}

void specdForgetDeviceRows(const void* p) {
  std::lock_guard<std::mutex> lock(lentMutex);
  lentRows.erase(reinterpret_cast<uintptr_t>(p));
}

bool specdDeviceRowsValid(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(lentMutex);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = lentRows.upper_bound(a);
  if (it == lentRows.begin()) return false;
  --it;
  return a >= it->first && bytes <= it->second && a - it->first <= it->second - bytes;
}

namespace {

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};

cublasLtHandle_t g_lt = nullptr;
void* g_workspace = nullptr;
constexpr size_t kWorkspaceBytes = 32u << 20;

void check(Napi::Env env, cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Napi::Error::New(env, std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void ensureLt(Napi::Env env) {
  if (g_lt != nullptr) return;
  if (cublasLtCreate(&g_lt) != CUBLAS_STATUS_SUCCESS) throw Napi::Error::New(env, "cublasLtCreate failed");
  check(env, cudaMalloc(&g_workspace, kWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
}

DeviceBuffer* buf(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (!info[i].IsExternal())
    throw Napi::TypeError::New(info.Env(), std::string(name) + ": expected a device buffer (from alloc)");
  DeviceBuffer* b = info[i].As<Napi::External<DeviceBuffer>>().Data();
  if (b->ptr == nullptr) throw Napi::Error::New(info.Env(), std::string(name) + ": the device buffer was freed");
  return b;
}

int64_t num(const Napi::CallbackInfo& info, size_t i, const char* name, int64_t lo = 0) {
  if (!info[i].IsNumber()) throw Napi::TypeError::New(info.Env(), std::string(name) + ": expected a number");
  const double v = info[i].As<Napi::Number>().DoubleValue();
  if (!(v >= static_cast<double>(lo) && v <= 9007199254740991.0 && v == static_cast<double>(static_cast<int64_t>(v))))
    throw Napi::RangeError::New(info.Env(), std::string(name) + ": expected an integer >= " + std::to_string(lo));
  return static_cast<int64_t>(v);
}

void need(const Napi::CallbackInfo& info, const DeviceBuffer* b, size_t bytes, const char* name) {
  if (b->bytes < bytes)
    throw Napi::RangeError::New(
        info.Env(), std::string(name) + ": " + std::to_string(b->bytes) + " bytes, needs " + std::to_string(bytes));
}

void launched(Napi::Env env, int status, const char* what) {
  if (status != 0) throw Napi::Error::New(env, std::string(what) + " failed with status " + std::to_string(status));
}

/** deviceInfo() → {name, computeCapability, totalBytes, freeBytes}; throws when no CUDA device is usable. */
Napi::Value DeviceInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int count = 0;
  check(env, cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count == 0) throw Napi::Error::New(env, "no CUDA device");
  cudaDeviceProp p{};
  check(env, cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  size_t freeB = 0, totalB = 0;
  check(env, cudaMemGetInfo(&freeB, &totalB), "cudaMemGetInfo");
  Napi::Object o = Napi::Object::New(env);
  o.Set("name", p.name);
  o.Set("computeCapability", std::to_string(p.major) + "." + std::to_string(p.minor));
  o.Set("totalBytes", static_cast<double>(totalB));
  o.Set("freeBytes", static_cast<double>(freeB));
  return o;
}

/** alloc(bytes) → a device buffer handle (cudaMalloc; never managed memory). */
Napi::Value Alloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int64_t bytes = num(info, 0, "bytes", 1);
  auto* b = new DeviceBuffer();
  const cudaError_t e = cudaMalloc(&b->ptr, static_cast<size_t>(bytes));
  if (e != cudaSuccess) {
    delete b;
    check(env, e, "cudaMalloc");
  }
  b->bytes = static_cast<size_t>(bytes);
  return Napi::External<DeviceBuffer>::New(env, b, [](Napi::Env, DeviceBuffer* d) {
    if (d->ptr != nullptr) cudaFree(d->ptr);
    delete d;
  });
}

/** free(buffer): releases the device memory now (a later use throws). */
Napi::Value Free(const Napi::CallbackInfo& info) {
  DeviceBuffer* b = buf(info, 0, "buffer");
  check(info.Env(), cudaFree(b->ptr), "cudaFree");
  b->ptr = nullptr;
  return info.Env().Undefined();
}

/** upload(buffer, typedArray, offsetBytes = 0) / download(buffer, typedArray, offsetBytes = 0): synchronous copies. */
Napi::Value Copy(const Napi::CallbackInfo& info, bool up) {
  DeviceBuffer* b = buf(info, 0, "buffer");
  if (!info[1].IsTypedArray()) throw Napi::TypeError::New(info.Env(), "host: expected a typed array");
  Napi::TypedArray t = info[1].As<Napi::TypedArray>();
  const int64_t offset = info.Length() > 2 ? num(info, 2, "offsetBytes") : 0;
  const size_t bytes = t.ByteLength();
  need(info, b, static_cast<size_t>(offset) + bytes, "buffer");
  uint8_t* host = static_cast<uint8_t*>(t.ArrayBuffer().Data()) + t.ByteOffset();
  uint8_t* dev = static_cast<uint8_t*>(b->ptr) + offset;
  check(
      info.Env(),
      up ? cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) : cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost),
      up ? "cudaMemcpy (upload)" : "cudaMemcpy (download)");
  return info.Env().Undefined();
}
Napi::Value Upload(const Napi::CallbackInfo& info) { return Copy(info, true); }
Napi::Value Download(const Napi::CallbackInfo& info) { return Copy(info, false); }

/** toBf16(out, x, n): out[i] = bf16(x[i]) (round to nearest even). */
Napi::Value ToBf16(const Napi::CallbackInfo& info) {
  DeviceBuffer* out = buf(info, 0, "out");
  DeviceBuffer* x = buf(info, 1, "x");
  const int64_t n = num(info, 2, "n", 1);
  need(info, out, n * 2, "out");
  need(info, x, n * 4, "x");
  launched(info.Env(), specdToBf16(out->ptr, static_cast<float*>(x->ptr), n, nullptr), "toBf16");
  return info.Env().Undefined();
}

/**
 * gemmBf16(out, xb, w, m, mPad, n, k): out [m, n] f32 = xb [m, k] bf16 · w [n, k]ᵀ bf16, fp32 accumulation.
 * `xb` and `out` hold mPad rows (≥ m; the plan is made for mPad: rows do not depend on m).
 */
Napi::Value GemmBf16(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  ensureLt(env);
  DeviceBuffer* out = buf(info, 0, "out");
  DeviceBuffer* xb = buf(info, 1, "xb");
  DeviceBuffer* w = buf(info, 2, "w");
  const int64_t m = num(info, 3, "m", 1), mPad = num(info, 4, "mPad", 1), n = num(info, 5, "n", 1),
                k = num(info, 6, "k", 1);
  if (mPad < m) throw Napi::RangeError::New(env, "mPad: must be >= m");
  need(info, out, mPad * n * 4, "out");
  need(info, xb, mPad * k * 2, "xb");
  need(info, w, n * k * 2, "w");
  launched(
      env,
      specdGemmBf16(g_lt, static_cast<float*>(out->ptr), xb->ptr, w->ptr, static_cast<int>(m), static_cast<int>(mPad),
                    static_cast<int>(n), static_cast<int>(k), g_workspace, kWorkspaceBytes, nullptr),
      "gemmBf16 (cublasLtMatmul)");
  return env.Undefined();
}

/** rmsNorm(out, x, w, rows, cols, eps): out, x [rows, cols] f32, w [cols] bf16. */
Napi::Value RmsNorm(const Napi::CallbackInfo& info) {
  DeviceBuffer* out = buf(info, 0, "out");
  DeviceBuffer* x = buf(info, 1, "x");
  DeviceBuffer* w = buf(info, 2, "w");
  const int64_t rows = num(info, 3, "rows", 1), cols = num(info, 4, "cols", 1);
  const float eps = static_cast<float>(info[5].As<Napi::Number>().DoubleValue());
  need(info, out, rows * cols * 4, "out");
  need(info, x, rows * cols * 4, "x");
  need(info, w, cols * 2, "w");
  launched(info.Env(),
           specdRmsNorm(static_cast<float*>(out->ptr), static_cast<float*>(x->ptr), w->ptr, static_cast<int>(rows),
                        static_cast<int>(cols), eps, nullptr),
           "rmsNorm");
  return info.Env().Undefined();
}

/** argmax(out, x, rows, cols): out [rows] i32, the lowest index of each row's maximum. */
Napi::Value Argmax(const Napi::CallbackInfo& info) {
  DeviceBuffer* out = buf(info, 0, "out");
  DeviceBuffer* x = buf(info, 1, "x");
  const int64_t rows = num(info, 2, "rows", 1), cols = num(info, 3, "cols", 1);
  need(info, out, rows * 4, "out");
  need(info, x, rows * cols * 4, "x");
  launched(info.Env(),
           specdArgmax(static_cast<int32_t*>(out->ptr), static_cast<float*>(x->ptr), static_cast<int>(rows),
                       static_cast<int>(cols), nullptr),
           "argmax");
  return info.Env().Undefined();
}

/** swiglu(out, gu, rows, inter): out [rows, inter] = silu(gate) · up over gu [rows, 2 · inter] f32. */
Napi::Value Swiglu(const Napi::CallbackInfo& info) {
  DeviceBuffer* out = buf(info, 0, "out");
  DeviceBuffer* gu = buf(info, 1, "gu");
  const int64_t rows = num(info, 2, "rows", 1), inter = num(info, 3, "inter", 1);
  need(info, out, rows * inter * 4, "out");
  need(info, gu, rows * inter * 8, "gu");
  launched(info.Env(),
           specdSwiglu(static_cast<float*>(out->ptr), static_cast<float*>(gu->ptr), static_cast<int>(rows),
                       static_cast<int>(inter), nullptr),
           "swiglu");
  return info.Env().Undefined();
}

/** embed(out, table, ids, rows, hidden, vocab): out [rows, hidden] f32 from table [vocab, hidden] bf16. */
Napi::Value Embed(const Napi::CallbackInfo& info) {
  DeviceBuffer* out = buf(info, 0, "out");
  DeviceBuffer* table = buf(info, 1, "table");
  DeviceBuffer* ids = buf(info, 2, "ids");
  const int64_t rows = num(info, 3, "rows", 1), hidden = num(info, 4, "hidden", 1), vocab = num(info, 5, "vocab", 1);
  need(info, out, rows * hidden * 4, "out");
  need(info, table, vocab * hidden * 2, "table");
  need(info, ids, rows * 4, "ids");
  launched(info.Env(),
           specdEmbed(static_cast<float*>(out->ptr), table->ptr, static_cast<int32_t*>(ids->ptr),
                      static_cast<int>(rows), static_cast<int>(hidden), nullptr),
           "embed");
  return info.Env().Undefined();
}

/** rope(x, positions, tokens, heads, headDim, rotaryDim, theta, neox): in place over x [tokens, heads, headDim] f32. */
Napi::Value Rope(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DeviceBuffer* x = buf(info, 0, "x");
  DeviceBuffer* pos = buf(info, 1, "positions");
  const int64_t tokens = num(info, 2, "tokens", 1), heads = num(info, 3, "heads", 1),
                headDim = num(info, 4, "headDim", 1), rotaryDim = num(info, 5, "rotaryDim", 0);
  if (rotaryDim % 2 != 0 || rotaryDim > headDim)
    throw Napi::RangeError::New(env, "rotaryDim: expected an even number <= headDim");
  need(info, x, tokens * heads * headDim * 4, "x");
  need(info, pos, tokens * 4, "positions");
  const float theta = static_cast<float>(info[6].As<Napi::Number>().DoubleValue());
  launched(env,
           specdRope(static_cast<float*>(x->ptr), static_cast<int32_t*>(pos->ptr), static_cast<int>(tokens),
                     static_cast<int>(heads), static_cast<int>(headDim), static_cast<int>(rotaryDim), theta,
                     info[7].ToBoolean().Value(), nullptr),
           "rope");
  return env.Undefined();
}

/**
 * writeKvPages(kPool, vPool, k, v, slots, tokens, rowFloats): pool row `slots[t]` = row t of k / v ([tokens,
 * rowFloats] f32); slot −1 skips. Slots must be < the pools' rows (the pools' sizes are checked against the largest
 * slot the caller names: `maxSlot`, argument 7).
 */
Napi::Value WriteKvPages(const Napi::CallbackInfo& info) {
  DeviceBuffer* kPool = buf(info, 0, "kPool");
  DeviceBuffer* vPool = buf(info, 1, "vPool");
  DeviceBuffer* k = buf(info, 2, "k");
  DeviceBuffer* v = buf(info, 3, "v");
  DeviceBuffer* slots = buf(info, 4, "slots");
  const int64_t tokens = num(info, 5, "tokens", 1), rowFloats = num(info, 6, "rowFloats", 1),
                maxSlot = num(info, 7, "maxSlot");
  need(info, kPool, (maxSlot + 1) * rowFloats * 4, "kPool");
  need(info, vPool, (maxSlot + 1) * rowFloats * 4, "vPool");
  need(info, k, tokens * rowFloats * 4, "k");
  need(info, v, tokens * rowFloats * 4, "v");
  need(info, slots, tokens * 4, "slots");
  launched(
      info.Env(),
      specdWriteKvPages(static_cast<float*>(kPool->ptr), static_cast<float*>(vPool->ptr), static_cast<float*>(k->ptr),
                        static_cast<float*>(v->ptr), static_cast<int32_t*>(slots->ptr), static_cast<int>(tokens),
                        static_cast<int>(rowFloats), nullptr),
      "writeKvPages");
  return info.Env().Undefined();
}

/** A device workspace kept across calls, grown as needed (the attention partitions). */
void* g_attnWork = nullptr;
size_t g_attnWorkBytes = 0;

/** The arguments pagedAttention and prefillAttention share (their contracts there). */
struct AttentionArgs {
  DeviceBuffer *out, *q, *kPool, *vPool, *cu, *kvLens, *tables, *pos;
  int64_t numSeqs, totalQ, maxBlocks, pageSize, qHeads, kvHeads, headDim, numPages;
  float scale;
};

/** Arguments 0–15 and numPages (argument `numPagesAt`); throws for a qHeads that is not a multiple of kvHeads. */
AttentionArgs attentionArgs(const Napi::CallbackInfo& info, size_t numPagesAt) {
  AttentionArgs a{buf(info, 0, "out"),
                  buf(info, 1, "q"),
                  buf(info, 2, "kPool"),
                  buf(info, 3, "vPool"),
                  buf(info, 4, "cuSeqlensQ"),
                  buf(info, 5, "kvLens"),
                  buf(info, 6, "blockTables"),
                  buf(info, 7, "positions"),
                  num(info, 8, "numSeqs", 1),
                  num(info, 9, "totalQ", 1),
                  num(info, 10, "maxBlocks", 1),
                  num(info, 11, "pageSize", 1),
                  num(info, 12, "qHeads", 1),
                  num(info, 13, "kvHeads", 1),
                  num(info, 14, "headDim", 1),
                  num(info, numPagesAt, "numPages", 1),
                  static_cast<float>(info[15].As<Napi::Number>().DoubleValue())};
  if (a.qHeads % a.kvHeads != 0) throw Napi::RangeError::New(info.Env(), "qHeads: must be a multiple of kvHeads");
  return a;
}

/** Throws a RangeError naming the first buffer of `a` too small for its shape. */
void needAttentionBuffers(const Napi::CallbackInfo& info, const AttentionArgs& a) {
  const int64_t rowBytes = a.totalQ * a.qHeads * a.headDim * 4;
  const int64_t poolBytes = a.numPages * a.pageSize * a.kvHeads * a.headDim * 4;
  need(info, a.out, rowBytes, "out");
  need(info, a.q, rowBytes, "q");
  need(info, a.kPool, poolBytes, "kPool");
  need(info, a.vPool, poolBytes, "vPool");
  need(info, a.cu, (a.numSeqs + 1) * 4, "cuSeqlensQ");
  need(info, a.kvLens, a.numSeqs * 4, "kvLens");
  need(info, a.tables, a.numSeqs * a.maxBlocks * 4, "blockTables");
  need(info, a.pos, a.totalQ * 4, "positions");
}

/**
 * pagedAttention(out, q, kPool, vPool, cuSeqlensQ, kvLens, blockTables, positions, numSeqs, totalQ, maxBlocks,
 * pageSize, qHeads, kvHeads, headDim, scale, causal, numPages, maxKvLen): out and q [totalQ, qHeads, headDim] f32;
 * pools [numPages, pageSize, kvHeads, headDim] f32 (NHD); the batch metadata i32 as native/src/attention.ts's
 * PagedBatch; maxKvLen ≥ every kvLens[s] (it sizes the split over keys). Page ids in blockTables must be < numPages
 * and kvLens ≤ maxKvLen (they are read on the device, not checked there).
 */
Napi::Value PagedAttention(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const AttentionArgs a = attentionArgs(info, 17);
  const bool causal = info[16].ToBoolean().Value();
  const int64_t maxKvLen = num(info, 18, "maxKvLen", 0);
  if (a.headDim > 256 || a.headDim % 16 != 0)
    throw Napi::RangeError::New(env, "headDim: a multiple of 16, at most 256");
  if (maxKvLen > a.maxBlocks * a.pageSize) throw Napi::RangeError::New(env, "maxKvLen: more than maxBlocks * pageSize");
  needAttentionBuffers(info, a);
  const int64_t parts = std::max<int64_t>(1, specdAttentionParts(static_cast<int>(maxKvLen)));
  const size_t work = static_cast<size_t>(a.totalQ * a.qHeads * parts * (2 + a.headDim) * 4);
  if (work > g_attnWorkBytes) {
    if (g_attnWork != nullptr) cudaFree(g_attnWork);
    g_attnWork = nullptr;
    g_attnWorkBytes = 0;
    check(env, cudaMalloc(&g_attnWork, work), "cudaMalloc (attention workspace)");
    g_attnWorkBytes = work;
  }
  launched(env,
           specdPagedAttention(static_cast<float*>(a.out->ptr), nullptr, static_cast<float*>(g_attnWork),
                               static_cast<float*>(a.q->ptr), static_cast<float*>(a.kPool->ptr),
                               static_cast<float*>(a.vPool->ptr), static_cast<int32_t*>(a.cu->ptr),
                               static_cast<int32_t*>(a.kvLens->ptr), static_cast<int32_t*>(a.tables->ptr),
                               static_cast<int32_t*>(a.pos->ptr), static_cast<int>(a.numSeqs),
                               static_cast<int>(a.totalQ), static_cast<int>(a.maxBlocks), static_cast<int>(a.pageSize),
                               static_cast<int>(a.qHeads), static_cast<int>(a.kvHeads), static_cast<int>(a.headDim),
                               a.scale, causal, static_cast<int>(maxKvLen), nullptr),
           "pagedAttention");
  return env.Undefined();
}

/**
 * prefillAttention(out, q, kPool, vPool, cuSeqlensQ, kvLens, blockTables, positions, numSeqs, totalQ, maxBlocks,
 * pageSize, qHeads, kvHeads, headDim, scale, numPages): the causal tensor-core attention of prefill chunks
 * (specdPrefillAttention), f32 `out` [totalQ, qHeads, headDim]; the other arguments as pagedAttention's. Throws a
 * RangeError for a headDim the kernel does not take (64 only).
 */
Napi::Value PrefillAttention(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const AttentionArgs a = attentionArgs(info, 16);
  if (!specdPrefillAttentionFits(static_cast<int>(a.headDim)))
    throw Napi::RangeError::New(env, "headDim: the prefill attention kernel takes 64 only");
  needAttentionBuffers(info, a);
  launched(env,
           specdPrefillAttention(static_cast<float*>(a.out->ptr), nullptr, static_cast<float*>(a.q->ptr),
                                 static_cast<float*>(a.kPool->ptr), static_cast<float*>(a.vPool->ptr),
                                 static_cast<int32_t*>(a.cu->ptr), static_cast<int32_t*>(a.kvLens->ptr),
                                 static_cast<int32_t*>(a.tables->ptr), static_cast<int32_t*>(a.pos->ptr),
                                 static_cast<int>(a.numSeqs), static_cast<int>(a.totalQ), static_cast<int>(a.maxBlocks),
                                 static_cast<int>(a.pageSize), static_cast<int>(a.qHeads), static_cast<int>(a.kvHeads),
                                 static_cast<int>(a.headDim), a.scale, nullptr),
           "prefillAttention");
  return env.Undefined();
}

/**
 * sample(logits, rows, vocab, request, wantProbs) → {results, probs}: sampling and rejection acceptance on the device
 * over the device buffer `logits` [rows, vocab] f32 (sampling.cu; `request` as sampler.h's parseSample): results
 * [groups · 2] i32 (accepted drafts, token; token −1 when a row it used is not finite), probs [Σ (k + 1), vocab] f32
 * (each group's rows' sampling probabilities, in group order) when `wantProbs`, else undefined.
 * @throws TypeError / RangeError naming a malformed argument; Error naming a failed CUDA call.
 */
Napi::Value Sample(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DeviceBuffer* logits = buf(info, 0, "logits");
  const int64_t rows = num(info, 1, "rows", 1), vocab = num(info, 2, "vocab", 1);
  need(info, logits, rows * vocab * 4, "logits");
  if (!info[3].IsObject()) throw Napi::TypeError::New(env, "request: expected an object");
  const SampleRequest r = parseSample(info[3].As<Napi::Object>(), static_cast<int>(rows), static_cast<int>(vocab));
  const bool wantProbs = info[4].ToBoolean().Value();
  static DeviceSampler* sampler = new DeviceSampler();  // lives as long as the process (the default stream)
  float* probsDev = nullptr;
  if (wantProbs) check(env, cudaMalloc(&probsDev, static_cast<size_t>(r.N) * vocab * 4), "cudaMalloc (probs)");
  Napi::Value probs = env.Undefined();
  std::vector<int32_t> res;
  try {
    res = sampler->run(r, static_cast<const float*>(logits->ptr), static_cast<int>(vocab), nullptr, probsDev);
    if (wantProbs) {
      Napi::Float32Array p = Napi::Float32Array::New(env, static_cast<size_t>(r.N) * vocab);
      check(env, cudaMemcpy(p.Data(), probsDev, p.ByteLength(), cudaMemcpyDeviceToHost), "cudaMemcpy (probs)");
      probs = p;
    }
  } catch (const std::exception& e) {
    if (probsDev != nullptr) cudaFree(probsDev);
    throw Napi::Error::New(env, e.what());
  }
  if (probsDev != nullptr) cudaFree(probsDev);
  Napi::Int32Array results = Napi::Int32Array::New(env, res.size());
  std::copy(res.begin(), res.end(), results.Data());
  Napi::Object out = Napi::Object::New(env);
  out.Set("results", results);
  out.Set("probs", probs);
  return out;
}

/** synchronize(): waits for every launch (errors of earlier launches surface here). */
Napi::Value Synchronize(const Napi::CallbackInfo& info) {
  check(info.Env(), cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return info.Env().Undefined();
}

/**
 * timeGemm(out, xb, w, m, mPad, n, k, reps) → ms per call (cudaEvent timing of reps back-to-back calls after one
 * warm-up), the weights read from device memory each call.
 */
Napi::Value TimeGemm(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int64_t reps = num(info, 7, "reps", 1);
  GemmBf16(info);  // warm-up (and the argument checks)
  cudaEvent_t a, b;
  check(env, cudaEventCreate(&a), "cudaEventCreate");
  check(env, cudaEventCreate(&b), "cudaEventCreate");
  cudaEventRecord(a);
  for (int64_t r = 0; r < reps; r++) GemmBf16(info);
  cudaEventRecord(b);
  check(env, cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Napi::Number::New(env, ms / static_cast<double>(reps));
}

}  // namespace

void RegisterLlama(Napi::Env env, Napi::Object exports);   // llama_runner.cc
void RegisterEagle3(Napi::Env env, Napi::Object exports);  // eagle3_runner.cc
void RegisterDFlash(Napi::Env env, Napi::Object exports);  // dflash_runner.cc

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  RegisterLlama(env, exports);
  RegisterEagle3(env, exports);
  RegisterDFlash(env, exports);
  exports.Set("deviceInfo", Napi::Function::New(env, DeviceInfo));
  exports.Set("alloc", Napi::Function::New(env, Alloc));
  exports.Set("free", Napi::Function::New(env, Free));
  exports.Set("upload", Napi::Function::New(env, Upload));
  exports.Set("download", Napi::Function::New(env, Download));
  exports.Set("toBf16", Napi::Function::New(env, ToBf16));
  exports.Set("gemmBf16", Napi::Function::New(env, GemmBf16));
  exports.Set("rmsNorm", Napi::Function::New(env, RmsNorm));
  exports.Set("argmax", Napi::Function::New(env, Argmax));
  exports.Set("swiglu", Napi::Function::New(env, Swiglu));
  exports.Set("embed", Napi::Function::New(env, Embed));
  exports.Set("rope", Napi::Function::New(env, Rope));
  exports.Set("writeKvPages", Napi::Function::New(env, WriteKvPages));
  exports.Set("pagedAttention", Napi::Function::New(env, PagedAttention));
  exports.Set("prefillAttention", Napi::Function::New(env, PrefillAttention));
  exports.Set("sample", Napi::Function::New(env, Sample));
  exports.Set("synchronize", Napi::Function::New(env, Synchronize));
  exports.Set("timeGemm", Napi::Function::New(env, TimeGemm));
  return exports;
}

}  // namespace

NODE_API_MODULE(specd_cuda, Init)
