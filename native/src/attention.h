// Shared binding-side helpers of the paged attention families (attention.cc, mla.cc): reading and
// validating the batch metadata, running the tiles on the pool, and a generic async worker.
// Not for the ISA files (includes napi and STL); their kernels are in attention_kernels.h.
#pragma once
#include <napi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attention_kernels.h"
#include "common.h"

namespace specd {
namespace attn {

/**
 * Batch of query blocks over paged KV (validated views, no copies):
 *   cu_seqlens_q i32 [num_seqs+1]: queries of sequence s are rows [cu[s], cu[s+1]); cu[0] = 0,
 *                                  non-decreasing, cu[num_seqs] = total_q;
 *   kv_lens      i32 [num_seqs]  : keys in the cache of sequence s (0 <= kv_len <= max_blocks*page_size);
 *   block_tables i32 [num_seqs, max_blocks]: page ids, entries [0, ceil(kv_len/page_size)) in [0, num_pages);
 *   positions    i32 [total_q]   : absolute position of each query (>= 0);
 *   mask "causal" | "non-causal", window >= 0 (0 = none). See VisibleKeys.
 */
struct PagedBatch {
  int64_t num_seqs = 0, total_q = 0, max_blocks = 0, page_size = 0, num_pages = 0;
  const int32_t* cu = nullptr;
  const int32_t* kv_lens = nullptr;
  const int32_t* tables = nullptr;
  const int32_t* positions = nullptr;
  bool causal = true;
  int64_t window = 0;
  Napi::Int32Array cu_arr, kv_arr, table_arr, pos_arr;  // kept for async references
};

/**
 * Reads (cuSeqlensQ, kvLens, blockTables, maxBlocksPerSeq, positions, mask, window) from
 * arguments base..base+6 and validates their contents; throws "call: param: expected …, got …".
 */
PagedBatch ReadPagedBatch(ArgReader& args, size_t base, int64_t num_pages, int64_t page_size);

/**
 * Visible keys [lo, hi) of a query at position p in a sequence of kv_len keys (key j has position j):
 *   causal:      j <= p                       and, with window W > 0, p - j < W
 *   non-causal:  every j < kv_len             and, with window W > 0, |p - j| < W
 */
void VisibleKeys(const PagedBatch& b, int64_t kv_len, int64_t p, int64_t* lo, int64_t* hi);

/**
 * Runs attention for every (query, head) of the batch: query row (t, h) at q + (t*num_heads + h)*k.dim,
 * output row at out + (t*num_heads + h)*v.dim; head h reads KV head h / (num_heads / num_kv_heads).
 * Tiles group rows of one (sequence, KV head); their shape is chosen for cache reuse and thread
 * count only (it never changes a result). Current ISA path.
 */
void RunPagedAttention(const PagedBatch& b, const PagedRows& k, const PagedRows& v, int64_t num_heads,
                       int64_t num_kv_heads, const float* q, float* out, float scale);

}  // namespace attn
}  // namespace specd
