// Portable GEMM kernels over packed bf16 weights (layout and reduction order: gemm_kernels.h).
// Baseline target, no -m flags, -ffp-contract=off: acc = acc + x*w with two roundings, k in order.
// The 16-lane inner loops are plain C++ that compilers vectorise for whatever baseline SIMD exists.
#include <cstring>

#include "bf16.h"
#include "gemm_kernels.h"

namespace specd {
namespace gemm {
namespace {

/** Writes `valid` outputs of a tile row: Y = acc, or Y = Y + acc when accumulating (Problem::accumulate). */
inline void StoreOut(const Problem& p, float* y, const float* acc, int64_t valid) {
  if (p.accumulate) {
    for (int64_t l = 0; l < valid; ++l) y[l] = y[l] + acc[l];
  } else {
    std::memcpy(y, acc, valid * sizeof(float));
  }
}

constexpr int kRowTile = 4;

// GCC 12 at -O3 vectorises the k-pair loop below as one strided group load over the R rows of X
// and reads up to one pair past the last row (SIGSEGV when X ends at a page boundary; reproduced
// with a guard page at m=3, k=2). Loop vectorisation is switched off for the multi-row tiles: the
// SLP vectoriser still vectorises the 16-lane loops (m = 4: 165 → 145 ms, 1 thread, 256 MiB of
// weights). The one-row tile (Tile1, decode) reads one contiguous row, has no strided group, and is
// faster with loop vectorisation (78 vs 104 ms), so it keeps it. native/test/gemm.test.ts places X
// against a guard page for m = 1..9.
template <int R>
__attribute__((optimize("no-tree-loop-vectorize"))) void Tile(const Problem& p, int64_t row0, int64_t panel) {
  const int64_t full_pairs = p.k / 2;
  const uint16_t* w = p.packed + panel * PanelPairs(p.k) * 32;
  float acc[R][16];
  std::memset(acc, 0, sizeof acc);  // +0
  float w0[16], w1[16];
  for (int64_t kp = 0; kp < full_pairs; ++kp) {
    const uint16_t* line = w + kp * 32;
    for (int l = 0; l < 16; ++l) {
      w0[l] = Bf16ToF32(line[2 * l]);
      w1[l] = Bf16ToF32(line[2 * l + 1]);
    }
    for (int r = 0; r < R; ++r) {
      const float x0 = p.x[(row0 + r) * p.ldx + 2 * kp];
      const float x1 = p.x[(row0 + r) * p.ldx + 2 * kp + 1];
      for (int l = 0; l < 16; ++l) acc[r][l] = acc[r][l] + x0 * w0[l];
      for (int l = 0; l < 16; ++l) acc[r][l] = acc[r][l] + x1 * w1[l];
    }
  }
  if (p.k & 1) {
    const uint16_t* line = w + full_pairs * 32;
    for (int l = 0; l < 16; ++l) w0[l] = Bf16ToF32(line[2 * l]);
    for (int r = 0; r < R; ++r) {
      const float x0 = p.x[(row0 + r) * p.ldx + 2 * full_pairs];
      for (int l = 0; l < 16; ++l) acc[r][l] = acc[r][l] + x0 * w0[l];
    }
  }
  const int64_t col0 = panel * kPanelCols;
  const int64_t valid = p.n - col0 < 16 ? p.n - col0 : 16;
  for (int r = 0; r < R; ++r) StoreOut(p, p.y + (row0 + r) * p.ldy + col0, acc[r], valid);
}

/** Tile<1> with loop vectorisation (see above): one row of X, same arithmetic and order. */
void Tile1(const Problem& p, int64_t row0, int64_t panel) {
  const int64_t full_pairs = p.k / 2;
  const uint16_t* w = p.packed + panel * PanelPairs(p.k) * 32;
  const float* x = p.x + row0 * p.ldx;
  float acc[16];
  std::memset(acc, 0, sizeof acc);  // +0
  float w0[16], w1[16];
  for (int64_t kp = 0; kp < full_pairs; ++kp) {
    const uint16_t* line = w + kp * 32;
    for (int l = 0; l < 16; ++l) {
      w0[l] = Bf16ToF32(line[2 * l]);
      w1[l] = Bf16ToF32(line[2 * l + 1]);
    }
    const float x0 = x[2 * kp];
    const float x1 = x[2 * kp + 1];
    for (int l = 0; l < 16; ++l) acc[l] = acc[l] + x0 * w0[l];
    for (int l = 0; l < 16; ++l) acc[l] = acc[l] + x1 * w1[l];
  }
  if (p.k & 1) {
    const uint16_t* line = w + full_pairs * 32;
    for (int l = 0; l < 16; ++l) w0[l] = Bf16ToF32(line[2 * l]);
    const float x0 = x[2 * full_pairs];
    for (int l = 0; l < 16; ++l) acc[l] = acc[l] + x0 * w0[l];
  }
  const int64_t col0 = panel * kPanelCols;
  const int64_t valid = p.n - col0 < 16 ? p.n - col0 : 16;
  StoreOut(p, p.y + row0 * p.ldy + col0, acc, valid);
}

void Panels(const Problem& p, int64_t panel_begin, int64_t panel_end) {
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    int64_t row = 0;
    for (; row + kRowTile <= p.m; row += kRowTile) Tile<kRowTile>(p, row, panel);
    switch (p.m - row) {
      case 1: Tile1(p, row, panel); break;
      case 2: Tile<2>(p, row, panel); break;
      case 3: Tile<3>(p, row, panel); break;
      default: break;
    }
  }
}

}  // namespace

void PanelsF32Portable(const Problem& p, int64_t panel_begin, int64_t panel_end, float*) {
  Panels(p, panel_begin, panel_end);
}

}  // namespace gemm
}  // namespace specd
