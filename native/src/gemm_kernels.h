// Inner GEMM kernels over packed bf16 weights, shared by gemm.cc (dispatch, threading, bindings),
// gemm_portable.cc and gemm_avx512.cc. Plain declarations only: safe for *_avx512.cc.
//
// Packed weight layout ("VNNI pairs in 16-column panels"), dtype bf16 (uint16 raw bits):
//   packed[panel][kp][lane][j] = W[panel*16 + lane][2*kp + j]
//   panel in [0, ceil(N/16)), kp in [0, ceil(K/2)), lane in [0, 16), j in {0, 1}
// i.e. `[Npad/16][Kpad/2][16][2]` with Npad = roundup(N, 16), Kpad = roundup(K, 2), padding = 0.
// One 64-byte line holds K-pairs for 16 output columns (one zmm feeds 16 FMA lanes), and each
// panel is one contiguous stream over K, so a GEMV reads weights strictly sequentially.
//
// Reduction order (batch invariance): output Y[m][n] is ONE fp32 accumulator starting at +0 and
// updated for k = 0, 1, ..., K-1 in order, whatever M, the row's tile or the thread. The
// fp32-activation kernels do acc = fma(x[m][k], w[n][k], acc) (AVX-512) or acc = acc + x*w with
// two roundings (portable; -ffp-contract=off). Hence row i of a GEMM equals the GEMV of row i bit
// for bit on one path; the two paths differ from each other by rounding only.
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
  /** For the bf16-activation variant only: X rounded to bf16 pairs, [m][ceil(k/2)] uint32. */
  const uint32_t* x_pairs;
};

inline int64_t KPairs(int64_t k) { return (k + 1) / 2; }
inline int64_t Panels(int64_t n) { return (n + kPanelCols - 1) / kPanelCols; }

/** Computes all rows of Y for panels [panel_begin, panel_end), fp32 activations. */
void PanelsF32Portable(const Problem& p, int64_t panel_begin, int64_t panel_end);
void PanelsF32Avx512(const Problem& p, int64_t panel_begin, int64_t panel_end);

/**
 * bf16-activation variant (opt-in): per pair acc = (acc + x1*w1) + x0*w0 with x rounded to bf16,
 * the order of AVX512_BF16 VDPBF16PS (products of two bf16 are exact in fp32). The AVX-512 path
 * additionally flushes denormals (instruction semantics); the portable path does not.
 */
void PanelsBf16Portable(const Problem& p, int64_t panel_begin, int64_t panel_end);
void PanelsBf16Avx512(const Problem& p, int64_t panel_begin, int64_t panel_end);

}  // namespace gemm
}  // namespace specd
