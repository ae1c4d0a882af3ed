// @specd/native-cuda: the DFlash draft runner's own kernel (dflash_runner.cc): the per-head q/k RMSNorm of Qwen3-style
// attention, RoPE and the draft KV page write in one launch over the rows of a projection GEMM's output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dflash_kernels.h"
#include "launch.cuh"

namespace {

constexpr int kWarps = 4;

/**
 * One block of kWarps warps per row t of `src` [rows, srcStride] f32, laid out as q heads [qHeads · headDim], then per
 * layer l < layers: k [kvHeads · headDim], v [kvHeads · headDim]. Warp w takes head units w, w + kWarps, …: unit u <
 * qHeads is q head u (normed by qNorm, rotated, into q [t, qHeads · headDim]); a later unit is k head h of layer l
 * (normed by kNorm + l · headDim, rotated, into layer (layer0 + l)'s K page row slots[t]). RMSNorm per head: x ·
 * rsqrt(mean(x²) + eps) · w, the sum of squares by a fixed xor-shuffle tree; RoPE neox (pairs (i, i + headDim / 2))
 * with cos/sin from cosSin [position, headDim]. Then v rows are copied into the V pages. Slot −1 skips the page
 * writes (a padded row). Layer g's K pages start at pools + 2g · poolFloats, its V pages poolFloats after them.
 */
__global__ void headNormRopeKvRows(float* q, float* pools, int64_t poolFloats, const float* src, int srcStride,
                                   const float* cosSin, const int32_t* positions, const int32_t* slots, int qHeads,
                                   int kvHeads, int headDim, int layers, int layer0, const float* qNorm,
                                   const float* kNorm, float eps) {
  const int t = blockIdx.x;
  pdlWait();
  pdlLaunchNext();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int half = headDim / 2;
  const int qw = qHeads * headDim, kw = kvHeads * headDim;
  const float* row = src + static_cast<int64_t>(t) * srcStride;
  const float* cs = cosSin + static_cast<int64_t>(positions[t]) * headDim;
  const int64_t slot = slots[t];
  const int units = qHeads + layers * kvHeads;
  for (int u = warp; u < units; u += kWarps) {
    const bool isQ = u < qHeads;
    const int l = isQ ? 0 : (u - qHeads) / kvHeads, h = isQ ? u : (u - qHeads) % kvHeads;
    if (!isQ && slot < 0) continue;
    const float* in = isQ ? row + static_cast<int64_t>(u) * headDim : row + qw + 2 * l * kw + h * headDim;
    const float* w = isQ ? qNorm : kNorm + l * headDim;
    float* dst = isQ ? q + static_cast<int64_t>(t) * qw + u * headDim
                     : pools + 2 * (layer0 + l) * poolFloats + slot * kw + h * headDim;
    float ss = 0.f;
    for (int i = lane; i < half; i += 32) ss += in[i] * in[i] + in[i + half] * in[i + half];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / headDim + eps);
    for (int i = lane; i < half; i += 32) {
      const float a = in[i] * inv * w[i], b = in[i + half] * inv * w[i + half], c = cs[i], s = cs[half + i];
      dst[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      dst[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
  }
  if (slot < 0) return;
  for (int l = 0; l < layers; l++) {
    float* v = pools + (2 * (layer0 + l) + 1) * poolFloats + slot * kw;
    const float* in = row + qw + 2 * l * kw + kw;
    for (int c = threadIdx.x; c < kw; c += blockDim.x) v[c] = in[c];
  }
}

}  // namespace

int specdHeadNormRopeKv(float* q, float* pools, int64_t poolFloats, const float* src, int srcStride,
                        const float* cosSin, const int32_t* positions, const int32_t* slots, int rows, int qHeads,
                        int kvHeads, int headDim, int layers, int layer0, const float* qNorm, const float* kNorm,
                        float eps, cudaStream_t stream) {
  if (rows <= 0) return 0;
  return static_cast<int>(specdLaunch(headNormRopeKvRows, dim3(rows), dim3(32 * kWarps), 0, stream, q, pools,
                                      poolFloats, src, srcStride, cosSin, positions, slots, qHeads, kvHeads, headDim,
                                      layers, layer0, qNorm, kNorm, eps));
}
