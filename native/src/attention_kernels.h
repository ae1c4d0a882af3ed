// Inner attention kernels over paged KV, shared by attention.cc / mla.cc (bindings, tiling,
// threads), attention_portable.cc and attention_avx512.cc. Plain declarations and static inline
// helpers only: safe to include from the ISA files (no STL, no napi).
//
// Paged rows. A pool holds `numPages` pages; key j (0-based index in its sequence's KV stream) of
// KV head h lives in page `table[j / pageSize]` at token slot `j % pageSize`:
//   row(j, h) = base + page * page_stride + (j % pageSize) * token_stride + h * head_stride  (floats)
// and the kernel uses the first `dim` floats of that row. Standard attention uses one pool per K
// and per V, `[numPages, pageSize, numKvHeads, headDim]` f32 (page_stride = pageSize*kvH*headDim,
// token_stride = kvH*headDim, head_stride = headDim). MLA uses ONE latent pool
// `[numPages, pageSize, kvLoraRank + ropeDim]` for both: K rows are whole rows (dim r+rope), V rows
// are the first r floats of the same rows.
//
// Positions. Key j has position j (the KV stream of a sequence is its token positions 0..kvLen-1).
// Each query row carries its visible key interval [lo, hi) (computed from its position and the
// mask by the caller); an empty interval (hi <= lo) gives an all-zero output row.
//
// Reduction order (batch invariance). For every query row, independently of the other rows of its
// tile, of the tile size, of the batch and of the thread:
//   keys are visited in chunks of kChunk = 16 aligned to ABSOLUTE key index (chunk c covers keys
//   [16c, 16c+16) ∩ [lo, hi)), chunks in ascending order; per chunk:
//     s_j   = dot(q, k_j) * scale            (dot over dim in a fixed order per key slot j mod 16,
//                                             see the ISA files)
//     m'    = max(m, max_j s_j);  alpha = exp(m - m');  p_j = exp(s_j - m')
//     l     = l * alpha + sum_j p_j;  acc = acc * alpha, then acc += p_j * v_j for j ascending
//   out = acc * (1 / l)   (m starts at -inf, l and acc at 0).
// Rows of one tile share only the K/V row fetches (cache reuse), never arithmetic, so a query's
// output is bit-identical whether computed alone, in a block, or batched with other sequences, for
// any thread count, on a given ISA path. The two paths (portable: std::exp, separate mul/add;
// AVX-512: own exp polynomial, FMA, tree-reduced dots) differ from each other by rounding only.
#pragma once
#include <cstdint>

namespace specd {
namespace attn {

constexpr int64_t kChunk = 16;      // keys per online-softmax step, aligned to the absolute key index
constexpr int kMaxRows = 64;        // query rows per tile (they share the K/V row fetches)
constexpr int kTransposedRows = 8;  // AVX-512: packed tiles of at least this many rows score from transposed K
constexpr int kPackRows = 16;       // AVX-512: tiles of at least this many rows copy each chunk's rows (packing)

/** Geometry of paged rows in one pool (all strides in floats). */
struct PagedRows {
  const float* base;
  int64_t page_stride, token_stride, head_stride;
  int64_t dim;  // floats of each row the kernel reads
};

/** One query row: q [k.dim] f32, out [v.dim] f32, visible keys [lo, hi). */
struct Row {
  const float* q;
  float* out;
  int64_t lo, hi;
};

/** Up to kMaxRows query rows of one sequence that read the same KV head. */
struct Tile {
  PagedRows k, v;
  const int32_t* table;  // the sequence's page ids
  int64_t page_size;
  int64_t kv_head;
  float scale;
  int rows;
  Row row[kMaxRows];
};

/**
 * Addresses of keys [jb, je) (KV head h) in pool p: out[j - jb] = the row of key j, in page table[j / page_size],
 * slot j % page_size. One division for the range, not two per key (a decode tile's 16-key chunk resolves 32
 * rows and prefetches 32 more).
 */
static inline void RowPtrs(const PagedRows& p, const int32_t* table, int64_t page_size, int64_t jb, int64_t je,
                           int64_t h, const float** out) {
  if (jb >= je) return;
  int64_t page = jb / page_size;
  int64_t slot = jb - page * page_size;
  const float* base = p.base + h * p.head_stride;
  for (int64_t j = jb; j < je; ++page, slot = 0) {  // one page's keys per pass: no table read past je
    const float* row = base + table[page] * p.page_stride + slot * p.token_stride;
    const int64_t n = (je - j < page_size - slot) ? je - j : page_size - slot;
    for (int64_t i = 0; i < n; ++i, row += p.token_stride) *out++ = row;
    j += n;
  }
}

/** Floats of per-thread scratch a tile needs for key dim dk and value dim dv. */
static inline int64_t TileScratchFloats(int64_t dk, int64_t dv) {
  return kMaxRows * (dv + 2 * kChunk + 2) + (2 * kChunk + 1) * (dk + 16) + kChunk * (dv + 16) + 64;
}

/** Attends all rows of a tile (see the reduction order above); scratch: TileScratchFloats(k.dim, v.dim). */
void AttendTilePortable(const Tile& t, float* scratch);
void AttendTileAvx512(const Tile& t, float* scratch);

/**
 * y[r][0:n] = sum_{i<k} x[r][i] * w[i][0:n] for r < rows (w row-major [k][n]), one accumulator
 * per output updated for i = 0..k-1 in order (portable: separate mul and add; AVX-512: FMA).
 * Rows are independent: the result of a row does not depend on `rows`. Used by MLA absorption.
 */
void RowsTimesMatrixPortable(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t k, int64_t n, float* y,
                             int64_t ldy);
void RowsTimesMatrixAvx512(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t k, int64_t n, float* y,
                           int64_t ldy);

}  // namespace attn
}  // namespace specd
