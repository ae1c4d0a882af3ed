// AVX-512 multi-token KDA recurrent kernel (math, blocking and reduction order: kda_kernels.h).
// Compiled with the AVX-512 flags; called only when isa.cc reports AVX-512 support. Intrinsics
// only, no STL (CMakeLists.txt).
//
// For each column block of up to 64 value channels (4 zmm), copied to the contiguous work buffer
// (lanes beyond d are zero there and never written back), and each token: pass 1 over the key rows
// i accumulates pred over the decayed rows alpha_i S[i] (FMA) without storing them; u = beta
// (v - pred); pass 2 recomputes alpha_i S[i] (the same product, so the same bits), adds k_i u
// (FMA), stores the row (and the optional snapshot row) and accumulates o (FMA). Throughput-bound on
// FP ops (~5 per state element and token); splitting the accumulators by even/odd i was measured
// and gained nothing.
#include <immintrin.h>

#include "kda_chunk.h"
#include "kda_kernels.h"
#include "kda_math.h"

namespace specd {
namespace kda {
namespace {

constexpr int kVecs = static_cast<int>(kColBlock / 16);

inline __mmask16 LaneMask(int64_t valid) {
  if (valid >= 16) return static_cast<__mmask16>(0xffff);
  if (valid <= 0) return static_cast<__mmask16>(0);
  return static_cast<__mmask16>((1u << valid) - 1u);
}

/**
 * All tokens on one column block whose valid lanes are given by m (B = zmm per row in use); the
 * block lives in `blk` ([d][kColBlock], contiguous) meanwhile.
 */
template <int B>
void Block(const Steps& s, int64_t j0, const __mmask16 (&m)[kVecs]) {
  const int64_t d = s.d;
  float* blk = s.work;
  for (int64_t i = 0; i < d; ++i)
    for (int b = 0; b < B; ++b)
      _mm512_storeu_ps(blk + i * kColBlock + 16 * b, _mm512_maskz_loadu_ps(m[b], s.state + i * d + j0 + 16 * b));
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* q = s.q + t * d;
    const float* k = s.k + t * d;
    const float* alpha = s.alpha + t * d;
    __m512 acc[B];
    for (int b = 0; b < B; ++b) acc[b] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; ++i) {
      const float* row = blk + i * kColBlock;
      const __m512 a = _mm512_set1_ps(alpha[i]);
      const __m512 ki = _mm512_set1_ps(k[i]);
      for (int b = 0; b < B; ++b) acc[b] = _mm512_fmadd_ps(ki, _mm512_mul_ps(_mm512_loadu_ps(row + 16 * b), a), acc[b]);
    }
    const __m512 vbeta = _mm512_set1_ps(s.beta[t]);
    __m512 u[B];
    for (int b = 0; b < B; ++b) {
      u[b] = _mm512_mul_ps(vbeta, _mm512_sub_ps(_mm512_maskz_loadu_ps(m[b], s.v + t * d + j0 + 16 * b), acc[b]));
      acc[b] = _mm512_setzero_ps();
    }
    float* snap = s.snap ? s.snap + t * s.ld_snap : nullptr;
    for (int64_t i = 0; i < d; ++i) {
      float* row = blk + i * kColBlock;
      const __m512 a = _mm512_set1_ps(alpha[i]);
      const __m512 ki = _mm512_set1_ps(k[i]);
      const __m512 qi = _mm512_set1_ps(q[i]);
      for (int b = 0; b < B; ++b) {
        const __m512 x = _mm512_fmadd_ps(ki, u[b], _mm512_mul_ps(_mm512_loadu_ps(row + 16 * b), a));
        _mm512_storeu_ps(row + 16 * b, x);
        if (snap) _mm512_mask_storeu_ps(snap + i * d + j0 + 16 * b, m[b], x);
        acc[b] = _mm512_fmadd_ps(qi, x, acc[b]);
      }
    }
    for (int b = 0; b < B; ++b) _mm512_mask_storeu_ps(s.o + t * s.ldo + j0 + 16 * b, m[b], acc[b]);
  }
  for (int64_t i = 0; i < d; ++i)
    for (int b = 0; b < B; ++b)
      _mm512_mask_storeu_ps(s.state + i * d + j0 + 16 * b, m[b], _mm512_loadu_ps(blk + i * kColBlock + 16 * b));
}

}  // namespace

void StepsAvx512(const Steps& s) {
  for (int64_t j0 = 0; j0 < s.d; j0 += kColBlock) {
    __mmask16 m[kVecs];
    for (int b = 0; b < kVecs; ++b) m[b] = LaneMask(s.d - j0 - 16 * b);
    const int64_t width = s.d - j0 < kColBlock ? s.d - j0 : kColBlock;
    switch ((width + 15) / 16) {
      case 1: Block<1>(s, j0, m); break;
      case 2: Block<2>(s, j0, m); break;
      case 3: Block<3>(s, j0, m); break;
      default: Block<4>(s, j0, m); break;
    }
  }
}

void ExpAvx512(const float* x, float* y, int64_t n) { ExpArray(x, y, n); }
void GatedScaleAvx512(const float* x, const float* w, const float* g, float inv, bool silu, float* y, int64_t n) {
  GatedScaleArray(x, w, g, inv, silu, y, n);
}
void GateRowAvx512(const float* f, const float* dt, float a, float* g, int64_t n) { GateRowArray(f, dt, a, g, n); }

namespace {

/** Lane permutations that (de)interleave 16 channels of the [C][3] state and [C][4] weights. */
struct ConvTables {
  int32_t s1[3][16], s2[3][16];  // A_j[c] = st[3c + j]: two-step gather from the 3 state registers
  int32_t w[4][16];              // W_j[c] = w[4c + j]: 4 (c mod 8) + j within a register pair
  int32_t o1[3][16], o2[3][16];  // new state register r, lane l: e = 16 r + l -> (s1 | s2 | x)[e / 3]
};

ConvTables MakeConvTables() {
  ConvTables t{};
  for (int j = 0; j < 3; ++j)
    for (int c = 0; c < 16; ++c) {
      const int e = 3 * c + j;
      t.s1[j][c] = e < 32 ? e : 0;
      t.s2[j][c] = e < 32 ? c : 16 + (e - 32);
    }
  for (int j = 0; j < 4; ++j)
    for (int c = 0; c < 16; ++c) t.w[j][c] = 4 * (c % 8) + j;
  for (int r = 0; r < 3; ++r)
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * r + l, c = e / 3, j = e % 3;
      t.o1[r][l] = j == 0 ? c : (j == 1 ? 16 + c : 0);
      t.o2[r][l] = j == 2 ? 16 + c : l;
    }
  return t;
}

inline __m512i Idx(const int32_t* v) { return _mm512_loadu_si512(v); }

}  // namespace

void ConvAvx512(const float* x_row, const float* w, float* conv, int64_t ch0, int64_t n, float* y) {
  static const ConvTables t = MakeConvTables();
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const int64_t ch = ch0 + c;
    float* st = conv + ch * 3;
    const float* wc = w + ch * 4;
    const __m512 r0 = _mm512_loadu_ps(st), r1 = _mm512_loadu_ps(st + 16), r2 = _mm512_loadu_ps(st + 32);
    __m512 s[3];
    for (int j = 0; j < 3; ++j)
      s[j] = _mm512_permutex2var_ps(_mm512_permutex2var_ps(r0, Idx(t.s1[j]), r1), Idx(t.s2[j]), r2);
    const __m512 w0 = _mm512_loadu_ps(wc), w1 = _mm512_loadu_ps(wc + 16), w2 = _mm512_loadu_ps(wc + 32),
                 w3 = _mm512_loadu_ps(wc + 48);
    __m512 wj[4];
    for (int j = 0; j < 4; ++j)
      wj[j] = _mm512_mask_blend_ps(static_cast<__mmask16>(0xff00), _mm512_permutex2var_ps(w0, Idx(t.w[j]), w1),
                                   _mm512_permutex2var_ps(w2, Idx(t.w[j]), w3));
    const __m512 x = _mm512_loadu_ps(x_row + ch);
    // Same operations and order as the portable loop (no FMA): bit-identical conv on both paths.
    __m512 acc = _mm512_mul_ps(wj[0], s[0]);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(wj[1], s[1]));
    acc = _mm512_add_ps(acc, _mm512_mul_ps(wj[2], s[2]));
    acc = _mm512_add_ps(acc, _mm512_mul_ps(wj[3], x));
    _mm512_storeu_ps(y + c, acc);
    for (int r = 0; r < 3; ++r)
      _mm512_storeu_ps(st + 16 * r,
                       _mm512_permutex2var_ps(_mm512_permutex2var_ps(s[1], Idx(t.o1[r]), s[2]), Idx(t.o2[r]), x));
  }
  for (; c < n; ++c) {
    const int64_t ch = ch0 + c;
    float* st = conv + ch * 3;
    const float* wc = w + ch * 4;
    const float xv = x_row[ch];
    float acc = wc[0] * st[0];
    acc = acc + wc[1] * st[1];
    acc = acc + wc[2] * st[2];
    acc = acc + wc[3] * xv;
    st[0] = st[1];
    st[1] = st[2];
    st[2] = xv;
    y[c] = acc;
  }
}
void SiluAvx512(float* y, int64_t n) { SiluInPlace(y, n); }
void ChunkAvx512(const ChunkArgs& a) { ChunkMath(a); }

}  // namespace kda
}  // namespace specd
