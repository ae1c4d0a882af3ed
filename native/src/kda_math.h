// exp for the KDA kernels: a branch-free fp32 exp (Cephes expf polynomial, ~1 ulp on its range)
// written in plain C++ so that loops over arrays auto-vectorise at the baseline ISA; std::exp is a
// scalar libm call and was most of the cost of a recurrent token (conv SiLU + decay: 4·d calls per
// head and token). Plain header, static inline only (safe for the ISA files, see CMakeLists.txt).
//
// Contract: x NaN -> NaN; x < -87.3 -> +0 (no denormals); x > 88 -> +inf (exp(88..88.72) is finite
// but within 2x of FLT_MAX: overflow is reported early, harmless for sigmoid/SiLU and decays <= 1).
#pragma once
#include <cstdint>
#include <cstring>

// The selects below are compares of floats: with the default -ftrapping-math GCC keeps them as
// branches and does not vectorise the loops. no-trapping-math only allows if-conversion here (no
// reassociation, no contraction): results are unchanged, bit for bit.
#if defined(__GNUC__) && !defined(__clang__)
#define SPECD_KDA_VECTORIZABLE __attribute__((optimize("no-trapping-math")))
#else
#define SPECD_KDA_VECTORIZABLE
#endif

namespace specd {
namespace kda {

SPECD_KDA_VECTORIZABLE static inline float Exp(float x) {
  const float lo = -87.3f, hi = 88.0f;
  const float xc = x < lo ? lo : (x > hi ? hi : x);  // NaN passes through (comparisons are false)
  const float magic = 12582912.0f;                   // 1.5 * 2^23: adding it rounds to an integer
  const float t = xc * 1.44269504088896341f + magic;
  const float n = t - magic;        // round(x * log2(e))
  float r = xc - n * 0.693359375f;  // x - n ln2, ln2 split in two parts
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = (p * r) * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  const int32_t e = (bits - 0x4B400000 + 127) << 23;  // 2^n, n in [-126, 127]
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  const float out = y * scale;
  return x < lo ? 0.0f : (x > hi ? __builtin_inff() : out);
}

/**
 * softplus(x) = log(1 + e^x) with torch's threshold (x > 20 -> x), fp32: max(x, 0) + log1p(u), u = Exp(-|x|)
 * in (0, 1], log1p(u) = 2·atanh(s) with s = u / (2 + u) in (0, 1/3] summed as the odd series to s^13
 * (truncation < 2e-8 relative). Measured against the double formula on [-40, 40]: ≤ 3 ulp (2.1e-7 relative).
 */
SPECD_KDA_VECTORIZABLE static inline float Softplus(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float u = Exp(-ax);
  const float s = u / (2.0f + u);
  const float s2 = s * s;
  float p = 1.0f / 13.0f;
  p = p * s2 + 1.0f / 11.0f;
  p = p * s2 + 1.0f / 9.0f;
  p = p * s2 + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  const float log1p_u = 2.0f * s + 2.0f * s * (s2 * p);
  const float pos = x > 0.0f ? x : 0.0f;
  return x > 20.0f ? x : pos + log1p_u;
}

/** y[i] = Exp(x[i]) (y may alias x). */
SPECD_KDA_VECTORIZABLE static inline void ExpArray(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Exp(x[i]);
}

/** y[i] = x[i] / (1 + Exp(-x[i])) in place (SiLU). */
SPECD_KDA_VECTORIZABLE static inline void SiluInPlace(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] / (1.0f + Exp(-y[i]));
}

/**
 * Gated RMSNorm's scaling of one row (norm.cc): y[i] = ((x[i] · inv) · w[i]) · act(g[i]), act = sigmoid
 * (1 / (1 + Exp(-g))) or, with `silu`, g / (1 + Exp(-g)). Elementwise, so y may alias x or g.
 */
SPECD_KDA_VECTORIZABLE static inline void GatedScaleArray(const float* x, const float* w, const float* g, float inv,
                                                          bool silu, float* y, int64_t n) {
  if (silu) {
    for (int64_t i = 0; i < n; ++i) y[i] = ((x[i] * inv) * w[i]) * (g[i] / (1.0f + Exp(-g[i])));
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = ((x[i] * inv) * w[i]) * (1.0f / (1.0f + Exp(-g[i])));
  }
}

/** g[i] = a · Softplus(f[i] + dt[i]): KDA's forget gate of one head (kdaGate, kda.cc). */
SPECD_KDA_VECTORIZABLE static inline void GateRowArray(const float* f, const float* dt, float a, float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = a * Softplus(f[i] + dt[i]);
}

}  // namespace kda
}  // namespace specd
