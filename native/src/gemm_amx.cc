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

#include "gemm_kernels.h"

namespace specd {
namespace gemm {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

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

/** Stores hi + lo (two fp32 tiles of one panel, summed once in fp32) as StoreTile does. */
inline void StoreSplitTile(const Problem& p, float* hi, const float* lo, int64_t row0, int rows, int64_t panel) {
  for (int r = 0; r < rows; ++r)
    _mm512_store_ps(hi + r * 16, _mm512_add_ps(_mm512_load_ps(hi + r * 16), _mm512_load_ps(lo + r * 16)));
  StoreTile(p, hi, row0, rows, panel);
}

/**
 * Split bf16: two accumulators per output, C_hi = Σ_k hi·w and C_lo = Σ_k lo·w (each one fp32 tile
 * updated per 32-k step in order), Y = C_hi + C_lo. Groups of 2 panels: C0, C1 = hi of panels 0, 1;
 * C2, C3 = lo of panels 0, 1, so the four TDPBF16PS of a k step update four independent tiles (a
 * shared accumulator would chain the hi and lo products back to back). A last odd panel runs alone
 * with the same per-output arithmetic, so grouping (and hence threads) never changes a result.
 */
void PanelsSplit(const Problem& p, int64_t panel_begin, int64_t panel_end) {
  const int64_t blocks = PanelPairs(p.k) / 16;
  const int64_t panel_stride = PanelPairs(p.k) * 32;
  const int64_t a_stride = p.ldxb * 2;
  alignas(64) float tile[4][16 * 16];
  for (int64_t row0 = 0; row0 < p.m; row0 += 16) {
    const int rows = static_cast<int>(p.m - row0 < 16 ? p.m - row0 : 16);
    Configure(rows);
    const uint16_t* hi = p.x_bf16 + row0 * p.ldxb;
    const uint16_t* lo = p.x_bf16_lo + row0 * p.ldxb;
    int64_t panel = panel_begin;
    for (; panel + 2 <= panel_end; panel += 2) {
      const uint16_t* w = p.packed + panel * panel_stride;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < blocks; ++kb) {
        PrefetchTile(w + (kb + kSplitPrefetchBlocks) * 512);
        PrefetchTile(w + panel_stride + (kb + kSplitPrefetchBlocks) * 512);
        _tile_loadd(4, hi + kb * 32, a_stride);
        _tile_loadd(7, lo + kb * 32, a_stride);
        _tile_loadd(5, w + kb * 512, 64);
        _tile_loadd(6, w + panel_stride + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 6);
        _tile_dpbf16ps(2, 7, 5);
        _tile_dpbf16ps(3, 7, 6);
      }
      _tile_stored(0, tile[0], 64);
      _tile_stored(1, tile[1], 64);
      _tile_stored(2, tile[2], 64);
      _tile_stored(3, tile[3], 64);
      StoreSplitTile(p, tile[0], tile[2], row0, rows, panel);
      StoreSplitTile(p, tile[1], tile[3], row0, rows, panel + 1);
    }
    for (; panel < panel_end; ++panel) {
      const uint16_t* w = p.packed + panel * panel_stride;
      _tile_zero(0);
      _tile_zero(2);
      for (int64_t kb = 0; kb < blocks; ++kb) {
        PrefetchTile(w + (kb + kSplitPrefetchBlocks) * 512);
        _tile_loadd(4, hi + kb * 32, a_stride);
        _tile_loadd(7, lo + kb * 32, a_stride);
        _tile_loadd(5, w + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(2, 7, 5);
      }
      _tile_stored(0, tile[0], 64);
      _tile_stored(2, tile[2], 64);
      StoreSplitTile(p, tile[0], tile[2], row0, rows, panel);
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
