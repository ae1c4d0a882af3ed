// AVX-512 GEMM kernels over packed GGUF-quantized weights (layout, numerics and reduction order:
// quant_kernels.h). Compiled with the AVX-512 flags; called only when isa.cc reports AVX-512.
// Intrinsics only, no STL (see CMakeLists.txt on ODR).
//
// Per panel block and panel: the 16 d (and m) scales are one 256-bit load widened by VCVTPH2PS;
// each 16-byte quant line is widened to 16 int32 (VPMOVZXBD / VPMOVSXBD) and converted to fp32
// (Q4: VPERMPS from the table 0..15 on the low nibble and on the line >> 4; Q8_0: VCVTDQ2PS), then
// dequantized with one FMA (d·q + m; d·q is exact so this equals the two-step value) or one MUL
// (Q8_0). Each weight vector then feeds R rows of
// fp32 FMAs (x broadcast). Activations stay fp32; no integer dot products.
//
// Schedule, for one thread's range of panels:
//   for each tile of B panels (B = 4 when m <= 2, so a GEMV has 4 independent FMA chains; else 2):
//     for each K chunk (whole K when m <= 8, else kChunkBlocks blocks = 512 k, in L1 for B = 2):
//       for each row tile of <= 8 rows: R x B accumulators in registers, saved to / loaded from
//                                       `scratch` between K chunks (exact fp32 store/load)
// The first row tile streams the weights from memory and prefetches (T0) the thread's NEXT tile of
// panels at the rate it consumes the current one (B·pbb bytes per block: the next tile is one
// contiguous region, swept linearly), so each tile after a thread's first finds its weights in
// cache; the last tile of a range prefetches kPrefetchBytes ahead in each panel instead (the
// hardware streamer stops at 4 KiB pages). From DRAM, one thread, AMD EPYC Zen 5, m = 1: Q4_1
// ×1.2–2.1, Q8_0 ×1.5 faster than with the per-panel prefetch alone (docs/BENCHMARKS.md, "m ≤ 16 on
// AMD EPYC Zen 5"). Later row tiles re-read the weights from L1. Each output still sees one
// accumulator updated in the fixed order of quant_kernels.h: batch invariant (prefetching changes
// no value).
#include <immintrin.h>

#include "quant_kernels.h"

namespace specd {
namespace quant {
namespace {

#ifndef SPECD_QUANT_PREFETCH
#define SPECD_QUANT_PREFETCH 4096
#endif
constexpr int64_t kPrefetchBytes = SPECD_QUANT_PREFETCH;
constexpr int64_t kChunkBlocks = 16;
constexpr int kRowTile = 8;

constexpr int64_t PbbOf(Type t) { return t == Type::kQ4_0 ? 288 : t == Type::kQ4_1 ? 320 : 544; }

inline void StoreRow(float* y, int64_t col, int64_t n, __m512 v) {
  const int64_t valid = n - col;
  if (valid >= 16) {
    _mm512_storeu_ps(y + col, v);
  } else if (valid > 0) {
    _mm512_mask_storeu_ps(y + col, static_cast<__mmask16>((1u << valid) - 1u), v);
  }
}

/** One tile's block range and where its accumulators live between chunks. */
struct Chunk {
  int64_t b_begin, b_end;
  bool first, last;
  float* scratch;     // [R][B][16]
  const uint8_t* pf;  // the next tile's weights, prefetched pf_step bytes per block (nullptr: none)
  int64_t pf_step;
};

template <Type T, int R, int B>
void Tile(const Problem& p, int64_t row0, int64_t panel0, const Chunk& c) {
  constexpr int64_t pbb = PbbOf(T);
  constexpr int64_t sb = T == Type::kQ4_1 ? 64 : 32;
  const int64_t blocks = p.k / kBlock;
  const int64_t panel_stride = blocks * pbb;
  const uint8_t* w = p.packed + panel0 * panel_stride;
  const float* x = p.x + row0 * p.ldx;
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b)
      acc[r][b] = c.first ? _mm512_setzero_ps() : _mm512_loadu_ps(c.scratch + (r * B + b) * 16);
  // float(nibble) by a 16-entry table: VPERMPS reads only the index's low 4 bits, so the low nibble
  // needs no AND and neither nibble a VCVTDQ2PS (8 instead of 9 vector ops per 32 weights).
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t blk = c.b_begin; blk < c.b_end; ++blk) {
    __m512 dv[B], mv[B];
    const uint8_t* qs[B];
    for (int b = 0; b < B; ++b) {
      const uint8_t* pb = w + b * panel_stride + blk * pbb;
      if (c.pf == nullptr)
        for (int64_t off = 0; off < pbb; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pb + kPrefetchBytes + off), _MM_HINT_T0);
      dv[b] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb)));
      if (T == Type::kQ4_1) {
        mv[b] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 32)));
      } else if (T == Type::kQ4_0) {
        mv[b] = _mm512_mul_ps(dv[b], _mm512_set1_ps(-8.0f));  // exact
      } else {
        mv[b] = _mm512_setzero_ps();
      }
      qs[b] = pb + sb;
    }
    if (c.pf != nullptr) {
      const uint8_t* next = c.pf + blk * c.pf_step;
      for (int64_t off = 0; off < c.pf_step; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T0);
    }
    const float* xb = x + blk * kBlock;
    if (T == Type::kQ8_0) {
      for (int kk = 0; kk < 32; ++kk) {
        __m512 wv[B];
        for (int b = 0; b < B; ++b) {
          const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs[b] + 16 * kk)));
          wv[b] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), dv[b]);  // exact
        }
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(xb[r * p.ldx + kk]);
          for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(xv, wv[b], acc[r][b]);
        }
      }
    } else {
      for (int j = 0; j < 16; ++j) {
        __m512 lo[B], hi[B];
        for (int b = 0; b < B; ++b) {
          const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs[b] + 16 * j)));
          lo[b] = _mm512_fmadd_ps(_mm512_permutexvar_ps(q, iota), dv[b], mv[b]);
          hi[b] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), iota), dv[b], mv[b]);
        }
        for (int r = 0; r < R; ++r) {
          const __m512 xl = _mm512_set1_ps(xb[r * p.ldx + j]);
          for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(xl, lo[b], acc[r][b]);
          const __m512 xh = _mm512_set1_ps(xb[r * p.ldx + 16 + j]);
          for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(xh, hi[b], acc[r][b]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) {
      if (c.last) {
        StoreRow(p.y + (row0 + r) * p.ldy, (panel0 + b) * kLanes, p.n, acc[r][b]);
      } else {
        _mm512_storeu_ps(c.scratch + (r * B + b) * 16, acc[r][b]);
      }
    }
}

template <Type T, int B>
void RowTile(const Problem& p, int64_t row0, int64_t rows, int64_t panel0, const Chunk& c) {
  switch (rows) {
    case 1: Tile<T, 1, B>(p, row0, panel0, c); break;
    case 2: Tile<T, 2, B>(p, row0, panel0, c); break;
    case 3: Tile<T, 3, B>(p, row0, panel0, c); break;
    case 4: Tile<T, 4, B>(p, row0, panel0, c); break;
    case 5: Tile<T, 5, B>(p, row0, panel0, c); break;
    case 6: Tile<T, 6, B>(p, row0, panel0, c); break;
    case 7: Tile<T, 7, B>(p, row0, panel0, c); break;
    case 8: Tile<T, 8, B>(p, row0, panel0, c); break;
    default: break;
  }
}

template <Type T, int B>
void PanelTile(const Problem& p, int64_t panel0, int64_t panel_end, float* scratch) {
  const int64_t blocks = p.k / kBlock;
  // The next tile: up to B panels after this one, within the thread's range (contiguous bytes).
  const int64_t next = panel_end - (panel0 + B) < B ? panel_end - (panel0 + B) : B;
  const int64_t tiles = (p.m + kRowTile - 1) / kRowTile;
  const int64_t chunk = tiles == 1 ? blocks : kChunkBlocks;
  for (int64_t b0 = 0; b0 < blocks; b0 += chunk) {
    Chunk c;
    c.b_begin = b0;
    c.b_end = b0 + chunk < blocks ? b0 + chunk : blocks;
    c.first = b0 == 0;
    c.last = c.b_end == blocks;
    // Balanced row tiles (m = 9 -> 5 + 4); tiling never changes an output's reduction order.
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t row = p.m * t / tiles;
      const int64_t rows = p.m * (t + 1) / tiles - row;
      c.scratch = scratch + row * B * 16;
      c.pf = t == 0 && next > 0 ? p.packed + (panel0 + B) * blocks * PbbOf(T) : nullptr;
      c.pf_step = next * PbbOf(T);
      RowTile<T, B>(p, row, rows, panel0, c);
    }
  }
}

template <Type T>
void PanelsOf(const Problem& p, int64_t panel_begin, int64_t panel_end, float* scratch) {
  int64_t panel = panel_begin;
  if (p.m <= 2) {
    for (; panel + 4 <= panel_end; panel += 4) PanelTile<T, 4>(p, panel, panel_end, scratch);
  }
  for (; panel + 2 <= panel_end; panel += 2) PanelTile<T, 2>(p, panel, panel_end, scratch);
  for (; panel < panel_end; ++panel) PanelTile<T, 1>(p, panel, panel_end, scratch);
}

}  // namespace

void PanelsAvx512(const Problem& p, int64_t panel_begin, int64_t panel_end, float* scratch) {
  switch (p.type) {
    case Type::kQ4_0: PanelsOf<Type::kQ4_0>(p, panel_begin, panel_end, scratch); break;
    case Type::kQ4_1: PanelsOf<Type::kQ4_1>(p, panel_begin, panel_end, scratch); break;
    case Type::kQ8_0: PanelsOf<Type::kQ8_0>(p, panel_begin, panel_end, scratch); break;
  }
}

}  // namespace quant
}  // namespace specd
