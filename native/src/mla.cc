// MLA family: multi-head latent attention (DeepSeek-V2 / Kimi-Linear, mla_use_nope: no RoPE) in
// ABSORBED form over a paged latent cache, for decode, verification blocks and prefill alike
// (prefill uses the same kernel; there is no separate non-absorbed path).
//
// JS entry points (wrapped by native/src/mla.ts; row-major f32):
//   mlaAttention(q [totalQ*H*(nope+rope)], pool [numPages*pageSize*(r+rope)], wUk [H*nope*r],
//                wUvT [H*r*v], out [totalQ*H*v], numPages, pageSize, H, nope, rope, v, r, scale,
//                cuSeqlensQ, kvLens, blockTables, maxBlocksPerSeq, positions, mask, window) -> undefined
//   mlaAttentionAsync(same) -> Promise<undefined>
//
// Latent cache (one shared "head"), fp32, per layer: [numPages][pageSize][r + rope], row of token j
// = [c_j (normalised latent, kv_a_layernorm output) | k_pe_j]; page p starts at byte
// p*pageSize*(r+rope)*4. Written with writePagedRows (attention.cc), copied with copyPages.
// Weights from kv_b_proj.weight [H*(nope+v), r] (per head: nope k-up rows, then v v-up rows):
//   wUk [H][nope][r]:  wUk[h][i][c]  = kv_b_proj[h*(nope+v) + i][c]
//   wUvT [H][r][v]:    wUvT[h][c][e] = kv_b_proj[h*(nope+v) + nope + e][c]   (transposed once at load)
// Per query token t and head h (three phases, each batch invariant):
//   A. q_lat[h] = W_UKᵀ q_nope[h]  (r floats; acc over i = 0..nope-1 in order), q_ext = [q_lat | q_pe]
//   B. paged attention with K rows = cache rows (dim r+rope), V rows = their first r floats:
//      s_j = dot(q_ext, [c_j | k_pe_j]) * scale = (q_nope·W_UK c_j + q_pe·k_pe_j)·scale, online
//      softmax (attention_kernels.h), o_lat = Σ p_j c_j
//   C. out[h] = W_UV o_lat  (v floats; acc over c = 0..r-1 in order)
// Phases A and C partition over (head, token block), B over (sequence, head tiles): no output's
// reduction order depends on the batch, the block length or the thread count.
#include <algorithm>
#include <vector>

#include "attention.h"
#include "families.h"
#include "isa.h"
#include "threadpool.h"

namespace specd {
namespace {

using attn::PagedBatch;
using attn::PagedRows;

struct MlaProblem {
  PagedBatch batch;
  int64_t heads = 0, nope = 0, rope = 0, vdim = 0, rank = 0;
  float scale = 0;
  const float* q = nullptr;
  const float* pool = nullptr;
  const float* wuk = nullptr;
  const float* wuvt = nullptr;
  float* out = nullptr;
};

constexpr int64_t kTokenBlock = 16;  // tokens per (head, block) item in phases A and C

void RunMla(const MlaProblem& p) {
  const int64_t T = p.batch.total_q;
  if (T == 0) return;
  const int64_t H = p.heads, r = p.rank, qd = p.nope + p.rope, ed = r + p.rope;
  void (*mat)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t) =
      attn::RowsTimesMatrixPortable;
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) mat = attn::RowsTimesMatrixAvx512;
#endif
  const int64_t blocks = (T + kTokenBlock - 1) / kTokenBlock;
  // Kept scratch (common.h): every element is written before it is read (A writes q_ext, B o_lat); fresh vectors
  // cost a 16-token verify more than the three phases together.
  thread_local std::vector<float> kept_qext, kept_olat;
  std::vector<float> own_qext, own_olat;
  float* pqe = KeptScratch(kept_qext, own_qext, T * H * ed);
  float* pol = KeptScratch(kept_olat, own_olat, T * H * r);
  const int64_t block_rows = std::min(kTokenBlock, T);  // ParallelFor work per item: a block's GEMV rows
  // A. absorption: q_ext[t][h] = [W_UK[h]ᵀ q_nope[t][h] | q_pe[t][h]].
  ParallelFor(
      H * blocks,
      [&](int64_t b, int64_t e) {
        for (int64_t item = b; item < e; ++item) {
          const int64_t h = item / blocks, t0 = item % blocks * kTokenBlock;
          const int64_t rows = std::min(kTokenBlock, T - t0);
          mat(p.q + (t0 * H + h) * qd, H * qd, rows, p.wuk + h * p.nope * r, p.nope, r, pqe + (t0 * H + h) * ed,
              H * ed);
          for (int64_t t = t0; t < t0 + rows; ++t)
            for (int64_t i = 0; i < p.rope; ++i) pqe[(t * H + h) * ed + r + i] = p.q[(t * H + h) * qd + p.nope + i];
        }
      },
      block_rows * p.nope * r);
  // B. attention over the latent cache (one KV "head" shared by all H heads).
  const int64_t page_stride = p.batch.page_size * ed;
  const PagedRows k{p.pool, page_stride, ed, 0, ed};
  const PagedRows v{p.pool, page_stride, ed, 0, r};
  attn::RunPagedAttention(p.batch, k, v, H, 1, pqe, pol, p.scale);
  // C. up-projection: out[t][h] = W_UV[h] o_lat[t][h].
  ParallelFor(
      H * blocks,
      [&](int64_t b, int64_t e) {
        for (int64_t item = b; item < e; ++item) {
          const int64_t h = item / blocks, t0 = item % blocks * kTokenBlock;
          const int64_t rows = std::min(kTokenBlock, T - t0);
          mat(pol + (t0 * H + h) * r, H * r, rows, p.wuvt + h * r * p.vdim, r, p.vdim, p.out + (t0 * H + h) * p.vdim,
              H * p.vdim);
        }
      },
      block_rows * r * p.vdim);
}

struct MlaCall {
  MlaProblem problem;
  Napi::Float32Array q, pool, wuk, wuvt, out;
};

MlaCall ReadMlaArgs(const Napi::CallbackInfo& info, const char* call) {
  ArgReader args(info, call);
  MlaCall c;
  MlaProblem& p = c.problem;
  const int64_t num_pages = args.Int(5, "numPages", 0);
  const int64_t page_size = args.Int(6, "pageSize", 1);
  p.heads = args.Int(7, "numHeads", 1);
  p.nope = args.Int(8, "qkNopeHeadDim", 1);
  p.rope = args.Int(9, "qkRopeHeadDim", 0);
  p.vdim = args.Int(10, "vHeadDim", 1);
  p.rank = args.Int(11, "kvLoraRank", 1);
  p.scale = static_cast<float>(args.Number(12, "scale"));
  c.pool = args.F32(1, "pool", CheckedProduct(call, {num_pages, page_size, p.rank + p.rope}),
                    "numPages*pageSize*(kvLoraRank+qkRopeHeadDim)");
  c.wuk = args.F32(2, "wUk", CheckedProduct(call, {p.heads, p.nope, p.rank}), "numHeads*qkNopeHeadDim*kvLoraRank");
  c.wuvt = args.F32(3, "wUvT", CheckedProduct(call, {p.heads, p.rank, p.vdim}), "numHeads*kvLoraRank*vHeadDim");
  p.batch = attn::ReadPagedBatch(args, 13, num_pages, page_size);
  c.q = args.F32(0, "q", CheckedProduct(call, {p.batch.total_q, p.heads, p.nope + p.rope}),
                 "totalQ*numHeads*(qkNopeHeadDim+qkRopeHeadDim)");
  c.out = args.F32(4, "out", CheckedProduct(call, {p.batch.total_q, p.heads, p.vdim}), "totalQ*numHeads*vHeadDim");
  p.q = c.q.Data();
  p.pool = c.pool.Data();
  p.wuk = c.wuk.Data();
  p.wuvt = c.wuvt.Data();
  p.out = c.out.Data();
  return c;
}

Napi::Value MlaAttentionBinding(const Napi::CallbackInfo& info) {
  RunMla(ReadMlaArgs(info, "mlaAttention").problem);
  return info.Env().Undefined();
}

Napi::Value MlaAttentionAsyncBinding(const Napi::CallbackInfo& info) {
  MlaCall c = ReadMlaArgs(info, "mlaAttentionAsync");
  const MlaProblem p = c.problem;
  return QueueKernel(
      info.Env(), "mlaAttentionAsync", [p]() { RunMla(p); },
      {c.q, c.pool, c.wuk, c.wuvt, c.out, p.batch.cu_arr, p.batch.kv_arr, p.batch.table_arr, p.batch.pos_arr});
}

}  // namespace

void RegisterMla(Napi::Env env, Napi::Object exports) {
  exports.Set("mlaAttention", Napi::Function::New(env, Guarded<MlaAttentionBinding>, "mlaAttention"));
  exports.Set("mlaAttentionAsync", Napi::Function::New(env, Guarded<MlaAttentionAsyncBinding>, "mlaAttentionAsync"));
}

}  // namespace specd
