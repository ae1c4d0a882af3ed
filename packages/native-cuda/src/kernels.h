// @specd/native-cuda: launchers of kernels.cu (see there). Each returns a cudaError_t or cublasStatus_t as int.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

int specdToBf16(void* out, const float* x, int64_t n, cudaStream_t stream);
int specdRmsNorm(float* out, const float* x, const void* w, int rows, int cols, float eps, cudaStream_t stream);
int specdArgmax(int32_t* out, const float* x, int rows, int cols, cudaStream_t stream);
int specdSwiglu(float* out, const float* gu, int rows, int inter, cudaStream_t stream);
int specdEmbed(float* out, const void* table, const int32_t* ids, int rows, int hidden, cudaStream_t stream);
int specdRope(float* x, const int32_t* positions, int tokens, int heads, int headDim, int rotaryDim, float theta,
              bool neox, cudaStream_t stream);
int specdWriteKvPages(float* kPool, float* vPool, const float* k, const float* v, const int32_t* slots, int tokens,
                      int rowFloats, cudaStream_t stream);
/** Partitions of 256 keys a query of `maxKvLen` keys is split into (the `part` workspace's third dimension). */
int specdAttentionParts(int maxKvLen);
/**
 * Paged attention; the result goes to `out` f32 or, when `out` is null, to `outBf16` bf16 ([totalQ, qHeads, headDim]).
 */
int specdPagedAttention(float* out, void* outBf16, float* part, const float* q, const float* kPool, const float* vPool,
                        const int32_t* cuSeqlensQ, const int32_t* kvLens, const int32_t* blockTables,
                        const int32_t* positions, int numSeqs, int totalQ, int maxBlocks, int pageSize, int qHeads,
                        int kvHeads, int headDim, float scale, bool causal, int maxKvLen, cudaStream_t stream);
/** Whether specdPrefillAttention takes this headDim (64: the tensor-core kernel is written for it). */
bool specdPrefillAttentionFits(int headDim);
/**
 * Causal paged attention for prefill chunks (batches of more than 32 rows) on the tensor cores (TF32 operands, fp32
 * accumulation; FlashAttention-2's tiling): the arguments of specdPagedAttention (causal only, no partition
 * workspace; headDim as specdPrefillAttentionFits). A row's bits depend on its own sequence's keys only.
 */
int specdPrefillAttention(float* out, void* outBf16, const float* q, const float* kPool, const float* vPool,
                          const int32_t* cuSeqlensQ, const int32_t* kvLens, const int32_t* blockTables,
                          const int32_t* positions, int numSeqs, int totalQ, int maxBlocks, int pageSize, int qHeads,
                          int kvHeads, int headDim, float scale, cudaStream_t stream);
int specdGemmBf16(cublasLtHandle_t lt, float* out, const void* xb, const void* w, int m, int mPad, int n, int k,
                  void* workspace, size_t workspaceBytes, cudaStream_t stream, bool accumulate = false);

// llama.cu: the whole-model runner's fused kernels (see there).
int specdRmsNormBf16(void* out, const float* x, const float* w, const int32_t* rows, int numRows, int cols, float eps,
                     cudaStream_t stream);
/**
 * RoPE of q and k fused with the KV page write over tokens rows of a q|k|v GEMM's output whose q and k heads hold RoPE
 * pair i at (2i, 2i + 1) for either style (weights stored by specdRopePairedRows).
 */
int specdRopeKv(float* q, float* kPool, float* vPool, const float* qkv, const float* cosSin, const int32_t* positions,
                const int32_t* slots, int tokens, int qHeads, int kvHeads, int headDim, bool neox, cudaStream_t stream);
/**
 * Reorders the q and k rows of a q|k|v weight bf16 [(qHeads + 2 · kvHeads) · headDim, cols] in place (host memory) so
 * that each head's RoPE pair (i, i + headDim / 2) of the neox style sits at rows (2i, 2i + 1): what
 * specdSmallGemmNormRope's epilogue and specdRopeKv read. The v rows are left as they are.
 */
void specdRopePairedRows(uint16_t* w, int qHeads, int kvHeads, int headDim, int cols);
int specdSwigluBf16(void* out, const float* gu, int rows, int inter, cudaStream_t stream);

/**
 * Rows of the largest batch the small GEMM (llama.cu) takes: decode steps and verify blocks, up to 32 rows (each
 * block reads every row's activations, so at 64 rows cuBLASLt is faster: 38.2k vs 19.2k tok/s at 64 sequences).
 */
constexpr int kSmallGemmRows = 32;
/** Whether the small GEMM takes `rows` rows of depth k (1 ≤ rows ≤ 32, k a multiple of 64). */
bool specdSmallGemmFits(int rows, int k);
/**
 * out [rows, n] f32 (+)= x [rows, k] bf16 · wᵀ, w bf16 [n, k], on the tensor cores with fp32 accumulation;
 * row-invariant (a row's bits do not depend on the other rows or on `rows`); launched with PDL when on.
 */
int specdSmallGemm(float* out, const void* x, const void* w, int rows, int n, int k, bool accumulate,
                   cudaStream_t stream);
/** outBf16 [rows, inter] = bf16(silu(x · Wgᵀ) · (x · Wuᵀ)), w = [Wg ; Wu] bf16 [2 · inter, k]: the same GEMM. */
int specdSmallGemmSwiglu(void* outBf16, const void* x, const void* w, int rows, int inter, int k, cudaStream_t stream);
/**
 * The small GEMM with RMSNorm fused: the input rows are bf16(xf[row] / rms(xf[row]) · normW) of f32 rows xf
 * [*, k] (row rowIdx[r] when rowIdx is given), eps inside the root. → out [rows, n] f32, or with outBf16 the SwiGLU
 * form (n = inter, w = [Wg ; Wu]) into outBf16 [rows, n]. Row-invariant like specdSmallGemm.
 */
int specdSmallGemmNorm(float* out, void* outBf16, const float* xf, const float* normW, const int32_t* rowIdx, float eps,
                       const void* w, int rows, int n, int k, cudaStream_t stream);
/**
 * RMSNorm + the q|k|v GEMM + RoPE + the KV page write in one launch (the small GEMM with a RoPE epilogue): x f32 rows
 * [rows, k] normalised by normW, w the q|k|v weight bf16 [(qHeads + 2 · kvHeads) · headDim, k] with its neox pairs
 * adjacent (specdRopePairedRows; as stored for the interleaved style) → q f32 [rows, qHeads · headDim] rotated, k
 * rotated and v into the pools at slots[r] (−1: skipped), cos/sin of positions[r] from cosSin [position, headDim].
 * The same fp32 operations on the same values as specdSmallGemmNorm then specdRopeKv (so the same bits by
 * construction; not compared bit for bit by a test); row-invariant like specdSmallGemm.
 */
int specdSmallGemmNormRope(float* q, float* kPool, float* vPool, const float* cosSin, const int32_t* positions,
                           const int32_t* slots, int qHeads, int kvHeads, int headDim, bool neox, const float* xf,
                           const float* normW, float eps, const void* w, int rows, int k, cudaStream_t stream);
/** specdSmallGemmNormRope over bf16 rows x [rows, k] that are already the GEMM's input (no RMSNorm). */
int specdSmallGemmRope(float* q, float* kPool, float* vPool, const float* cosSin, const int32_t* positions,
                       const int32_t* slots, int qHeads, int kvHeads, int headDim, bool neox, const void* x,
                       const void* w, int rows, int k, cudaStream_t stream);
/** Bytes of the workspace specdArgmaxTwoPass needs for rows × cols. */
size_t specdArgmaxWorkspaceBytes(int rows, int cols);
/**
 * Greedy argmax of each row of x [rows, cols] f32 → out [rows] (lowest index among equal maxima; −1: a value not
 * finite). With `d2t` (an EAGLE-3 chain step's pick): also drafts [rows] = out and next [rows] = d2t[out] (0 for −1).
 */
int specdArgmaxTwoPass(int32_t* out, void* workspace, const float* x, int rows, int cols, cudaStream_t stream,
                       int32_t* drafts = nullptr, int32_t* next = nullptr, const int32_t* d2t = nullptr);
/** Programmatic dependent launch for later launches (launch.cuh; default on, used on sm_90+ only). */
void specdSetPdl(bool on);

// sampling.cu: sampling and rejection acceptance on the device (see there).
/** Bytes of the per-row statistics workspace of specdSampleAccept for `rows` stats rows. */
size_t specdSampleStatsBytes(int rows);
/**
 * Sampling + rejection acceptance of `groups` sequences over `statRows` logit rows (sampling.cu's file comment; the
 * packed arrays as sampler.h builds them): results [groups · 2] i32 (accepted drafts, token; token −1 when a row it
 * used is not finite), or null to skip the decision; probsOut [statRows, vocab] f32 (the rows' probabilities), or
 * null. Deterministic: a group's result depends on its own rows and inputs only.
 */
int specdSampleAccept(int32_t* results, void* statsWs, float* probsOut, const float* logits, int vocab, int groups,
                      int statRows, const int32_t* rowGroup, const int32_t* rowIndex, const int32_t* statsRow0,
                      const int32_t* gi, const double* gf, const int32_t* drafts, const double* uniforms,
                      const float* q, cudaStream_t stream);

/**
 * A draft head's q rows into the target vocabulary: out[r · outRowStride + outRow0, cols[i]] = in[r, i] over rows ×
 * inCols (out [*, outCols] f32; its other entries untouched; cols: the draft vocabulary's token ids).
 */
int specdScatterCols(float* out, const float* in, const int32_t* cols, int rows, int inCols, int outCols,
                     int outRowStride, int outRow0, cudaStream_t stream);

// binding.cc: device buffers whose rows one runner lends another by address (a drafter's q read by the target
// runner's sampler on the same device); a lent address is accepted only inside a registered buffer.
/** Registers [p, p + bytes) as lendable (until specdForgetDeviceRows(p)). Thread-safe. */
void specdRegisterDeviceRows(const void* p, size_t bytes);
/** Drops the buffer that starts at p. Thread-safe. */
void specdForgetDeviceRows(const void* p);
/** Whether [p, p + bytes) lies inside one registered buffer. Thread-safe. */
bool specdDeviceRowsValid(const void* p, size_t bytes);
