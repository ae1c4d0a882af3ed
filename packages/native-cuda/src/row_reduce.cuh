// @specd/native-cuda: device helpers shared by kernels.cu and llama.cu.
#pragma once
#include <cuda_runtime.h>

/**
 * 1 / sqrt(mean(xr[0, cols)²) + eps) for the row `xr`, computed by a whole block of ≤ 256 threads (every thread
 * gets it): per-thread strided sums, then a fixed tree in shared memory, so a row's bits do not depend on the other
 * rows of the launch. RMSNorm's scale (kernels.cu's rmsNormRows, llama.cu's rmsNormBf16Rows).
 */
__device__ __forceinline__ float rmsInvRow(const float* xr, int cols, float eps) {
  __shared__ float partial[256];
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c] * xr[c];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  return rsqrtf(partial[0] / cols + eps);
}
