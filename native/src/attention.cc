// Attention family: GQA attention over a paged KV cache (fp32 pages), page writes and page copies.
//
// JS entry points (wrapped by native/src/attention.ts; all shapes row-major, f32 unless noted):
//   pagedAttention(q [totalQ*numHeads*headDim], kPool, vPool [numPages*pageSize*numKvHeads*headDim],
//                  out [totalQ*numHeads*headDim], numPages, pageSize, numKvHeads, headDim, numHeads,
//                  scale, cuSeqlensQ i32 [numSeqs+1], kvLens i32 [numSeqs],
//                  blockTables i32 [numSeqs*maxBlocksPerSeq], maxBlocksPerSeq, positions i32 [totalQ],
//                  mask "causal" | "non-causal", window (0 = none), headMajor? 0 | 1) -> undefined
//   pagedAttentionAsync(same) -> Promise<undefined>   (libuv thread; buffers referenced, not copied)
//   writePagedRows(src [tokens*heads*cols], tokens, cols, pool [numPages*heads*pageSize*rowElements],
//                  numPages, pageSize, rowElements, colOffset, slots i32 [tokens], heads? = 1) -> undefined
//       pages laid out [heads][pageSize][rowElements]; for slot s = slots[t] (= page*pageSize +
//       offset; -1 = skip) and each head h, row (page, h, offset) gets src[t][h] at columns
//       [colOffset, colOffset+cols). reshape_and_cache for NHD K/V (heads = 1, cols = rowElements =
//       kvH*headDim), HND K/V (heads = kvH, cols = rowElements = headDim) and MLA's [latent | k_pe]
//       rows (heads = 1, two calls).
//   prefetchPages(pool, pageElements, pages i32 [n][, pool2]) -> undefined
//       prefetch hints for whole pages (a decode step's K/V before the layer's q/k/v GEMM); changes nothing.
//   copyPages(src, dst, pageElements, srcPages i32 [n], dstPages i32 [n]) -> undefined
//       dst page dstPages[i] = src page srcPages[i] (whole pages, any pool: K, V or MLA latent).
//
// Byte layout of one layer's K (or V) pool, fp32 little-endian, no padding; page p is the contiguous
// range starting at byte p*pageSize*numKvHeads*headDim*4 (copyable by page) and inside a page:
//   NHD (default, vLLM): [pageSize][numKvHeads][headDim]: slot o, head h at (o*numKvHeads + h)*headDim*4;
//        one head's share of a page = pageSize runs of headDim*4 bytes, stride numKvHeads*headDim*4;
//   HND (headMajor = 1, FlashInfer "HND"): [numKvHeads][pageSize][headDim]: head h, slot o at
//        (h*pageSize + o)*headDim*4; one head's share of a page = ONE run of pageSize*headDim*4 bytes.
// HND streams faster on CPU (one head's rows are contiguous; NHD puts them numKvHeads*headDim*4
// bytes apart, 4 KiB for 8 heads of 128: every row a new 4 KiB page) and makes head-aware PD copies
// single runs; see docs/BENCHMARKS.md, "Attention".
// Masks, positions and the reduction order (batch invariance): attention_kernels.h, attention.h.
#include "attention.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "families.h"
#include "isa.h"
#include "threadpool.h"

namespace specd {
namespace attn {

PagedBatch ReadPagedBatch(ArgReader& args, size_t base, int64_t num_pages, int64_t page_size) {
  PagedBatch b;
  b.num_pages = num_pages;
  b.page_size = page_size;
  b.kv_arr = args.I32(base + 1, "kvLens");
  b.num_seqs = static_cast<int64_t>(b.kv_arr.ElementLength());
  b.cu_arr = args.I32(base, "cuSeqlensQ", static_cast<size_t>(b.num_seqs + 1), "kvLens.length+1");
  b.max_blocks = args.Int(base + 3, "maxBlocksPerSeq", 0);
  b.table_arr = args.I32(base + 2, "blockTables", CheckedProduct(args.call(), {b.num_seqs, b.max_blocks}),
                         "numSeqs*maxBlocksPerSeq");
  b.cu = b.cu_arr.Data();
  b.kv_lens = b.kv_arr.Data();
  b.tables = b.table_arr.Data();
  if (b.cu[0] != 0) args.Fail("cuSeqlensQ[0]", "0", std::to_string(b.cu[0]));
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    if (b.cu[s + 1] < b.cu[s])
      args.Fail("cuSeqlensQ", "non-decreasing offsets",
                "cuSeqlensQ[" + std::to_string(s + 1) + "] = " + std::to_string(b.cu[s + 1]) + " < " +
                    std::to_string(b.cu[s]));
    const int64_t kv = b.kv_lens[s];
    if (kv < 0 || kv > b.max_blocks * page_size)
      args.Fail("kvLens",
                "kvLens[" + std::to_string(s) +
                    "] in [0, maxBlocksPerSeq*pageSize = " + std::to_string(b.max_blocks * page_size) + "]",
                std::to_string(kv));
    const int64_t used = (kv + page_size - 1) / page_size;
    for (int64_t i = 0; i < used; ++i) {
      const int32_t page = b.tables[s * b.max_blocks + i];
      if (page < 0 || page >= num_pages)
        args.Fail("blockTables", "page ids in [0, numPages = " + std::to_string(num_pages) + ")",
                  "blockTables[" + std::to_string(s) + "][" + std::to_string(i) + "] = " + std::to_string(page));
    }
  }
  b.total_q = b.cu[b.num_seqs];
  b.pos_arr = args.I32(base + 4, "positions", static_cast<size_t>(b.total_q), "cuSeqlensQ[numSeqs]");
  b.positions = b.pos_arr.Data();
  for (int64_t t = 0; t < b.total_q; ++t)
    if (b.positions[t] < 0)
      args.Fail("positions", "positions >= 0",
                "positions[" + std::to_string(t) + "] = " + std::to_string(b.positions[t]));
  const std::string mask = args.String(base + 5, "mask");
  if (mask == "causal") b.causal = true;
  else if (mask == "non-causal") b.causal = false;
  else args.Fail("mask", "\"causal\" or \"non-causal\"", "\"" + mask + "\"");
  b.window = args.Int(base + 6, "window", 0, std::numeric_limits<int32_t>::max());
  return b;
}

void VisibleKeys(const PagedBatch& b, int64_t kv_len, int64_t p, int64_t* lo, int64_t* hi) {
  int64_t l = 0;
  int64_t h = kv_len;
  if (b.causal) h = std::min(h, p + 1);
  if (b.window > 0) {
    l = std::max<int64_t>(0, p - b.window + 1);
    if (!b.causal) h = std::min(h, p + b.window);
  }
  *lo = l;
  *hi = h;
}

namespace {

/** One tile to build: tokens [t0, t1) × heads [h0, h1) of sequence s (heads of one KV group). */
struct TileSpec {
  int64_t seq, t0, t1, h0, h1;
};

}  // namespace

void RunPagedAttention(const PagedBatch& b, const PagedRows& k, const PagedRows& v, int64_t num_heads,
                       int64_t num_kv_heads, const float* q, float* out, float scale) {
  if (b.total_q == 0) return;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t threads = PoolSize();
  int64_t hp = std::min<int64_t>(group, kMaxRows);
  int64_t tp = std::max<int64_t>(1, kMaxRows / hp);
  auto count = [&](int64_t tpn, int64_t hpn) {
    int64_t n = 0;
    for (int64_t s = 0; s < b.num_seqs; ++s)
      n += (b.cu[s + 1] - b.cu[s] + tpn - 1) / tpn * ((group + hpn - 1) / hpn) * num_kv_heads;
    return n;
  };
  // Smaller tiles when there are too few to share among the threads evenly (a decode step: one tile per
  // KV head); the shape never changes a result.
  while (count(tp, hp) < 2 * threads && (tp > 1 || hp > 1)) {
    if (tp > 1) tp = (tp + 1) / 2;
    else hp = (hp + 1) / 2;
  }
  std::vector<TileSpec> specs;
  specs.reserve(static_cast<size_t>(count(tp, hp)));
  for (int64_t s = 0; s < b.num_seqs; ++s)
    for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh)
      for (int64_t hb = kvh * group; hb < (kvh + 1) * group; hb += hp)
        for (int64_t t = b.cu[s]; t < b.cu[s + 1]; t += tp)
          specs.push_back({s, t, std::min<int64_t>(t + tp, b.cu[s + 1]), hb, std::min(hb + hp, (kvh + 1) * group)});
  // Work of each tile: its rows' visible keys × (K + V dims), × kColdReads: a step's K/V rows come from
  // memory, not cache (the weights streamed since evicted them), so they cost several work units each.
  constexpr int64_t kColdReads = 4;
  std::vector<int64_t> cum(specs.size() + 1, 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    const TileSpec& sp = specs[i];
    int64_t keys = 0;
    for (int64_t t = sp.t0; t < sp.t1; ++t) {
      int64_t lo, hi;
      VisibleKeys(b, b.kv_lens[sp.seq], b.positions[t], &lo, &hi);
      keys += std::max<int64_t>(0, hi - lo);
    }
    cum[i + 1] = cum[i] + std::max<int64_t>(1, keys * (sp.h1 - sp.h0) * (k.dim + v.dim) * kColdReads);
  }
  // Bins of consecutive tiles with equal shares of the work (causal blocks: later rows see more keys), so
  // that the threads finish together; ParallelFor then runs one bin per range.
  const int64_t total = cum.back();
  const int64_t n_specs = static_cast<int64_t>(specs.size());
  const int64_t bins = PartitionCount(n_specs, std::max<int64_t>(1, total / n_specs), static_cast<int>(threads));
  std::vector<size_t> edge(static_cast<size_t>(bins) + 1, specs.size());
  edge[0] = 0;
  for (int64_t i = 1; i < bins; ++i) {
    // first tile whose work midpoint lies past i/bins of the total
    const int64_t target = total * i / bins;
    size_t j = edge[static_cast<size_t>(i - 1)];
    while (j < specs.size() && cum[j] + (cum[j + 1] - cum[j]) / 2 < target) ++j;
    edge[static_cast<size_t>(i)] = j;
  }
  void (*kernel)(const Tile&, float*) = AttendTilePortable;
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) kernel = AttendTileAvx512;
#endif
  ParallelFor(
      bins,
      [&](int64_t bin_begin, int64_t bin_end) {
        // per-thread scratch kept between calls (a decode step's 41 KB zero-fill cost a fifth of its attention);
        // every tile writes what it reads of it
        thread_local std::vector<float> scratch;
        const size_t need = static_cast<size_t>(TileScratchFloats(k.dim, v.dim));
        if (scratch.size() < need) scratch.resize(need);
        for (size_t i = edge[static_cast<size_t>(bin_begin)]; i < edge[static_cast<size_t>(bin_end)]; ++i) {
          const TileSpec& sp = specs[i];
          Tile tile;
          tile.k = k;
          tile.v = v;
          tile.table = b.tables + sp.seq * b.max_blocks;
          tile.page_size = b.page_size;
          tile.kv_head = sp.h0 / group;
          tile.scale = scale;
          tile.rows = 0;
          const int64_t kv_len = b.kv_lens[sp.seq];
          for (int64_t t = sp.t0; t < sp.t1; ++t) {
            int64_t lo, hi;
            VisibleKeys(b, kv_len, b.positions[t], &lo, &hi);
            for (int64_t h = sp.h0; h < sp.h1; ++h) {
              Row& row = tile.row[tile.rows++];
              row.q = q + (t * num_heads + h) * k.dim;
              row.out = out + (t * num_heads + h) * v.dim;
              row.lo = lo;
              row.hi = hi;
            }
          }
          kernel(tile, scratch.data());
        }
      },
      // one bin per range: its work is what PartitionCount weighed above
      std::max<int64_t>(1, total / std::max<int64_t>(1, bins)));
}

}  // namespace attn

namespace {

using attn::PagedBatch;
using attn::PagedRows;

struct AttentionCall {
  PagedBatch batch;
  PagedRows k{}, v{};
  int64_t num_heads = 0, num_kv_heads = 0;
  float scale = 0;
  Napi::Float32Array q, kpool, vpool, out;
  const float* pq = nullptr;  // q.Data()
  float* po = nullptr;        // out.Data()
  void Run() const { attn::RunPagedAttention(batch, k, v, num_heads, num_kv_heads, pq, po, scale); }
  /** The same work for the worker thread (raw pointers and sizes only; no napi calls there). */
  std::function<void()> Job() const {
    const PagedBatch b = batch;
    const PagedRows kk = k, vv = v;
    const int64_t nh = num_heads, nkv = num_kv_heads;
    const float sc = scale;
    const float* q_ = pq;
    float* o_ = po;
    return [b, kk, vv, nh, nkv, sc, q_, o_]() { attn::RunPagedAttention(b, kk, vv, nh, nkv, q_, o_, sc); };
  }
};

AttentionCall ReadAttentionArgs(const Napi::CallbackInfo& info, const char* call) {
  ArgReader args(info, call);
  AttentionCall c;
  const int64_t num_pages = args.Int(4, "numPages", 0);
  const int64_t page_size = args.Int(5, "pageSize", 1);
  c.num_kv_heads = args.Int(6, "numKvHeads", 1);
  const int64_t head_dim = args.Int(7, "headDim", 1);
  c.num_heads = args.Int(8, "numHeads", 1);
  if (c.num_heads % c.num_kv_heads != 0)
    args.Fail("numHeads", "a multiple of numKvHeads = " + std::to_string(c.num_kv_heads), std::to_string(c.num_heads));
  const double scale = args.Number(9, "scale");
  c.scale = static_cast<float>(scale);
  const size_t pool = CheckedProduct(call, {num_pages, page_size, c.num_kv_heads, head_dim});
  c.kpool = args.F32(1, "kPool", pool, "numPages*pageSize*numKvHeads*headDim");
  c.vpool = args.F32(2, "vPool", pool, "numPages*pageSize*numKvHeads*headDim");
  c.batch = attn::ReadPagedBatch(args, 10, num_pages, page_size);
  const size_t rows = CheckedProduct(call, {c.batch.total_q, c.num_heads, head_dim});
  c.q = args.F32(0, "q", rows, "totalQ*numHeads*headDim");
  c.out = args.F32(3, "out", rows, "totalQ*numHeads*headDim");
  c.pq = c.q.Data();
  c.po = c.out.Data();
  const bool head_major = !args.IsAbsent(17) && args.Int(17, "headMajor", 0, 1) == 1;
  const int64_t page_stride = page_size * c.num_kv_heads * head_dim;
  const int64_t token_stride = head_major ? head_dim : c.num_kv_heads * head_dim;
  const int64_t head_stride = head_major ? page_size * head_dim : head_dim;
  c.k = PagedRows{c.kpool.Data(), page_stride, token_stride, head_stride, head_dim};
  c.v = PagedRows{c.vpool.Data(), page_stride, token_stride, head_stride, head_dim};
  return c;
}

Napi::Value PagedAttentionBinding(const Napi::CallbackInfo& info) {
  ReadAttentionArgs(info, "pagedAttention").Run();
  return info.Env().Undefined();
}

Napi::Value PagedAttentionAsyncBinding(const Napi::CallbackInfo& info) {
  AttentionCall c = ReadAttentionArgs(info, "pagedAttentionAsync");
  return QueueKernel(
      info.Env(), "pagedAttentionAsync", c.Job(),
      {c.q, c.kpool, c.vpool, c.out, c.batch.cu_arr, c.batch.kv_arr, c.batch.table_arr, c.batch.pos_arr});
}

Napi::Value WritePagedRowsBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "writePagedRows");
  const int64_t tokens = args.Int(1, "tokens", 0);
  const int64_t cols = args.Int(2, "cols", 1);
  const int64_t num_pages = args.Int(4, "numPages", 0);
  const int64_t page_size = args.Int(5, "pageSize", 1);
  const int64_t row_elements = args.Int(6, "rowElements", 1);
  const int64_t col_offset = args.Int(7, "colOffset", 0);
  const int64_t heads = args.IsAbsent(9) ? 1 : args.Int(9, "heads", 1);
  if (col_offset + cols > row_elements)
    args.Fail("colOffset", "colOffset + cols <= rowElements = " + std::to_string(row_elements),
              std::to_string(col_offset) + " + " + std::to_string(cols));
  auto src = args.F32(0, "src", CheckedProduct("writePagedRows", {tokens, heads, cols}), "tokens*heads*cols");
  auto pool = args.F32(3, "pool", CheckedProduct("writePagedRows", {num_pages, heads, page_size, row_elements}),
                       "numPages*heads*pageSize*rowElements");
  auto slots = args.I32(8, "slots", static_cast<size_t>(tokens), "tokens");
  const int32_t* ps = slots.Data();
  const int64_t num_slots = num_pages * page_size;
  for (int64_t t = 0; t < tokens; ++t)
    if (ps[t] < -1 || ps[t] >= num_slots)
      args.Fail("slots", "slot ids in [-1, numPages*pageSize = " + std::to_string(num_slots) + ")",
                "slots[" + std::to_string(t) + "] = " + std::to_string(ps[t]));
  const float* s = src.Data();
  float* p = pool.Data();
  // Page layout [heads][pageSize][rowElements] (heads = 1: plain rows).
  ParallelFor(
      tokens,
      [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          if (ps[t] < 0) continue;
          const int64_t page = ps[t] / page_size, off = ps[t] % page_size;
          for (int64_t h = 0; h < heads; ++h)
            std::memcpy(p + ((page * heads + h) * page_size + off) * row_elements + col_offset,
                        s + (t * heads + h) * cols, static_cast<size_t>(cols) * sizeof(float));
        }
      },
      heads * cols);
  return info.Env().Undefined();
}

Napi::Value PrefetchPagesBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "prefetchPages");
  const int64_t page_elements = args.Int(1, "pageElements", 1);
  auto pool = args.F32(0, "pool");
  auto ids = args.I32(2, "pages");
  // an optional second pool of the same page size (a layer's V beside its K): one call for both
  const bool two = !args.IsAbsent(3);
  Napi::Float32Array pool2 = two ? args.F32(3, "pool2") : pool;
  const int64_t pages = static_cast<int64_t>(std::min(pool.ElementLength(), pool2.ElementLength())) / page_elements;
  const int32_t* pi = ids.Data();
  const int64_t n = static_cast<int64_t>(ids.ElementLength());
  for (int64_t i = 0; i < n; ++i)
    if (pi[i] < 0 || pi[i] >= pages)
      args.Fail("pages", "page ids in [0, " + std::to_string(pages) + ")",
                "pages[" + std::to_string(i) + "] = " + std::to_string(pi[i]));
  // Hints only (prefetcht1: into this core's L2 on the way); nothing is read into a register or written.
  const int64_t bytes = page_elements * static_cast<int64_t>(sizeof(float));
  const auto hint = [&](const float* pool_data) {
    const char* base = reinterpret_cast<const char*>(pool_data);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(base + pi[i] * bytes + o, 0, 2);
  };
  hint(pool.Data());
  if (two) hint(pool2.Data());
  return info.Env().Undefined();
}

Napi::Value CopyPagesBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "copyPages");
  const int64_t page_elements = args.Int(2, "pageElements", 1);
  auto src = args.F32(0, "src");
  auto dst = args.F32(1, "dst");
  if (src.ElementLength() % page_elements != 0)
    args.Fail("src", "a length divisible by pageElements = " + std::to_string(page_elements),
              "length " + std::to_string(src.ElementLength()));
  if (dst.ElementLength() % page_elements != 0)
    args.Fail("dst", "a length divisible by pageElements = " + std::to_string(page_elements),
              "length " + std::to_string(dst.ElementLength()));
  auto src_ids = args.I32(3, "srcPages");
  auto dst_ids = args.I32(4, "dstPages", src_ids.ElementLength(), "srcPages.length");
  const int64_t n = static_cast<int64_t>(src_ids.ElementLength());
  const int64_t src_pages = static_cast<int64_t>(src.ElementLength()) / page_elements;
  const int64_t dst_pages = static_cast<int64_t>(dst.ElementLength()) / page_elements;
  const int32_t* si = src_ids.Data();
  const int32_t* di = dst_ids.Data();
  const bool same = src.Data() == dst.Data();
  if (!same && src.Data() < dst.Data() + dst.ElementLength() && dst.Data() < src.Data() + src.ElementLength())
    args.Fail("dst", "the same pool as src or a pool that does not overlap it", "a partly overlapping view");
  std::vector<char> dst_used(static_cast<size_t>(dst_pages), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (si[i] < 0 || si[i] >= src_pages)
      args.Fail("srcPages", "page ids in [0, " + std::to_string(src_pages) + ")",
                "srcPages[" + std::to_string(i) + "] = " + std::to_string(si[i]));
    if (di[i] < 0 || di[i] >= dst_pages)
      args.Fail("dstPages", "page ids in [0, " + std::to_string(dst_pages) + ")",
                "dstPages[" + std::to_string(i) + "] = " + std::to_string(di[i]));
    if (dst_used[static_cast<size_t>(di[i])])
      args.Fail("dstPages", "distinct page ids",
                "dstPages[" + std::to_string(i) + "] = " + std::to_string(di[i]) + " again");
    dst_used[static_cast<size_t>(di[i])] = 1;
  }
  if (same)
    for (int64_t i = 0; i < n; ++i)
      if (dst_used[static_cast<size_t>(si[i])] && si[i] != di[i])
        args.Fail("srcPages", "no page that is also a destination (same pool)",
                  "srcPages[" + std::to_string(i) + "] = " + std::to_string(si[i]));
  const float* s = src.Data();
  float* d = dst.Data();
  ParallelFor(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          if (!(same && si[i] == di[i]))
            std::memcpy(d + di[i] * page_elements, s + si[i] * page_elements,
                        static_cast<size_t>(page_elements) * sizeof(float));
      },
      2 * page_elements);
  return info.Env().Undefined();
}

}  // namespace

void RegisterAttention(Napi::Env env, Napi::Object exports) {
  exports.Set("pagedAttention", Napi::Function::New(env, Guarded<PagedAttentionBinding>, "pagedAttention"));
  exports.Set("pagedAttentionAsync",
              Napi::Function::New(env, Guarded<PagedAttentionAsyncBinding>, "pagedAttentionAsync"));
  exports.Set("writePagedRows", Napi::Function::New(env, Guarded<WritePagedRowsBinding>, "writePagedRows"));
  exports.Set("copyPages", Napi::Function::New(env, Guarded<CopyPagesBinding>, "copyPages"));
  exports.Set("prefetchPages", Napi::Function::New(env, Guarded<PrefetchPagesBinding>, "prefetchPages"));
}

}  // namespace specd
