// @specd/native-cuda: the kernels of the whole-model Llama runner (llama_runner.cc) that the single kernels of
// kernels.cu do not cover: RMSNorm straight to the bf16 input of the next GEMM (optionally over gathered rows),
// RoPE of q and k fused with the KV page write, and SwiGLU straight to bf16. Every launcher returns the CUDA status
// and never throws. Numerics: fp32 activations and accumulation, bf16 only where a GEMM reads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.h"
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

}  // namespace

int specdRmsNormBf16(void* out, const float* x, const float* w, const int32_t* rows, int numRows, int cols, float eps,
                     cudaStream_t stream) {
  rmsNormBf16Rows<<<numRows, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), x, w, rows, cols, eps);
  return static_cast<int>(cudaGetLastError());
}

int specdRopeKv(float* q, float* kPool, float* vPool, const float* qkv, const float* cosSin, const int32_t* positions,
                const int32_t* slots, int tokens, int qHeads, int kvHeads, int headDim, bool neox,
                cudaStream_t stream) {
  ropeKvRows<<<tokens, 128, 0, stream>>>(q, kPool, vPool, qkv, cosSin, positions, slots, qHeads, kvHeads, headDim,
                                         neox);
  return static_cast<int>(cudaGetLastError());
}

int specdSwigluBf16(void* out, const float* gu, int rows, int inter, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * inter;
  swigluBf16Rows<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), gu,
                                                                               rows, inter);
  return static_cast<int>(cudaGetLastError());
}
