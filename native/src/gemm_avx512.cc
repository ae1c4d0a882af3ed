// AVX-512 GEMM kernels over packed bf16 weights (layout and reduction order: gemm_kernels.h).
// Compiled with -mavx512f/bw/vl/bf16/vnni; called only when isa.cc reports AVX-512 support.
// Intrinsics only, no STL (see CMakeLists.txt on ODR).
#include <immintrin.h>

#include "gemm_kernels.h"

namespace specd {
namespace gemm {
namespace {

constexpr int kRowTile = 8;  // rows per register tile
constexpr int kColTile = 2;  // 16-column panels per register tile (R*B accumulators <= 16)

inline void StoreRow(float* y, int64_t col, int64_t n, __m512 v) {
  const int64_t valid = n - col;
  if (valid >= 16) {
    _mm512_storeu_ps(y + col, v);
  } else {
    _mm512_mask_storeu_ps(y + col, static_cast<__mmask16>((1u << valid) - 1u), v);
  }
}

// fp32 activations: widen the bf16 pair line into two fp32 vectors (even k, odd k) and FMA.
template <int R, int B>
inline void TileF32(const Problem& p, int64_t row0, int64_t panel0) {
  const int64_t kpairs = KPairs(p.k);
  const int64_t full_pairs = p.k / 2;
  const int64_t panel_stride = kpairs * 32;  // uint16 per panel
  const uint16_t* w = p.packed + panel0 * panel_stride;
  const float* x = p.x + row0 * p.ldx;
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < full_pairs; ++kp) {
    __m512 w0[B], w1[B];
    for (int b = 0; b < B; ++b) {
      const __m512i v = _mm512_loadu_si512(w + b * panel_stride + kp * 32);
      w0[b] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      w1[b] = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 x0 = _mm512_set1_ps(x[r * p.ldx + 2 * kp]);
      const __m512 x1 = _mm512_set1_ps(x[r * p.ldx + 2 * kp + 1]);
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(x0, w0[b], acc[r][b]);
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(x1, w1[b], acc[r][b]);
    }
  }
  if (p.k & 1) {  // last k alone (its pair partner is padding and is skipped)
    const int64_t kp = full_pairs;
    for (int b = 0; b < B; ++b) {
      const __m512i v = _mm512_loadu_si512(w + b * panel_stride + kp * 32);
      const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      for (int r = 0; r < R; ++r) acc[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * p.ldx + 2 * kp]), w0, acc[r][b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) StoreRow(p.y + (row0 + r) * p.ldy, (panel0 + b) * kPanelCols, p.n, acc[r][b]);
}

// bf16 activations: one VDPBF16PS per pair line and row.
template <int R, int B>
inline void TileBf16(const Problem& p, int64_t row0, int64_t panel0) {
  const int64_t kpairs = KPairs(p.k);
  const int64_t panel_stride = kpairs * 32;
  const uint16_t* w = p.packed + panel0 * panel_stride;
  const uint32_t* xp = p.x_pairs + row0 * kpairs;
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kpairs; ++kp) {
    __m512bh wv[B];
    for (int b = 0; b < B; ++b) wv[b] = (__m512bh)_mm512_loadu_si512(w + b * panel_stride + kp * 32);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[r * kpairs + kp]));
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xv, wv[b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) StoreRow(p.y + (row0 + r) * p.ldy, (panel0 + b) * kPanelCols, p.n, acc[r][b]);
}

template <int B, bool kBf16>
inline void RowTail(const Problem& p, int64_t row0, int64_t rows, int64_t panel0) {
#define SPECD_TILE(R) (kBf16 ? TileBf16<R, B>(p, row0, panel0) : TileF32<R, B>(p, row0, panel0))
  switch (rows) {
    case 1: SPECD_TILE(1); break;
    case 2: SPECD_TILE(2); break;
    case 3: SPECD_TILE(3); break;
    case 4: SPECD_TILE(4); break;
    case 5: SPECD_TILE(5); break;
    case 6: SPECD_TILE(6); break;
    case 7: SPECD_TILE(7); break;
    default: break;
  }
#undef SPECD_TILE
}

template <int B, bool kBf16>
inline void AllRows(const Problem& p, int64_t panel0) {
  int64_t row = 0;
  for (; row + kRowTile <= p.m; row += kRowTile) {
    if (kBf16) {
      TileBf16<kRowTile, B>(p, row, panel0);
    } else {
      TileF32<kRowTile, B>(p, row, panel0);
    }
  }
  if (row < p.m) RowTail<B, kBf16>(p, row, p.m - row, panel0);
}

template <bool kBf16>
void Panels(const Problem& p, int64_t panel_begin, int64_t panel_end) {
  int64_t panel = panel_begin;
  for (; panel + kColTile <= panel_end; panel += kColTile) AllRows<kColTile, kBf16>(p, panel);
  for (; panel < panel_end; ++panel) AllRows<1, kBf16>(p, panel);
}

}  // namespace

void PanelsF32Avx512(const Problem& p, int64_t panel_begin, int64_t panel_end) {
  Panels<false>(p, panel_begin, panel_end);
}

void PanelsBf16Avx512(const Problem& p, int64_t panel_begin, int64_t panel_end) {
  Panels<true>(p, panel_begin, panel_end);
}

}  // namespace gemm
}  // namespace specd
