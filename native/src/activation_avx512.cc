// AVX-512 SiLU / SwiGLU and softmax's exponentials: activation_kernels.h's ExpF on 16 lanes (two halves of 8 doubles),
// the same operations in the same order (this file is compiled with -ffp-contract=off, CMakeLists.txt), so the same
// bits as the portable loops. Called only when isa.cc reports AVX-512. Intrinsics and plain headers only, no STL (ODR,
// CMakeLists.txt).
// GCC 12's avx512fintrin.h fills the pass-through operand of some masked builtins (_mm512_shuffle_f64x2,
// _mm512_extractf64x4_pd) with a deliberately undefined register, and -Wuninitialized then warns inside the header
// once Fold16 is inlined (a false positive, fixed in GCC 13): silenced for that header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "activation_kernels.h"

namespace specd {
namespace act {
namespace {

/** ExpF of 8 floats (already clamped to [-150, 100] or NaN), as 8 floats. */
inline __m256 Exp8(__m256 xc) {
  const __m512d xd = _mm512_cvtps_pd(xc);
  const __m512d shift = _mm512_set1_pd(0x1.8p+52);
  const __m512d z = _mm512_mul_pd(_mm512_set1_pd(0x1.71547652b82fep+0 * 32), xd);
  __m512d kd = _mm512_add_pd(z, shift);
  const __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, shift);
  const __m512d r = _mm512_sub_pd(z, kd);
  const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
  const __m512i* tab = reinterpret_cast<const __m512i*>(kExp2Tab);
  const __m512i lo = _mm512_permutex2var_epi64(_mm512_loadu_si512(tab), idx, _mm512_loadu_si512(tab + 1));
  const __m512i hi = _mm512_permutex2var_epi64(_mm512_loadu_si512(tab + 2), idx, _mm512_loadu_si512(tab + 3));
  const __m512i tv = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), lo, hi);
  const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(tv, _mm512_slli_epi64(ki, 47)));
  const __m512d zz = _mm512_add_pd(_mm512_mul_pd(_mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r),
                                   _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_add_pd(_mm512_mul_pd(_mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r), _mm512_set1_pd(1.0));
  y = _mm512_add_pd(_mm512_mul_pd(zz, r2), y);
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

/** ExpF of 16 floats: clamped as ExpF clamps, then two halves of 8. */
inline __m512 Exp16(__m512 x) {
  // x < -150 ? -150 : (x > 100 ? 100 : x), NaN kept (max/min return their second operand on NaN)
  x = _mm512_min_ps(_mm512_set1_ps(100.0f), _mm512_max_ps(_mm512_set1_ps(-150.0f), x));
  const __m256 e0 = Exp8(_mm512_castps512_ps256(x));
  const __m256 e1 = Exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(e0)), _mm256_castps_pd(e1), 1));
}

/** silu of 16 lanes: g / (1 + ExpF(-g)). */
inline __m512 Silu16(__m512 g) {
  const __m512 e = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

inline __mmask16 Tail(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

}  // namespace

void SiluAvx512(const float* g, float* o, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = Tail(n - i);
    _mm512_mask_storeu_ps(o + i, m, Silu16(_mm512_maskz_loadu_ps(m, g + i)));
  }
}

void ExpShiftAvx512(const float* x, float* o, int64_t n, float mx, float inv_t) {
  const __m512 m = _mm512_set1_ps(mx), s = _mm512_set1_ps(inv_t), zero_at = _mm512_set1_ps(-104.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = Tail(n - i);
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m), s);
    // ExpF(d) is exactly 0 for d <= −104 (e^−104 < 2^−150, half the least denormal): 16 such lanes (a masked row's
    // −Infinity entries, top-k's) are written 0 without the polynomial
    if (_mm512_mask_cmp_ps_mask(k, d, zero_at, _CMP_GT_OQ) == 0) _mm512_mask_storeu_ps(o + i, k, _mm512_setzero_ps());
    else _mm512_mask_storeu_ps(o + i, k, Exp16(d));
  }
}

void SwigluAvx512(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = Tail(n - i);
    const __m512 s = Silu16(_mm512_maskz_loadu_ps(m, g + i));
    _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

namespace {

/** The two registers' 16 partials folded as SumF64Lanes16 folds them: + 8 lane-wise, then + 4, + 2, + 1. */
inline double Fold16(__m512d a0, __m512d a1) {
  const __m512d s8 = _mm512_add_pd(a0, a1);
  const __m256d s4 =
      _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_castpd512_pd256(_mm512_shuffle_f64x2(s8, s8, 0xEE)));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

}  // namespace

double SumF64Lanes16Avx512(const float* x, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    // a tail's missing lanes add +0.0: no change to a partial (every partial is +0.0 or a sum of floats)
    const __m512 v = _mm512_maskz_loadu_ps(Tail(n - i), x + i);
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE))));
  }
  return Fold16(a0, a1);
}

double SumAtLeastAvx512(const float* x, int64_t n, float t) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  const __m512 tv = _mm512_set1_ps(t);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 tail = Tail(n - i);
    const __m512 raw = _mm512_maskz_loadu_ps(tail, x + i);
    const __m512 v = _mm512_maskz_mov_ps(_mm512_mask_cmp_ps_mask(tail, raw, tv, _CMP_GE_OQ), raw);
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE))));
  }
  return Fold16(a0, a1);
}

int64_t IndicesAtLeastAvx512(const float* x, int64_t n, float t, int32_t* idx) {
  const __m512 tv = _mm512_set1_ps(t);
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t c = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 tail = Tail(n - i);
    const __mmask16 k = _mm512_mask_cmp_ps_mask(tail, _mm512_maskz_loadu_ps(tail, x + i), tv, _CMP_GE_OQ);
    if (k == 0) continue;
    _mm512_mask_compressstoreu_epi32(idx + c, k, _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int>(i))));
    c += __builtin_popcount(k);
  }
  return c;
}

float DivideF64MaxAvx512(const float* x, float* o, int64_t n, double t, bool* nan) {
  const __m512d d = _mm512_set1_pd(t);
  __m256 m = _mm256_set1_ps(-__builtin_inff());
  __mmask8 bad = 0;
  for (int64_t i = 0; i < n; i += 8) {
    const __mmask8 k = static_cast<__mmask8>(n - i >= 8 ? 0xff : (1u << (n - i)) - 1u);
    const __m256 v = _mm512_cvtpd_ps(_mm512_div_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, x + i)), d));
    _mm256_mask_storeu_ps(o + i, k, v);
    m = _mm256_mask_max_ps(m, k, v, m);  // MAXPS(v, m): a NaN v keeps m
    bad = static_cast<__mmask8>(bad | _mm256_mask_cmp_ps_mask(k, v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = -__builtin_inff();
  for (const float v : lanes) r = v > r ? v : r;
  *nan = bad != 0;
  return r;
}

float ScaleMaxAvx512(const float* x, float* o, int64_t n, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  __m512 m = _mm512_set1_ps(-__builtin_inff());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = Tail(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sv);
    _mm512_mask_storeu_ps(o + i, k, v);
    m = _mm512_mask_max_ps(m, k, v, m);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  float r = -__builtin_inff();
  for (const float v : lanes) r = v > r ? v : r;
  return r;
}

int64_t IndicesPositiveAvx512(const float* x, int64_t n, int32_t* idx) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t c = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 tail = Tail(n - i);
    const __mmask16 k =
        _mm512_mask_cmp_ps_mask(tail, _mm512_maskz_loadu_ps(tail, x + i), _mm512_setzero_ps(), _CMP_GT_OQ);
    if (k == 0) continue;
    _mm512_mask_compressstoreu_epi32(idx + c, k, _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int>(i))));
    c += __builtin_popcount(k);
  }
  return c;
}

}  // namespace act
}  // namespace specd
