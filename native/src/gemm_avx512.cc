// AVX-512 GEMM kernels over packed bf16 weights (layout and reduction order: gemm_kernels.h).
// Compiled with -mavx512f/bw/vl/bf16/vnni; called only when isa.cc reports AVX-512 support.
// Intrinsics only, no STL (see CMakeLists.txt on ODR).
//
// Schedule, for one thread's range of panels:
//   for each panel pair (B = 2 panels = 32 output columns; a last odd panel alone):
//     for each K block of kBlockPairs pairs (weights of the block: 2 x 128 x 64 B = 16 KiB, in L1):
//       for each row tile of <= 8 rows:  R x B fp32 accumulators in registers, loaded from / saved
//                                        to `scratch` between K blocks (exact: fp32 store/load)
// The first row tile streams the weight block from memory (software prefetch kPrefetchPairs lines
// ahead, because the hardware streamer stops at 4 KiB pages); later row tiles re-read it from L1,
// so a verify GEMM of 16 tokens streams the weights once. Each output element still sees exactly
// one accumulator updated for k = 0..K-1 in order: batch invariant.
#include <immintrin.h>

#include "gemm_kernels.h"

namespace specd {
namespace gemm {
namespace {

#ifndef SPECD_GEMM_PREFETCH
#define SPECD_GEMM_PREFETCH 128
#endif
constexpr int64_t kPrefetchPairs = SPECD_GEMM_PREFETCH;  // prefetch distance (one K block), pair lines
constexpr int64_t kBlockPairs = 128;                     // K pairs per block
constexpr int kRowTile = 8;                              // rows per register tile
constexpr int kColTile = 2;                              // panels per register tile

inline void StoreRow(float* y, int64_t col, int64_t n, __m512 v, bool accumulate) {
  const int64_t valid = n - col;
  if (valid >= 16) {
    _mm512_storeu_ps(y + col, accumulate ? _mm512_add_ps(_mm512_loadu_ps(y + col), v) : v);
  } else {
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    _mm512_mask_storeu_ps(y + col, mask, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y + col), v) : v);
  }
}

/** Where one tile's accumulators live between K blocks, and which block this is. */
struct Block {
  int64_t kp_begin, kp_end;  // pair range of this block
  bool first, last;          // first: start from +0; last: finish odd k and write Y
  float* scratch;            // [R][B][16] fp32 accumulators of this tile
};

template <int R, int B>
inline void LoadAcc(__m512 (&acc)[R][B], const Block& blk) {
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b)
      acc[r][b] = blk.first ? _mm512_setzero_ps() : _mm512_loadu_ps(blk.scratch + (r * B + b) * 16);
}

template <int R, int B>
inline void SaveAcc(const Problem& p, const __m512 (&acc)[R][B], const Block& blk, int64_t row0, int64_t panel0) {
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) {
      if (blk.last) {
        StoreRow(p.y + (row0 + r) * p.ldy, (panel0 + b) * kPanelCols, p.n, acc[r][b], p.accumulate);
      } else {
        _mm512_storeu_ps(blk.scratch + (r * B + b) * 16, acc[r][b]);
      }
    }
}

// fp32 activations: widen each bf16 pair line into two fp32 vectors (even k, odd k) and FMA.
template <int R, int B>
void TileF32(const Problem& p, int64_t row0, int64_t panel0, const Block& blk) {
  const int64_t panel_stride = PanelPairs(p.k) * 32;  // uint16 per panel
  const int64_t full_pairs = p.k / 2;
  const uint16_t* w = p.packed + panel0 * panel_stride;
  const float* x = p.x + row0 * p.ldx;
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t kp_end = blk.kp_end < full_pairs ? blk.kp_end : full_pairs;
  __m512 acc[R][B];
  LoadAcc<R, B>(acc, blk);
  for (int64_t kp = blk.kp_begin; kp < kp_end; ++kp) {
    __m512 w0[B], w1[B];
    for (int b = 0; b < B; ++b) {
      _mm_prefetch(reinterpret_cast<const char*>(w + b * panel_stride + (kp + kPrefetchPairs) * 32), _MM_HINT_T0);
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
  if (blk.last && (p.k & 1)) {  // last k alone (its pair partner is padding and is skipped)
    const int64_t kp = full_pairs;
    for (int b = 0; b < B; ++b) {
      const __m512i v = _mm512_loadu_si512(w + b * panel_stride + kp * 32);
      const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      for (int r = 0; r < R; ++r) acc[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * p.ldx + 2 * kp]), w0, acc[r][b]);
    }
  }
  SaveAcc<R, B>(p, acc, blk, row0, panel0);
}

template <int B>
void RowTile(const Problem& p, int64_t row0, int64_t rows, int64_t panel0, const Block& blk) {
  switch (rows) {
    case 1: TileF32<1, B>(p, row0, panel0, blk); break;
    case 2: TileF32<2, B>(p, row0, panel0, blk); break;
    case 3: TileF32<3, B>(p, row0, panel0, blk); break;
    case 4: TileF32<4, B>(p, row0, panel0, blk); break;
    case 5: TileF32<5, B>(p, row0, panel0, blk); break;
    case 6: TileF32<6, B>(p, row0, panel0, blk); break;
    case 7: TileF32<7, B>(p, row0, panel0, blk); break;
    case 8: TileF32<8, B>(p, row0, panel0, blk); break;
    default: break;
  }
}

template <int B>
void PanelTile(const Problem& p, int64_t panel0, float* scratch) {
  const int64_t kpairs = KPairs(p.k);
  for (int64_t kb = 0; kb < kpairs; kb += kBlockPairs) {
    Block blk;
    blk.kp_begin = kb;
    blk.kp_end = kb + kBlockPairs < kpairs ? kb + kBlockPairs : kpairs;
    blk.first = kb == 0;
    blk.last = blk.kp_end == kpairs;
    // Balanced row tiles (m = 9 -> 5 + 4, not 8 + 1): a 1-row tile is FMA-latency bound and
    // would cost half a full tile. Tiling never changes an output's reduction order.
    const int64_t tiles = (p.m + kRowTile - 1) / kRowTile;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t row = p.m * t / tiles;
      const int64_t rows = p.m * (t + 1) / tiles - row;
      blk.scratch = scratch + row * B * 16;
      RowTile<B>(p, row, rows, panel0, blk);
    }
  }
}

void Panels(const Problem& p, int64_t panel_begin, int64_t panel_end, float* scratch) {
  int64_t panel = panel_begin;
  for (; panel + kColTile <= panel_end; panel += kColTile) PanelTile<kColTile>(p, panel, scratch);
  for (; panel < panel_end; ++panel) PanelTile<1>(p, panel, scratch);
}

}  // namespace

void PanelsF32Avx512(const Problem& p, int64_t panel_begin, int64_t panel_end, float* scratch) {
  Panels(p, panel_begin, panel_end, scratch);
}

namespace {

/** F32ToBf16 (bf16.h) on 16 lanes, the same bits: round to nearest even, NaN -> quiet NaN, sign kept. */
inline __m256i ToBf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

}  // namespace

void ToBf16RowsAvx512(const Problem& p, bool split, uint16_t* xb, int64_t ldxb) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  for (int64_t r = 0; r < p.m; ++r) {
    const float* x = p.x + r * p.ldx;
    uint16_t* hi_row = xb + (split ? 2 * r : r) * ldxb;
    uint16_t* lo_row = hi_row + ldxb;
    for (int64_t i = 0; i < p.k; i += 16) {
      const __mmask16 mask =
          p.k - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (p.k - i)) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
      const __m256i hi = ToBf16x16(v);
      _mm256_mask_storeu_epi16(hi_row + i, mask, hi);
      if (!split) continue;
      // SplitRest (gemm.cc): v - hi, or 0 where that is not finite
      const __m512 rest = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16)));
      const __mmask16 finite =
          _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(rest), exponent), exponent);
      _mm256_mask_storeu_epi16(lo_row + i, mask, ToBf16x16(_mm512_maskz_mov_ps(finite, rest)));
    }
  }
}

}  // namespace gemm
}  // namespace specd
