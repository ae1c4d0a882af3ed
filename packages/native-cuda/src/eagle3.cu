// @specd/native-cuda: the kernels of the EAGLE-3 draft runner (eagle3_runner.cc) that kernels.cu and llama.cu do not
// cover: the draft layer's input row [input_layernorm(embed(token)); hidden_norm(g)] straight to bf16 (with the
// residual g or hidden_norm(g) kept in f32), and a row copy between row sets (a sequence's last g into its slot). Every
// launcher returns the CUDA status and never throws. Numerics: fp32 activations, bf16 only where a GEMM reads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "eagle3_kernels.h"
#include "launch.cuh"

namespace {

constexpr int kThreads = 256;

/**
 * 1 / sqrt(mean(v²) + eps) of a row whose c-th value `load(c)` returns, by a block of kThreads threads: per-thread
 * strided sums, then a fixed tree in shared memory (row_reduce.cuh's order), so a row's bits do not depend on the
 * other rows. Ends with a barrier: a second call in the same kernel may reuse `partial` at once.
 */
template <typename Load>
__device__ __forceinline__ float blockRmsInv(Load load, int cols, float eps, float* partial) {
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = load(c);
    s += v * v;
  }
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = rsqrtf(partial[0] / cols + eps);
  __syncthreads();
  return inv;
}

/**
 * One block per row r (module comment of eagle3_runner.cc, "Step"): e = f32(embed[tokens[r]]) (an id outside
 * [0, vocab) reads row 0: a padded row, or a step after a non-finite argmax), g = g[gRows[r]] (gRows null: g[r];
 * gRows[r] < 0: zeros), xb[r] = [bf16(rms(e) · inputNorm) ; bf16(rms(g) · hiddenNorm)] (2D wide), and, when
 * `resid` is given, resid[r] = hidden_norm(g) (normBeforeResidual) or g, f32.
 */
__global__ void draftInputRows(__nv_bfloat16* xb, float* resid, const __nv_bfloat16* embed, const int32_t* tokens,
                               int vocab, const float* g, const int32_t* gRows, const float* inputNorm,
                               const float* hiddenNorm, int D, float eps, bool normBeforeResidual) {
  __shared__ float partial[kThreads];
  pdlWait();
  pdlLaunchNext();
  const int r = blockIdx.x;
  int32_t tok = tokens[r];
  if (tok < 0 || tok >= vocab) tok = 0;
  const __nv_bfloat16* er = embed + static_cast<int64_t>(tok) * D;
  const int64_t gRow = gRows == nullptr ? r : gRows[r];
  const float* gr = gRow < 0 ? nullptr : g + gRow * D;
  const float invE = blockRmsInv([&](int c) { return __bfloat162float(er[c]); }, D, eps, partial);
  const float invG = blockRmsInv([&](int c) { return gr == nullptr ? 0.f : gr[c]; }, D, eps, partial);
  __nv_bfloat16* out = xb + static_cast<int64_t>(r) * 2 * D;
  float* res = resid == nullptr ? nullptr : resid + static_cast<int64_t>(r) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    out[c] = __float2bfloat16_rn(__bfloat162float(er[c]) * invE * inputNorm[c]);
    const float gv = gr == nullptr ? 0.f : gr[c];
    const float gn = gv * invG * hiddenNorm[c];
    out[D + c] = __float2bfloat16_rn(gn);
    if (res != nullptr) res[c] = normBeforeResidual ? gn : gv;
  }
}

/** dst[dstRows[i], :] = src[srcRows[i], :] for i < count (rows of D f32); one block per copied row. */
__global__ void copyRows(float* dst, const int32_t* dstRows, const float* src, const int32_t* srcRows, int D) {
  pdlWait();
  pdlLaunchNext();
  const int64_t d = dstRows[blockIdx.x], s = srcRows[blockIdx.x];
  for (int c = threadIdx.x; c < D; c += blockDim.x) dst[d * D + c] = src[s * D + c];
}

}  // namespace

int specdEagle3Input(void* xb, float* resid, const void* embed, const int32_t* tokens, int vocab, const float* g,
                     const int32_t* gRows, const float* inputNorm, const float* hiddenNorm, int rows, int D, float eps,
                     bool normBeforeResidual, cudaStream_t stream) {
  if (rows == 0) return 0;
  return static_cast<int>(specdLaunch(draftInputRows, dim3(rows), dim3(kThreads), 0, stream,
                                      static_cast<__nv_bfloat16*>(xb), resid, static_cast<const __nv_bfloat16*>(embed),
                                      tokens, vocab, g, gRows, inputNorm, hiddenNorm, D, eps, normBeforeResidual));
}

int specdCopyRows(float* dst, const int32_t* dstRows, const float* src, const int32_t* srcRows, int count, int D,
                  cudaStream_t stream) {
  if (count == 0) return 0;
  return static_cast<int>(specdLaunch(copyRows, dim3(count), dim3(kThreads), 0, stream, dst, dstRows, src, srcRows, D));
}
