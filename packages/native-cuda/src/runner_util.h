// @specd/native-cuda: host helpers the whole-model runners share (llama_runner.cc, eagle3_runner.cc,
// dflash_runner.cc): CUDA errors as exceptions, CUDA-graph capture and replay timing, row padding, and the N-API
// argument checks. Each runner's TU gets its own copy (an unnamed namespace).
#pragma once
#include <cuda_runtime.h>
#include <napi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels.h"

namespace {

/** A failed CUDA call or launch, named (the N-API layer turns it into an Error). */
class CudaFailure : public std::exception {
 public:
  explicit CudaFailure(std::string m) : msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
  std::string msg;
};

/** @throws CudaFailure "what: <error name> (<error string>)" unless e is cudaSuccess. */
void ok(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw CudaFailure(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
/** @throws CudaFailure "what failed with status N" unless a launcher returned 0. */
void launched(int status, const char* what) {
  if (status != 0) throw CudaFailure(std::string(what) + " failed with status " + std::to_string(status));
}

/**
 * Captures what `launch` puts on `stream` as a CUDA graph and instantiates it (the caller ran `launch` once outside
 * the capture first, so every GEMM plan and kernel attribute exists). A throw from `launch` ends the capture and
 * rethrows. @throws CudaFailure naming the failed capture call.
 */
template <typename F>
cudaGraphExec_t captureGraph(cudaStream_t stream, F&& launch) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    launch();
  } catch (...) {
    cudaStreamEndCapture(stream, &g);
    if (g != nullptr) cudaGraphDestroy(g);
    throw;
  }
  ok(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  ok(e, "cudaGraphInstantiate");
  return exec;
}

/** GPU ms per replay of `graph`, `reps` replays back to back on `stream` (cudaEvent timing). */
double replayGraphMs(cudaGraphExec_t graph, cudaStream_t stream, int reps) {
  cudaEvent_t a = nullptr, b = nullptr;
  ok(cudaEventCreate(&a), "cudaEventCreate");
  ok(cudaEventCreate(&b), "cudaEventCreate");
  cudaEventRecord(a, stream);
  for (int r = 0; r < reps; r++) cudaGraphLaunch(graph, stream);
  cudaEventRecord(b, stream);
  float ms = 0;
  const cudaError_t e = cudaEventSynchronize(b);
  if (e == cudaSuccess) cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  ok(e, "graph replay (cudaEventSynchronize)");
  return ms / reps;
}

/**
 * The device memory a runner owns: `dev` allocates (zeroed) activations, or while `kvPhase` what the KV pool's
 * allocation sizes (freed apart, by the runner's freeKv); `upload` allocates a weight once and copies it.
 */
class RunnerMemory {
 public:
  size_t weightBytes = 0, activationBytes = 0;

 protected:
  std::vector<void*> allocs, kvAllocs;  // kvAllocs: what the KV pool's allocation sized
  bool kvPhase = false;

  /** @throws CudaFailure naming `what` and the bytes. */
  void* dev(size_t bytes, const char* what) {
    void* p = nullptr;
    ok(cudaMalloc(&p, bytes), std::string("cudaMalloc (") + what + ", " + std::to_string(bytes) + " bytes)");
    (kvPhase ? kvAllocs : allocs).push_back(p);
    ok(cudaMemset(p, 0, bytes), "cudaMemset");
    if (!kvPhase) activationBytes += bytes;
    return p;
  }
  /** @throws std::invalid_argument "name: got bytes, expected want" when they differ. */
  static void expect(size_t got, size_t want, const std::string& name) {
    if (got != want)
      throw std::invalid_argument(name + ": " + std::to_string(got) + " bytes, expected " + std::to_string(want));
  }
  /**
   * Uploads a q|k|v weight bf16 [(qHeads + 2 · kvHeads) · headDim, cols] from host `src` with each neox RoPE pair in
   * adjacent rows (specdRopePairedRows; as given for the interleaved style): the layout the small GEMM's RoPE epilogue
   * and specdRopeKv read. @throws std::invalid_argument when `bytes` is not that size.
   */
  void uploadQkv(void** slot, const void* src, size_t bytes, int qHeads, int kvHeads, int headDim, int cols, bool neox,
                 const std::string& name) {
    expect(bytes, static_cast<size_t>(qHeads + 2 * kvHeads) * headDim * cols * 2, name);
    std::vector<uint16_t> rows(static_cast<const uint16_t*>(src), static_cast<const uint16_t*>(src) + bytes / 2);
    if (neox) specdRopePairedRows(rows.data(), qHeads, kvHeads, headDim, cols);
    upload(slot, rows.data(), bytes, name);
  }
  /**
   * Runs `alloc` as the KV pool's allocation (what it `dev`s is freed by the runner's `freeKv`), after `freeKv`: a
   * second call replaces the first. When `alloc` throws, what it made is freed again (no half-made pool) and the
   * exception goes on.
   */
  template <typename Alloc, typename Free>
  void allocKvPhase(Alloc&& alloc, Free&& freeKv) {
    freeKv();
    kvPhase = true;
    try {
      alloc();
    } catch (...) {
      freeKv();
      kvPhase = false;
      throw;
    }
    kvPhase = false;
  }
  /**
   * The RoPE table on the device: cos | sin [maxModelLen, headDim] f32 (per position, headDim / 2 cosines then the
   * sines), the CPU path's formula (native/src/rope.cc: inv_freq = theta^(−2i / headDim) in double, then cos / sin).
   */
  float* ropeTable(double theta, int headDim, int maxModelLen) {
    std::vector<float> cs(static_cast<size_t>(maxModelLen) * headDim);
    const int half = headDim / 2;
    for (int p = 0; p < maxModelLen; p++)
      for (int i = 0; i < half; i++) {
        const double inv = std::pow(theta, -2.0 * i / static_cast<double>(headDim));
        const double angle = static_cast<double>(p) * inv;
        cs[static_cast<size_t>(p) * headDim + i] = static_cast<float>(std::cos(angle));
        cs[static_cast<size_t>(p) * headDim + half + i] = static_cast<float>(std::sin(angle));
      }
    float* table = static_cast<float*>(dev(cs.size() * 4, "RoPE table"));
    ok(cudaMemcpy(table, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy (RoPE table)");
    return table;
  }
  /** Copies `bytes` from host `src` into the weight at `*slot` (allocated at the first upload). */
  void upload(void** slot, const void* src, size_t bytes, const std::string& name) {
    if (*slot == nullptr) {
      ok(cudaMalloc(slot, bytes), "cudaMalloc (weight " + name + ", " + std::to_string(bytes) + " bytes)");
      allocs.push_back(*slot);
      weightBytes += bytes;
    }
    ok(cudaMemcpy(*slot, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (weight " + name + ")");
  }
};

/**
 * A draft layer's MLP on `rows` rows of the residual h [rows, D] f32, the down projection added into h:
 * post_attention_layernorm, gate|up GEMM, SwiGLU, down GEMM. With `small`, the small tensor-core GEMM (the norm in its
 * prologue, SwiGLU in its epilogue, into sb); else the norm into hb, `gemm` (cuBLASLt) into gu, and the SwiGLU
 * kernel into sb. gemm(out, in, w, m, n, k, accumulate, what) is the runner's. Launches only (stream order).
 */
template <typename Gemm>
void draftMlp(bool small, Gemm&& gemm, cudaStream_t stream, float* h, void* hb, float* gu, void* sb,
              const float* postNorm, const void* wGateUp, const void* wDown, int rows, int D, int inter, float eps) {
  if (small) {
    launched(specdSmallGemmNorm(nullptr, sb, h, postNorm, nullptr, eps, wGateUp, rows, inter, D, stream),
             "post_attention_layernorm + gate|up GEMM + SwiGLU");
    launched(specdSmallGemm(h, sb, wDown, rows, D, inter, true, stream), "down GEMM");
  } else {
    launched(specdRmsNormBf16(hb, h, postNorm, nullptr, rows, D, eps, stream), "post_attention_layernorm");
    gemm(gu, hb, wGateUp, rows, 2 * inter, D, false, "gate|up GEMM");
    launched(specdSwigluBf16(sb, gu, rows, inter, stream), "SwiGLU");
    gemm(h, sb, wDown, rows, D, inter, true, "down GEMM");
  }
}

/**
 * A drafter's head: the final norm of the residual rows `rowIdx` (all `n` when null) of h [·, D] f32, then the draft
 * head GEMM into logits [n, vocab] f32 — on the small GEMM (the norm in its prologue) with `small`, else the norm into
 * hb and `gemm`. Launches only.
 */
template <typename Gemm>
void draftHead(bool small, Gemm&& gemm, cudaStream_t stream, float* logits, const float* h, void* hb,
               const float* finalNorm, const int32_t* rowIdx, const void* head, int n, int vocab, int D, float eps) {
  if (small) {
    launched(specdSmallGemmNorm(logits, nullptr, h, finalNorm, rowIdx, eps, head, n, vocab, D, stream),
             "norm + draft head GEMM");
  } else {
    launched(specdRmsNormBf16(hb, h, finalNorm, rowIdx, n, D, eps, stream), "norm");
    gemm(logits, hb, head, n, vocab, D, false, "draft head GEMM");
  }
}

/**
 * body() with the runners' exceptions as JavaScript errors: std::invalid_argument → RangeError, CudaFailure → Error
 * (its message names the failed call).
 */
template <typename F>
auto guarded(Napi::Env env, F body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    throw Napi::RangeError::New(env, e.what());
  } catch (const CudaFailure& e) {
    throw Napi::Error::New(env, e.what());
  }
}

/** o[key] as an integer in [lo, hi]. @throws TypeError (not a number) or RangeError naming the key. */
int intField(Napi::Object o, const char* key, int lo, int hi = 1 << 30) {
  Napi::Value v = o.Get(key);
  if (!v.IsNumber()) throw Napi::TypeError::New(o.Env(), std::string(key) + ": expected a number");
  const double x = v.As<Napi::Number>().DoubleValue();
  if (!(x >= lo && x <= hi && x == std::floor(x)))
    throw Napi::RangeError::New(o.Env(), std::string(key) + ": expected an integer in [" + std::to_string(lo) + ", " +
                                             std::to_string(hi) + "], got " + std::to_string(x));
  return static_cast<int>(x);
}

/** o[key] as a finite number > 0 (or ≥ 0 when !positive). @throws RangeError naming the key. */
double numField(Napi::Object o, const char* key, bool positive = true) {
  Napi::Value v = o.Get(key);
  const double x = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : NAN;
  if (!(positive ? x > 0 : x >= 0) || !std::isfinite(x))
    throw Napi::RangeError::New(
        o.Env(), std::string(key) + (positive ? ": expected a positive number" : ": expected a number >= 0"));
  return x;
}

/** Argument i as an Int32Array of `length` elements. @throws TypeError or RangeError naming the argument. */
const int32_t* i32(const Napi::CallbackInfo& info, size_t i, const char* name, size_t length) {
  if (!info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw Napi::TypeError::New(info.Env(), std::string(name) + ": expected an Int32Array");
  Napi::Int32Array a = info[i].As<Napi::Int32Array>();
  if (a.ElementLength() != length)
    throw Napi::RangeError::New(info.Env(), std::string(name) + ": length " + std::to_string(a.ElementLength()) +
                                                ", expected " + std::to_string(length));
  return a.Data();
}

/** Argument i as an integer in [lo, hi]. @throws TypeError (not a number) or RangeError naming it. */
[[maybe_unused]] int intArg(const Napi::CallbackInfo& info, size_t i, const char* name, int lo, int hi) {
  if (!info[i].IsNumber()) throw Napi::TypeError::New(info.Env(), std::string(name) + ": expected a number");
  const double x = info[i].As<Napi::Number>().DoubleValue();
  if (!(x >= lo && x <= hi && x == std::floor(x)))
    throw Napi::RangeError::New(info.Env(), std::string(name) + ": expected an integer in [" + std::to_string(lo) +
                                                ", " + std::to_string(hi) + "], got " + std::to_string(x));
  return static_cast<int>(x);
}

[[maybe_unused]] size_t typedLength(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (!info[i].IsTypedArray()) throw Napi::TypeError::New(info.Env(), std::string(name) + ": expected an Int32Array");
  return info[i].As<Napi::TypedArray>().ElementLength();
}

/** 2^⌈log2 v⌉ (1 for v ≤ 1). */
[[maybe_unused]] int pow2Ceil(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}
/**
 * Rows a batch of n runs as (kernels and GEMM plans alike): 2^⌈log2 n⌉. Up to 32 rows the small GEMM is
 * row-invariant, so padding changes no real row's bits; above, cuBLASLt's plan is made for the padded count.
 */
[[maybe_unused]] int padRows(int n) { return pow2Ceil(n); }

/** The paged attention's key span for contexts of at most maxKv keys: 2^⌈log2 maxKv⌉, at least 64, at most `cap`. */
[[maybe_unused]] int attnSpan(int maxKv, int cap) { return std::min(cap, pow2Ceil(std::max(64, maxKv))); }

/** Argument 0 as a runner handle of type R (made by `create`). @throws TypeError (not one) or Error once disposed. */
template <typename R>
R* runnerArg(const Napi::CallbackInfo& info, const char* create) {
  if (!info[0].IsExternal())
    throw Napi::TypeError::New(info.Env(), std::string("runner: expected a handle from ") + create);
  R* r = info[0].As<Napi::External<R>>().Data();
  if (r->disposed) throw Napi::Error::New(info.Env(), "runner: disposed");
  return r;
}

/** `<runner>Dispose(runner)`: frees R's device memory, graphs and stream now (a later use throws). Idempotent. */
template <typename R>
Napi::Value disposeRunner(const Napi::CallbackInfo& info, const char* create) {
  if (!info[0].IsExternal())
    throw Napi::TypeError::New(info.Env(), std::string("runner: expected a handle from ") + create);
  R* r = info[0].As<Napi::External<R>>().Data();
  if (!r->disposed) r->release();
  return info.Env().Undefined();
}

/** A runner's {weightBytes, kvBytes, activationBytes, maxBlocks, graphs} (`<runner>Info`; llamaInfo adds its host
 * timings). */
template <typename R>
Napi::Object runnerInfo(Napi::Env env, const R* r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("weightBytes", static_cast<double>(r->weightBytes));
  o.Set("kvBytes", static_cast<double>(r->kvBytes));
  o.Set("activationBytes", static_cast<double>(r->activationBytes));
  o.Set("maxBlocks", r->maxBlocks);
  const std::vector<std::string> labels = r->graphLabels();
  Napi::Array g = Napi::Array::New(env, labels.size());
  for (size_t i = 0; i < labels.size(); i++) g.Set(static_cast<uint32_t>(i), labels[i]);
  o.Set("graphs", g);
  return o;
}

/** Throws unless runner `r` has its KV pool (`allocCall` makes it) and every weight (`missing()` names the first). */
template <typename R>
void requireReady(Napi::Env env, const R* r, const char* call, const char* allocCall) {
  if (!r->hasKv()) throw Napi::Error::New(env, std::string(call) + ": no draft KV pool yet (" + allocCall + ")");
  const std::string missing = r->missing();
  if (!missing.empty()) throw Napi::Error::New(env, std::string(call) + ": weight " + missing + " was not uploaded");
}

/**
 * Argument i as a Float32Array of `rows` rows of `width` floats (a context write's rows).
 * @throws TypeError (not a Float32Array) or RangeError naming `name` and the expected shape.
 */
[[maybe_unused]] Napi::Float32Array f32Rows(const Napi::CallbackInfo& info, size_t i, const char* name, size_t rows,
                                            size_t width) {
  if (!info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    throw Napi::TypeError::New(info.Env(), std::string(name) + ": expected a Float32Array");
  Napi::Float32Array a = info[i].As<Napi::Float32Array>();
  if (a.ElementLength() != rows * width)
    throw Napi::RangeError::New(info.Env(), std::string(name) + ": length " + std::to_string(a.ElementLength()) +
                                                ", expected [" + std::to_string(rows) + ", " + std::to_string(width) +
                                                "] f32");
  return a;
}

}  // namespace
