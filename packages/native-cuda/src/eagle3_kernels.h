// @specd/native-cuda: launchers of eagle3.cu, the EAGLE-3 draft runner's own kernels (see there). Each returns a
// cudaError_t as int.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

/**
 * The draft layer's input rows: xb [rows, 2D] bf16 = [rms(embed[tokens[r]]) · inputNorm ; rms(g row) · hiddenNorm],
 * g row = g[gRows[r]] (gRows null: g[r]; negative: zeros); resid [rows, D] f32 (optional) = hidden_norm(g) when
 * `normBeforeResidual`, else g. embed bf16 [vocab, D]; norms f32 [D].
 */
int specdEagle3Input(void* xb, float* resid, const void* embed, const int32_t* tokens, int vocab, const float* g,
                     const int32_t* gRows, const float* inputNorm, const float* hiddenNorm, int rows, int D, float eps,
                     bool normBeforeResidual, cudaStream_t stream);
/** dst[dstRows[i], :] = src[srcRows[i], :], `count` rows of D f32. */
int specdCopyRows(float* dst, const int32_t* dstRows, const float* src, const int32_t* srcRows, int count, int D,
                  cudaStream_t stream);
