// @specd/native-cuda: launchers of dflash.cu, the DFlash draft runner's own kernel (see there). Returns a
// cudaError_t as int.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

/**
 * Per-head RMSNorm + RoPE (neox) + the draft KV page write over `rows` rows of src [rows, srcStride] f32 = q heads
 * [qHeads · headDim] then, per layer l < layers, k and v [kvHeads · headDim] each: q → q [rows, qHeads · headDim]
 * (qHeads 0: none), k of layer l → layer (layer0 + l)'s K pages, v → its V pages, at slots[r] (−1: skipped); layer
 * g's pages at pools + 2g · poolFloats (K) and + (2g + 1) · poolFloats (V), rows of kvHeads · headDim f32. qNorm
 * [headDim], kNorm [layers, headDim] f32; cos/sin of positions[r] from cosSin [position, headDim].
 */
int specdHeadNormRopeKv(float* q, float* pools, int64_t poolFloats, const float* src, int srcStride,
                        const float* cosSin, const int32_t* positions, const int32_t* slots, int rows, int qHeads,
                        int kvHeads, int headDim, int layers, int layer0, const float* qNorm, const float* kNorm,
                        float eps, cudaStream_t stream);
