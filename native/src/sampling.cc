// Sampling family: row-wise softmax, argmax, and top-k / top-p logit filters, all over
// [rows, cols] f32 row-major (rows = sequences or draft positions, cols = vocabulary).
//
// JS entry points (wrapped by native/src/sampling.ts):
//   softmax(x, rows, cols, temperature (> 0), out: Float32Array [rows*cols]) -> undefined
//       out = exp((x - max)/T) / sum, exp in f32, sum in double (16 partial sums in a fixed order, the same on
//       every path: activation_kernels.h's SumF64Lanes16). Entries of -Infinity get 0.
//       Throws (ERR_SPECD_KERNEL) when a row has no finite maximum (all -Infinity or NaN).
//   argmax(x, rows, cols, out: Int32Array [rows], checked = false, prob?: Float32Array [rows]) -> undefined
//       first index of the largest value; NaN never wins; a row of only NaN gives 0. checked: −1 for a row that
//       holds a NaN or +Infinity or has no finite value (−Infinity entries, masked tokens, are allowed).
//       prob: also softmax(x)'s largest probability per row, f32(1 / Σ exp(x − max)) with softmax's exponentials
//       and sum (NaN for a row without a finite maximum).
//   topKMask(logits, rows, cols, k (1..cols), out) -> undefined
//       keeps entries >= the k-th largest value of the row (ties at the boundary are all kept, so
//       more than k may survive), sets the others to -Infinity.
//   topPMask(logits, rows, cols, p (0 < p <= 1), out) -> undefined
//       on probabilities softmax(logits) (apply the temperature to the logits first), keeps the
//       smallest prefix of tokens sorted by (probability desc, index asc) whose cumulative mass
//       reaches p (at least one token), sets the others to -Infinity. p = 1 keeps all.
//   samplingProbs(logits, rows, cols, temperature (> 0), topK (0 = off), p (0 < p <= 1), out, support?, counts?)
//       -> undefined
//       the sampling distribution in one call: x = f32(logits / temperature) (the division in double, as
//       JavaScript's into a Float32Array), topKMask(x, topK) when 0 < topK < cols, topPMask(x, p) when p < 1,
//       softmax(x): the bits of those calls made one after the other (SamplingRow). Throws like softmax; a row
//       holding a NaN beside finite values comes out all NaN. support: Int32Array [rows*cols], counts: Int32Array
//       [rows]: row r's positive entries' ids ascending in support[r*cols, r*cols + counts[r]) (−1: a NaN row).
// out may alias the input for softmax, topKMask, topPMask and samplingProbs. Rows are independent.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "activation_kernels.h"
#include "common.h"
#include "families.h"
#include "isa.h"
#include "threadpool.h"

namespace specd {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/**
 * The largest value of x[0, cols) (NaN never wins; −Inf for a row without a non-NaN value), 16 lanes at a time:
 * each accumulator updated as `v > acc ? v : acc` (SSE MAXPS(v, acc) is exactly that: a NaN v keeps acc). The
 * same value as a one-pass scan but for the sign of a zero maximum (which −0 or +0 of the row comes out). With
 * kFlagNaN also whether the row holds a NaN (`*nan`), in the same pass.
 */
template <bool kFlagNaN>
float MaxRowImpl(const float* x, int64_t cols, bool* nan) {
  float m = kNegInf;
  bool any_nan = false;
  int64_t i = 0;
#if defined(__SSE2__)
  if (cols >= 16) {
    __m128 a0 = _mm_set1_ps(kNegInf), a1 = a0, a2 = a0, a3 = a0;
    __m128 n = _mm_setzero_ps();
    for (; i + 16 <= cols; i += 16) {
      const __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
      const __m128 v2 = _mm_loadu_ps(x + i + 8), v3 = _mm_loadu_ps(x + i + 12);
      a0 = _mm_max_ps(v0, a0);
      a1 = _mm_max_ps(v1, a1);
      a2 = _mm_max_ps(v2, a2);
      a3 = _mm_max_ps(v3, a3);
      if constexpr (kFlagNaN)
        n = _mm_or_ps(n, _mm_or_ps(_mm_cmpunord_ps(v0, v1), _mm_cmpunord_ps(v2, v3)));  // unordered: a NaN
    }
    if constexpr (kFlagNaN) any_nan = _mm_movemask_ps(n) != 0;
    float lanes[16];
    _mm_storeu_ps(lanes, a0);
    _mm_storeu_ps(lanes + 4, a1);
    _mm_storeu_ps(lanes + 8, a2);
    _mm_storeu_ps(lanes + 12, a3);
    for (const float v : lanes) m = v > m ? v : m;
  }
#endif
  for (; i < cols; ++i) {
    m = x[i] > m ? x[i] : m;
    if constexpr (kFlagNaN) any_nan = any_nan || std::isnan(x[i]);
  }
  if constexpr (kFlagNaN) *nan = any_nan;
  return m;
}

float MaxRow(const float* x, int64_t cols) { return MaxRowImpl<false>(x, cols, nullptr); }

/** First i with x[i] == m, 16 at a time (0 when there is none). */
int32_t FirstIndexOf(const float* x, int64_t cols, float m) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 mv = _mm_set1_ps(m);
  for (; i + 16 <= cols; i += 16) {
    const __m128 e =
        _mm_or_ps(_mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i), mv), _mm_cmpeq_ps(_mm_loadu_ps(x + i + 4), mv)),
                  _mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i + 8), mv), _mm_cmpeq_ps(_mm_loadu_ps(x + i + 12), mv)));
    if (_mm_movemask_ps(e) != 0) break;
  }
#endif
  for (; i < cols; ++i)
    if (x[i] == m) return static_cast<int32_t>(i);
  return 0;
}

/**
 * First index of the largest value of x[0, cols) (NaN never wins; a row of only NaN gives 0). Two passes that
 * run 16 lanes at a time (a branchy one-pass scan is scalar): the maximum m (MaxRow), then the first i with
 * x[i] == m. The same index as the one-pass scan: the first occurrence of m (−0 and +0 compare equal there too, so
 * the first zero of either sign when m is a zero); m = −Inf finds the first −Inf; a row without a non-NaN value
 * finds nothing (0).
 */
int32_t ArgmaxRow(const float* x, int64_t cols) { return FirstIndexOf(x, cols, MaxRow(x, cols)); }

/**
 * ArgmaxRow of a row a token may be chosen from, else −1: a NaN, +Infinity, or no finite value (−Infinity entries
 * are allowed: masked tokens) — core's checkLogitsRow rule. The NaN check rides in the maximum's pass; +Infinity
 * and "no finite value" are the maximum's own value (+Inf, −Inf).
 */
int32_t ArgmaxCheckedRow(const float* x, int64_t cols) {
  bool nan = false;
  const float m = MaxRowImpl<true>(x, cols, &nan);
  if (nan || !(m < std::numeric_limits<float>::infinity()) || !(m > kNegInf)) return -1;
  return FirstIndexOf(x, cols, m);
}

/** out[i] = exp((x[i] − mx)·inv_t) by activation_kernels.h's ExpF (AVX-512 where present; the same bits on every path).
 */
void ExpShift(const float* x, float* out, int64_t n, float mx, float inv_t) {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::ExpShiftAvx512(x, out, n, mx, inv_t);
#endif
  act::ExpShiftArray(x, out, n, mx, inv_t);
}

/** Σ x[0, n) in double in activation_kernels.h's SumF64Lanes16 order (AVX-512 where present; the same bits). */
double SumF64(const float* x, int64_t n) {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::SumF64Lanes16Avx512(x, n);
#endif
  return act::SumF64Lanes16(x, n);
}

/** Σ of the x[i] >= t in double (a fixed order; AVX-512 where present). */
double SumAtLeast(const float* x, int64_t n, float t) {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::SumAtLeastAvx512(x, n, t);
#endif
  return act::SumAtLeastArray(x, n, t);
}

/** o = f32(x / t) with the maximum of o and whether some o[i] is NaN (AVX-512 where present, the same bits). */
float DivideF64Max(const float* x, float* o, int64_t n, double t, bool* nan) {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::DivideF64MaxAvx512(x, o, n, t, nan);
#endif
  return act::DivideF64MaxArray(x, o, n, t, nan);
}

/** o[i] = x[i] · s → the largest o[i] (AVX-512 where present, the same bits). */
float ScaleMax(const float* x, float* o, int64_t n, float s) {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::ScaleMaxAvx512(x, o, n, s);
#endif
  return act::ScaleMaxArray(x, o, n, s);
}

/** The indices i with x[i] > 0, ascending, into idx; → how many. */
int64_t IndicesPositive(const float* x, int64_t n, int32_t* idx) {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::IndicesPositiveAvx512(x, n, idx);
#endif
  return act::IndicesPositiveArray(x, n, idx);
}

/** The indices i with x[i] >= t, ascending, into idx; → how many. */
int64_t IndicesAtLeast(const float* x, int64_t n, float t, int32_t* idx) {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return act::IndicesAtLeastAvx512(x, n, t, idx);
#endif
  return act::IndicesAtLeastArray(x, n, t, idx);
}

/**
 * Writes exp((x-max)/T)/sum into out (out may alias x); returns false when the row has no finite maximum. The
 * exponentials are ExpF's, 16 at a time (ExpShift), the same on every host (libm's FMA expf rounds differently: 2
 * floats of 2.2e9, activation_kernels.h); the sum a double sum in SumF64Lanes16's fixed order (16 partials: one
 * chain of dependent adds over the vocabulary cost a double add's latency per element).
 */
bool SoftmaxRow(const float* x, float* out, int64_t cols, float inv_t) {
  const float mx = MaxRow(x, cols);
  if (!std::isfinite(mx)) return false;
  ExpShift(x, out, cols, mx, inv_t);
  const double sum = SumF64(out, cols);
  const float inv_sum = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < cols; ++i) out[i] *= inv_sum;
  return true;
}

/**
 * softmax(x)'s largest probability, f32(1 / Σ exp(x − mx)) for the row's maximum mx (MaxRow's): SoftmaxRow's
 * exponentials and sum (so the same value as its entry at the argmax), without writing the row; NaN for a row without
 * a finite maximum.
 */
float MaxProbRow(const float* x, int64_t cols, float mx) {
  if (!std::isfinite(mx)) return std::numeric_limits<float>::quiet_NaN();
  thread_local std::vector<float> exps;
  if (exps.size() < static_cast<size_t>(cols)) exps.resize(static_cast<size_t>(cols));
  ExpShift(x, exps.data(), cols, mx, 1.0f);
  return static_cast<float>(1.0 / SumF64(exps.data(), cols));
}

struct RowsArgs {
  int64_t rows, cols;
  const float* x;
  float* out;
};

RowsArgs ReadRows(ArgReader& args, const char* x_name, size_t out_index) {
  RowsArgs r;
  r.rows = args.Int(1, "rows", 0);
  r.cols = args.Int(2, "cols", 1);
  const size_t total = CheckedProduct(args.call(), {r.rows, r.cols});
  r.x = args.F32(0, x_name, total, "rows*cols").Data();
  r.out = args.F32(out_index, "out", total, "rows*cols").Data();
  return r;
}

Napi::Value SoftmaxBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "softmax");
  RowsArgs r = ReadRows(args, "x", 4);
  const double t = args.Number(3, "temperature");
  if (!(t > 0)) args.Fail("temperature", "a number > 0", std::to_string(t));
  const float inv_t = static_cast<float>(1.0 / t);
  ParallelFor(
      r.rows,
      [&](int64_t b, int64_t e) {
        for (int64_t row = b; row < e; ++row) {
          if (!SoftmaxRow(r.x + row * r.cols, r.out + row * r.cols, r.cols, inv_t)) {
            throw KernelError("softmax: x: row " + std::to_string(row) + " has no finite value");
          }
        }
      },
      4 * r.cols);
  return info.Env().Undefined();
}

Napi::Value ArgmaxBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "argmax");
  const int64_t rows = args.Int(1, "rows", 0);
  const int64_t cols = args.Int(2, "cols", 1, INT32_MAX);
  auto x = args.F32(0, "x", CheckedProduct("argmax", {rows, cols}), "rows*cols");
  auto out = args.I32(3, "out", static_cast<size_t>(rows), "rows");
  const bool checked = info.Length() > 4 && info[4].IsBoolean() && info[4].As<Napi::Boolean>().Value();
  float* pp = info.Length() > 5 && !info[5].IsUndefined()
                  ? args.F32(5, "prob", static_cast<size_t>(rows), "rows").Data()
                  : nullptr;
  const float* px = x.Data();
  int32_t* po = out.Data();
  ParallelFor(
      rows,
      [&](int64_t b, int64_t e) {
        for (int64_t row = b; row < e; ++row) {
          const float* xr = px + row * cols;
          if (pp != nullptr) {
            // one maximum pass for the index and the probability
            const float mx = MaxRow(xr, cols);
            po[row] = checked ? ArgmaxCheckedRow(xr, cols) : FirstIndexOf(xr, cols, mx);
            pp[row] = MaxProbRow(xr, cols, mx);
          } else {
            po[row] = checked ? ArgmaxCheckedRow(xr, cols) : ArgmaxRow(xr, cols);
          }
        }
      },
      cols * (pp != nullptr ? 4 : 1));
  return info.Env().Undefined();
}

/**
 * The k-th largest of x[0, cols) with NaN counted as −Infinity (1 <= k <= cols); tmp has room for cols floats. The
 * values within δ = 1, 4, 16, … of the row's maximum are counted (one vectorisable pass each) until at least k are;
 * they hold the k largest, so only they are selected from (std::nth_element). A row where that set would be most of
 * it, or without a finite maximum, selects from the whole row. The value never depends on δ: at T 0.7 over SmolLM2's
 * 49,152 logits, top-k 40 selects from a few hundred values instead of all.
 */
float KthLargest(const float* x, int64_t cols, int64_t k, float* tmp) {
  const float mx = MaxRow(x, cols);
  for (float delta = 1.0f; std::isfinite(mx) && delta < 1e30f; delta *= 4.0f) {
    const float t = mx - delta;
    int64_t c = 0;
    for (int64_t i = 0; i < cols; ++i) c += x[i] >= t ? 1 : 0;  // NaN: not counted (it is −Infinity here)
    if (c < k) continue;
    if (2 * c > cols) break;
    int64_t n = 0;
    for (int64_t i = 0; i < cols; ++i)
      if (x[i] >= t) tmp[n++] = x[i];
    std::nth_element(tmp, tmp + (k - 1), tmp + n, std::greater<float>());
    return tmp[k - 1];
  }
  for (int64_t i = 0; i < cols; ++i) tmp[i] = std::isnan(x[i]) ? kNegInf : x[i];
  std::nth_element(tmp, tmp + (k - 1), tmp + cols, std::greater<float>());
  return tmp[k - 1];
}

/** One row of topKMask (o may alias x); tmp has room for cols floats. */
void TopKRow(const float* x, float* o, int64_t cols, int64_t k, float* tmp) {
  const float threshold = KthLargest(x, cols, k, tmp);
  for (int64_t i = 0; i < cols; ++i) o[i] = x[i] >= threshold ? x[i] : kNegInf;
}

Napi::Value TopKMaskBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "topKMask");
  RowsArgs r = ReadRows(args, "logits", 4);
  const int64_t k = args.Int(3, "k", 1, r.cols);
  ParallelFor(
      r.rows,
      [&](int64_t b, int64_t e) {
        std::vector<float> tmp(static_cast<size_t>(r.cols));
        for (int64_t row = b; row < e; ++row) TopKRow(r.x + row * r.cols, r.out + row * r.cols, r.cols, k, tmp.data());
      },
      8 * r.cols);
  return info.Env().Undefined();
}

/**
 * The smallest prefix of the tokens sorted by (prob desc, index asc) whose cumulative mass (a double sum in that
 * order) reaches p, at least one token: the full sort's set, found without sorting the row. It is left in
 * order[0, n) (that sorted order); → n. The tokens with prob >= t come first in that order for any threshold t, so
 * once such a set's sorted cumulative reaches p it holds the prefix, and only it is sorted. The thresholds tried are
 * mx · 2^−B for growing B (mx: the row's largest prob, MaxRow's), each taken when the (vectorised, fixed-order) mass
 * of the tokens at or above it reaches p; should their cumulative in the sorted order still fall short (the mass was
 * summed in another order), the next threshold is tried, and at last the whole row is sorted. The threshold changes
 * only the work, never the set. A peaked row (temperature 0.2, say) sorts a handful of tokens instead of the
 * vocabulary. `order` has room for cols entries.
 */
int64_t TopPKeep(const float* prob, int64_t cols, double p, float mx, int32_t* order) {
  const auto by_prob = [&](int32_t a, int32_t c) { return prob[a] > prob[c] || (prob[a] == prob[c] && a < c); };
  // the length of the sorted prefix of order[0, n) reaching p, or −1 when the n fall short
  const auto take = [&](int64_t n) -> int64_t {
    std::sort(order, order + n, by_prob);
    double c = 0.0;
    int64_t j = 0;
    while (j < n && (c += prob[order[j]]) < p) ++j;  // j: the token whose mass reaches p, or n
    if (j == n && n < cols) return -1;
    return j < n ? j + 1 : n;
  };
  for (const int b : {3, 7, 12, 20, 32, 48, 72, 100}) {
    const float t = std::ldexp(mx, -b);
    if (!(t > 0.0f)) break;
    if (SumAtLeast(prob, cols, t) < p) continue;
    const int64_t n = take(IndicesAtLeast(prob, cols, t, order));
    if (n >= 0) return n;
  }
  std::iota(order, order + cols, 0);  // the whole row
  return take(cols);
}

/**
 * Buffers of one row for topPMask and samplingProbs, one set per thread kept between calls (`For(cols)`): a
 * vocabulary-sized allocation per call (~0.6 MB at 49,152) came back from the kernel as fresh pages and cost more
 * page faults than the row's arithmetic. Held for the thread's life: 13 bytes × the largest vocabulary seen, per
 * pool thread (0.6 MB at 49,152).
 */
struct RowScratch {
  std::vector<float> prob, tmp;
  std::vector<int32_t> order;
  std::vector<uint8_t> keep;
  static RowScratch& For(int64_t cols) {
    thread_local RowScratch s;
    const auto n = static_cast<size_t>(cols);
    if (s.keep.size() < n) {  // keep last: a resize that throws leaves keep short, so the next call retries all
      s.prob.resize(n);
      s.tmp.resize(n);
      s.order.resize(n);
      s.keep.resize(n);
    }
    return s;
  }
};

/** One row of topPMask with p < 1 (o may alias x); false when the row has no finite value. */
bool TopPRow(const float* x, float* o, int64_t cols, double p, RowScratch& s) {
  if (!SoftmaxRow(x, s.prob.data(), cols, 1.0f)) return false;
  std::fill(s.keep.begin(), s.keep.begin() + cols, 0);
  const int64_t n = TopPKeep(s.prob.data(), cols, p, MaxRow(s.prob.data(), cols), s.order.data());
  for (int64_t q = 0; q < n; ++q) s.keep[s.order[q]] = 1;
  for (int64_t i = 0; i < cols; ++i) o[i] = s.keep[i] ? x[i] : kNegInf;
  return true;
}

Napi::Value TopPMaskBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "topPMask");
  RowsArgs r = ReadRows(args, "logits", 4);
  const double p = args.Number(3, "p");
  if (!(p > 0 && p <= 1)) args.Fail("p", "a number in (0, 1]", std::to_string(p));
  ParallelFor(
      r.rows,
      [&](int64_t b, int64_t e) {
        for (int64_t row = b; row < e; ++row) {
          const float* xr = r.x + row * r.cols;
          float* o = r.out + row * r.cols;
          if (p >= 1.0) {
            if (o != xr) std::copy(xr, xr + r.cols, o);
            continue;
          }
          if (!TopPRow(xr, o, r.cols, p, RowScratch::For(r.cols))) {
            throw KernelError("topPMask: logits: row " + std::to_string(row) + " has no finite value");
          }
        }
      },
      16 * r.cols);
  return info.Env().Undefined();
}

/**
 * One row of samplingProbs into o (o may alias x): o = f32(x / t), topKMask(k) when 0 < k < cols, topPMask(p) when
 * p < 1, softmax — the bits of those calls made one after the other. When `support` is given, the ids of o's
 * positive entries, ascending, go there. → how many (0 without `support`), −1 for a row holding a NaN beside finite
 * values (o is then all NaN), −2 for a row without a finite value (+Infinity, only −Infinity or NaN; o undefined).
 *
 * The row is made in fewer passes with the same bits: the division fused with the maximum and the NaN check; top-k
 * (KthLargest); the exponentials and their sum; the scale fused with the probabilities' maximum; top-p's candidates
 * (TopPKeep); then the final softmax over the kept tokens only: the masked row's maximum is the kept one's, its
 * exponentials are the same ExpF of the same differences, and its 16-partial double sum adds the kept values in the
 * same order (the masked ones add +0.0, which changes no partial), so only the kept entries are computed and the rest
 * written 0. At temperature 0.2 / top-p 0.9 over SmolLM2's 49,152 logits (AMD EPYC Zen 5, one thread, best of 5):
 * ~80 µs a row against ~130 for the calls one after the other (docs/BENCHMARKS.md, "The sampled row"); the division
 * (~15 µs) and the exponentials (~35) are most of what is left.
 */
int64_t SamplingRow(const float* x, float* o, int64_t cols, double t, int64_t k, double p, RowScratch& s,
                    int32_t* support) {
  bool nan = false;
  const float mx = DivideF64Max(x, o, cols, t, &nan);
  if (nan && mx > kNegInf && mx < std::numeric_limits<float>::infinity()) {
    // a NaN beside finite values: no distribution (sorting NaN probabilities has no order either)
    std::fill(o, o + cols, std::numeric_limits<float>::quiet_NaN());
    return -1;
  }
  // no finite value (+Infinity, only −Infinity or NaN): the softmax the calls end in fails on it (top-k and top-p
  // keep the maximum)
  if (!std::isfinite(mx)) return -2;
  // top-k keeps the maximum, so mx stays the masked row's
  if (k > 0 && k < cols) TopKRow(o, o, cols, k, s.tmp.data());
  float* prob = s.prob.data();
  // (the exponentials and their sum in two passes: fused into one they ran ~5 µs slower over 49,152)
  ExpShift(o, prob, cols, mx, 1.0f);
  const float inv_sum = static_cast<float>(1.0 / SumF64(prob, cols));
  if (p >= 1.0) {
    // softmax(o): its maximum is mx (up to the sign of a zero, which no difference o − mx sees), the same
    // exponentials and sum
    ScaleMax(prob, o, cols, inv_sum);
    return support != nullptr ? IndicesPositive(o, cols, support) : 0;
  }
  // topPMask(o, p): softmax(o) (prob), then the kept prefix in order[0, n)
  int32_t* kept = s.order.data();
  const int64_t n = TopPKeep(prob, cols, p, ScaleMax(prob, prob, cols, inv_sum), kept);
  std::sort(kept, kept + n);
  // softmax of the masked row over the kept tokens: maximum, ExpF of (o − max) · 1, the 16 partials in index order
  // (read before o is written)
  float* e = s.tmp.data();
  for (int64_t q = 0; q < n; ++q) e[q] = o[kept[q]];
  float km = kNegInf;
  for (int64_t q = 0; q < n; ++q) km = e[q] > km ? e[q] : km;
  double part[16] = {};
  for (int64_t q = 0; q < n; ++q) {
    e[q] = act::ExpF((e[q] - km) * 1.0f);
    part[kept[q] & 15] += static_cast<double>(e[q]);
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) part[l] += part[l + w];
  const float inv_kept = static_cast<float>(1.0 / part[0]);
  std::fill(o, o + cols, 0.0f);
  int64_t c = 0;
  for (int64_t q = 0; q < n; ++q) {
    const float v = e[q] * inv_kept;
    o[kept[q]] = v;
    if (support != nullptr && v > 0.0f) support[c++] = kept[q];
  }
  return c;
}

Napi::Value SamplingProbsBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "samplingProbs");
  RowsArgs r = ReadRows(args, "logits", 6);
  const double t = args.Number(3, "temperature");
  if (!(t > 0)) args.Fail("temperature", "a number > 0", std::to_string(t));
  const int64_t k = args.Int(4, "topK", 0, r.cols);
  const double p = args.Number(5, "topP");
  if (!(p > 0 && p <= 1)) args.Fail("topP", "a number in (0, 1]", std::to_string(p));
  // optional: support [rows*cols] i32 and counts [rows] i32 (SamplingRow's count per row)
  const bool with_support = info.Length() > 7 && !info[7].IsUndefined();
  int32_t* support = with_support
                         ? args.I32(7, "support", CheckedProduct(args.call(), {r.rows, r.cols}), "rows*cols").Data()
                         : nullptr;
  int32_t* counts = with_support ? args.I32(8, "counts", static_cast<size_t>(r.rows), "rows").Data() : nullptr;
  ParallelFor(
      r.rows,
      [&](int64_t b, int64_t e) {
        RowScratch& s = RowScratch::For(r.cols);
        for (int64_t row = b; row < e; ++row) {
          const int64_t n = SamplingRow(r.x + row * r.cols, r.out + row * r.cols, r.cols, t, k, p, s,
                                        support == nullptr ? nullptr : support + row * r.cols);
          if (n == -2) throw KernelError("samplingProbs: logits: row " + std::to_string(row) + " has no finite value");
          if (counts != nullptr) counts[row] = static_cast<int32_t>(n);
        }
      },
      24 * r.cols);
  return info.Env().Undefined();
}

}  // namespace

void RegisterSampling(Napi::Env env, Napi::Object exports) {
  exports.Set("softmax", Napi::Function::New(env, Guarded<SoftmaxBinding>, "softmax"));
  exports.Set("samplingProbs", Napi::Function::New(env, Guarded<SamplingProbsBinding>, "samplingProbs"));
  exports.Set("argmax", Napi::Function::New(env, Guarded<ArgmaxBinding>, "argmax"));
  exports.Set("topKMask", Napi::Function::New(env, Guarded<TopKMaskBinding>, "topKMask"));
  exports.Set("topPMask", Napi::Function::New(env, Guarded<TopPMaskBinding>, "topPMask"));
}

}  // namespace specd
