// GEMM family: bf16 weight packing and Y = X . W^T with fp32 accumulation.
//
// JS entry points (wrapped by native/src/gemm.ts; shapes row-major):
//   packBf16(w: Uint16Array [n*k] bf16, n, k, out: Uint16Array [packedBf16Length(n,k)]) -> undefined
//   gemmBf16(x: Float32Array [m*k], m, k, packed: Uint16Array, n, y: Float32Array [m*n],
//            activations?: "f32" | "bf16" | "bf16x2", accumulate?: boolean) -> undefined  (synchronous)
//   gemmBf16Async(same arguments) -> Promise<undefined>             (libuv thread, see below)
//
// Sync vs async: the sync call blocks the JS thread for the duration of the GEMM (~ms for a
// layer's projection at decode), which is what a model forward running on its own worker
// thread wants (no Promise/microtask overhead, ~5-20 us). The async call runs on a libuv pool
// thread and returns a Promise; use it from the main/server thread for long calls (large
// prefill GEMMs, lm_head over a big vocabulary) so the event loop keeps serving. Both share the
// one compute pool, so two concurrent calls are serialised, not oversubscribed. While an async
// call is running the caller must not write x/packed or read y (their buffers are referenced,
// not copied, and must not be transferred or detached).
//
// Activations: "f32" (default, the project rule) keeps X in fp32 (FMA on widened weights).
// "bf16" (opt-in) rounds X to bf16 first: on the avx512 path with AMX it runs TDPBF16PS tiles
// (several times the FLOP rate of fp32 FMA, so verifying 16 tokens costs about one GEMV);
// otherwise it runs the fp32 kernel of the current path on the rounded X. "bf16x2" (opt-in; split
// bf16) writes X = hi + lo with hi = bf16(X), lo = bf16(X - hi) (16 significant bits, relative error
// ~2^-17 instead of 2^-9), hi and lo as two rows of one AMX tile: one TDPBF16PS per panel and k step
// for up to 8 rows, two fp32 accumulators per output summed once (without AMX the fp32 kernel on hi +
// lo). Every variant is batch invariant; they
// differ from each other by the rounding of X (and AMX's own summation order).
//
// Layout, reduction order and batch invariance: gemm_kernels.h.
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "families.h"
#include "gemm_kernels.h"
#include "isa.h"
#include "threadpool.h"

namespace specd {
namespace {

using gemm::Problem;

/** Packs W[n, k] bf16 row-major into the panel layout of gemm_kernels.h (parallel over panels). */
void PackBf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* out) {
  const int64_t kpairs = gemm::KPairs(k);      // pairs holding weights
  const int64_t stored = gemm::PanelPairs(k);  // pairs stored per panel (zero padded)
  ParallelFor(
      gemm::Panels(n),
      [&](int64_t begin, int64_t end) {
        for (int64_t panel = begin; panel < end; ++panel) {
          uint16_t* dst = out + panel * stored * 32;
          for (int64_t lane = 0; lane < 16; ++lane) {
            const int64_t row = panel * 16 + lane;
            if (row >= n) {
              for (int64_t kp = 0; kp < stored; ++kp) dst[kp * 32 + 2 * lane] = dst[kp * 32 + 2 * lane + 1] = 0;
              continue;
            }
            const uint16_t* src = w + row * k;
            for (int64_t kp = 0; kp < kpairs; ++kp) {
              dst[kp * 32 + 2 * lane] = src[2 * kp];
              dst[kp * 32 + 2 * lane + 1] = (2 * kp + 1 < k) ? src[2 * kp + 1] : 0;
            }
            for (int64_t kp = kpairs; kp < stored; ++kp) dst[kp * 32 + 2 * lane] = dst[kp * 32 + 2 * lane + 1] = 0;
          }
        }
      },
      16 * k);  // work per panel: 16 rows of k weights
}

enum class Activations { kF32, kBf16, kBf16x2 };

/** Runs one fp32-activation GEMM on the current ISA path, partitioned over column panels only. */
/**
 * Rows per pass over the weights when m is large. A kernel pass re-reads every row of X for each
 * panel pair, so at m = 512, k = 2048 it streams 4 MiB of X per 32 output columns from L3; in blocks
 * of 64 rows X's block (512 KiB) stays in L2 and the weights are re-read m/64 times instead.
 * Measured (2 threads, fp32 activations): n = k = 2048: m = 512 18.8 → 17.1 ms, m = 1024 39.1 → 33.3 ms;
 * n = 2048, k = 8192, m = 128: 18.2 → 17.8 ms; the lm_head shape 49152 × 576 and 8192 × 2048 within
 * ±3 %. Never changes a result: rows are independent (batch invariance).
 */
constexpr int64_t kRowBlock = 64;

void RunGemmF32(const Problem& p) {
  void (*kernel)(const Problem&, int64_t, int64_t, float*) = gemm::PanelsF32Portable;
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) kernel = gemm::PanelsF32Avx512;
#endif
  if (p.m == 0 || p.n == 0) return;
  if (p.m > kRowBlock) {
    for (int64_t r0 = 0; r0 < p.m; r0 += kRowBlock) {
      Problem q = p;
      q.x = p.x + r0 * p.ldx;
      q.y = p.y + r0 * p.ldy;
      q.m = p.m - r0 < kRowBlock ? p.m - r0 : kRowBlock;
      RunGemmF32(q);
    }
    return;
  }
  ParallelFor(
      gemm::Panels(p.n),
      [&](int64_t begin, int64_t end) {
        std::vector<float> scratch(static_cast<size_t>(gemm::ScratchFloats(p.m)));
        kernel(p, begin, end, scratch.data());
      },
      gemm::PanelWork(p.m, p.k));
}

/** The low half of split bf16 before rounding: v - hi, or 0 where that is not finite (v = ±Inf). */
inline float SplitRest(float v, float hi) {
  const float rest = v - hi;
  return std::isfinite(rest) ? rest : 0.0f;
}

/**
 * bf16 activation rows: p.x [m, k] f32 -> xb [m][ldxb] (split: hi and lo rows interleaved, lo = bf16(SplitRest)),
 * F32ToBf16's rounding; the AVX-512 loop gives the same bits as the scalar one.
 */
void ToBf16Rows(const Problem& p, bool split, uint16_t* xb, int64_t ldxb) {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return gemm::ToBf16RowsAvx512(p, split, xb, ldxb);
#endif
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t i = 0; i < p.k; ++i) {
      const float v = p.x[r * p.ldx + i];
      const uint16_t hi = F32ToBf16(v);
      xb[(split ? 2 * r : r) * ldxb + i] = hi;
      if (split) xb[(2 * r + 1) * ldxb + i] = F32ToBf16(SplitRest(v, Bf16ToF32(hi)));
    }
}

/**
 * Padding of a bf16 activation row, in bf16 (one 64-byte line). Without it a row of k = 2048 is exactly
 * 4 KiB, so the 16 rows of an AMX A tile (8 X rows as hi and lo) share one L1 set. Measured on AMX (docs/
 * BENCHMARKS.md, "the split-bf16 GEMM at 16 rows"): 7-16 % less time at 16 rows, none at one. Never read by a
 * kernel (they stop at Kpad).
 */
constexpr int64_t kXbPad = 32;

/**
 * Runs one GEMM with the chosen activation precision (never splits K). The m = 1 GEMV runs the same
 * kernel as any m (AMX: a one-row tile), so row i of a GEMM is the GEMV of row i bit for bit.
 */
void RunGemm(Problem p, Activations act) {
  if (act == Activations::kF32 || p.m == 0) return RunGemmF32(p);
  const bool split = act == Activations::kBf16x2;
  const int64_t kpad = gemm::PanelPairs(p.k) * 2;  // K as the tiles read it
  const int64_t ldxb = kpad + kXbPad;
  // bf16: [m][ldxb] rows of hi. Split bf16: hi and lo rows interleaved, [m][2][ldxb] (gemm_kernels.h).
  const int64_t rows_per_x = split ? 2 : 1;
  // Kept scratch (common.h; 133 KB for 16 split rows at k = 2048).
  thread_local std::vector<uint16_t> kept;
  std::vector<uint16_t> own;
  uint16_t* const xb = KeptScratch(kept, own, p.m * rows_per_x * ldxb);
  ToBf16Rows(p, split, xb, ldxb);
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512 && AmxAvailable()) {
    // The tiles read the rows' K padding [k, Kpad): zeroed every call (the kept buffer holds older rows there);
    // kXbPad is never read.
    if (kpad > p.k)
      for (int64_t row = 0; row < p.m * rows_per_x; ++row)
        std::memset(xb + row * ldxb + p.k, 0, static_cast<size_t>(kpad - p.k) * sizeof(uint16_t));
    p.x_bf16 = xb;
    p.x_bf16_lo = split ? xb + ldxb : nullptr;
    p.ldxb = ldxb;
    ParallelFor(
        gemm::Panels(p.n), [&](int64_t begin, int64_t end) { gemm::PanelsBf16Amx(p, begin, end); },
        gemm::PanelWork(p.m, p.k));
    return;
  }
#endif
  // No AMX: the fp32 kernels on the rounded X (bf16), or on hi + lo (split bf16, exact in fp32).
  std::vector<float> xr(static_cast<size_t>(p.m * p.k));
  for (int64_t r = 0; r < p.m; ++r) {
    const uint16_t* hi = xb + r * rows_per_x * ldxb;
    for (int64_t i = 0; i < p.k; ++i)
      xr[r * p.k + i] = split ? Bf16ToF32(hi[i]) + Bf16ToF32(hi[ldxb + i]) : Bf16ToF32(hi[i]);
  }
  p.x = xr.data();
  p.ldx = p.k;
  RunGemmF32(p);
}

Napi::Value PackBf16Binding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "packBf16");
  const int64_t n = args.Int(1, "n", 1);
  const int64_t k = args.Int(2, "k", 1);
  auto w = args.U16(0, "w", CheckedProduct("packBf16", {n, k}), "n*k");
  auto out = args.U16(3, "out", CheckedProduct("packBf16", {gemm::Panels(n) * 16, gemm::PanelPairs(k) * 2}),
                      "packedBf16Length(n, k)");
  PackBf16(w.Data(), n, k, out.Data());
  return info.Env().Undefined();
}

/** Arguments of gemmBf16 / gemmBf16Async after validation; typed arrays are views (no copy). */
struct GemmCall {
  Problem problem{};
  Activations act = Activations::kF32;
  Napi::Float32Array x, y;
  Napi::Uint16Array packed;
};

GemmCall ReadGemmArgs(const Napi::CallbackInfo& info, const char* call) {
  ArgReader args(info, call);
  GemmCall c;
  const std::string act = args.IsAbsent(6) ? "f32" : args.String(6, "activations");
  if (act == "bf16") {
    c.act = Activations::kBf16;
  } else if (act == "bf16x2") {
    c.act = Activations::kBf16x2;
  } else if (act != "f32") {
    args.Fail("activations", "\"f32\", \"bf16\" or \"bf16x2\"", "\"" + act + "\"");
  }
  const int64_t m = args.Int(1, "m", 0);
  const int64_t k = args.Int(2, "k", 1);
  const int64_t n = args.Int(4, "n", 1);
  c.x = args.F32(0, "x", CheckedProduct(call, {m, k}), "m*k");
  c.packed = args.U16(3, "packed", CheckedProduct(call, {gemm::Panels(n) * 16, gemm::PanelPairs(k) * 2}),
                      "packedBf16Length(n, k)");
  c.y = args.F32(5, "y", CheckedProduct(call, {m, n}), "m*n");
  c.problem = Problem{c.x.Data(), k, c.packed.Data(), c.y.Data(), n, m, n, k};
  c.problem.accumulate = !args.IsAbsent(7) && args.Bool(7, "accumulate");
  return c;
}

Napi::Value GemmBf16Binding(const Napi::CallbackInfo& info) {
  GemmCall c = ReadGemmArgs(info, "gemmBf16");
  RunGemm(c.problem, c.act);
  return info.Env().Undefined();
}

// ---- Async worker pattern (copy this for other long kernels) -----------------------------------
// 1. Validate arguments and take raw pointers on the JS thread (constructor).
// 2. Keep the typed arrays alive with Napi::Persistent references (no copies).
// 3. Execute() runs on a libuv thread: no napi calls there; throw or SetError on failure.
// 4. OnOK/OnError run on the JS thread and settle the Promise.
class GemmWorker : public Napi::AsyncWorker {
 public:
  GemmWorker(Napi::Env env, GemmCall call)
      : Napi::AsyncWorker(env, "specd:gemmBf16Async"),
        deferred_(Napi::Promise::Deferred::New(env)),
        problem_(call.problem),
        act_(call.act),
        x_ref_(Napi::Persistent(static_cast<Napi::Object>(call.x))),
        packed_ref_(Napi::Persistent(static_cast<Napi::Object>(call.packed))),
        y_ref_(Napi::Persistent(static_cast<Napi::Object>(call.y))) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    try {
      RunGemm(problem_, act_);
    } catch (const std::exception& e) {
      SetError(std::string("gemmBf16Async: ") + e.what());
    }
  }
  void OnOK() override { deferred_.Resolve(Env().Undefined()); }
  void OnError(const Napi::Error& e) override {
    deferred_.Reject(MakeError(Env(), ErrorKind::kError, "ERR_SPECD_KERNEL", e.Message()).Value());
  }

 private:
  Napi::Promise::Deferred deferred_;
  Problem problem_;
  Activations act_;
  Napi::ObjectReference x_ref_, packed_ref_, y_ref_;
};

Napi::Value GemmBf16AsyncBinding(const Napi::CallbackInfo& info) {
  GemmCall c = ReadGemmArgs(info, "gemmBf16Async");
  auto* worker = new GemmWorker(info.Env(), c);  // deletes itself after OnOK/OnError
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

}  // namespace

void RegisterGemm(Napi::Env env, Napi::Object exports) {
  exports.Set("packBf16", Napi::Function::New(env, Guarded<PackBf16Binding>, "packBf16"));
  exports.Set("gemmBf16", Napi::Function::New(env, Guarded<GemmBf16Binding>, "gemmBf16"));
  exports.Set("gemmBf16Async", Napi::Function::New(env, Guarded<GemmBf16AsyncBinding>, "gemmBf16Async"));
}

}  // namespace specd
