// MoE family: sigmoid router with top-k selection, and SwiGLU experts grouped by expert on the
// packed bf16 GEMM kernels of gemm_kernels.h (no second GEMM).
//
// JS entry points (wrapped by native/src/moe.ts; tensors row-major):
//   moeRoute(logits: Float32Array [N, E] (router logits x.Wg^T, fp32), n, numExperts,
//            bias: Float32Array [E] | null (e_score_correction_bias), topK, routedScalingFactor,
//            renormalize: boolean, ids: Int32Array [N, topK], weights: Float32Array [N, topK],
//            scores: Float32Array [N, E] | null) -> undefined
//     scores = sigmoid(logits) = 1/(1+exp(-l)) in fp32; the k experts with the largest
//     key = score + bias (fp32 add; selection only) are chosen, ties broken by the LOWEST expert id,
//     a NaN key ranks below every number; ids are written in selection order (descending key).
//     weights = score / (sum of the chosen scores, summed in selection order, + 1e-20) * factor
//     (without the division when renormalize is false), as kimi.py MoEGate.
//   moeExperts(x: Float32Array [N, D], n, hidden D, ids: Int32Array [N, topK] (each in [0, E)),
//              weights: Float32Array [N, topK], topK, inter I,
//              w13: Uint16Array[] (E entries; entry e = packBf16(concat(w1_e, w3_e)) of [2I, D]),
//              w2: Uint16Array[] (E entries; entry e = packBf16(w2_e) of [D, I]),
//              sharedW13: Uint16Array | null ([2Is, D] packed), sharedW2: Uint16Array | null ([D, Is]),
//              sharedInter Is, out: Float32Array [N, D]) -> undefined
//     out[t] = sum over the token's (expert e, slot j) pairs in ascending (e, j) order of
//              weights[t][j] * w2_e(silu(w1_e x_t) * w3_e x_t),  then + shared(x_t) (unscaled), fp32.
//     Only the entries of experts that some token uses are read (lengths checked then).
//   moeExpertsAsync(same arguments) -> Promise<undefined>
//
// Grouping: the (token, slot) rows routed to expert e are gathered (ascending token, then slot)
// into one GEMM of m_e rows per weight; all GEMMs of a phase (w13 of every used expert and the
// shared one; then every w2) run in one ParallelFor over their concatenated column panels.
//
// Batch invariance: each GEMM row equals the GEMV of that row bit for bit (gemm_kernels.h), the
// SwiGLU is elementwise, and each token's output is summed in ascending expert id, then slot, then
// the shared expert, from +0: a token's output does not depend on which other tokens share the
// batch, on their order or on the thread count (portable and AVX-512 paths differ by rounding only,
// like the GEMM).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "families.h"
#include "gemm_kernels.h"
#include "isa.h"
#include "threadpool.h"

namespace specd {
namespace {

// ---- Router --------------------------------------------------------------------------------------

struct Choice {
  float key;
  int32_t id;
};

/** Top-k of one token: keys ranked descending, ties to the lowest id (ids visited ascending). */
void SelectTopK(const float* scores, const float* bias, int64_t e_count, int64_t k, Choice* best) {
  int64_t filled = 0;
  for (int64_t e = 0; e < e_count; ++e) {
    float key = bias ? scores[e] + bias[e] : scores[e];
    if (std::isnan(key)) key = -INFINITY;
    // Position: after every entry whose key is >= this key (earlier ids win ties).
    int64_t pos = filled;
    while (pos > 0 && key > best[pos - 1].key) --pos;
    if (pos >= k) continue;
    const int64_t last = std::min(filled, k - 1);
    for (int64_t i = last; i > pos; --i) best[i] = best[i - 1];
    best[pos] = Choice{key, static_cast<int32_t>(e)};
    if (filled < k) ++filled;
  }
}

Napi::Value MoeRouteBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "moeRoute");
  const int64_t n = args.Int(1, "n", 0);
  const int64_t e_count = args.Int(2, "numExperts", 1, 1 << 20);
  const int64_t k = args.Int(4, "topK", 1, e_count);
  const double factor = args.Number(5, "routedScalingFactor");
  const bool renormalize = info.Length() > 6 && info[6].ToBoolean().Value();
  auto logits = args.F32(0, "logits", CheckedProduct("moeRoute", {n, e_count}), "n*numExperts");
  const float* bias =
      args.IsAbsent(3) ? nullptr : args.F32(3, "bias", static_cast<size_t>(e_count), "numExperts").Data();
  auto ids = args.I32(7, "ids", CheckedProduct("moeRoute", {n, k}), "n*topK");
  auto weights = args.F32(8, "weights", CheckedProduct("moeRoute", {n, k}), "n*topK");
  float* scores_out = args.IsAbsent(9)
                          ? nullptr
                          : args.F32(9, "scores", CheckedProduct("moeRoute", {n, e_count}), "n*numExperts").Data();
  const float* pl = logits.Data();
  int32_t* pid = ids.Data();
  float* pw = weights.Data();
  const float scale = static_cast<float>(factor);
  ParallelFor(
      n,
      [&](int64_t begin, int64_t end) {
        std::vector<float> scores(static_cast<size_t>(e_count));
        std::vector<Choice> best(static_cast<size_t>(k));
        for (int64_t t = begin; t < end; ++t) {
          const float* lt = pl + t * e_count;
          for (int64_t e = 0; e < e_count; ++e) scores[e] = 1.0f / (1.0f + std::exp(-lt[e]));
          if (scores_out)
            std::memcpy(scores_out + t * e_count, scores.data(), static_cast<size_t>(e_count) * sizeof(float));
          SelectTopK(scores.data(), bias, e_count, k, best.data());
          float sum = 0.0f;
          for (int64_t j = 0; j < k; ++j) sum = sum + scores[best[j].id];
          const float denom = sum + 1e-20f;
          for (int64_t j = 0; j < k; ++j) {
            const float s = scores[best[j].id];
            pid[t * k + j] = best[j].id;
            pw[t * k + j] = (renormalize ? s / denom : s) * scale;
          }
        }
      },
      4 * e_count);
  return info.Env().Undefined();
}

// ---- Grouped experts -------------------------------------------------------------------------------

/** A phase of independent GEMMs run over their concatenated column panels. */
struct GemmJob {
  gemm::Problem p;
  int64_t panel0;  // first global panel index of this job
};

void RunJobs(const std::vector<GemmJob>& jobs) {
  if (jobs.empty()) return;
  void (*kernel)(const gemm::Problem&, int64_t, int64_t, float*) = gemm::PanelsF32Portable;
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) kernel = gemm::PanelsF32Avx512;
#endif
  int64_t max_m = 0;
  for (const auto& j : jobs) max_m = std::max(max_m, j.p.m);
  const int64_t total = jobs.back().panel0 + gemm::Panels(jobs.back().p.n);
  int64_t work = 0;  // ParallelFor work units of the whole phase (gemm::PanelWork per panel)
  for (const auto& j : jobs) work += gemm::Panels(j.p.n) * gemm::PanelWork(j.p.m, j.p.k);
  const int64_t work_per_panel = std::max<int64_t>(1, work / total);
  ParallelFor(
      total,
      [&](int64_t begin, int64_t end) {
        std::vector<float> scratch(static_cast<size_t>(gemm::ScratchFloats(max_m)));
        size_t j = static_cast<size_t>(std::upper_bound(jobs.begin(), jobs.end(), begin,
                                                        [](int64_t v, const GemmJob& job) { return v < job.panel0; }) -
                                       jobs.begin()) -
                   1;
        for (int64_t idx = begin; idx < end; ++j) {
          const GemmJob& job = jobs[j];
          const int64_t job_end = job.panel0 + gemm::Panels(job.p.n);
          const int64_t stop = std::min(end, job_end);
          if (stop > idx) kernel(job.p, idx - job.panel0, stop - job.panel0, scratch.data());
          idx = std::max(idx, stop);
        }
      },
      work_per_panel);
}

/** Validated moeExperts call: raw pointers into the caller's arrays (no copies). */
struct MoeProblem {
  int64_t n = 0, hidden = 0, k = 0, inter = 0, e_count = 0, shared_inter = 0;
  const float* x = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  std::vector<const uint16_t*> w13, w2;  // [E], null for experts no token uses
  const uint16_t* shared_w13 = nullptr;
  const uint16_t* shared_w2 = nullptr;
  float* out = nullptr;
};

inline float Silu(float g) { return g / (1.0f + std::exp(-g)); }

/** Tokens per internal pass: bounds the gathered buffers (rows*(2D + 3I) floats, ~60 MiB at
 *  hidden 2304, inter 1024, top-8). Tokens are independent, so splitting changes no bit. */
constexpr int64_t kTokensPerPass = 512;

void RunMoePass(const MoeProblem& p);

void RunMoe(const MoeProblem& p) {
  for (int64_t t0 = 0; t0 < p.n; t0 += kTokensPerPass) {
    MoeProblem part = p;
    part.n = std::min(kTokensPerPass, p.n - t0);
    part.x = p.x + t0 * p.hidden;
    part.ids = p.ids + t0 * p.k;
    part.weights = p.weights + t0 * p.k;
    part.out = p.out + t0 * p.hidden;
    RunMoePass(part);
  }
}

void RunMoePass(const MoeProblem& p) {
  const int64_t n = p.n, D = p.hidden, I = p.inter, k = p.k;
  if (n == 0) return;
  // Rows per expert, ascending (token, slot): counting sort by expert id.
  std::vector<int64_t> count(static_cast<size_t>(p.e_count + 1), 0);
  for (int64_t r = 0; r < n * k; ++r) ++count[static_cast<size_t>(p.ids[r]) + 1];
  for (int64_t e = 0; e < p.e_count; ++e) count[e + 1] += count[e];  // count[e] = first grouped row of e
  std::vector<int64_t> row_of(static_cast<size_t>(n * k));           // (token, slot) -> grouped row
  {
    std::vector<int64_t> next(count.begin(), count.end() - 1);
    for (int64_t r = 0; r < n * k; ++r) row_of[r] = next[static_cast<size_t>(p.ids[r])]++;
  }
  const int64_t rows = n * k;
  const bool shared = p.shared_w13 != nullptr;
  const int64_t Is = p.shared_inter;
  // Activations in kept scratch (common.h; each is written in full before it is read): ~1 MB each for a 16-token
  // verify at hidden 2048.
  struct Buffers {
    std::vector<float> xg, h13, act, y, sh13, sact, sy;
  };
  thread_local Buffers kept;
  Buffers own;
  float* const xg = KeptScratch(kept.xg, own.xg, rows * D);
  float* const h13 = KeptScratch(kept.h13, own.h13, rows * 2 * I);
  float* const act = KeptScratch(kept.act, own.act, rows * I);
  float* const y = KeptScratch(kept.y, own.y, rows * D);
  float* const sh13 = shared ? KeptScratch(kept.sh13, own.sh13, n * 2 * Is) : nullptr;
  float* const sact = shared ? KeptScratch(kept.sact, own.sact, n * Is) : nullptr;
  float* const sy = shared ? KeptScratch(kept.sy, own.sy, n * D) : nullptr;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(xg + row_of[r] * D, p.x + (r / k) * D, static_cast<size_t>(D) * sizeof(float));
  // Phase 1: [m_e, 2I] = X_e . W13_e^T for every used expert (+ shared).
  std::vector<GemmJob> jobs;
  int64_t panel = 0;
  for (int64_t e = 0; e < p.e_count; ++e) {
    const int64_t m = count[e + 1] - count[e];
    if (m == 0) continue;
    gemm::Problem q{xg + count[e] * D, D, p.w13[e], h13 + count[e] * 2 * I, 2 * I, m, 2 * I, D};
    jobs.push_back(GemmJob{q, panel});
    panel += gemm::Panels(2 * I);
  }
  if (shared) {
    jobs.push_back(GemmJob{gemm::Problem{p.x, D, p.shared_w13, sh13, 2 * Is, n, 2 * Is, D}, panel});
  }
  RunJobs(jobs);
  // SwiGLU: silu(gate) * up, gate = columns [0, I), up = [I, 2I).
  ParallelFor(
      rows + (shared ? n : 0),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const bool sh = r >= rows;
          const int64_t ii = sh ? Is : I;
          const float* hr = sh ? sh13 + (r - rows) * 2 * Is : h13 + r * 2 * I;
          float* ar = sh ? sact + (r - rows) * Is : act + r * I;
          for (int64_t c = 0; c < ii; ++c) ar[c] = Silu(hr[c]) * hr[ii + c];
        }
      },
      3 * std::max(I, Is));
  // Phase 2: [m_e, D] = A_e . W2_e^T.
  jobs.clear();
  panel = 0;
  for (int64_t e = 0; e < p.e_count; ++e) {
    const int64_t m = count[e + 1] - count[e];
    if (m == 0) continue;
    gemm::Problem q{act + count[e] * I, I, p.w2[e], y + count[e] * D, D, m, D, I};
    jobs.push_back(GemmJob{q, panel});
    panel += gemm::Panels(D);
  }
  if (shared) jobs.push_back(GemmJob{gemm::Problem{sact, Is, p.shared_w2, sy, D, n, D, Is}, panel});
  RunJobs(jobs);
  // Combine per token: ascending (expert, slot), then the shared expert.
  ParallelFor(
      n,
      [&](int64_t begin, int64_t end) {
        std::vector<int64_t> order(static_cast<size_t>(k));
        for (int64_t t = begin; t < end; ++t) {
          for (int64_t j = 0; j < k; ++j) order[j] = j;
          std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
            const int32_t ea = p.ids[t * k + a], eb = p.ids[t * k + b];
            return ea != eb ? ea < eb : a < b;
          });
          float* ot = p.out + t * D;
          for (int64_t c = 0; c < D; ++c) ot[c] = 0.0f;
          for (int64_t j : order) {
            const float w = p.weights[t * k + j];
            const float* yr = y + row_of[t * k + j] * D;
            for (int64_t c = 0; c < D; ++c) ot[c] = ot[c] + w * yr[c];
          }
          if (shared) {
            const float* sr = sy + t * D;
            for (int64_t c = 0; c < D; ++c) ot[c] = ot[c] + sr[c];
          }
        }
      },
      (k + 1) * 2 * D);
}

size_t PackedLength(const char* call, int64_t n, int64_t k) {
  return CheckedProduct(call, {gemm::Panels(n) * 16, gemm::PanelPairs(k) * 2});
}

/** Reads element e of a JS array of packed weights (Uint16Array of `length`), keeping it alive. */
const uint16_t* ExpertWeights(ArgReader& args, Napi::Array list, int64_t e, const char* name, size_t length,
                              std::vector<Napi::Object>& keep) {
  Napi::Value v = list.Get(static_cast<uint32_t>(e));
  const std::string what = std::string(name) + "[" + std::to_string(e) + "]";
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint16_array)
    args.Fail(what.c_str(), "Uint16Array of length " + std::to_string(length), "another value");
  Napi::Uint16Array a = v.As<Napi::Uint16Array>();
  if (a.ElementLength() != length)
    args.Fail(what.c_str(), "Uint16Array of length " + std::to_string(length),
              "length " + std::to_string(a.ElementLength()));
  keep.push_back(a);
  return a.Data();
}

struct MoeCall {
  MoeProblem problem;
  std::vector<Napi::Object> arrays;
};

MoeCall ReadMoeArgs(const Napi::CallbackInfo& info, const char* call) {
  ArgReader args(info, call);
  MoeCall c;
  MoeProblem& p = c.problem;
  p.n = args.Int(1, "n", 0);
  p.hidden = args.Int(2, "hidden", 1);
  p.k = args.Int(5, "topK", 1, 1 << 16);
  p.inter = args.Int(6, "inter", 1);
  auto x = args.F32(0, "x", CheckedProduct(call, {p.n, p.hidden}), "n*hidden");
  auto ids = args.I32(3, "ids", CheckedProduct(call, {p.n, p.k}), "n*topK");
  auto weights = args.F32(4, "weights", CheckedProduct(call, {p.n, p.k}), "n*topK");
  auto out = args.F32(12, "out", CheckedProduct(call, {p.n, p.hidden}), "n*hidden");
  if (!info[7].IsArray()) args.Fail("w13", "an Array of Uint16Array (one per expert)", "another value");
  if (!info[8].IsArray()) args.Fail("w2", "an Array of Uint16Array (one per expert)", "another value");
  Napi::Array w13 = info[7].As<Napi::Array>();
  Napi::Array w2 = info[8].As<Napi::Array>();
  p.e_count = w13.Length();
  if (p.e_count < 1) args.Fail("w13", "at least one expert", "an empty Array");
  if (static_cast<int64_t>(w2.Length()) != p.e_count)
    args.Fail("w2", "an Array of " + std::to_string(p.e_count) + " entries (w13.length)",
              "length " + std::to_string(w2.Length()));
  p.x = x.Data();
  p.ids = ids.Data();
  p.weights = weights.Data();
  p.out = out.Data();
  c.arrays = {x, ids, weights, out};
  p.w13.assign(static_cast<size_t>(p.e_count), nullptr);
  p.w2.assign(static_cast<size_t>(p.e_count), nullptr);
  const size_t len13 = PackedLength(call, 2 * p.inter, p.hidden), len2 = PackedLength(call, p.hidden, p.inter);
  for (int64_t r = 0; r < p.n * p.k; ++r) {
    const int32_t e = p.ids[r];
    if (e < 0 || e >= p.e_count)
      args.Fail("ids", "expert ids in [0, " + std::to_string(p.e_count) + ")",
                std::to_string(e) + " at " + std::to_string(r));
    if (p.w13[e]) continue;
    p.w13[e] = ExpertWeights(args, w13, e, "w13", len13, c.arrays);
    p.w2[e] = ExpertWeights(args, w2, e, "w2", len2, c.arrays);
  }
  if (!args.IsAbsent(9)) {
    p.shared_inter = args.Int(11, "sharedInter", 1);
    auto s13 = args.U16(9, "sharedW13", PackedLength(call, 2 * p.shared_inter, p.hidden),
                        "packedBf16Length(2*sharedInter, hidden)");
    auto s2 =
        args.U16(10, "sharedW2", PackedLength(call, p.hidden, p.shared_inter), "packedBf16Length(hidden, sharedInter)");
    p.shared_w13 = s13.Data();
    p.shared_w2 = s2.Data();
    c.arrays.push_back(s13);
    c.arrays.push_back(s2);
  }
  return c;
}

Napi::Value MoeExpertsBinding(const Napi::CallbackInfo& info) {
  MoeCall c = ReadMoeArgs(info, "moeExperts");
  RunMoe(c.problem);
  return info.Env().Undefined();
}

Napi::Value MoeExpertsAsyncBinding(const Napi::CallbackInfo& info) {
  auto c = ReadMoeArgs(info, "moeExpertsAsync");
  MoeProblem p = std::move(c.problem);
  return QueueKernel(info.Env(), "moeExpertsAsync", [p]() mutable { RunMoe(p); }, std::move(c.arrays));
}

}  // namespace

void RegisterMoe(Napi::Env env, Napi::Object exports) {
  exports.Set("moeRoute", Napi::Function::New(env, Guarded<MoeRouteBinding>, "moeRoute"));
  exports.Set("moeExperts", Napi::Function::New(env, Guarded<MoeExpertsBinding>, "moeExperts"));
  exports.Set("moeExpertsAsync", Napi::Function::New(env, Guarded<MoeExpertsAsyncBinding>, "moeExpertsAsync"));
}

}  // namespace specd
