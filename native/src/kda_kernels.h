// Inner KDA (Kimi Delta Attention) kernels shared by kda.cc (conv, norms, dispatch, threading,
// bindings), and kda_avx512.cc. Plain declarations only: safe for the ISA files.
//
// State layout, fp32: S[i][j] with i the key channel (d_k rows) and j the value channel (d_v
// columns), row-major [d, d] per head (d_k = d_v = d), i.e. the pool is [numSlots, H, d, d].
//
// Recurrent steps for one head over `tokens` consecutive tokens of one sequence (REFERENCE.md §7;
// tools/reference/specd_ref/kimi.py kda_recurrent), with alpha = exp(g) computed by the caller and
// q already scaled by d^-1/2; per token t:
//   S'[i][j] = S[i][j] * alpha[i]
//   pred[j]  = sum_{i=0..d-1} k[i] * S'[i][j]            (one accumulator per j, i ascending)
//   u[j]     = beta * (v[j] - pred[j])
//   S[i][j]  = S'[i][j] + k[i] * u[j]
//   o[j]     = sum_{i=0..d-1} q[i] * S[i][j]             (one accumulator per j, i ascending)
// Every quantity of column j depends only on column j of S, so the kernels walk S in column blocks
// of kColBlock and run ALL tokens on one block before the next: the block (d x 64 fp32 = 32 KiB at
// d = 128, copied to a contiguous work buffer) stays in L1 across the tokens, and S is read from
// L2/memory once per call, not per token.
// Reduction order: every output is one fp32 accumulator over i = 0..d-1 in order, starting from
// +0, on both paths, and the per-element operation sequence does not depend on `tokens` or the
// blocking: a call over T tokens equals T calls over one token bit for bit. The portable path
// rounds products and sums separately (-ffp-contract=off), the AVX-512 path uses FMA, so the two
// paths differ by rounding only and each is deterministic.
#pragma once
#include <cstdint>

namespace specd {
namespace kda {

constexpr int64_t kColBlock = 64;

/** One call of the multi-token recurrent kernel for one head. */
struct Steps {
  float* state;        // S [d][d], updated in place
  int64_t d;           // head dim (d_k = d_v)
  int64_t tokens;      // tokens of this call
  const float* q;      // [tokens][d], normalised and scaled
  const float* k;      // [tokens][d], normalised
  const float* v;      // [tokens][d]
  const float* alpha;  // [tokens][d], exp(g)
  const float* beta;   // [tokens]
  float* o;            // output of token t at o + t * ldo, d floats
  int64_t ldo;
  float* snap;  // when not null: S after token t is written to snap + t * ld_snap ([d][d])
  int64_t ld_snap;
  float* work;  // StepsWorkFloats(d) floats owned by the calling thread
};

/**
 * Work floats of one Steps call: the current column block is copied into a contiguous [d][64]
 * buffer while the tokens run on it (in S itself, rows are d floats apart: at d = 128 a 64-column
 * block covers only half of the L1 sets and thrashes the L1, measured 2-3x slower).
 */
static inline int64_t StepsWorkFloats(int64_t d) { return d * kColBlock; }

void StepsPortable(const Steps& s);
void StepsAvx512(const Steps& s);

/**
 * Elementwise helpers of the token preparation: y[i] = Exp(x[i]) and SiLU in place, with the exp of
 * kda_math.h. The portable versions are the header's loops compiled for the baseline ISA (4 lanes);
 * the AVX-512 versions are the same source compiled in kda_avx512.cc (16 lanes). Per element the
 * same operations, so results match up to the compilers' contraction choices (paths may differ by
 * rounding only, like every kernel here).
 */
void ExpAvx512(const float* x, float* y, int64_t n);

/**
 * kda_math.h's GatedScaleArray (gated RMSNorm) and GateRowArray (kdaGate) compiled for AVX-512
 * (16 lanes; the portable callers run the same loops at 4). The same operations per element, no contraction: the
 * same bits as the portable loops.
 */
void GatedScaleAvx512(const float* x, const float* w, const float* g, float inv, bool silu, float* y, int64_t n);
void GateRowAvx512(const float* f, const float* dt, float a, float* g, int64_t n);

/**
 * Causal depthwise conv (kernel 4) of one token for channels [ch0, ch0 + n) without the SiLU:
 * y[c] = ((w0*s0 + w1*s1) + w2*s2) + w3*x (products and sums rounded separately, no FMA, so both
 * paths give the same bits), then the channel's state [s0, s1, s2] becomes [s1, s2, x].
 * x_row: the token's pre-conv inputs (indexed by channel); w: [channels][4]; conv: [channels][3].
 * The AVX-512 version handles 16 channels per step with lane permutes (state and weights stay in
 * their row-major layouts).
 */
void ConvAvx512(const float* x_row, const float* w, float* conv, int64_t ch0, int64_t n, float* y);

struct ChunkArgs;  // kda_chunk.h
/** One chunk of the WY form (kda_chunk.h ChunkMath) compiled for the baseline ISA / for AVX-512. */
void ChunkPortable(const ChunkArgs& a);
void ChunkAvx512(const ChunkArgs& a);
void SiluAvx512(float* y, int64_t n);

}  // namespace kda
}  // namespace specd
