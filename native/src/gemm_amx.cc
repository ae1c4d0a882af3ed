// AMX GEMM kernel for the opt-in bf16-activation variant (see gemm_kernels.h). Compiled with
// -mamx-tile -mamx-bf16 (+ AVX-512 flags); called only when isa.cc reports AMX usable (cpuid,
// XCR0 and the Linux arch_prctl permission). Intrinsics only, no STL (see CMakeLists.txt on ODR).
//
// Tiles: C0..C3 = 4 panels x (rows x 16) fp32 accumulators, A = X rows x 32 k (bf16; tile 4, and
// tile 7 for the low half of split bf16), B = 16 K pairs x 16 columns of one panel (exactly 1 KiB of
// the packed layout, stride 64 B).
// Loop: row tiles of <= 16 rows (one tile config each) > groups of 4 panels > K in steps of 32.
// For m <= 16 (verification) the weights are streamed exactly once.
#include <immintrin.h>

#include "amx_tiles.h"
#include "gemm_kernels.h"

namespace specd {
namespace gemm {
namespace {

using TileConfig = AmxTileConfig;

void Configure(int rows) {
  TileConfig cfg = {};
  cfg.palette_id = 1;
  for (int t = 0; t < 4; ++t) {  // C tiles
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = 64;
  }
  cfg.rows[4] = static_cast<uint8_t>(rows);  // A
  cfg.colsb[4] = 64;
  for (int t = 5; t < 7; ++t) {  // B
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  cfg.rows[7] = static_cast<uint8_t>(rows);  // A, low half of split bf16
  cfg.colsb[7] = 64;
  _tile_loadconfig(&cfg);
}

inline void StoreTile(const Problem& p, const float* tile, int64_t row0, int rows, int64_t panel) {
  const int64_t col = panel * kPanelCols;
  const int64_t valid = p.n - col;
  const __mmask16 mask = valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1u);
  for (int r = 0; r < rows; ++r) {
    float* y = p.y + (row0 + r) * p.ldy + col;
    const __m512 v = _mm512_load_ps(tile + r * 16);
    _mm512_mask_storeu_ps(y, mask, p.accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), v) : v);
  }
}

/**
 * Software prefetch distance of the split kernel, in 32-k steps (1 KiB of a panel each): 8 KiB ahead
 * per weight stream, as the fp32 kernel does, because the hardware streamer stops at 4 KiB pages and a
 * 2-panel group has only two streams in flight. A hint only: it never changes a result.
 */
constexpr int64_t kSplitPrefetchBlocks = 8;

/** Prefetches one 1 KiB B tile (16 lines) into L1; addresses past the buffer are harmless (hints). */
inline void PrefetchTile(const uint16_t* w) {
  const char* c = reinterpret_cast<const char*>(w);
  for (int line = 0; line < 16; ++line) _mm_prefetch(c + line * 64, _MM_HINT_T0);
}

/** Tile config of the split kernel: C0, C1, A4 hold rows0 rows; C2, C3, A7 rows1 (0: unused). */
void ConfigureSplit(int rows0, int rows1) {
  TileConfig cfg = {};
  cfg.palette_id = 1;
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, 16, 16, rows1};
  for (int t = 0; t < 8; ++t) {
    if (rows[t] == 0) continue;
    cfg.rows[t] = static_cast<uint8_t>(rows[t]);
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

/** Y rows [row0, row0 + n) of one panel from a stacked tile: row r = tile row 2r (hi·W) + 2r + 1 (lo·W). */
inline void StoreStacked(const Problem& p, const float* tile, int64_t row0, int n, int64_t panel) {
  alignas(64) float sum[16 * 16];
  for (int r = 0; r < n; ++r)
    _mm512_store_ps(sum + r * 16,
                    _mm512_add_ps(_mm512_load_ps(tile + 2 * r * 16), _mm512_load_ps(tile + (2 * r + 1) * 16)));
  StoreTile(p, sum, row0, n, panel);
}

/**
 * Split bf16 with stacked rows: X row i is the two A rows 2i (hi) and 2i + 1 (lo) (p.x_bf16 holds them
 * interleaved, p.x_bf16_lo = p.x_bf16 + p.ldxb), so one TDPBF16PS computes hi·W and lo·W of up to 8 X
 * rows into two C rows, and Y = C[2i] + C[2i+1] once at the end: each output has two fp32 accumulators
 * (hi·W, lo·W), each updated per 32-k step in order. A GEMV (m = 1) costs one TDPBF16PS per panel and
 * k step, as the plain bf16 kernel. Groups: 2 panels x 2 row tiles of 8 X rows (C0, C1: rows 0-7 of
 * panels 0, 1; C2, C3: rows 8-15), the B tiles loaded once for both row tiles, so up to 16 rows stream
 * the weights once. Row tile and panel grouping never change an output's arithmetic (batch and thread
 * invariant).
 */
void PanelsSplit(const Problem& p, int64_t panel_begin, int64_t panel_end) {
  const int64_t blocks = PanelPairs(p.k) / 16;
  const int64_t panel_stride = PanelPairs(p.k) * 32;
  const int64_t a_stride = p.ldxb * 2;  // bytes between stacked rows (hi 0, lo 0, hi 1, ...)
  alignas(64) float tile[4][16 * 16];
  for (int64_t row0 = 0; row0 < p.m; row0 += 16) {
    const int n0 = static_cast<int>(p.m - row0 < 8 ? p.m - row0 : 8);
    const int n1 = static_cast<int>(p.m - row0 - 8 <= 0 ? 0 : (p.m - row0 - 8 < 8 ? p.m - row0 - 8 : 8));
    ConfigureSplit(2 * n0, 2 * n1);
    const uint16_t* a0 = p.x_bf16 + 2 * row0 * p.ldxb;
    const uint16_t* a1 = a0 + 16 * p.ldxb;  // X row row0 + 8
    int64_t panel = panel_begin;
    for (; panel + 2 <= panel_end; panel += 2) {
      const uint16_t* w = p.packed + panel * panel_stride;
      _tile_zero(0);
      _tile_zero(1);
      if (n1 > 0) {
        _tile_zero(2);
        _tile_zero(3);
      }
      if (n1 > 0) {
        // Each tile is loaded just before its first use, and the second panel's B tile after the first panel's
        // two products: on the AMX host 4 % less time at 16 rows than loading A, B, B, A first (docs/BENCHMARKS.md,
        // "the split-bf16 GEMM's loop order"); the same products in the same order per accumulator, so the same bits.
        for (int64_t kb = 0; kb < blocks; ++kb) {
          PrefetchTile(w + (kb + kSplitPrefetchBlocks) * 512);
          PrefetchTile(w + panel_stride + (kb + kSplitPrefetchBlocks) * 512);
          _tile_loadd(5, w + kb * 512, 64);
          _tile_loadd(4, a0 + kb * 32, a_stride);
          _tile_dpbf16ps(0, 4, 5);
          _tile_loadd(7, a1 + kb * 32, a_stride);
          _tile_dpbf16ps(2, 7, 5);
          _tile_loadd(6, w + panel_stride + kb * 512, 64);
          _tile_dpbf16ps(1, 4, 6);
          _tile_dpbf16ps(3, 7, 6);
        }
      } else {
        for (int64_t kb = 0; kb < blocks; ++kb) {
          PrefetchTile(w + (kb + kSplitPrefetchBlocks) * 512);
          PrefetchTile(w + panel_stride + (kb + kSplitPrefetchBlocks) * 512);
          _tile_loadd(4, a0 + kb * 32, a_stride);
          _tile_loadd(5, w + kb * 512, 64);
          _tile_loadd(6, w + panel_stride + kb * 512, 64);
          _tile_dpbf16ps(0, 4, 5);
          _tile_dpbf16ps(1, 4, 6);
        }
      }
      _tile_stored(0, tile[0], 64);
      _tile_stored(1, tile[1], 64);
      StoreStacked(p, tile[0], row0, n0, panel);
      StoreStacked(p, tile[1], row0, n0, panel + 1);
      if (n1 > 0) {
        _tile_stored(2, tile[2], 64);
        _tile_stored(3, tile[3], 64);
        StoreStacked(p, tile[2], row0 + 8, n1, panel);
        StoreStacked(p, tile[3], row0 + 8, n1, panel + 1);
      }
    }
    for (; panel < panel_end; ++panel) {
      const uint16_t* w = p.packed + panel * panel_stride;
      _tile_zero(0);
      if (n1 > 0) _tile_zero(2);
      for (int64_t kb = 0; kb < blocks; ++kb) {
        PrefetchTile(w + (kb + kSplitPrefetchBlocks) * 512);
        _tile_loadd(4, a0 + kb * 32, a_stride);
        _tile_loadd(5, w + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 5);
        if (n1 > 0) {
          _tile_loadd(7, a1 + kb * 32, a_stride);
          _tile_dpbf16ps(2, 7, 5);
        }
      }
      _tile_stored(0, tile[0], 64);
      StoreStacked(p, tile[0], row0, n0, panel);
      if (n1 > 0) {
        _tile_stored(2, tile[2], 64);
        StoreStacked(p, tile[2], row0 + 8, n1, panel);
      }
    }
  }
  _tile_release();
}

}  // namespace

void PanelsBf16Amx(const Problem& p, int64_t panel_begin, int64_t panel_end) {
  if (p.x_bf16_lo != nullptr) return PanelsSplit(p, panel_begin, panel_end);
  const int64_t blocks = PanelPairs(p.k) / 16;        // 32-k steps
  const int64_t panel_stride = PanelPairs(p.k) * 32;  // uint16 per panel
  const int64_t a_stride = p.ldxb * 2;                // bytes per X row
  alignas(64) float tile[4][16 * 16];
  for (int64_t row0 = 0; row0 < p.m; row0 += 16) {
    const int rows = static_cast<int>(p.m - row0 < 16 ? p.m - row0 : 16);
    Configure(rows);
    const uint16_t* a = p.x_bf16 + row0 * p.ldxb;
    int64_t panel = panel_begin;
    for (; panel + 4 <= panel_end; panel += 4) {
      const uint16_t* w = p.packed + panel * panel_stride;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < blocks; ++kb) {
        _tile_loadd(4, a + kb * 32, a_stride);
        _tile_loadd(5, w + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, w + panel_stride + kb * 512, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, w + 2 * panel_stride + kb * 512, 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(6, w + 3 * panel_stride + kb * 512, 64);
        _tile_dpbf16ps(3, 4, 6);
      }
      _tile_stored(0, tile[0], 64);
      _tile_stored(1, tile[1], 64);
      _tile_stored(2, tile[2], 64);
      _tile_stored(3, tile[3], 64);
      for (int t = 0; t < 4; ++t) StoreTile(p, tile[t], row0, rows, panel + t);
    }
    for (; panel < panel_end; ++panel) {
      const uint16_t* w = p.packed + panel * panel_stride;
      _tile_zero(0);
      for (int64_t kb = 0; kb < blocks; ++kb) {
        _tile_loadd(4, a + kb * 32, a_stride);
        _tile_loadd(5, w + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 5);
      }
      _tile_stored(0, tile[0], 64);
      StoreTile(p, tile[0], row0, rows, panel);
    }
  }
  _tile_release();
}

}  // namespace gemm
}  // namespace specd
