// Activation family: SiLU and SwiGLU, elementwise f32.
//
// JS entry points (wrapped by native/src/activation.ts):
//   silu(x: Float32Array [n], out: Float32Array [n]) -> undefined          out = x * sigmoid(x)
//   swiglu(gate: Float32Array [n], up: Float32Array [n], out: Float32Array [n]) -> undefined
//                                                                         out = silu(gate) * up
//   swigluFused(gateUp: Float32Array [rows*2*inter], rows, inter, out: Float32Array [rows*inter])
//     -> undefined   gateUp row = [gate (inter) | up (inter)], the output of a fused gate_up GEMM
//   add(a: Float32Array [n], b: Float32Array [n], out: Float32Array [n]) -> undefined   out = a + b
//     (one f32 rounding: the same bits as the JavaScript `a[i] + b[i]` stored to a Float32Array;
//     a residual add of a block without a per-element JavaScript loop)
// silu(g) = g / (1 + exp(-g)) in f32 with the vectorisable exp of kda_math.h (activation_kernels.h;
// AVX-512 path in activation_avx512.cc). out may alias an input (except swigluFused).
#include "activation_kernels.h"
#include "common.h"
#include "families.h"
#include "isa.h"
#include "threadpool.h"

namespace specd {
namespace {

constexpr int64_t kChunk = 1 << 13;

using SiluFn = void (*)(const float*, float*, int64_t);
using SwigluFn = void (*)(const float*, const float*, float*, int64_t);

void SiluPortable(const float* g, float* o, int64_t n) { act::SiluArray(g, o, n); }
void SwigluPortable(const float* g, const float* u, float* o, int64_t n) { act::SwigluArray(g, u, o, n); }

SiluFn PickSilu() {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::SiluAvx512;
#endif
  return SiluPortable;
}

SwigluFn PickSwiglu() {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::SwigluAvx512;
#endif
  return SwigluPortable;
}

template <typename Fn>
void Chunked(int64_t n, Fn fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  ParallelFor(chunks, [&](int64_t b, int64_t e) { fn(b * kChunk, e * kChunk < n ? e * kChunk : n); }, kChunk);
}

Napi::Value SiluBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "silu");
  auto x = args.F32(0, "x");
  auto out = args.F32(1, "out", x.ElementLength(), "x.length");
  const float* px = x.Data();
  float* po = out.Data();
  const SiluFn silu = PickSilu();
  Chunked(static_cast<int64_t>(x.ElementLength()), [&](int64_t lo, int64_t hi) { silu(px + lo, po + lo, hi - lo); });
  return info.Env().Undefined();
}

Napi::Value SwigluBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "swiglu");
  auto gate = args.F32(0, "gate");
  auto up = args.F32(1, "up", gate.ElementLength(), "gate.length");
  auto out = args.F32(2, "out", gate.ElementLength(), "gate.length");
  const float* pg = gate.Data();
  const float* pu = up.Data();
  float* po = out.Data();
  const SwigluFn swiglu = PickSwiglu();
  Chunked(static_cast<int64_t>(gate.ElementLength()),
          [&](int64_t lo, int64_t hi) { swiglu(pg + lo, pu + lo, po + lo, hi - lo); });
  return info.Env().Undefined();
}

Napi::Value AddBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "add");
  auto a = args.F32(0, "a");
  auto b = args.F32(1, "b", a.ElementLength(), "a.length");
  auto out = args.F32(2, "out", a.ElementLength(), "a.length");
  const float* pa = a.Data();
  const float* pb = b.Data();
  float* po = out.Data();
  Chunked(static_cast<int64_t>(a.ElementLength()), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) po[i] = pa[i] + pb[i];
  });
  return info.Env().Undefined();
}

Napi::Value SwigluFusedBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "swigluFused");
  const int64_t rows = args.Int(1, "rows", 0);
  const int64_t inter = args.Int(2, "inter", 1);
  auto gu = args.F32(0, "gateUp", CheckedProduct("swigluFused", {rows, 2, inter}), "rows*2*inter");
  auto out = args.F32(3, "out", CheckedProduct("swigluFused", {rows, inter}), "rows*inter");
  const float* pg = gu.Data();
  float* po = out.Data();
  const SwigluFn swiglu = PickSwiglu();
  ParallelFor(
      rows,
      [&](int64_t b, int64_t e) {  // work per row: 2*inter read, inter written
        for (int64_t r = b; r < e; ++r) swiglu(pg + r * 2 * inter, pg + r * 2 * inter + inter, po + r * inter, inter);
      },
      3 * inter);
  return info.Env().Undefined();
}

}  // namespace

void RegisterActivation(Napi::Env env, Napi::Object exports) {
  exports.Set("silu", Napi::Function::New(env, Guarded<SiluBinding>, "silu"));
  exports.Set("swiglu", Napi::Function::New(env, Guarded<SwigluBinding>, "swiglu"));
  exports.Set("add", Napi::Function::New(env, Guarded<AddBinding>, "add"));
  exports.Set("swigluFused", Napi::Function::New(env, Guarded<SwigluFusedBinding>, "swigluFused"));
}

}  // namespace specd
