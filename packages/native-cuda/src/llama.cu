// @specd/native-cuda: the kernels of the whole-model Llama runner (llama_runner.cc) that the single kernels of
// kernels.cu do not cover: RMSNorm straight to the bf16 input of the next GEMM (optionally over gathered rows),
// RoPE of q and k fused with the KV page write, and SwiGLU straight to bf16. Every launcher returns the CUDA status
// and never throws. Numerics: fp32 activations and accumulation, bf16 only where a GEMM reads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

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
 * interleaved (2i, 2i + 1).
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
    const float a = in[ia], b = in[ib], c = cs[i], s = cs[half + i];
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

/** What a small GEMM's prologue makes of its input (the bf16 rows the GEMV reads). */
enum SmallIn : int {
  kInBf16 = 0,    // bf16 [rows, k] as given (the attention output)
  kInNorm = 1,    // RMSNorm of f32 [*, k] rows (gathered by rowIdx when given) times normW, rounded to bf16
  kInSwiglu = 2,  // silu(gate) · up of f32 [rows, 2k] = [gate | up], rounded to bf16
};

constexpr int kSmallWarps = 4;

__device__ __forceinline__ void fma8(float& acc, const uint4& w, const uint4& x) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const float2 wf = __bfloat1622float2(wp[e]), xf = __bfloat1622float2(xp[e]);
    acc = __fmaf_rn(wf.x, xf.x, acc);
    acc = __fmaf_rn(wf.y, xf.y, acc);
  }
}

/**
 * The GEMM of a batch of at most 16 rows (decode steps and verify blocks): out[r, c] (+)= Σ_k in[r, k] · W[c, k],
 * W bf16 [n, k] (k a multiple of 8), the input made by prologue P into shared memory as bf16 [M, k] (rows ≥ `rows`
 * are zeros). One warp owns C output columns: lane l sums the 8-element chunks l, l + 32, … in order with fp32 FMAs,
 * then a fixed xor butterfly adds the 32 lanes. Row r's bits depend on row r alone — not on M, C or the other rows
 * (the row invariance greedy speculation needs: a verify block's row equals the decode step's). The RMSNorm scale of
 * a row is one warp's strided sum of squares and the same butterfly. With PDL the block prefetches its weight rows
 * into L2 before waiting for the previous kernel.
 */
template <int M, int C, int P>
__global__ void __launch_bounds__(kSmallWarps * 32)
    smallGemm(float* out, const void* in, const float* normW, const int32_t* rowIdx, const __nv_bfloat16* W, int rows,
              int n, int k, float eps, bool accumulate) {
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col0 = (blockIdx.x * kSmallWarps + warp) * C;
  const int chunks = k / 8;
  // the warp's weight rows into L2 while the previous kernel finishes (128-byte lines)
  for (int c = 0; c < C; c++)
    if (col0 + c < n) {
      const char* row = reinterpret_cast<const char*>(W + static_cast<int64_t>(col0 + c) * k);
      for (int off = lane * 128; off < k * 2; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
    }
  pdlWait();
  pdlLaunchNext();
  if (P == kInNorm) {
    const float* x = static_cast<const float*>(in);
    for (int r = warp; r < M; r += kSmallWarps) {
      __nv_bfloat16* dst = xs + r * k;
      if (r >= rows) {
        for (int i = lane; i < k; i += 32) dst[i] = __float2bfloat16_rn(0.f);
        continue;
      }
      const float* xr = x + static_cast<int64_t>(rowIdx == nullptr ? r : rowIdx[r]) * k;
      float s = 0.f;
      for (int i = lane; i < k; i += 32) s = __fmaf_rn(xr[i], xr[i], s);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
      const float inv = rsqrtf(__fadd_rn(__fdiv_rn(s, static_cast<float>(k)), eps));
      for (int i = lane; i < k; i += 32) dst[i] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(xr[i], inv), normW[i]));
    }
  } else if (P == kInSwiglu) {
    const float* gu = static_cast<const float*>(in);
    for (int i = threadIdx.x; i < M * k; i += blockDim.x) {
      const int r = i / k, j = i % k;
      float v = 0.f;
      if (r < rows) {
        const float g = gu[static_cast<int64_t>(r) * 2 * k + j], u = gu[static_cast<int64_t>(r) * 2 * k + k + j];
        v = g / (1.f + expf(-g)) * u;
      }
      xs[i] = __float2bfloat16_rn(v);
    }
  } else {
    const uint4* src = static_cast<const uint4*>(in);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int i = threadIdx.x; i < M * chunks; i += blockDim.x)
      dst[i] = i / chunks < rows ? src[i] : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  if (col0 >= n) return;
  float acc[C][M];
#pragma unroll
  for (int c = 0; c < C; c++)
#pragma unroll
    for (int m = 0; m < M; m++) acc[c][m] = 0.f;
  const uint4* wrow[C];
#pragma unroll
  for (int c = 0; c < C; c++)
    wrow[c] = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(min(col0 + c, n - 1)) * k);
  const uint4* xv = reinterpret_cast<const uint4*>(xs);
#pragma unroll 2
  for (int ch = lane; ch < chunks; ch += 32) {
    uint4 w[C];
#pragma unroll
    for (int c = 0; c < C; c++) w[c] = __ldg(wrow[c] + ch);
#pragma unroll
    for (int m = 0; m < M; m++) {
      const uint4 xm = xv[m * chunks + ch];
#pragma unroll
      for (int c = 0; c < C; c++) fma8(acc[c][m], w[c], xm);
    }
  }
#pragma unroll
  for (int c = 0; c < C; c++)
#pragma unroll
    for (int m = 0; m < M; m++) {
      float v = acc[c][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
      if (lane == ((c * M + m) & 31) && m < rows && col0 + c < n) {
        float* dst = out + static_cast<int64_t>(m) * n + col0 + c;
        *dst = accumulate ? __fadd_rn(*dst, v) : v;
      }
    }
}

template <int M, int C, int P>
int launchSmall(float* out, const void* in, const float* normW, const int32_t* rowIdx, const void* W, int rows, int n,
                int k, float eps, bool accumulate, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(M) * k * 2;
  static size_t allowed = 48u << 10;  // per instantiation: raised once, outside any graph capture (the warm-up)
  if (smem > allowed) {
    const cudaError_t e =
        cudaFuncSetAttribute(smallGemm<M, C, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
    allowed = smem;
  }
  const unsigned blocks = static_cast<unsigned>((n + kSmallWarps * C - 1) / (kSmallWarps * C));
  return static_cast<int>(specdLaunch(smallGemm<M, C, P>, dim3(blocks), dim3(kSmallWarps * 32), smem, stream, out, in,
                                      normW, rowIdx, static_cast<const __nv_bfloat16*>(W), rows, n, k, eps,
                                      accumulate));
}

/** Columns per warp: more for wide outputs (the lm_head) and many rows (the prologue's work per block). */
template <int M, int P>
int dispatchC(float* out, const void* in, const float* normW, const int32_t* rowIdx, const void* W, int rows, int n,
              int k, float eps, bool accumulate, cudaStream_t stream) {
  if (n >= 16384)
    return launchSmall<M, (M <= 4 ? 8 : 4), P>(out, in, normW, rowIdx, W, rows, n, k, eps, accumulate, stream);
  return launchSmall<M, (M <= 2 ? 2 : 4), P>(out, in, normW, rowIdx, W, rows, n, k, eps, accumulate, stream);
}

template <int P>
int dispatchM(float* out, const void* in, const float* normW, const int32_t* rowIdx, const void* W, int rows, int n,
              int k, float eps, bool accumulate, cudaStream_t stream) {
  if (rows <= 1) return dispatchC<1, P>(out, in, normW, rowIdx, W, rows, n, k, eps, accumulate, stream);
  if (rows <= 2) return dispatchC<2, P>(out, in, normW, rowIdx, W, rows, n, k, eps, accumulate, stream);
  if (rows <= 4) return dispatchC<4, P>(out, in, normW, rowIdx, W, rows, n, k, eps, accumulate, stream);
  if (rows <= 8) return dispatchC<8, P>(out, in, normW, rowIdx, W, rows, n, k, eps, accumulate, stream);
  return dispatchC<16, P>(out, in, normW, rowIdx, W, rows, n, k, eps, accumulate, stream);
}

}  // namespace

bool specdSmallGemmFits(int rows, int k) {
  return rows >= 1 && rows <= kSmallGemmRows && k % 8 == 0 && static_cast<size_t>(16) * k * 2 <= (160u << 10);
}

int specdSmallGemm(float* out, const void* in, int prologue, const float* normW, const int32_t* rowIdx, const void* w,
                   int rows, int n, int k, float eps, bool accumulate, cudaStream_t stream) {
  if (!specdSmallGemmFits(rows, k) || prologue < kInBf16 || prologue > kInSwiglu)
    return static_cast<int>(cudaErrorInvalidValue);
  if (prologue == kInNorm) return dispatchM<kInNorm>(out, in, normW, rowIdx, w, rows, n, k, eps, accumulate, stream);
  if (prologue == kInSwiglu)
    return dispatchM<kInSwiglu>(out, in, normW, rowIdx, w, rows, n, k, eps, accumulate, stream);
  return dispatchM<kInBf16>(out, in, normW, rowIdx, w, rows, n, k, eps, accumulate, stream);
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
  rmsNormBf16Rows<<<numRows, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), x, w, rows, cols, eps);
  return static_cast<int>(cudaGetLastError());
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
