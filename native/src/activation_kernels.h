// SiLU / SwiGLU inner loops and softmax's exponentials, shared by activation.cc / sampling.cc (portable) and
// activation_avx512.cc. Plain header, static inline only (safe for the ISA files, see CMakeLists.txt).
//
// silu(g) = g / (1 + ExpF(-g)). ExpF is glibc's expf algorithm (sysdeps/ieee754/flt-32/e_expf.c,
// ARM optimized-routines: x·32/ln2 rounded to k, 2^(k/32) from a 32-entry table, a degree-3
// polynomial in double, one rounding to float; 0.502 ulp) written branch-free so that the loops
// vectorise: std::exp is a scalar libm call, ~5 ns an element, and was most of a verify block's SwiGLU
// time. It has the constants and operation order of glibc's build without FMA, and no FMA contraction here
// (CMakeLists.txt compiles activation_avx512.cc with -ffp-contract=off too), so every ISA path gives the same
// bits on every host. libm itself picks an FMA build of expf on CPUs with FMA, whose reduction rounds once less:
// against it (glibc 2.36, AMD EPYC Zen 5), every float in [−150, 100] compared, 2 of 2,245,918,722 differ, by one
// ulp (x = 0x1.04845ep+5 and −0x1.f8cbb2p+5). Each element depends on its own inputs only (batch and thread-count
// invariant).
#pragma once
#include <cstdint>
#include <cstring>

#include "kda_math.h"  // SPECD_KDA_VECTORIZABLE

namespace specd {
namespace act {

/** asuint64(2^(i/32)) - (i << 47): the scale 2^(k/32) is asdouble(T[k % 32] + (k << 47)). */
static const uint64_t kExp2Tab[32] = {0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
                                      0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
                                      0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
                                      0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
                                      0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
                                      0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
                                      0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
                                      0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

/** expf(x) with glibc's bits: NaN -> NaN, x >= 88.73 -> +inf, x <= -103.98 -> 0 (denormals kept). */
SPECD_KDA_VECTORIZABLE static inline float ExpF(float x) {
  // Clamped so that k stays small (the clamped values still give +inf and 0); NaN passes through.
  const float xc = x < -150.0f ? -150.0f : (x > 100.0f ? 100.0f : x);
  const double xd = xc;
  const double z = 0x1.71547652b82fep+0 * 32 * xd;
  double kd = z + 0x1.8p+52;  // round to nearest: k in the low bits
  uint64_t ki;
  std::memcpy(&ki, &kd, sizeof ki);
  kd -= 0x1.8p+52;
  const double r = z - kd;
  const uint64_t t = kExp2Tab[ki % 32] + (ki << 47);
  double s;
  std::memcpy(&s, &t, sizeof s);
  const double zz = 0x1.c6af84b912394p-5 / 32 / 32 / 32 * r + 0x1.ebfce50fac4f3p-3 / 32 / 32;
  const double r2 = r * r;
  double y = 0x1.62e42ff0c52d6p-1 / 32 * r + 1;
  y = zz * r2 + y;
  return static_cast<float>(y * s);
}

/** o[i] = silu(g[i]) (o may alias g). */
SPECD_KDA_VECTORIZABLE static inline void SiluArray(const float* g, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + ExpF(-g[i]));
}

/** o[i] = silu(g[i]) * u[i] (o may alias g or u). */
SPECD_KDA_VECTORIZABLE static inline void SwigluArray(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + ExpF(-g[i])) * u[i];
}

/** o[i] = ExpF((x[i] - mx) * inv_t): softmax's exponentials (sampling.cc; o may alias x). */
SPECD_KDA_VECTORIZABLE static inline void ExpShiftArray(const float* x, float* o, int64_t n, float mx, float inv_t) {
  for (int64_t i = 0; i < n; ++i) o[i] = ExpF((x[i] - mx) * inv_t);
}

/**
 * Σ x[0, n) in double, in a fixed order: 16 partial sums, x[i] added to partial i mod 16 in index order, then the
 * partials folded in halves (p[l] += p[l + 8], then + 4, + 2, + 1). The AVX-512 version adds the same values in the
 * same order (two registers of 8 doubles, the folds lane-wise), so every path gives the same bits. Softmax's
 * normaliser (sampling.cc): 16 independent chains instead of one (a double add's latency per element).
 */
static inline double SumF64Lanes16(const float* x, int64_t n) {
  double p[16] = {};
  for (int64_t i = 0; i < n; ++i) p[i & 15] += static_cast<double>(x[i]);
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) p[l] += p[l + w];
  return p[0];
}

/** Σ of the x[i] >= t, in double (SumF64Lanes16's order over the kept values; the others add 0). */
static inline double SumAtLeastArray(const float* x, int64_t n, float t) {
  double p[16] = {};
  for (int64_t i = 0; i < n; ++i) p[i & 15] += x[i] >= t ? static_cast<double>(x[i]) : 0.0;
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) p[l] += p[l + w];
  return p[0];
}

/** Writes the indices i with x[i] >= t into idx in ascending order; returns how many. */
static inline int64_t IndicesAtLeastArray(const float* x, int64_t n, float t, int32_t* idx) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] >= t) idx[c++] = static_cast<int32_t>(i);
  return c;
}

/**
 * o[i] = f32(f64(x[i]) / t) (o may alias x): a temperature applied as JavaScript does into a Float32Array, fused with
 * the maximum of its output: returns the largest o[i] (NaN never wins: `v > m ? v : m`; −Inf when there is none) and
 * sets *nan when some o[i] is NaN. samplingProbs's first pass (sampling.cc).
 */
static inline float DivideF64MaxArray(const float* x, float* o, int64_t n, double t, bool* nan) {
  float m = -__builtin_inff();
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(static_cast<double>(x[i]) / t);
    o[i] = v;
    m = v > m ? v : m;
    any = any || v != v;
  }
  *nan = any;
  return m;
}

/** o[i] = x[i] · s (f32; o may alias x); returns the largest o[i] (as DivideF64MaxArray; −Inf when n = 0). */
static inline float ScaleMaxArray(const float* x, float* o, int64_t n, float s) {
  float m = -__builtin_inff();
  for (int64_t i = 0; i < n; ++i) {
    o[i] = x[i] * s;
    m = o[i] > m ? o[i] : m;
  }
  return m;
}

/** Writes the indices i with x[i] > 0 into idx in ascending order; returns how many. */
static inline int64_t IndicesPositiveArray(const float* x, int64_t n, int32_t* idx) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > 0.0f) idx[c++] = static_cast<int32_t>(i);
  return c;
}

double SumF64Lanes16Avx512(const float* x, int64_t n);
float DivideF64MaxAvx512(const float* x, float* o, int64_t n, double t, bool* nan);
float ScaleMaxAvx512(const float* x, float* o, int64_t n, float s);
int64_t IndicesPositiveAvx512(const float* x, int64_t n, int32_t* idx);
double SumAtLeastAvx512(const float* x, int64_t n, float t);
int64_t IndicesAtLeastAvx512(const float* x, int64_t n, float t, int32_t* idx);
void SiluAvx512(const float* g, float* o, int64_t n);
void ExpShiftAvx512(const float* x, float* o, int64_t n, float mx, float inv_t);
void SwigluAvx512(const float* g, const float* u, float* o, int64_t n);

}  // namespace act
}  // namespace specd
