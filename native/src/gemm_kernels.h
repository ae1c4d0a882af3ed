// Inner GEMM kernels over packed bf16 weights, shared by gemm.cc (dispatch, threading, bindings),
// gemm_portable.cc, gemm_avx512.cc and gemm_amx.cc. Plain declarations only: safe for the ISA files.
//
// Packed weight layout ("VNNI pairs in 16-column panels"), dtype bf16 (uint16 raw bits):
//   packed[panel][kp][lane][j] = W[panel*16 + lane][2*kp + j]
//   panel in [0, ceil(N/16)), kp in [0, Kpad/2), lane in [0, 16), j in {0, 1}
// i.e. `[Npad/16][Kpad/2][16][2]` with Npad = roundup(N, 16), Kpad = roundup(K, 32), padding = 0.
// (K is padded to 32 so that every 16 pairs of a panel form one AMX B tile of 16 rows x 64 B.)
// One 64-byte line holds K-pairs for 16 output columns (one zmm feeds 16 FMA lanes), and each
// panel is one contiguous stream over K, so a GEMV reads weights strictly sequentially (the
// `[K/2][N][2]` order would jump N*4 bytes between lines, a new 4 KiB page almost every line).
//
// Reduction order (batch invariance), fp32 activations (the default and the project rule): output
// Y[m][n] is ONE fp32 accumulator starting at +0 and updated for k = 0, 1, ..., K-1 in order,
// whatever M, the row's tile or the thread: acc = fma(x[m][k], w[n][k], acc) on AVX-512, or
// acc = acc + x*w with two roundings on the portable path (-ffp-contract=off). Hence row i of a
// GEMM equals the GEMV of row i bit for bit on one path; the two paths differ by rounding only.
//
// bf16 activations (opt-in): X rounded to bf16. With AMX, TDPBF16PS tiles (PanelsBf16Amx); else
// the fp32 kernels run on the rounded X. Split bf16 ("bf16x2", opt-in): X = hi + lo, both bf16
// (hi = bf16(X), lo = bf16(X - hi): 16 significant bits) as two rows of one A tile, so TDPBF16PS
// fills two fp32 accumulators (hi·W, lo·W) summed once at the end; else the fp32 kernels on hi + lo. The m = 1 GEMV of
// every variant runs the same kernel as the GEMM (a one-row tile), never a separate GEMV kernel. A VDPBF16PS
// (AVX512_BF16) register kernel was measured and dropped: 90 GFLOP/s vs 140 GFLOP/s for fp32 FMA on widened weights (1
// core, cached, M=16), while AMX reaches several hundred (docs/BENCHMARKS.md, "Kernels").
#pragma once
#include <cstdint>

namespace specd {
namespace gemm {

constexpr int64_t kPanelCols = 16;

/** One GEMM problem: Y[m, n] (f32, row stride ldy) = X[m, k] (f32, row stride ldx) . W[n, k]^T. */
struct Problem {
  const float* x;
  int64_t ldx;
  const uint16_t* packed;  // see layout above
  float* y;
  int64_t ldy;
  int64_t m, n, k;
  /**
   * bf16-activation variant only: X rounded to bf16, [m][ldxb] with zero padding up to Kpad and beyond
   * (gemm.cc pads ldxb by one cache line: see kXbPad).
   */
  const uint16_t* x_bf16 = nullptr;
  int64_t ldxb = 0;
  /**
   * Split-bf16 ("bf16x2") variant only: the residual bf16(X - bf16(X)). The rows are stacked: hi row i
   * at x_bf16 + 2i*ldxb, lo row i at x_bf16 + (2i+1)*ldxb, and x_bf16_lo = x_bf16 + ldxb, so one AMX
   * tile holds hi and lo of up to 8 X rows (one TDPBF16PS computes hi·W and lo·W into two C rows).
   */
  const uint16_t* x_bf16_lo = nullptr;
  /**
   * Y ← Y + X·Wᵀ instead of Y ← X·Wᵀ: each output's dot product is reduced exactly as without it
   * (one accumulator from +0 over k in order), then added once to the old Y[i][j] in fp32 — the
   * same bits as computing X·Wᵀ and adding it elementwise afterwards.
   */
  bool accumulate = false;
};

/** K pairs that hold weights: ceil(k/2). */
static inline int64_t KPairs(int64_t k) { return (k + 1) / 2; }
/** K pairs stored per panel (Kpad/2, a multiple of 16): the panel stride is PanelPairs*32 uint16. */
static inline int64_t PanelPairs(int64_t k) { return (KPairs(k) + 15) / 16 * 16; }
static inline int64_t Panels(int64_t n) { return (n + kPanelCols - 1) / kPanelCols; }
/**
 * ParallelFor work units (threadpool.h) of one column panel of an m-row GEMM with depth k: the
 * panel's kPanelCols·k weights streamed once, plus the multiply-adds at ~1/8 of a weight's cost
 * (register-tiled, 16 lanes). Decides only how many threads run a call, never a result.
 */
static inline int64_t PanelWork(int64_t m, int64_t k) { return kPanelCols * k * (1 + m / 8); }

/**
 * Computes all rows of Y for panels [panel_begin, panel_end), fp32 activations. `scratch` holds
 * ScratchFloats(m) floats owned by the calling thread (accumulators between K blocks).
 */
void PanelsF32Portable(const Problem& p, int64_t panel_begin, int64_t panel_end, float* scratch);
void PanelsF32Avx512(const Problem& p, int64_t panel_begin, int64_t panel_end, float* scratch);

/**
 * bf16-activation variant on AMX (opt-in; X rounded to bf16, TDPBF16PS with fp32 accumulation in
 * tiles of 16 rows x 16 columns x 32 k). Row results depend only on that row of X, so the variant
 * is batch invariant too; its rounding differs from the fp32-activation kernels (X in bf16, the
 * tile's internal summation order, denormals flushed). Needs p.x_bf16; compiled in gemm_amx.cc.
 * With p.x_bf16_lo set (split bf16, "bf16x2", stacked rows) each output has two fp32 accumulators,
 * one over hi·W and one over lo·W (each updated per 32-k step in order), added once at the end: the
 * same arithmetic for every row, tile and thread (m = 1 runs the same kernel), so row i of a GEMM
 * still equals the GEMV of row i bit for bit.
 */
void PanelsBf16Amx(const Problem& p, int64_t panel_begin, int64_t panel_end);

/**
 * X [m, k] f32 (p.x, p.ldx) -> bf16 rows of xb [m][ldxb] (split: hi row i at 2i·ldxb, lo = bf16(x - hi) at
 * (2i + 1)·ldxb, 0 where x - hi is not finite), rounded as F32ToBf16 (bf16.h) bit for bit; columns k..ldxb
 * are left as the caller set them. The AVX-512 version of gemm.cc's scalar loop (gemm_avx512.cc).
 */
void ToBf16RowsAvx512(const Problem& p, bool split, uint16_t* xb, int64_t ldxb);

/** Scratch floats a kernel call needs per thread for m rows. */
static inline int64_t ScratchFloats(int64_t m) { return (m + 8) * 2 * kPanelCols; }

}  // namespace gemm
}  // namespace specd
