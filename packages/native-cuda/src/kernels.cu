// @specd/native-cuda: the device side of the first CUDA kernels (issue 18). Device memory is owned by the caller
// (binding.cc: cudaMalloc'd buffers behind opaque handles); every function here launches on `stream` and returns the
// CUDA or cuBLAS status, never throws. Numerics: bf16 weights, fp32 accumulation, fp32 activations in and out.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "kernels.h"
#include "launch.cuh"
#include "row_reduce.cuh"

namespace {

/** out[i] = bf16(x[i]) (round to nearest even), n elements. */
__global__ void toBf16(__nv_bfloat16* out, const float* x, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}

/**
 * RMSNorm, one block per row: out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) · w (w bf16), fp32 throughout.
 * The row's sum of squares is a fixed tree over the block's threads: the same bits for a row whatever the rows.
 */
__global__ void rmsNormRows(float* out, const float* x, const __nv_bfloat16* w, int cols, float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * cols;
  float* orow = out + static_cast<int64_t>(blockIdx.x) * cols;
  const float inv = rmsInvRow(xr, cols, eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = xr[c] * inv * __bfloat162float(w[c]);
}

/**
 * Greedy argmax, one block per row (the lowest index among equal maxima, as the CPU path); −1 for a row with a
 * value that is not finite (the CPU path's checkLogitsRow refuses such a row).
 */
__global__ void argmaxRows(int32_t* out, const float* x, int cols) {
  __shared__ float best[256];
  __shared__ int idx[256];
  pdlWait();
  pdlLaunchNext();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * cols;
  float b = -INFINITY;
  int bi = 0x7fffffff;
  int bad = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = xr[c];
    bad |= !isfinite(v);
    if (v > b) {
      b = v;
      bi = c;
    }
  }
  bad = __syncthreads_or(bad);
  best[threadIdx.x] = b;
  idx[threadIdx.x] = bi;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      const float o = best[threadIdx.x + stride];
      const int oi = idx[threadIdx.x + stride];
      if (o > best[threadIdx.x] || (o == best[threadIdx.x] && oi < idx[threadIdx.x])) {
        best[threadIdx.x] = o;
        idx[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = bad ? -1 : idx[0];
}

/** SwiGLU: out[r, j] = silu(gu[r, j]) · gu[r, inter + j] over rows of [gate | up] (2 · inter wide). */
__global__ void swigluRows(float* out, const float* gu, int rows, int inter) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * inter) return;
  const int64_t r = i / inter;
  const int j = static_cast<int>(i % inter);
  const float g = gu[r * 2 * inter + j];
  const float u = gu[r * 2 * inter + inter + j];
  out[i] = g / (1.f + expf(-g)) * u;
}

/** Embedding gather: out[r, :] = f32(table[ids[r], :]) (table bf16 [vocab, hidden]). */
__global__ void embedRows(float* out, const __nv_bfloat16* table, const int32_t* ids, int hidden) {
  pdlWait();
  pdlLaunchNext();
  const int64_t row = static_cast<int64_t>(ids[blockIdx.x]) * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x)
    out[static_cast<int64_t>(blockIdx.x) * hidden + c] = __bfloat162float(table[row + c]);
}

/**
 * RoPE in place over x [tokens, heads, headDim]: pair (a, b) → (a·cos − b·sin, b·cos + a·sin), angle =
 * pos · theta^(−2i / rotaryDim); neox pairs (i, i + rotaryDim/2), interleaved (2i, 2i + 1). One thread per pair.
 */
__global__ void ropeRows(float* x, const int32_t* positions, int tokens, int heads, int headDim, int rotaryDim,
                         float theta, bool neox) {
  const int half = rotaryDim / 2;
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(tokens) * heads * half) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;  // token · heads + head
  const int t = static_cast<int>(th / heads);
  float* row = x + th * headDim;
  const float invFreq = powf(theta, -2.0f * i / rotaryDim);
  float sn, cs;
  sincosf(positions[t] * invFreq, &sn, &cs);
  const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
  const float a = row[ia], b = row[ib];
  row[ia] = a * cs - b * sn;
  row[ib] = b * cs + a * sn;
}

/** vLLM reshape_and_cache: pool[slot, :] = rows[t, :] for each token t with slot ≥ 0 (K and V pools alike). */
__global__ void writePages(float* kPool, float* vPool, const float* k, const float* v, const int32_t* slots, int tokens,
                           int rowFloats) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(tokens) * rowFloats) return;
  const int t = static_cast<int>(idx / rowFloats);
  const int c = static_cast<int>(idx % rowFloats);
  const int64_t slot = slots[t];
  if (slot < 0) return;
  kPool[slot * rowFloats + c] = k[idx];
  vPool[slot * rowFloats + c] = v[idx];
}

constexpr int kAttnThreads = 128;
constexpr int kAttnTile = 32;
/** Keys per partition: a query's keys split at multiples of this, one block per partition (flash-decoding). */
constexpr int kAttnPart = 64;

__device__ void partitionBody(float* dst, const float* q, const float* kPool, const float* vPool,
                              const int32_t* blockTables, int s, int row, int head, int kvHead, int64_t rowFloats,
                              int begin, int last, int maxBlocks, int pageSize, int qHeads, int headDim, float scale);

/**
 * Paged attention, first pass: one block of 128 threads per (query row, q head, partition of 64 keys); NHD pages
 * ([page, slot, kvHead, headDim] f32), GQA, headDim a multiple of 16 up to 256. The partition's visible keys (causal:
 * j ≤ the query's position; non-causal: j < kvLen) go in tiles of 32: four threads score a key (float4 loads of
 * its K row, a fixed two-step shuffle sum), the 32 scores meet in shared memory, and every thread folds the tile
 * into the same online-softmax (m, l) in key order (fp32); for the output, thread t owns dim t mod headDim over its
 * group of the tile's keys (128 / headDim groups), whose partial sums are added in group order at the end. The
 * partition's (m, l, acc[headDim]) go to `part` ([rows, qHeads, parts, 2 + headDim] f32); an empty partition writes
 * l = 0. A query's bits depend on its own keys only (not on the batch, nor on how many partitions were launched).
 */
__global__ void attentionPartial(float* part, const float* q, const float* kPool, const float* vPool,
                                 const int32_t* cuSeqlensQ, const int32_t* kvLens, const int32_t* blockTables,
                                 const int32_t* positions, int numSeqs, int maxBlocks, int pageSize, int qHeads,
                                 int kvHeads, int headDim, float scale, bool causal) {
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  const int partIdx = blockIdx.z;
  const int t = threadIdx.x;
  pdlWait();
  pdlLaunchNext();
  // the row's sequence: the last s with cuSeqlensQ[s] <= row (rows past the batch's tokens fall to the last
  // sequence, which a padded batch gives no keys)
  int s = 0, hi = numSeqs - 1;
  while (s < hi) {
    const int mid = (s + hi + 1) / 2;
    if (cuSeqlensQ[mid] <= row) s = mid;
    else hi = mid - 1;
  }
  const int kvHead = head / (qHeads / kvHeads);
  const int64_t rowFloats = static_cast<int64_t>(kvHeads) * headDim;
  const int kvLen = kvLens[s];
  const int visible = causal ? min(positions[row] + 1, kvLen) : kvLen;
  const int begin = partIdx * kAttnPart;
  const int last = min(visible, begin + kAttnPart);
  float* dst = part + ((static_cast<int64_t>(row) * qHeads + head) * gridDim.z + partIdx) * (2 + headDim);
  if (last <= begin) {
    if (t == 0) {
      dst[0] = -INFINITY;
      dst[1] = 0.f;
    }
  } else {
    partitionBody(dst, q, kPool, vPool, blockTables, s, row, head, kvHead, rowFloats, begin, last, maxBlocks, pageSize,
                  qHeads, headDim, scale);
  }
}

/** One non-empty partition of attentionPartial (module comment there): its (m, l, acc) into dst. */
__device__ void partitionBody(float* dst, const float* q, const float* kPool, const float* vPool,
                              const int32_t* blockTables, int s, int row, int head, int kvHead, int64_t rowFloats,
                              int begin, int last, int maxBlocks, int pageSize, int qHeads, int headDim, float scale) {
  const int t = threadIdx.x;
  __shared__ __align__(16) float qs[256];
  __shared__ float sc[kAttnTile];
  __shared__ int64_t slotS[kAttnTile];  // the tile's keys' pool rows (the V pass reads them without the table)
  __shared__ float comb[kAttnThreads];
  const float* qr = q + (static_cast<int64_t>(row) * qHeads + head) * headDim;
  for (int c = t; c < headDim; c += kAttnThreads) qs[c] = qr[c];
  __syncthreads();
  const int32_t* table = blockTables + static_cast<int64_t>(s) * maxBlocks;
  const int64_t headOff = static_cast<int64_t>(kvHead) * headDim;
  const int kk = t >> 2, qq = t & 3;  // scoring: key kk of the tile, quarter qq of its float4 chunks
  const int groups = headDim <= kAttnThreads ? kAttnThreads / headDim : 1;
  const int d0 = headDim <= kAttnThreads ? t % headDim : t;  // output dims d0 (and d0 + 128 when headDim > 128)
  const int g = headDim <= kAttnThreads ? t / headDim : 0;
  const bool d1 = headDim > kAttnThreads && t + kAttnThreads < headDim;
  const int perGroup = kAttnTile / groups;
  float m = -INFINITY, l = 0.f, acc0 = 0.f, acc1 = 0.f;
  for (int j0 = begin; j0 < last; j0 += kAttnTile) {
    const int n = min(kAttnTile, last - j0);
    float dot = 0.f;
    if (kk < n) {
      const int j = j0 + kk;
      const int64_t slot = static_cast<int64_t>(table[j / pageSize]) * pageSize + j % pageSize;
      if (qq == 0) slotS[kk] = slot;
      const float4* kr = reinterpret_cast<const float4*>(kPool + slot * rowFloats + headOff);
#pragma unroll 4
      for (int i = qq; i < headDim / 4; i += 4) {
        const float4 k4 = kr[i];
        dot += qs[4 * i] * k4.x + qs[4 * i + 1] * k4.y + qs[4 * i + 2] * k4.z + qs[4 * i + 3] * k4.w;
      }
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    dot += __shfl_xor_sync(0xffffffffu, dot, 2);
    if (qq == 0) sc[kk] = dot * scale;
    __syncthreads();
    float tileMax = -INFINITY;
    for (int i = 0; i < n; i++) tileMax = fmaxf(tileMax, sc[i]);
    const float mNew = fmaxf(m, tileMax);
    const float corr = expf(m - mNew);
    float a0 = 0.f, a1 = 0.f;
    const int iEnd = min(n, (g + 1) * perGroup);
#pragma unroll 8
    for (int i = g * perGroup; i < iEnd; i++) {
      const float p = expf(sc[i] - mNew);
      const float* vr = vPool + slotS[i] * rowFloats + headOff;
      a0 += p * vr[d0];
      if (d1) a1 += p * vr[d0 + kAttnThreads];
    }
    float psum = 0.f;
    for (int i = 0; i < n; i++) psum += expf(sc[i] - mNew);
    l = l * corr + psum;
    acc0 = acc0 * corr + a0;
    acc1 = acc1 * corr + a1;
    m = mNew;
    __syncthreads();  // sc is rewritten by the next tile
  }
  if (groups > 1) {
    comb[t] = acc0;
    __syncthreads();
    if (g != 0) return;
    for (int gg = 1; gg < groups; gg++) acc0 += comb[gg * headDim + d0];
  }
  if (t == 0) {
    dst[0] = m;
    dst[1] = l;
  }
  dst[2 + d0] = acc0;
  if (d1) dst[2 + d0 + kAttnThreads] = acc1;
}

/**
 * The merge of (row, head)'s partitions by one warp (lane = its thread): out = Σ acc_p e^(m_p − M) / Σ l_p e^(m_p − M)
 * over the non-empty partitions in order (they are a prefix: partition p holds keys [64p, 64p + 64) of the visible
 * ones).
 */
__device__ void mergeParts(float* out, __nv_bfloat16* outBf16, const float* part, int parts, int qHeads, int headDim,
                           int row, int head, int lane) {
  const float* src = part + (static_cast<int64_t>(row) * qHeads + head) * parts * (2 + headDim);
  int used = 0;
  while (used < parts && __ldcg(src + used * (2 + headDim) + 1) > 0.f) used++;
  float M = -INFINITY;
  for (int p = 0; p < used; p++) M = fmaxf(M, __ldcg(src + p * (2 + headDim)));
  float L = 0.f;
  for (int p = 0; p < used; p++) {
    const float* x = src + p * (2 + headDim);
    L += __ldcg(x + 1) * expf(__ldcg(x) - M);
  }
  const int64_t at = (static_cast<int64_t>(row) * qHeads + head) * headDim;
  for (int c = lane; c < headDim; c += 32) {
    float o = 0.f;
    for (int p = 0; p < used; p++) {
      const float* x = src + p * (2 + headDim);
      o += __ldcg(x + 2 + c) * expf(__ldcg(x) - M);
    }
    const float r = L > 0.f ? o / L : 0.f;
    if (out != nullptr) out[at + c] = r;
    else outBf16[at + c] = __float2bfloat16_rn(r);
  }
}

/**
 * Paged attention, second pass: one warp per (query row, q head) merges its partitions (mergeParts), so the number
 * of partitions launched for the batch does not touch a query's bits. A query with no visible key gets zeros.
 * Written as f32 to `out` or, when `out` is null, as bf16 to `outBf16` (the input of the output projection's GEMM).
 */
__global__ void attentionMerge(float* out, __nv_bfloat16* outBf16, const float* part, int parts, int qHeads,
                               int headDim) {
  pdlWait();
  pdlLaunchNext();
  mergeParts(out, outBf16, part, parts, qHeads, headDim, blockIdx.x, blockIdx.y, threadIdx.x);
}

constexpr int kTcRows = 64;    // query rows of a prefill-attention block: 16 per warp, 4 warps
constexpr int kTcKeys = 64;    // keys per tile
constexpr int kTcHd = 64;      // the head dim the kernel is written for
constexpr int kTcStride = 68;  // shared-memory row stride (words): the fragment reads below hit 32 distinct banks

/** x rounded to TF32 (10-bit mantissa, round to nearest, ties away), as the tensor cores' .tf32 operand. */
__device__ __forceinline__ uint32_t toTf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

/**
 * c += a · b on the tensor cores, m16n8k8 TF32 → fp32 (PTX ISA, "mma.m16n8k8" fragments; g = lane / 4, c = lane % 4):
 * a0..a3 = A[g][c], A[g + 8][c], A[g][c + 4], A[g + 8][c + 4]; b0, b1 = B[c][g], B[c + 4][g];
 * c0..c3 = C[g][2c], C[g][2c + 1], C[g + 8][2c], C[g + 8][2c + 1].
 */
__device__ __forceinline__ void mmaTf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/**
 * Causal paged attention for prefill chunks (batches of more than 32 rows) on the tensor cores: FlashAttention-2's
 * tiling (arXiv 2307.08691) with TF32 operands and fp32 accumulation. One block of 4 warps per (64 query rows, q
 * head); a warp owns 16 rows and keeps their Q fragments, the running (m, l) and the output [16, 64] in registers.
 * Per tile of 64 keys (staged in shared memory once for the block, rounded to TF32): S = Q·Kᵀ (64 mma), scale and
 * causal mask in fp32, the online softmax (row max over the quad, exp in fp32, l as per-thread partial sums added in
 * a fixed order at the end), then O = O·corr + P·V (64 mma), P taken straight from S's accumulator registers: the
 * PV product's k index c stands for key 2c and c + 4 for key 2c + 1, so no shuffle is needed (V is read at those
 * rows). Rows of several sequences in one block are taken a sequence at a time. Every tile starts at key 0 of the
 * sequence and a tile past a row's visible keys leaves it exactly as it was (p = 0, corr = 1; a warp with no visible
 * key in the tile skips it), so a row's bits depend on its own sequence's keys only, not on the other rows. TF32
 * rounds q, k, v and p to 10 mantissa bits (2⁻¹¹ relative): the scores carry ~1e-3 of the fp32 path's error, far
 * below the bf16 weights' (test-gpu/kernels.test.mjs compares it with an fp32 reference). headDim 64 only.
 * Output as attentionMerge: f32 `out`, or bf16 `outBf16` when `out` is null.
 */
__global__ void __launch_bounds__(128)
    prefillAttention(float* out, __nv_bfloat16* outBf16, const float* q, const float* kPool, const float* vPool,
                     const int32_t* cuSeqlensQ, const int32_t* kvLens, const int32_t* blockTables,
                     const int32_t* positions, int numSeqs, int totalQ, int maxBlocks, int pageSize, int qHeads,
                     int kvHeads, float scale) {
  __shared__ __align__(16) uint32_t ks[kTcKeys * kTcStride];
  __shared__ __align__(16) uint32_t vs[kTcKeys * kTcStride];
  __shared__ int64_t slotOf[kTcKeys];
  __shared__ int seqOf[kTcRows], vis[kTcRows];
  pdlWait();
  pdlLaunchNext();
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.x * kTcRows, head = blockIdx.y;
  const int kvHead = head / (qHeads / kvHeads);
  const int64_t rowFloats = static_cast<int64_t>(kvHeads) * kTcHd;
  const int64_t headOff = static_cast<int64_t>(kvHead) * kTcHd;
  if (t < kTcRows) {
    const int row = row0 + t;
    int sq = -1, v = 0;
    if (row < totalQ) {
      int lo = 0, hi = numSeqs - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (cuSeqlensQ[mid] <= row) lo = mid;
        else hi = mid - 1;
      }
      sq = lo;
      v = min(positions[row] + 1, kvLens[lo]);
    }
    seqOf[t] = sq;
    vis[t] = v;
  }
  // the warp's rows a = row0 + 16·warp + g and b = a + 8: their Q fragments for the 8 k-steps over the head dim
  const int ra = warp * 16 + g, rb = ra + 8;
  uint32_t qf[kTcHd / 8][4];
  {
    const bool okA = row0 + ra < totalQ, okB = row0 + rb < totalQ;
    const float* qa = q + (static_cast<int64_t>(row0 + ra) * qHeads + head) * kTcHd;
    const float* qb = q + (static_cast<int64_t>(row0 + rb) * qHeads + head) * kTcHd;
#pragma unroll
    for (int kk = 0; kk < kTcHd / 8; kk++) {
      qf[kk][0] = okA ? toTf32(qa[kk * 8 + c]) : 0u;
      qf[kk][1] = okB ? toTf32(qb[kk * 8 + c]) : 0u;
      qf[kk][2] = okA ? toTf32(qa[kk * 8 + c + 4]) : 0u;
      qf[kk][3] = okB ? toTf32(qb[kk * 8 + c + 4]) : 0u;
    }
  }
  float o[kTcHd / 8][4];
#pragma unroll
  for (int i = 0; i < kTcHd / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
  __syncthreads();
  const int firstSeq = seqOf[0], lastSeq = seqOf[min(kTcRows, totalQ - row0) - 1];
  for (int sq = firstSeq; sq <= lastSeq; sq++) {
    int kmax = 0, warpMax = 0;
    for (int r = 0; r < kTcRows; r++)
      if (seqOf[r] == sq) {
        kmax = max(kmax, vis[r]);
        if (r >> 4 == warp) warpMax = max(warpMax, vis[r]);
      }
    const int visA = seqOf[ra] == sq ? vis[ra] : 0, visB = seqOf[rb] == sq ? vis[rb] : 0;
    const int32_t* table = blockTables + static_cast<int64_t>(sq) * maxBlocks;
    for (int j0 = 0; j0 < kmax; j0 += kTcKeys) {
      const int n = min(kTcKeys, kmax - j0);
      if (t < kTcKeys) {
        const int j = j0 + t;
        slotOf[t] = t < n ? static_cast<int64_t>(table[j / pageSize]) * pageSize + j % pageSize : -1;
      }
      __syncthreads();
      for (int i = t; i < kTcKeys * (kTcHd / 4); i += 128) {
        const int kk = i / (kTcHd / 4), c4 = i % (kTcHd / 4);
        float4 k4 = make_float4(0.f, 0.f, 0.f, 0.f), v4 = k4;
        if (kk < n) {
          const int64_t at = slotOf[kk] * rowFloats + headOff;
          k4 = reinterpret_cast<const float4*>(kPool + at)[c4];
          v4 = reinterpret_cast<const float4*>(vPool + at)[c4];
        }
        reinterpret_cast<uint4*>(ks + kk * kTcStride)[c4] =
            make_uint4(toTf32(k4.x), toTf32(k4.y), toTf32(k4.z), toTf32(k4.w));
        reinterpret_cast<uint4*>(vs + kk * kTcStride)[c4] =
            make_uint4(toTf32(v4.x), toTf32(v4.y), toTf32(v4.z), toTf32(v4.w));
      }
      __syncthreads();
      if (j0 < warpMax) {  // warp-uniform: a warp whose rows see no key of the tile skips it (bit-neutral)
        float s[kTcKeys / 8][4];
#pragma unroll
        for (int nt = 0; nt < kTcKeys / 8; nt++) {
          s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
          const uint32_t* kr = ks + (nt * 8 + g) * kTcStride + c;
#pragma unroll
          for (int kk = 0; kk < kTcHd / 8; kk++)
            mmaTf32(s[nt], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], kr[kk * 8], kr[kk * 8 + 4]);
        }
        float tmA = -INFINITY, tmB = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kTcKeys / 8; nt++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int j = j0 + nt * 8 + 2 * c + e;
            s[nt][e] = j < visA ? s[nt][e] * scale : -INFINITY;
            s[nt][2 + e] = j < visB ? s[nt][2 + e] * scale : -INFINITY;
            tmA = fmaxf(tmA, s[nt][e]);
            tmB = fmaxf(tmB, s[nt][2 + e]);
          }
        tmA = fmaxf(tmA, __shfl_xor_sync(0xffffffffu, tmA, 1));
        tmA = fmaxf(tmA, __shfl_xor_sync(0xffffffffu, tmA, 2));
        tmB = fmaxf(tmB, __shfl_xor_sync(0xffffffffu, tmB, 1));
        tmB = fmaxf(tmB, __shfl_xor_sync(0xffffffffu, tmB, 2));
        const float nA = fmaxf(mA, tmA), nB = fmaxf(mB, tmB);
        const float corrA = nA == -INFINITY ? 1.f : expf(mA - nA), corrB = nB == -INFINITY ? 1.f : expf(mB - nB);
        mA = nA;
        mB = nB;
        float sumA = 0.f, sumB = 0.f;
#pragma unroll
        for (int nt = 0; nt < kTcKeys / 8; nt++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            s[nt][e] = s[nt][e] == -INFINITY ? 0.f : expf(s[nt][e] - nA);
            s[nt][2 + e] = s[nt][2 + e] == -INFINITY ? 0.f : expf(s[nt][2 + e] - nB);
            sumA += s[nt][e];
            sumB += s[nt][2 + e];
          }
        lA = lA * corrA + sumA;
        lB = lB * corrB + sumB;
#pragma unroll
        for (int nd = 0; nd < kTcHd / 8; nd++) {
          o[nd][0] *= corrA;
          o[nd][1] *= corrA;
          o[nd][2] *= corrB;
          o[nd][3] *= corrB;
        }
        // O += P·V over the tile's 8 chunks of 8 keys: k index c ↔ key 2c, c + 4 ↔ key 2c + 1 of the chunk
#pragma unroll
        for (int kc = 0; kc < kTcKeys / 8; kc++) {
          const uint32_t a0 = toTf32(s[kc][0]), a1 = toTf32(s[kc][2]), a2 = toTf32(s[kc][1]), a3 = toTf32(s[kc][3]);
          const uint32_t* v0 = vs + (kc * 8 + 2 * c) * kTcStride + g;
#pragma unroll
          for (int nd = 0; nd < kTcHd / 8; nd++) mmaTf32(o[nd], a0, a1, a2, a3, v0[nd * 8], v0[kTcStride + nd * 8]);
        }
      }
      __syncthreads();  // ks, vs and slotOf are rewritten by the next tile
    }
  }
  lA += __shfl_xor_sync(0xffffffffu, lA, 1);
  lA += __shfl_xor_sync(0xffffffffu, lA, 2);
  lB += __shfl_xor_sync(0xffffffffu, lB, 1);
  lB += __shfl_xor_sync(0xffffffffu, lB, 2);
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int row = row0 + (half == 0 ? ra : rb);
    const float l = half == 0 ? lA : lB;
    if (row >= totalQ) continue;
    const int64_t at = (static_cast<int64_t>(row) * qHeads + head) * kTcHd + 2 * c;
#pragma unroll
    for (int nd = 0; nd < kTcHd / 8; nd++) {
      const float x0 = l > 0.f ? o[nd][2 * half] / l : 0.f, x1 = l > 0.f ? o[nd][2 * half + 1] / l : 0.f;
      if (out != nullptr) {
        out[at + nd * 8] = x0;
        out[at + nd * 8 + 1] = x1;
      } else {
        *reinterpret_cast<__nv_bfloat162*>(outBf16 + at + nd * 8) = __floats2bfloat162_rn(x0, x1);
      }
    }
  }
}
}  // namespace

int specdToBf16(void* out, const float* x, int64_t n, cudaStream_t stream) {
  toBf16<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), x, n);
  return static_cast<int>(cudaGetLastError());
}

int specdRmsNorm(float* out, const float* x, const void* w, int rows, int cols, float eps, cudaStream_t stream) {
  rmsNormRows<<<rows, 256, 0, stream>>>(out, x, static_cast<const __nv_bfloat16*>(w), cols, eps);
  return static_cast<int>(cudaGetLastError());
}

int specdArgmax(int32_t* out, const float* x, int rows, int cols, cudaStream_t stream) {
  return static_cast<int>(specdLaunch(argmaxRows, dim3(rows), dim3(256), 0, stream, out, x, cols));
}

int specdSwiglu(float* out, const float* gu, int rows, int inter, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * inter;
  swigluRows<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(out, gu, rows, inter);
  return static_cast<int>(cudaGetLastError());
}

int specdEmbed(float* out, const void* table, const int32_t* ids, int rows, int hidden, cudaStream_t stream) {
  return static_cast<int>(specdLaunch(embedRows, dim3(rows), dim3(256), 0, stream, out,
                                      static_cast<const __nv_bfloat16*>(table), ids, hidden));
}

namespace {

/** A cuBLASLt plan for one (mPad, n, k): descriptors and the algorithm, made once and kept (not thread-safe). */
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

std::map<std::tuple<int, int, int, size_t>, GemmPlan> g_plans;

/**
 * Makes the plan of (mPad, n, k): of the heuristic's candidates (up to 8) whose split-K, if any, reduces through the
 * workspace in a fixed order (reduction schemes COMPUTE_TYPE / OUTPUT_TYPE; never INPLACE, whose atomics add in a
 * varying order), the fastest on these operands (5 timed calls each after one warm-up, into a scratch output):
 * autotuning as vLLM's GEMM tuners. A plan is one algorithm and tile shape, so the reduction order of an output row
 * does not depend on the other rows. Runs outside stream capture (the first call of each shape is eager).
 */
cublasStatus_t makePlan(cublasLtHandle_t lt, int mPad, int n, int k, size_t workspaceBytes, GemmPlan* plan,
                        const void* xb, const void* w, void* workspace, cudaStream_t stream) {
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t st = cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn));
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, k);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, mPad, k);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, mPad, n);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceCreate(&pref);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspaceBytes,
                                              sizeof(workspaceBytes));
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                              sizeof(schemes));
  cublasLtMatmulHeuristicResult_t heur[8];
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 8, heur, &found);
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  int pick = 0;
  void* scratch = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (found > 1 && cudaMalloc(&scratch, static_cast<size_t>(mPad) * n * 4) == cudaSuccess &&
      cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
    const float alpha = 1.f, beta = 0.f;
    float best = INFINITY;
    for (int i = 0; i < found; i++) {
      auto call = [&]() {
        return cublasLtMatmul(lt, plan->op, &alpha, w, plan->a, xb, plan->b, &beta, scratch, plan->c, scratch, plan->c,
                              &heur[i].algo, workspace, workspaceBytes, stream);
      };
      if (call() != CUBLAS_STATUS_SUCCESS) continue;
      cudaEventRecord(e0, stream);
      for (int r = 0; r < 5; r++) call();
      cudaEventRecord(e1, stream);
      float ms = INFINITY;
      if (cudaEventSynchronize(e1) == cudaSuccess) cudaEventElapsedTime(&ms, e0, e1);
      if (ms < best) {
        best = ms;
        pick = i;
      }
    }
  }
  if (e0 != nullptr) cudaEventDestroy(e0);
  if (e1 != nullptr) cudaEventDestroy(e1);
  if (scratch != nullptr) cudaFree(scratch);
  cudaGetLastError();  // a candidate that failed to launch leaves nothing behind
  plan->algo = heur[pick].algo;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

/**
 * out [m, n] f32 = xb [m, k] bf16 · w [n, k]ᵀ bf16, fp32 accumulation (cuBLASLt, CUBLAS_COMPUTE_32F). Column-major
 * view: C[n, m] = W[k, n]ᵀ · X[k, m] (op(A) = T). `mPad` (≥ m) is the row count the plan is made for: calls with
 * any m ≤ mPad use one algorithm and tile shape, so each row's reduction order does not depend on m (xb holds mPad
 * rows, the padding zeros). `accumulate`: out += xb · wᵀ instead (β = 1, C = D in place: the residual add of a
 * projection, after the whole reduction, so rows stay independent of m). The plan (makePlan: the fastest of the
 * heuristic's candidates with a fixed reduction order) is made at the first call of each (mPad, n, k) and kept. Returns
 * a cublasStatus_t (0 = ok).
 */
int specdRope(float* x, const int32_t* positions, int tokens, int heads, int headDim, int rotaryDim, float theta,
              bool neox, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(tokens) * heads * (rotaryDim / 2);
  if (n == 0) return 0;
  ropeRows<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, positions, tokens, heads, headDim, rotaryDim,
                                                                       theta, neox);
  return static_cast<int>(cudaGetLastError());
}

int specdWriteKvPages(float* kPool, float* vPool, const float* k, const float* v, const int32_t* slots, int tokens,
                      int rowFloats, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(tokens) * rowFloats;
  writePages<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(kPool, vPool, k, v, slots, tokens, rowFloats);
  return static_cast<int>(cudaGetLastError());
}

int specdAttentionParts(int maxKvLen) { return (maxKvLen + kAttnPart - 1) / kAttnPart; }

int specdPagedAttention(float* out, void* outBf16, float* part, const float* q, const float* kPool, const float* vPool,
                        const int32_t* cuSeqlensQ, const int32_t* kvLens, const int32_t* blockTables,
                        const int32_t* positions, int numSeqs, int totalQ, int maxBlocks, int pageSize, int qHeads,
                        int kvHeads, int headDim, float scale, bool causal, int maxKvLen, cudaStream_t stream) {
  if (headDim > 256 || headDim % 16 != 0 || qHeads % kvHeads != 0) return static_cast<int>(cudaErrorInvalidValue);
  const int parts = max(1, specdAttentionParts(maxKvLen));
  cudaError_t e = specdLaunch(attentionPartial, dim3(totalQ, qHeads, parts), dim3(kAttnThreads), 0, stream, part, q,
                              kPool, vPool, cuSeqlensQ, kvLens, blockTables, positions, numSeqs, maxBlocks, pageSize,
                              qHeads, kvHeads, headDim, scale, causal);
  if (e != cudaSuccess) return static_cast<int>(e);
  return static_cast<int>(specdLaunch(attentionMerge, dim3(totalQ, qHeads), dim3(32), 0, stream, out,
                                      static_cast<__nv_bfloat16*>(outBf16), static_cast<const float*>(part), parts,
                                      qHeads, headDim));
}

int specdGemmBf16(cublasLtHandle_t lt, float* out, const void* xb, const void* w, int m, int mPad, int n, int k,
                  void* workspace, size_t workspaceBytes, cudaStream_t stream, bool accumulate) {
  (void)m;
  const auto key = std::make_tuple(mPad, n, k, workspaceBytes);
  auto it = g_plans.find(key);
  if (it == g_plans.end()) {
    GemmPlan plan;
    const cublasStatus_t st = makePlan(lt, mPad, n, k, workspaceBytes, &plan, xb, w, workspace, stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
      if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
      if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
      if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
      if (plan.op != nullptr) cublasLtMatmulDescDestroy(plan.op);
      return static_cast<int>(st);
    }
    it = g_plans.emplace(key, plan).first;
  }
  const GemmPlan& p = it->second;
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  return static_cast<int>(cublasLtMatmul(lt, p.op, &alpha, w, p.a, xb, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                         workspace, workspaceBytes, stream));
}

bool specdPrefillAttentionFits(int headDim) { return headDim == kTcHd; }

int specdPrefillAttention(float* out, void* outBf16, const float* q, const float* kPool, const float* vPool,
                          const int32_t* cuSeqlensQ, const int32_t* kvLens, const int32_t* blockTables,
                          const int32_t* positions, int numSeqs, int totalQ, int maxBlocks, int pageSize, int qHeads,
                          int kvHeads, int headDim, float scale, cudaStream_t stream) {
  if (!specdPrefillAttentionFits(headDim) || qHeads % kvHeads != 0) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(specdLaunch(prefillAttention, dim3((totalQ + kTcRows - 1) / kTcRows, qHeads), dim3(128), 0,
                                      stream, out, static_cast<__nv_bfloat16*>(outBf16), q, kPool, vPool, cuSeqlensQ,
                                      kvLens, blockTables, positions, numSeqs, totalQ, maxBlocks, pageSize, qHeads,
                                      kvHeads, scale));
}
