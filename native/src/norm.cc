// Norm family: RMSNorm over the last dimension, optionally gated.
//
// JS entry point (wrapped by native/src/norm.ts):
//   rmsNorm(x: Float32Array [rows*dim], weight: Float32Array [dim], rows, dim, eps,
//           out: Float32Array [rows*dim], gate: Float32Array [rows*dim] | null,
//           gateKind: "none" | "sigmoid" | "silu") -> undefined
//   y[r][i] = float(x[r][i] * inv_r) * weight[i] * act(gate[r][i]),
//   inv_r = 1 / sqrt(mean_i(x[r][i]^2) + eps)   (sum of squares in double: 8 interleaved partial
//   sums, lane l taking i = l mod 8 in order, then the lanes and the tail in index order — a fixed
//   order the compiler vectorises; one sequential double chain was latency-bound)
//   act = 1 (none), sigmoid(g) = 1/(1+exp(-g)), silu(g) = g*sigmoid(g), exp = kda::Exp (kda_math.h, ~1 ulp).
// The per-head form over [tokens, heads, headDim] is the same call with rows = tokens*heads and
// dim = headDim (weight shared by the heads). out may alias x. Rows are independent, so results
// do not depend on the batch or the thread count. Portable code vectorised by the compiler
// at the baseline ISA, but for the gate (exp), whose loop has an AVX-512 build too (kda_avx512.cc, same bits).
#include <cmath>

#include "common.h"
#include "families.h"
#include "isa.h"
#include "kda_kernels.h"
#include "kda_math.h"
#include "threadpool.h"

namespace specd {
namespace {

enum class Gate { kNone, kSigmoid, kSilu };

template <Gate G>
void NormRows(const float* x, const float* w, const float* gate, float* out, int64_t begin, int64_t end, int64_t dim,
              double eps) {
  for (int64_t r = begin; r < end; ++r) {
    const float* xr = x + r * dim;
    constexpr int64_t kLanes = 8;
    double part[kLanes] = {};
    int64_t i0 = 0;
    for (; i0 + kLanes <= dim; i0 += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) part[l] += static_cast<double>(xr[i0 + l]) * xr[i0 + l];
    double ss = 0.0;
    for (int64_t l = 0; l < kLanes; ++l) ss += part[l];
    for (; i0 < dim; ++i0) ss += static_cast<double>(xr[i0]) * xr[i0];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    float* yr = out + r * dim;
    const float* gr = gate ? gate + r * dim : nullptr;
    if (G == Gate::kNone) {
      for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * inv) * w[i];
      continue;
    }
    // The gate's exp is kda::Exp (~1 ulp, branch-free: 16 lanes on the AVX-512 path; std::exp's scalar calls made
    // a 16-token verify's gated norm ~9x a token's).
#if defined(SPECD_HAVE_AVX512_BUILD)
    if (CurrentIsa() == Isa::kAvx512) {
      kda::GatedScaleAvx512(xr, w, gr, inv, G == Gate::kSilu, yr, dim);
      continue;
    }
#endif
    kda::GatedScaleArray(xr, w, gr, inv, G == Gate::kSilu, yr, dim);
  }
}

Napi::Value RmsNormBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "rmsNorm");
  const int64_t rows = args.Int(2, "rows", 0);
  const int64_t dim = args.Int(3, "dim", 1);
  const double eps = args.Number(4, "eps");
  if (eps < 0) args.Fail("eps", "a number >= 0", std::to_string(eps));
  const size_t total = CheckedProduct("rmsNorm", {rows, dim});
  auto x = args.F32(0, "x", total, "rows*dim");
  auto w = args.F32(1, "weight", static_cast<size_t>(dim), "dim");
  auto out = args.F32(5, "out", total, "rows*dim");
  const std::string kind = args.IsAbsent(7) ? "none" : args.String(7, "gateKind");
  Gate g;
  if (kind == "none") g = Gate::kNone;
  else if (kind == "sigmoid") g = Gate::kSigmoid;
  else if (kind == "silu") g = Gate::kSilu;
  else args.Fail("gateKind", "\"none\", \"sigmoid\" or \"silu\"", "\"" + kind + "\"");
  const float* gate = nullptr;
  if (g != Gate::kNone) gate = args.F32(6, "gate", total, "rows*dim").Data();
  const float* px = x.Data();
  const float* pw = w.Data();
  float* po = out.Data();
  ParallelFor(
      rows,
      [&](int64_t b, int64_t e) {  // work per row: ~3 passes over dim
        switch (g) {
          case Gate::kNone: NormRows<Gate::kNone>(px, pw, gate, po, b, e, dim, eps); break;
          case Gate::kSigmoid: NormRows<Gate::kSigmoid>(px, pw, gate, po, b, e, dim, eps); break;
          case Gate::kSilu: NormRows<Gate::kSilu>(px, pw, gate, po, b, e, dim, eps); break;
        }
      },
      3 * dim);
  return info.Env().Undefined();
}

}  // namespace

void RegisterNorm(Napi::Env env, Napi::Object exports) {
  exports.Set("rmsNorm", Napi::Function::New(env, Guarded<RmsNormBinding>, "rmsNorm"));
}

}  // namespace specd
