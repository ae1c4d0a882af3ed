// Convert family: bf16 <-> f32 over whole arrays (see bf16.h for the rounding rule).
//
// JS entry points (wrapped by native/src/convert.ts):
//   f32ToBf16(src: Float32Array [n], dst: Uint16Array [n]) -> undefined   round to nearest even
//   bf16ToF32(src: Uint16Array [n], dst: Float32Array [n]) -> undefined   exact
// Portable only: the loops are memory-bound and compilers vectorise them at the baseline ISA.
#include "common.h"
#include "families.h"
#include "threadpool.h"

namespace specd {
namespace {

constexpr int64_t kChunk = 1 << 14;

template <typename Fn>
void Chunked(int64_t n, Fn fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  ParallelFor(chunks, [&](int64_t b, int64_t e) { fn(b * kChunk, e * kChunk < n ? e * kChunk : n); }, kChunk);
}

Napi::Value F32ToBf16Binding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "f32ToBf16");
  auto src = args.F32(0, "src");
  auto dst = args.U16(1, "dst", src.ElementLength(), "src.length");
  const float* s = src.Data();
  uint16_t* d = dst.Data();
  Chunked(static_cast<int64_t>(src.ElementLength()), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) d[i] = F32ToBf16(s[i]);
  });
  return info.Env().Undefined();
}

Napi::Value Bf16ToF32Binding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "bf16ToF32");
  auto src = args.U16(0, "src");
  auto dst = args.F32(1, "dst", src.ElementLength(), "src.length");
  const uint16_t* s = src.Data();
  float* d = dst.Data();
  Chunked(static_cast<int64_t>(src.ElementLength()), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) d[i] = Bf16ToF32(s[i]);
  });
  return info.Env().Undefined();
}

}  // namespace

void RegisterConvert(Napi::Env env, Napi::Object exports) {
  exports.Set("f32ToBf16", Napi::Function::New(env, Guarded<F32ToBf16Binding>, "f32ToBf16"));
  exports.Set("bf16ToF32", Napi::Function::New(env, Guarded<Bf16ToF32Binding>, "bf16ToF32"));
}

}  // namespace specd
