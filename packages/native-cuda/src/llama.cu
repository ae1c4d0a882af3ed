// @specd/native-cuda: the kernels of the whole-model Llama runner (llama_runner.cc) that the single kernels of
// kernels.cu do not cover: RMSNorm straight to the bf16 input of the next GEMM (optionally over gathered rows),
// RoPE of q and k fused with the KV page write, and SwiGLU straight to bf16. Every launcher returns the CUDA status
// and never throws. Numerics: fp32 activations and accumulation, bf16 only where a GEMM reads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "launch.cuh"
#include "row_reduce.cuh"

namespace {

/**
 * out[r, :] = bf16(x[src, :] / sqrt(mean(x[src, :]²) + eps) · w), src = rows[r] when `rows` is given, else r; one
 * block of 256 threads per row, the sum of squares a fixed tree over the block (a row's bits do not depend on the
 * other rows). x f32 [*, cols], w f32 [cols], out bf16 [numRows, cols].
 */
__global__ void rmsNormBf16Rows(__nv_bfloat16* out, const float* x, const float* w, const int32_t* rows, int cols,
                                float eps) {
  pdlWait();
  pdlLaunchNext();
  const int64_t src = rows == nullptr ? blockIdx.x : rows[blockIdx.x];
  const float* xr = x + src * cols;
  __nv_bfloat16* orow = out + static_cast<int64_t>(blockIdx.x) * cols;
  const float inv = rmsInvRow(xr, cols, eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = __float2bfloat16_rn(xr[c] * inv * w[c]);
}

/**
 * One block per token t of a fused q|k|v row (qkv [*, (qHeads + 2 · kvHeads) · headDim] f32): q rotated into
 * q [t, qHeads, headDim]; k rotated and v copied into the layer's pools at row slots[t] ([*, kvHeads · headDim] f32;
 * slot −1 skips: a padded row). RoPE over the whole head (rotary dim = headDim) with cos/sin from the table
 * cosSin [position, headDim] (c_i at i, s_i at headDim/2 + i: the CPU path's values), neox pairs (i, i + half) or
 * interleaved (2i, 2i + 1). The q and k heads of the qkv rows hold pair i at (2i, 2i + 1) whatever the style (the
 * runners store their q|k|v weights so, specdRopePairedRows); the output keeps the style's layout.
 */
__global__ void ropeKvRows(float* q, float* kPool, float* vPool, const float* qkv, const float* cosSin,
                           const int32_t* positions, const int32_t* slots, int qHeads, int kvHeads, int headDim,
                           bool neox) {
  const int t = blockIdx.x;
  pdlWait();
  pdlLaunchNext();
  const int half = headDim / 2;
  const int qw = qHeads * headDim, kw = kvHeads * headDim;
  const float* src = qkv + static_cast<int64_t>(t) * (qw + 2 * kw);
  const float* cs = cosSin + static_cast<int64_t>(positions[t]) * headDim;
  const int64_t slot = slots[t];
  float* qr = q + static_cast<int64_t>(t) * qw;
  float* kr = slot >= 0 ? kPool + slot * kw : nullptr;
  const int pairs = (qHeads + kvHeads) * half;
  for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int head = idx / half, i = idx % half;
    const bool isQ = head < qHeads;
    if (!isQ && kr == nullptr) continue;
    const float* in = src + static_cast<int64_t>(head) * headDim;  // k heads follow the q heads in the row
    float* dst = isQ ? qr + head * headDim : kr + (head - qHeads) * headDim;
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    const float a = in[2 * i], b = in[2 * i + 1], c = cs[i], s = cs[half + i];
    dst[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    dst[ib] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
  if (slot < 0) return;
  for (int c = threadIdx.x; c < kw; c += blockDim.x) vPool[slot * kw + c] = src[qw + kw + c];
}

/** out[r, j] = bf16(silu(gu[r, j]) · gu[r, inter + j]) over rows of [gate | up] (2 · inter wide, f32). */
__global__ void swigluBf16Rows(__nv_bfloat16* out, const float* gu, int rows, int inter) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * inter) return;
  const int64_t r = i / inter;
  const int j = static_cast<int>(i % inter);
  const float g = gu[r * 2 * inter + j];
  const float u = gu[r * 2 * inter + inter + j];
  out[i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
}

constexpr int kSplitK = 4;  // warps of a small-GEMM block: each sums a fixed quarter of k

/**
 * Where the small GEMM's RoPE epilogue (ROPE) puts a q|k|v row: q rotated into q [rows, qw], k rotated into kPool
 * and v copied into vPool at row slots[r] ([*, kw] f32 each; slot −1 skips: a padded row), cos/sin of positions[r]
 * from cosSin [position, headDim] (ropeKvRows' table and arithmetic).
 */
struct RopeOut {
  float* q;
  float* kPool;
  float* vPool;
  const float* cosSin;
  const int32_t* positions;
  const int32_t* slots;
  int qw, kw, headDim;
  bool neox;
};

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/** 16 bf16 (32 bytes) at p as 8 words, or zeros when !valid. */
__device__ __forceinline__ void load16(uint32_t (&w)[8], const __nv_bfloat16* p, bool valid) {
  if (valid) {
    const uint4 lo = __ldg(reinterpret_cast<const uint4*>(p)), hi = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = 0u;
  }
}

/** 16 f32 at p scaled by inv and the norm weights nw, rounded to bf16, as 8 words; zeros when !valid. */
__device__ __forceinline__ void loadNorm16(uint32_t (&w)[8], const float* p, const float* nw, float inv, bool valid) {
  if (!valid) {
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = 0u;
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; q++) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p) + q), c = __ldg(reinterpret_cast<const float4*>(nw) + q);
    const __nv_bfloat162 lo =
        __floats2bfloat162_rn(__fmul_rn(__fmul_rn(v.x, inv), c.x), __fmul_rn(__fmul_rn(v.y, inv), c.y));
    const __nv_bfloat162 hi =
        __floats2bfloat162_rn(__fmul_rn(__fmul_rn(v.z, inv), c.z), __fmul_rn(__fmul_rn(v.w, inv), c.w));
    w[2 * q] = *reinterpret_cast<const uint32_t*>(&lo);
    w[2 * q + 1] = *reinterpret_cast<const uint32_t*>(&hi);
  }
}

/**
 * The GEMM of a batch of at most 32 rows (decode steps and verify blocks) on the tensor cores: out[r, c] (+)= Σ_k
 * x[r, k] · W[c, k], x bf16 [rows, k] in MC chunks of 16 rows (the last padded with zeros in registers; a W
 * fragment loaded once feeds every chunk), W bf16 [n, k], k a multiple of 64, fp32 accumulation (mma.sync m16n8k16). A
 * block owns NT tiles of 8 output columns; its kSplitK warps each sum a fixed range of k's 64-wide superblocks, and
 * warp 0 adds the four partial tiles in warp order. Inside a superblock, lane (g = lane / 4, t = lane % 4) feeds the
 * MMA the 16 contiguous elements [t·16, t·16 + 16) of rows g and g + 8 and of its tile's column g, four per MMA step:
 * the k order inside the MMA is a fixed permutation of the superblock, the same for x and W. Nothing depends on `rows`
 * except which rows are zero, and the MMA's row r reads row r of x only: a row's bits are the same at any batch size up
 * to 64 (the row invariance greedy speculation needs: a verify block's row equals the decode step's). PAIR (SwiGLU):
 * the tiles are gate columns [c0, c0 + 8·NT) and the same up columns n + c0 … of W [2n, k]; the epilogue writes outBf16
 * [rows, n] = bf16(silu(gate) · up) instead of out. NORM (RMSNorm fused): x is xf f32 rows (row rowIdx[r] when given),
 * each block computes a row's 1 / rms (warp r mod 4: a strided float4 sum of squares and a fixed butterfly) and feeds
 * the MMA bf16(x · inv · normW). ROPE (q|k|v with RoPE and the KV write fused, `ro`): W's q and k rows hold each RoPE
 * pair at adjacent columns (2i, 2i + 1) of its head (specdRopePairedRows), so a lane's two accumulators of a row are
 * one pair: rotated as ropeKvRows does (the same fp32 operations on the same values: the same bits) and written to
 * q / the K pool; the v columns go to the V pool.
 */
template <int NT, int MC, bool PAIR, bool NORM, bool ROPE = false>
__global__ void __launch_bounds__(kSplitK * 32)
    mmaGemm(float* out, __nv_bfloat16* outBf16, const __nv_bfloat16* x, const float* xf, const float* normW,
            const int32_t* rowIdx, float eps, const __nv_bfloat16* W, int rows, int n, int k, bool accumulate,
            RopeOut ro) {
  constexpr int TILES = PAIR ? 2 * NT : NT;
  __shared__ float partial[kSplitK - 1][32][MC * TILES * 4];
  __shared__ float invS[16 * MC];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int c0 = blockIdx.x * 8 * NT;
  int wrow[TILES];
  bool wok[TILES];
#pragma unroll
  for (int i = 0; i < TILES; i++) {
    const int c = c0 + 8 * (i % NT) + g;
    wok[i] = c < n;
    wrow[i] = (PAIR && i >= NT ? n : 0) + (wok[i] ? c : 0);
  }
  const int sbs = k / 64;
  const int per = (sbs + kSplitK - 1) / kSplitK;
  const int sb0 = warp * per, sb1 = min(sbs, sb0 + per);
  // this warp's weights into L2 while the previous kernel finishes
  for (int i = 0; i < TILES; i++)
    if (wok[i] && sb0 < sb1) {
      const char* p = reinterpret_cast<const char*>(W + static_cast<int64_t>(wrow[i]) * k + sb0 * 64);
      for (int off = t * 128; off < (sb1 - sb0) * 128; off += 4 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
    }
  pdlWait();
  pdlLaunchNext();
  if (NORM) {
    for (int r = warp; r < 16 * MC; r += kSplitK) {
      float ss = 0.f;
      if (r < rows) {
        const float4* xr = reinterpret_cast<const float4*>(xf + static_cast<int64_t>(rowIdx ? rowIdx[r] : r) * k);
#pragma unroll 4
        for (int i = lane; i < k / 4; i += 32) {
          const float4 v = __ldg(xr + i);
          ss = __fmaf_rn(v.x, v.x, ss);
          ss = __fmaf_rn(v.y, v.y, ss);
          ss = __fmaf_rn(v.z, v.z, ss);
          ss = __fmaf_rn(v.w, v.w, ss);
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
      if (lane == 0) invS[r] = rsqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(k)), eps));
    }
    __syncthreads();
  }
  float acc[MC][TILES][4];
#pragma unroll
  for (int m = 0; m < MC; m++)
#pragma unroll
    for (int i = 0; i < TILES; i++) acc[m][i][0] = acc[m][i][1] = acc[m][i][2] = acc[m][i][3] = 0.f;
  // this lane's two rows of each 16-row chunk m: 16m + g and 16m + g + 8
  bool ok[MC][2];
  int64_t off[MC][2];
  float inv[MC][2];
#pragma unroll
  for (int m = 0; m < MC; m++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = 16 * m + g + 8 * h;
      ok[m][h] = r < rows;
      const int src = ok[m][h] ? (NORM && rowIdx != nullptr ? rowIdx[r] : r) : 0;
      off[m][h] = static_cast<int64_t>(src) * k + t * 16;
      inv[m][h] = NORM && ok[m][h] ? invS[r] : 0.f;
    }
#pragma unroll 2
  for (int sb = sb0; sb < sb1; sb++) {
    uint32_t b[TILES][8];
#pragma unroll
    for (int i = 0; i < TILES; i++) load16(b[i], W + static_cast<int64_t>(wrow[i]) * k + sb * 64 + t * 16, wok[i]);
#pragma unroll
    for (int m = 0; m < MC; m++) {
      uint32_t a0[8], a1[8];
      if (NORM) {
        loadNorm16(a0, xf + off[m][0] + sb * 64, normW + sb * 64 + t * 16, inv[m][0], ok[m][0]);
        loadNorm16(a1, xf + off[m][1] + sb * 64, normW + sb * 64 + t * 16, inv[m][1], ok[m][1]);
      } else {
        load16(a0, x + off[m][0] + sb * 64, ok[m][0]);
        load16(a1, x + off[m][1] + sb * 64, ok[m][1]);
      }
#pragma unroll
      for (int s = 0; s < 4; s++) {
        const uint32_t a[4] = {a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1]};
#pragma unroll
        for (int i = 0; i < TILES; i++) mma16816(acc[m][i], a, b[i][2 * s], b[i][2 * s + 1]);
      }
    }
  }
  if (warp > 0) {
#pragma unroll
    for (int m = 0; m < MC; m++)
#pragma unroll
      for (int i = 0; i < TILES; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) partial[warp - 1][lane][(m * TILES + i) * 4 + e] = acc[m][i][e];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kSplitK - 1; w++)
#pragma unroll
    for (int m = 0; m < MC; m++)
#pragma unroll
      for (int i = 0; i < TILES; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[m][i][e] = __fadd_rn(acc[m][i][e], partial[w][lane][(m * TILES + i) * 4 + e]);
  // C fragment: acc[m][i][0..1] row 16m + g, columns 2t, 2t + 1 of tile i; acc[m][i][2..3] row 16m + g + 8
  if constexpr (ROPE) {
    const int half = ro.headDim / 2;
#pragma unroll
    for (int m = 0; m < MC; m++)
#pragma unroll
      for (int i = 0; i < NT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int r = 16 * m + g + 8 * h;
          const int c = c0 + 8 * i + 2 * t;
          if (r >= rows || c >= n) continue;
          const float a = acc[m][i][2 * h], b = acc[m][i][2 * h + 1];
          const int64_t slot = ro.slots[r];
          if (c >= ro.qw + ro.kw) {  // v: copied
            if (slot >= 0) {
              float* dst = ro.vPool + slot * ro.kw + (c - ro.qw - ro.kw);
              dst[0] = a;
              dst[1] = b;
            }
            continue;
          }
          const bool isQ = c < ro.qw;
          if (!isQ && slot < 0) continue;
          const int cc = isQ ? c : c - ro.qw;
          const int head = cc / ro.headDim, p = (cc % ro.headDim) / 2;
          const int ia = ro.neox ? p : 2 * p, ib = ro.neox ? p + half : 2 * p + 1;
          const float* cs = ro.cosSin + static_cast<int64_t>(ro.positions[r]) * ro.headDim;
          const float cv = cs[p], sv = cs[half + p];
          float* dst = (isQ ? ro.q + static_cast<int64_t>(r) * ro.qw : ro.kPool + slot * ro.kw) + head * ro.headDim;
          dst[ia] = __fsub_rn(__fmul_rn(a, cv), __fmul_rn(b, sv));
          dst[ib] = __fadd_rn(__fmul_rn(b, cv), __fmul_rn(a, sv));
        }
  } else {
#pragma unroll
    for (int m = 0; m < MC; m++)
#pragma unroll
      for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = 16 * m + (e < 2 ? g : g + 8);
          const int c = c0 + 8 * i + 2 * t + (e & 1);
          if (r >= rows || c >= n) continue;
          if (PAIR) {
            const float gate = acc[m][i][e], up = acc[m][NT + i][e];
            outBf16[static_cast<int64_t>(r) * n + c] = __float2bfloat16_rn(gate / (1.f + expf(-gate)) * up);
          } else {
            float* dst = out + static_cast<int64_t>(r) * n + c;
            *dst = accumulate ? __fadd_rn(*dst, acc[m][i][e]) : acc[m][i][e];
          }
        }
  }
}

/**
 * Greedy argmax, first pass: block (row, p) scans columns [p · 2048, p · 2048 + 2048) of x [rows, cols] (float4
 * loads when cols is a multiple of 4) → part[row, p] = (max, lowest index of it, any value not finite).
 */
constexpr int kArgmaxSpan = 2048;
struct ArgmaxPart {
  float v;
  int i;
  int bad;
};

__device__ __forceinline__ void argmaxTake(float& b, int& bi, float v, int i) {
  if (v > b || (v == b && i < bi)) {
    b = v;
    bi = i;
  }
}

__global__ void __launch_bounds__(256) argmaxPass1(ArgmaxPart* part, const float* x, int cols) {
  __shared__ float sv[256];
  __shared__ int si[256];
  pdlWait();
  pdlLaunchNext();
  const int row = blockIdx.x, p = blockIdx.y, parts = gridDim.y;
  const float* xr = x + static_cast<int64_t>(row) * cols;
  const int begin = p * kArgmaxSpan, end = min(cols, begin + kArgmaxSpan);
  float b = -INFINITY;
  int bi = 0x7fffffff, bad = 0;
#pragma unroll
  for (int j = 0; j < kArgmaxSpan / 256; j++) {
    const int c = begin + j * 256 + threadIdx.x;
    if (c < end) {
      const float v = xr[c];
      bad |= !isfinite(v);
      argmaxTake(b, bi, v, c);
    }
  }
  bad = __syncthreads_or(bad);
  sv[threadIdx.x] = b;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int stride = 128; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride)
      argmaxTake(sv[threadIdx.x], si[threadIdx.x], sv[threadIdx.x + stride], si[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) part[static_cast<int64_t>(row) * parts + p] = {sv[0], si[0], bad};
}

/**
 * Greedy argmax, second pass: one warp per row over its parts → out[row] (−1 when a value was not finite); with
 * `d2t`, also drafts[row] = out[row] and next[row] = d2t[out[row]] (0 for −1): an EAGLE-3 chain step's pick.
 */
__global__ void argmaxPass2(int32_t* out, const ArgmaxPart* part, int parts, int32_t* drafts, int32_t* next,
                            const int32_t* d2t) {
  pdlWait();
  pdlLaunchNext();
  const int row = blockIdx.x, lane = threadIdx.x;
  float b = -INFINITY;
  int bi = 0x7fffffff, bad = 0;
  for (int p = lane; p < parts; p += 32) {
    const ArgmaxPart q = part[static_cast<int64_t>(row) * parts + p];
    bad |= q.bad;
    argmaxTake(b, bi, q.v, q.i);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, b, o);
    const int i = __shfl_xor_sync(0xffffffffu, bi, o);
    argmaxTake(b, bi, v, i);
    bad |= __shfl_xor_sync(0xffffffffu, bad, o);
  }
  if (lane == 0) {
    const int32_t a = bad ? -1 : bi;
    out[row] = a;
    if (d2t != nullptr) {
      drafts[row] = a;
      next[row] = a < 0 ? 0 : d2t[a];
    }
  }
}

template <int NT, int MC, bool PAIR, bool NORM, bool ROPE>
int launchMmaMc(float* out, void* outBf16, const void* x, const float* xf, const float* normW, const int32_t* rowIdx,
                float eps, const void* w, int rows, int n, int k, bool accumulate, const RopeOut& ro,
                cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((n + 8 * NT - 1) / (8 * NT));
  return static_cast<int>(specdLaunch(mmaGemm<NT, MC, PAIR, NORM, ROPE>, dim3(blocks), dim3(kSplitK * 32), 0, stream,
                                      out, static_cast<__nv_bfloat16*>(outBf16), static_cast<const __nv_bfloat16*>(x),
                                      xf, normW, rowIdx, eps, static_cast<const __nv_bfloat16*>(w), rows, n, k,
                                      accumulate, ro));
}

/** The 16-row chunks the batch needs: 1 or 2 (each chunk's rows computed by the same MMA code). */
template <int NT, bool PAIR, bool NORM, bool ROPE = false>
int launchMma(float* out, void* outBf16, const void* x, const float* xf, const float* normW, const int32_t* rowIdx,
              float eps, const void* w, int rows, int n, int k, bool accumulate, cudaStream_t stream,
              const RopeOut& ro = RopeOut{}) {
  if (rows <= 16)
    return launchMmaMc<NT, 1, PAIR, NORM, ROPE>(out, outBf16, x, xf, normW, rowIdx, eps, w, rows, n, k, accumulate, ro,
                                                stream);
  return launchMmaMc<NT, 2, PAIR, NORM, ROPE>(out, outBf16, x, xf, normW, rowIdx, eps, w, rows, n, k, accumulate, ro,
                                              stream);
}

}  // namespace

bool specdSmallGemmFits(int rows, int k) { return rows >= 1 && rows <= kSmallGemmRows && k % 64 == 0; }

int specdSmallGemm(float* out, const void* x, const void* w, int rows, int n, int k, bool accumulate,
                   cudaStream_t stream) {
  if (!specdSmallGemmFits(rows, k)) return static_cast<int>(cudaErrorInvalidValue);
  if (n >= 16384)
    return launchMma<4, false, false>(out, nullptr, x, nullptr, nullptr, nullptr, 0.f, w, rows, n, k, accumulate,
                                      stream);
  return launchMma<1, false, false>(out, nullptr, x, nullptr, nullptr, nullptr, 0.f, w, rows, n, k, accumulate, stream);
}

int specdSmallGemmSwiglu(void* outBf16, const void* x, const void* w, int rows, int inter, int k, cudaStream_t stream) {
  if (!specdSmallGemmFits(rows, k)) return static_cast<int>(cudaErrorInvalidValue);
  return launchMma<1, true, false>(nullptr, outBf16, x, nullptr, nullptr, nullptr, 0.f, w, rows, inter, k, false,
                                   stream);
}

int specdSmallGemmNorm(float* out, void* outBf16, const float* xf, const float* normW, const int32_t* rowIdx, float eps,
                       const void* w, int rows, int n, int k, cudaStream_t stream) {
  if (!specdSmallGemmFits(rows, k)) return static_cast<int>(cudaErrorInvalidValue);
  if (outBf16 != nullptr)
    return launchMma<1, true, true>(nullptr, outBf16, nullptr, xf, normW, rowIdx, eps, w, rows, n, k, false, stream);
  if (n >= 16384)
    return launchMma<4, false, true>(out, nullptr, nullptr, xf, normW, rowIdx, eps, w, rows, n, k, false, stream);
  return launchMma<1, false, true>(out, nullptr, nullptr, xf, normW, rowIdx, eps, w, rows, n, k, false, stream);
}

int specdSmallGemmNormRope(float* q, float* kPool, float* vPool, const float* cosSin, const int32_t* positions,
                           const int32_t* slots, int qHeads, int kvHeads, int headDim, bool neox, const float* xf,
                           const float* normW, float eps, const void* w, int rows, int k, cudaStream_t stream) {
  const int qw = qHeads * headDim, kw = kvHeads * headDim;
  if (!specdSmallGemmFits(rows, k) || headDim % 8 != 0) return static_cast<int>(cudaErrorInvalidValue);
  const RopeOut ro{q, kPool, vPool, cosSin, positions, slots, qw, kw, headDim, neox};
  return launchMma<1, false, true, true>(nullptr, nullptr, nullptr, xf, normW, nullptr, eps, w, rows, qw + 2 * kw, k,
                                         false, stream, ro);
}

int specdSmallGemmRope(float* q, float* kPool, float* vPool, const float* cosSin, const int32_t* positions,
                       const int32_t* slots, int qHeads, int kvHeads, int headDim, bool neox, const void* x,
                       const void* w, int rows, int k, cudaStream_t stream) {
  const int qw = qHeads * headDim, kw = kvHeads * headDim;
  if (!specdSmallGemmFits(rows, k) || headDim % 8 != 0) return static_cast<int>(cudaErrorInvalidValue);
  const RopeOut ro{q, kPool, vPool, cosSin, positions, slots, qw, kw, headDim, neox};
  return launchMma<1, false, false, true>(nullptr, nullptr, x, nullptr, nullptr, nullptr, 0.f, w, rows, qw + 2 * kw, k,
                                          false, stream, ro);
}

void specdRopePairedRows(uint16_t* w, int qHeads, int kvHeads, int headDim, int cols) {
  const int half = headDim / 2;
  std::vector<uint16_t> head(static_cast<size_t>(headDim) * cols);
  for (int h = 0; h < qHeads + kvHeads; h++) {
    uint16_t* base = w + static_cast<size_t>(h) * headDim * cols;
    std::copy(base, base + head.size(), head.begin());
    for (int i = 0; i < half; i++) {
      std::copy_n(head.data() + static_cast<size_t>(i) * cols, cols, base + static_cast<size_t>(2 * i) * cols);
      std::copy_n(head.data() + static_cast<size_t>(i + half) * cols, cols,
                  base + static_cast<size_t>(2 * i + 1) * cols);
    }
  }
}

size_t specdArgmaxWorkspaceBytes(int rows, int cols) {
  return static_cast<size_t>(rows) * ((cols + kArgmaxSpan - 1) / kArgmaxSpan) * sizeof(ArgmaxPart);
}

int specdArgmaxTwoPass(int32_t* out, void* workspace, const float* x, int rows, int cols, cudaStream_t stream,
                       int32_t* drafts, int32_t* next, const int32_t* d2t) {
  const int parts = (cols + kArgmaxSpan - 1) / kArgmaxSpan;
  ArgmaxPart* part = static_cast<ArgmaxPart*>(workspace);
  cudaError_t e = specdLaunch(argmaxPass1, dim3(rows, parts), dim3(256), 0, stream, part, x, cols);
  if (e != cudaSuccess) return static_cast<int>(e);
  return static_cast<int>(specdLaunch(argmaxPass2, dim3(rows), dim3(32), 0, stream, out,
                                      static_cast<const ArgmaxPart*>(part), parts, drafts, next, d2t));
}

namespace {
bool g_pdl = true;
int g_pdlArch = -1;  // the device's major compute capability, read once
}  // namespace

bool specdPdlEnabled() {
  if (!g_pdl) return false;
  if (g_pdlArch < 0) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      major = 0;
    g_pdlArch = major;
  }
  return g_pdlArch >= 9;
}

void specdSetPdl(bool on) { g_pdl = on; }

int specdRmsNormBf16(void* out, const float* x, const float* w, const int32_t* rows, int numRows, int cols, float eps,
                     cudaStream_t stream) {
  return static_cast<int>(specdLaunch(rmsNormBf16Rows, dim3(numRows), dim3(256), 0, stream,
                                      static_cast<__nv_bfloat16*>(out), x, w, rows, cols, eps));
}

int specdRopeKv(float* q, float* kPool, float* vPool, const float* qkv, const float* cosSin, const int32_t* positions,
                const int32_t* slots, int tokens, int qHeads, int kvHeads, int headDim, bool neox,
                cudaStream_t stream) {
  return static_cast<int>(specdLaunch(ropeKvRows, dim3(tokens), dim3(128), 0, stream, q, kPool, vPool, qkv, cosSin,
                                      positions, slots, qHeads, kvHeads, headDim, neox));
}

int specdSwigluBf16(void* out, const float* gu, int rows, int inter, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * inter;
  swigluBf16Rows<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), gu, rows,
                                                                             inter);
  return static_cast<int>(cudaGetLastError());
}
