// KDA family: Kimi Delta Attention core (short conv + SiLU, L2 norms, gated delta rule) over a
// batch of sequences whose fp32 states live in slot pools.
//
// JS entry points (wrapped by native/src/kda.ts; all tensors row-major, C = H*d channels per
// projection, T = sum(seqLens) tokens of the batch, sequence b owning tokens
// [sum(seqLens[0..b)), +seqLens[b])):
//   kdaForward(qkv: Float32Array [T, 3C]  (pre-conv q | k | v of each token),
//              g: Float32Array [T, H, d]  (log decay, <= 0), beta: Float32Array [T, H],
//              convWeight: Float32Array [3C, 4] (q_conv1d | k_conv1d | v_conv1d weights, [C,1,4] each),
//              seqLens: Int32Array [B] (>= 0), slots: Int32Array [B] (distinct, in [0, numSlots)),
//              statePool: Float32Array [numSlots, H, d, d]  (read and updated in place),
//              convPool: Float32Array [numSlots, 3C, 3]     (last 3 pre-conv inputs per channel, oldest
//                                                            first; read and updated in place),
//              heads, headDim, out: Float32Array [T, H, d], mode: "recurrent" | "chunked", chunk,
//              snapState: Float32Array [T, H, d, d] | null, snapConv: Float32Array [T, 3C, 3] | null,
//              scale, initState: Float32Array [R, H, d, d] | null, initConv: Float32Array [R, 3C, 3] | null,
//              initRows: Int32Array [B] (in [0, R)) | null) -> undefined   (initState/initConv: "recurrent" only,
//              both or neither, seqLens all >= 1: sequence b's slot is set to row initRows[b] of them (row b without
//              initRows, R = B) before its tokens run — a replay from a kept state in one pass),
//              keepState: Float32Array [R', H, d, d] | null, keepConv: Float32Array [R', 3C, 3] | null,
//              keepRows: Int32Array [B] (in [-1, R'), distinct but -1) | null   ("recurrent" only: sequence b's state
//              and conv state before its tokens are written to row keepRows[b], none for -1 — a verify's pre-block
//              state for a later replay, written where the kernel reads it anyway)
//   kdaForwardAsync(same arguments) -> Promise<undefined>     (libuv thread, like gemmBf16Async)
//
// Per sequence and head (kimi.py KDAAttention + kda_recurrent / kda_chunked):
//   x_t = qkv[t][ch];  y = ((w0*x_{t-3} + w1*x_{t-2}) + w2*x_{t-1}) + w3*x_t  (conv state = x_{t-3..t-1})
//   silu(y) = y / (1 + exp(-y));  q, k: x * (1/sqrt(sum x^2 + 1e-6)) (sum in double), q also * scale;
//   alpha = exp(g); then the recurrent kernel of kda_kernels.h ("recurrent"), or the WY chunk form
//   of kda_chunk.h ("chunked", chunk tokens at a time, pairwise exponent differences G_t - G_s <= 0
//   only). exp is the vectorisable fp32 exp of kda_math.h (~1 ulp; std::exp was most of the cost).
//
// ISA: the recurrent kernel (StepsAvx512 intrinsics / StepsPortable), exp/SiLU and the chunk math
// each have a portable and an AVX-512 build (kda_avx512.cc); the paths differ by rounding only, so
// a sequence must stay on one path (setIsa is process-wide; the default never changes).
//
// Snapshots ("recurrent" only): when snapState/snapConv are given, row t (the batch's token index)
// receives the head states / conv state of the token's sequence right AFTER token t, so committing
// n accepted tokens of a block that started at batch row r0 is a copy of row r0+n-1 into the slot.
//
// Batch and thread invariance: the work items are (sequence, head) pairs, each computed by one
// thread in a fixed order that depends only on that sequence's tokens and state (ParallelFor gives
// whole items to threads), so a token's output and the new state are bit-identical whatever the
// other sequences of the batch and the thread count. "recurrent" on T tokens in one call equals T
// calls of one token bit for bit (same per-token arithmetic); "chunked" equals itself when a
// prefill is split at multiples of `chunk` tokens, and equals "recurrent" within fp32 tolerance
// only (different summation order).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "common.h"
#include "families.h"
#include "isa.h"
#include "kda_chunk.h"
#include "kda_kernels.h"
#include "kda_math.h"
#include "threadpool.h"

namespace specd {
namespace {

constexpr int64_t kTaps = 4;      // short_conv_kernel_size
constexpr int64_t kConvKeep = 3;  // pre-conv inputs kept per channel (kTaps - 1)
constexpr double kL2Eps = 1e-6;   // kimi.py L2_EPS

enum class Mode { kRecurrent, kChunked };

/** One validated kdaForward call: raw pointers into the caller's typed arrays (no copies). */
struct KdaProblem {
  int64_t heads = 0, dim = 0, batch = 0, tokens = 0, chunk = 64;
  Mode mode = Mode::kRecurrent;
  float scale = 1.0f;
  const float* qkv = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  const float* conv_w = nullptr;
  const int32_t* seq_lens = nullptr;
  const int32_t* slots = nullptr;
  float* state_pool = nullptr;
  float* conv_pool = nullptr;
  float* out = nullptr;
  float* snap_state = nullptr;
  float* snap_conv = nullptr;
  // Recurrent mode, optional: the states and conv states before the sequences' tokens ([R][H][d][d], [R][3C][3];
  // sequence b's at row init_rows[b]), copied into its slot first (a replay without a separate restore pass).
  const float* init_state = nullptr;
  const float* init_conv = nullptr;
  const int32_t* init_rows = nullptr;  // the row of init_state / init_conv of each sequence (null: row b)
  // Recurrent mode, optional: where each sequence's state and conv state before its tokens are written
  // ([R][H][d][d], [R][3C][3]; sequence b's at row keep_rows[b], none where it is -1).
  float* keep_state = nullptr;
  float* keep_conv = nullptr;
  const int32_t* keep_rows = nullptr;
  std::vector<int64_t> starts;  // first batch row of each sequence
  // Elementwise math of the current ISA path (set by RunKda).
  void (*exp)(const float*, float*, int64_t) = nullptr;
  void (*silu)(float*, int64_t) = nullptr;
  void (*conv)(const float*, const float*, float*, int64_t, int64_t, float*) = nullptr;
};

void ExpPortable(const float* x, float* y, int64_t n) { kda::ExpArray(x, y, n); }
void SiluPortable(float* y, int64_t n) { kda::SiluInPlace(y, n); }

using StepsFn = void (*)(const kda::Steps&);

StepsFn PickSteps() {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return kda::StepsAvx512;
#endif
  return kda::StepsPortable;
}

constexpr int64_t kTokenGroup = 64;  // tokens prepared per recurrent kernel call (bounds scratch)

/** Portable conv of one token for channels [ch0, ch0 + n) (contract: kda_kernels.h ConvAvx512). */
void ConvPortable(const float* x_row, const float* w, float* conv, int64_t ch0, int64_t n, float* y) {
  for (int64_t c = 0; c < n; ++c) {
    const int64_t ch = ch0 + c;
    float* st = conv + ch * kConvKeep;
    const float* wc = w + ch * kTaps;
    const float x = x_row[ch];
    float acc = wc[0] * st[0];
    acc = acc + wc[1] * st[1];
    acc = acc + wc[2] * st[2];
    acc = acc + wc[3] * x;
    st[0] = st[1];
    st[1] = st[2];
    st[2] = x;
    y[c] = acc;
  }
}

/**
 * Causal depthwise conv (kernel 4) + SiLU of one token for `n` channels starting at `ch0`;
 * shifts those channels' conv state (pool row `conv`, [3C][3]) by one input.
 */
inline void ConvSilu(const KdaProblem& p, const float* x_row, const float* w, float* conv, int64_t ch0, int64_t n,
                     float* y) {
  p.conv(x_row, w, conv, ch0, n, y);
  p.silu(y, n);
}

/**
 * x[i] *= 1/sqrt(sum x^2 + 1e-6) * post. Sum of squares in double with 8 interleaved partial sums
 * (lane l takes i = l mod 8, in order; then lanes and tail in index order): a fixed order that the
 * compiler vectorises (one sequential double chain was ~1/5 of a recurrent token's time).
 */
inline void L2Normalize(float* x, int64_t d, float post) {
  constexpr int64_t kLanes = 8;
  double part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) part[l] += static_cast<double>(x[i + l]) * x[i + l];
  double ss = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) ss += part[l];
  for (; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + kL2Eps));
  for (int64_t i = 0; i < d; ++i) x[i] = (x[i] * inv) * post;
}

/** q (scaled), k, v of head h for batch row `row`: conv + SiLU + L2 norms; updates the conv state. */
inline void PrepareToken(const KdaProblem& p, int64_t row, int64_t h, float* conv, float* q, float* k, float* v) {
  const int64_t d = p.dim, c = p.heads * p.dim;
  const float* x_row = p.qkv + row * 3 * c;
  ConvSilu(p, x_row, p.conv_w, conv, h * d, d, q);
  ConvSilu(p, x_row, p.conv_w, conv, c + h * d, d, k);
  ConvSilu(p, x_row, p.conv_w, conv, 2 * c + h * d, d, v);
  L2Normalize(q, d, p.scale);
  L2Normalize(k, d, 1.0f);
}

/** Copies head h's conv channels (q, k, v parts) from a [3C][3] conv state to another. */
inline void CopyHeadConv(const KdaProblem& p, int64_t h, const float* from, float* to) {
  const int64_t d = p.dim, c = p.heads * p.dim;
  for (int64_t part = 0; part < 3; ++part) {
    const int64_t off = (part * c + h * d) * kConvKeep;
    std::memcpy(to + off, from + off, static_cast<size_t>(d * kConvKeep) * sizeof(float));
  }
}

/** Recurrent scratch floats: q, k, v, alpha for one token group. */
int64_t RecurrentScratchFloats(int64_t d) { return 4 * kTokenGroup * d + kda::StepsWorkFloats(d); }

/**
 * Token-by-token recurrence of sequence b, head h (decode, verification, replay), in groups of up
 * to kTokenGroup tokens: conv/norms of the group first, then the multi-token kernel.
 */
void RecurrentItem(const KdaProblem& p, int64_t b, int64_t h, StepsFn steps, float* scratch) {
  const int64_t d = p.dim, hd = p.heads * d, len = p.seq_lens[b], slot = p.slots[b];
  float* state = p.state_pool + (slot * p.heads + h) * d * d;
  float* conv = p.conv_pool + slot * 3 * hd * kConvKeep;
  float* q = scratch;
  float* k = q + kTokenGroup * d;
  float* v = k + kTokenGroup * d;
  float* alpha = v + kTokenGroup * d;
  float* work = alpha + kTokenGroup * d;
  if (p.init_state != nullptr) {
    // this head's state and conv channels from the caller's initial state (hot in cache for the steps below)
    const int64_t r = p.init_rows != nullptr ? p.init_rows[b] : b;
    std::memcpy(state, p.init_state + (r * p.heads + h) * d * d, static_cast<size_t>(d * d) * sizeof(float));
    CopyHeadConv(p, h, p.init_conv + r * 3 * hd * kConvKeep, conv);
  }
  if (p.keep_state != nullptr && p.keep_rows[b] >= 0) {
    // this head's state and conv channels before the tokens, for a later replay (hot in cache: the steps read them)
    const int64_t r = p.keep_rows[b];
    std::memcpy(p.keep_state + (r * p.heads + h) * d * d, state, static_cast<size_t>(d * d) * sizeof(float));
    CopyHeadConv(p, h, conv, p.keep_conv + r * 3 * hd * kConvKeep);
  }
  for (int64_t t0 = 0; t0 < len; t0 += kTokenGroup) {
    const int64_t n = std::min(kTokenGroup, len - t0);
    const int64_t row0 = p.starts[b] + t0;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = row0 + t;
      PrepareToken(p, row, h, conv, q + t * d, k + t * d, v + t * d);
      const float* g = p.g + (row * p.heads + h) * d;
      p.exp(g, alpha + t * d, d);
      if (p.snap_conv) CopyHeadConv(p, h, conv, p.snap_conv + row * 3 * hd * kConvKeep);
    }
    std::vector<float> beta(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) beta[t] = p.beta[(row0 + t) * p.heads + h];
    kda::Steps s{state,
                 d,
                 n,
                 q,
                 k,
                 v,
                 alpha,
                 beta.data(),
                 p.out + row0 * hd + h * d,
                 hd,
                 p.snap_state ? p.snap_state + (row0 * p.heads + h) * d * d : nullptr,
                 p.heads * d * d,
                 work};
    steps(s);
  }
}

/** Scratch floats of one chunked item for chunk length L: q k v G u r o [L][d], akk aqk [L][L], [L], [d], beta [L]. */
int64_t ChunkScratchFloats(int64_t L, int64_t d) { return 7 * L * d + 2 * L * L + 2 * L + d; }

using ChunkFn = void (*)(const kda::ChunkArgs&);

ChunkFn PickChunk() {
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) return kda::ChunkAvx512;
#endif
  return kda::ChunkPortable;
}

/**
 * WY chunk form of sequence b, head h (kimi.py kda_chunked), chunk by chunk (the last may be
 * shorter): conv/norms and the cumulative decay of a chunk here, its math in kda_chunk.h.
 */
void ChunkedItem(const KdaProblem& p, int64_t b, int64_t h, ChunkFn chunk_fn, float* scratch) {
  const int64_t d = p.dim, hd = p.heads * d, len = p.seq_lens[b], slot = p.slots[b], C = p.chunk;
  float* state = p.state_pool + (slot * p.heads + h) * d * d;
  float* conv = p.conv_pool + slot * 3 * hd * kConvKeep;
  kda::ChunkArgs a{};
  float* q = scratch;
  float* k = q + C * d;
  float* v = k + C * d;
  float* G = v + C * d;
  a.u = G + C * d;
  a.r = a.u + C * d;
  a.o = a.r + C * d;
  a.akk = a.o + C * d;
  a.aqk = a.akk + C * C;
  a.wrow = a.aqk + C * C;
  a.ke = a.wrow + C;
  float* beta = a.ke + d;
  a.state = state;
  a.d = d;
  a.stride = C;
  a.q = q;
  a.k = k;
  a.v = v;
  a.G = G;
  a.beta = beta;
  a.ldo = hd;
  for (int64_t c0 = 0; c0 < len; c0 += C) {
    const int64_t L = std::min(C, len - c0);
    const int64_t row0 = p.starts[b] + c0;
    for (int64_t t = 0; t < L; ++t) {
      PrepareToken(p, row0 + t, h, conv, q + t * d, k + t * d, v + t * d);
      const float* g = p.g + ((row0 + t) * p.heads + h) * d;
      for (int64_t i = 0; i < d; ++i) G[t * d + i] = (t == 0 ? 0.0f : G[(t - 1) * d + i]) + g[i];
      beta[t] = p.beta[(row0 + t) * p.heads + h];
    }
    a.L = L;
    a.out = p.out + row0 * hd + h * d;
    chunk_fn(a);
  }
}

/** Runs a validated problem: ParallelFor over (sequence, head) items. */
void RunKda(KdaProblem& p) {
  const int64_t items = p.batch * p.heads;
  if (items == 0 || p.tokens == 0) return;
  const StepsFn steps = PickSteps();
  const ChunkFn chunk_fn = PickChunk();
  p.exp = ExpPortable;
  p.silu = SiluPortable;
  p.conv = ConvPortable;
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) {
    p.exp = kda::ExpAvx512;
    p.silu = kda::SiluAvx512;
    p.conv = kda::ConvAvx512;
  }
#endif
  // Work per (sequence, head) item: ~4 passes over the d×d state per token (average tokens).
  const int64_t item_work = std::max<int64_t>(1, p.tokens / std::max<int64_t>(1, p.batch)) * 4 * p.dim * p.dim;
  ParallelFor(
      items,
      [&](int64_t begin, int64_t end) {
        const int64_t floats =
            p.mode == Mode::kRecurrent ? RecurrentScratchFloats(p.dim) : ChunkScratchFloats(p.chunk, p.dim);
        // Kept scratch (common.h; pool threads are persistent): a fresh allocation of this size is an
        // mmap + page faults on every call, which dominated single-token decode.
        thread_local std::vector<float> kept;
        std::vector<float> own;
        float* const scratch = KeptScratch(kept, own, floats);
        for (int64_t item = begin; item < end; ++item) {
          const int64_t b = item / p.heads, h = item % p.heads;
          if (p.seq_lens[b] == 0) continue;
          if (p.mode == Mode::kRecurrent) {
            RecurrentItem(p, b, h, steps, scratch);
          } else {
            ChunkedItem(p, b, h, chunk_fn, scratch);
          }
        }
      },
      item_work);
}

/** Arguments of kdaForward / kdaForwardAsync after validation; typed arrays kept for async refs. */
struct KdaCall {
  KdaProblem problem;
  std::vector<Napi::Object> arrays;
};

/**
 * Arguments i (state rows [R, H, d, d]) and i + 1 (conv rows [R, 3C, 3]) of an initial or kept state: validated,
 * R (>= 1) into `rows`.
 */
std::pair<Napi::Float32Array, Napi::Float32Array> StateRows(ArgReader& args, const char* call, const KdaProblem& p,
                                                            size_t i, const char* state_name, const char* conv_name,
                                                            int64_t& rows) {
  auto state = args.F32(i, state_name);
  const size_t per_row = CheckedProduct(call, {p.heads, p.dim, p.dim});
  if (state.ElementLength() == 0 || state.ElementLength() % per_row != 0)
    args.Fail(state_name, "a Float32Array of rows*heads*headDim*headDim elements (rows >= 1)",
              "length " + std::to_string(state.ElementLength()));
  rows = static_cast<int64_t>(state.ElementLength() / per_row);
  auto conv =
      args.F32(i + 1, conv_name, CheckedProduct(call, {rows, 3, p.heads * p.dim, kConvKeep}), "rows*3*heads*headDim*3");
  return {state, conv};
}

KdaCall ReadKdaArgs(const Napi::CallbackInfo& info, const char* call) {
  ArgReader args(info, call);
  KdaCall c;
  KdaProblem& p = c.problem;
  p.heads = args.Int(8, "heads", 1, 1 << 16);
  p.dim = args.Int(9, "headDim", 1, 1 << 12);
  const std::string mode = args.String(11, "mode");
  if (mode == "recurrent") {
    p.mode = Mode::kRecurrent;
  } else if (mode == "chunked") {
    p.mode = Mode::kChunked;
  } else {
    args.Fail("mode", "\"recurrent\" or \"chunked\"", "\"" + mode + "\"");
  }
  p.chunk = args.Int(12, "chunk", 1, 1024);
  const double scale = args.Number(15, "scale");
  p.scale = static_cast<float>(scale);
  const int64_t hd = p.heads * p.dim;
  auto seq_lens = args.I32(4, "seqLens");
  p.batch = static_cast<int64_t>(seq_lens.ElementLength());
  auto slots = args.I32(5, "slots", static_cast<size_t>(p.batch), "seqLens.length");
  p.seq_lens = seq_lens.Data();
  p.slots = slots.Data();
  p.starts.resize(static_cast<size_t>(p.batch));
  int64_t tokens = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.seq_lens[b] < 0)
      args.Fail("seqLens", "non-negative lengths", std::to_string(p.seq_lens[b]) + " at " + std::to_string(b));
    p.starts[static_cast<size_t>(b)] = tokens;
    tokens += p.seq_lens[b];
  }
  p.tokens = tokens;
  const size_t state_per_slot = CheckedProduct(call, {p.heads, p.dim, p.dim});
  const size_t conv_per_slot = CheckedProduct(call, {3, hd, kConvKeep});
  auto state_pool = args.F32(6, "statePool");
  if (state_pool.ElementLength() == 0 || state_pool.ElementLength() % state_per_slot != 0)
    args.Fail("statePool", "a Float32Array of numSlots*heads*headDim*headDim elements (numSlots >= 1)",
              "length " + std::to_string(state_pool.ElementLength()));
  const int64_t num_slots = static_cast<int64_t>(state_pool.ElementLength() / state_per_slot);
  auto conv_pool =
      args.F32(7, "convPool", CheckedProduct(call, {num_slots, 3, hd, kConvKeep}), "numSlots*3*heads*headDim*3");
  (void)conv_per_slot;
  std::vector<bool> used(static_cast<size_t>(num_slots), false);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int32_t s = p.slots[b];
    if (s < 0 || s >= num_slots)
      args.Fail("slots", "slots in [0, " + std::to_string(num_slots) + ")",
                std::to_string(s) + " at " + std::to_string(b));
    if (used[static_cast<size_t>(s)]) args.Fail("slots", "distinct slots", "slot " + std::to_string(s) + " twice");
    used[static_cast<size_t>(s)] = true;
  }
  auto qkv = args.F32(0, "qkv", CheckedProduct(call, {tokens, 3, hd}), "T*3*heads*headDim");
  auto g = args.F32(1, "g", CheckedProduct(call, {tokens, hd}), "T*heads*headDim");
  auto beta = args.F32(2, "beta", CheckedProduct(call, {tokens, p.heads}), "T*heads");
  auto conv_w = args.F32(3, "convWeight", CheckedProduct(call, {3, hd, kTaps}), "3*heads*headDim*4");
  auto out = args.F32(10, "out", CheckedProduct(call, {tokens, hd}), "T*heads*headDim");
  p.qkv = qkv.Data();
  p.g = g.Data();
  p.beta = beta.Data();
  p.conv_w = conv_w.Data();
  p.state_pool = state_pool.Data();
  p.conv_pool = conv_pool.Data();
  p.out = out.Data();
  c.arrays = {qkv, g, beta, conv_w, seq_lens, slots, state_pool, conv_pool, out};
  if (!args.IsAbsent(13)) {
    if (p.mode != Mode::kRecurrent) args.Fail("snapState", "null in \"chunked\" mode", "a Float32Array");
    auto snap =
        args.F32(13, "snapState", CheckedProduct(call, {tokens, p.heads, p.dim, p.dim}), "T*heads*headDim*headDim");
    p.snap_state = snap.Data();
    c.arrays.push_back(snap);
  }
  if (!args.IsAbsent(14)) {
    if (p.mode != Mode::kRecurrent) args.Fail("snapConv", "null in \"chunked\" mode", "a Float32Array");
    auto snap = args.F32(14, "snapConv", CheckedProduct(call, {tokens, 3, hd, kConvKeep}), "T*3*heads*headDim*3");
    p.snap_conv = snap.Data();
    c.arrays.push_back(snap);
  }
  if (args.IsAbsent(16) != args.IsAbsent(17))
    args.Fail("initState", "given with initConv, or both null", "one of them");
  if (!args.IsAbsent(16)) {
    if (p.mode != Mode::kRecurrent) args.Fail("initState", "null in \"chunked\" mode", "a Float32Array");
    for (int64_t b = 0; b < p.batch; ++b)
      if (p.seq_lens[b] < 1)
        args.Fail("seqLens", "lengths >= 1 with an initial state",
                  std::to_string(p.seq_lens[b]) + " at " + std::to_string(b));
    int64_t rows = 0;
    auto [init_state, init_conv] = StateRows(args, call, p, 16, "initState", "initConv", rows);
    if (args.IsAbsent(18)) {
      if (rows != p.batch)
        args.Fail("initState", "one row per sequence without initRows", std::to_string(rows) + " rows");
    } else {
      auto init_rows = args.I32(18, "initRows", static_cast<size_t>(p.batch), "seqLens.length");
      for (int64_t b = 0; b < p.batch; ++b)
        if (init_rows.Data()[b] < 0 || init_rows.Data()[b] >= rows)
          args.Fail("initRows", "rows in [0, " + std::to_string(rows) + ")",
                    std::to_string(init_rows.Data()[b]) + " at " + std::to_string(b));
      p.init_rows = init_rows.Data();
      c.arrays.push_back(init_rows);
    }
    p.init_state = init_state.Data();
    p.init_conv = init_conv.Data();
    c.arrays.push_back(init_state);
    c.arrays.push_back(init_conv);
  }
  if (!args.IsAbsent(19)) {
    if (p.mode != Mode::kRecurrent) args.Fail("keepState", "null in \"chunked\" mode", "a Float32Array");
    int64_t rows = 0;
    auto [keep_state, keep_conv] = StateRows(args, call, p, 19, "keepState", "keepConv", rows);
    auto keep_rows = args.I32(21, "keepRows", static_cast<size_t>(p.batch), "seqLens.length");
    std::vector<bool> taken(static_cast<size_t>(rows), false);
    for (int64_t b = 0; b < p.batch; ++b) {
      const int32_t r = keep_rows.Data()[b];
      if (r < -1 || r >= rows)
        args.Fail("keepRows", "rows in [-1, " + std::to_string(rows) + ")",
                  std::to_string(r) + " at " + std::to_string(b));
      if (r >= 0 && taken[static_cast<size_t>(r)])
        args.Fail("keepRows", "distinct rows", "row " + std::to_string(r) + " twice");
      if (r >= 0) taken[static_cast<size_t>(r)] = true;
    }
    p.keep_state = keep_state.Data();
    p.keep_conv = keep_conv.Data();
    p.keep_rows = keep_rows.Data();
    c.arrays.push_back(keep_state);
    c.arrays.push_back(keep_conv);
    c.arrays.push_back(keep_rows);
  }
  return c;
}

Napi::Value KdaForwardBinding(const Napi::CallbackInfo& info) {
  KdaCall c = ReadKdaArgs(info, "kdaForward");
  RunKda(c.problem);
  return info.Env().Undefined();
}

Napi::Value KdaForwardAsyncBinding(const Napi::CallbackInfo& info) {
  auto c = ReadKdaArgs(info, "kdaForwardAsync");
  KdaProblem p = std::move(c.problem);
  return QueueKernel(info.Env(), "kdaForwardAsync", [p]() mutable { RunKda(p); }, std::move(c.arrays));
}

/**
 * kdaGate(f [T, C] f32 (f_b_proj output), dtBias [C], negA [H] (-exp(A_log)), b: Float32Array, bOffset, bStride,
 *         T, H, d, g out [T, C], beta out [T, H]):
 *   g[t][h*d+i] = negA[h] * softplus(f[t][h*d+i] + dtBias[h*d+i])   (kda::Softplus: torch's threshold 20)
 *   beta[t][h]  = 1 / (1 + exp(-b[bOffset + t*bStride + h]))
 * in fp32 with the vectorisable kda::Exp (kda_math.h; ~3 ulp against the double formula the TypeScript
 * kernels keep). kda::GateRowArray, compiled at the baseline ISA and for AVX-512 (GateRowAvx512, 16 lanes, 5x
 * faster at 16 tokens): the same operations, so the same bits on both; elementwise, so a token's gates never depend
 * on the batch, the thread count or the path.
 */
Napi::Value KdaGateBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "kdaGate");
  const int64_t T = args.Int(6, "tokens", 0);
  const int64_t H = args.Int(7, "heads", 1, 1 << 16);
  const int64_t d = args.Int(8, "headDim", 1, 1 << 16);
  const int64_t C = H * d;
  const int64_t b_off = args.Int(4, "bOffset", 0);
  const int64_t b_stride = args.Int(5, "bStride", H);
  auto f = args.F32(0, "f", CheckedProduct("kdaGate", {T, C}), "tokens*heads*headDim");
  auto dt = args.F32(1, "dtBias", static_cast<size_t>(C), "heads*headDim");
  auto neg_a = args.F32(2, "negA", static_cast<size_t>(H), "heads");
  auto b = args.F32(3, "b");
  if (T > 0 && static_cast<int64_t>(b.ElementLength()) < b_off + (T - 1) * b_stride + H)
    args.Fail("b", "a Float32Array of at least bOffset + (tokens-1)*bStride + heads floats",
              "length " + std::to_string(b.ElementLength()));
  auto g = args.F32(9, "g", CheckedProduct("kdaGate", {T, C}), "tokens*heads*headDim");
  auto beta = args.F32(10, "beta", CheckedProduct("kdaGate", {T, H}), "tokens*heads");
  const float *pf = f.Data(), *pdt = dt.Data(), *pa = neg_a.Data(), *pb = b.Data();
  float *pg = g.Data(), *pbeta = beta.Data();
  void (*gate_row)(const float*, const float*, float, float*, int64_t) = kda::GateRowArray;
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) gate_row = kda::GateRowAvx512;
#endif
  ParallelFor(
      T,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          for (int64_t h = 0; h < H; ++h) {
            gate_row(pf + t * C + h * d, pdt + h * d, pa[h], pg + t * C + h * d, d);
            pbeta[t * H + h] = 1.0f / (1.0f + kda::Exp(-pb[b_off + t * b_stride + h]));
          }
        }
      },
      8 * C);
  return info.Env().Undefined();
}

}  // namespace

namespace kda {

void ChunkPortable(const ChunkArgs& a) { ChunkMath(a); }

void StepsPortable(const Steps& st) {
  const int64_t d = st.d;
  float pred[kColBlock], u[kColBlock], acc[kColBlock];
  float* blk = st.work;  // [d][kColBlock]: the current column block, contiguous
  for (int64_t j0 = 0; j0 < d; j0 += kColBlock) {
    const int64_t w = std::min(kColBlock, d - j0);
    for (int64_t i = 0; i < d; ++i)
      std::memcpy(blk + i * kColBlock, st.state + i * d + j0, static_cast<size_t>(w) * sizeof(float));
    for (int64_t t = 0; t < st.tokens; ++t) {
      const float* q = st.q + t * d;
      const float* k = st.k + t * d;
      const float* alpha = st.alpha + t * d;
      for (int64_t j = 0; j < w; ++j) pred[j] = 0.0f;
      for (int64_t i = 0; i < d; ++i) {
        const float a = alpha[i], ki = k[i];
        float* row = blk + i * kColBlock;
        for (int64_t j = 0; j < w; ++j) pred[j] = pred[j] + ki * (row[j] * a);
      }
      const float beta = st.beta[t];
      for (int64_t j = 0; j < w; ++j) u[j] = beta * (st.v[t * d + j0 + j] - pred[j]);
      for (int64_t j = 0; j < w; ++j) acc[j] = 0.0f;
      float* snap = st.snap ? st.snap + t * st.ld_snap : nullptr;
      for (int64_t i = 0; i < d; ++i) {
        const float a = alpha[i], ki = k[i], qi = q[i];
        float* row = blk + i * kColBlock;
        for (int64_t j = 0; j < w; ++j) {
          const float x = row[j] * a + ki * u[j];
          row[j] = x;
          acc[j] = acc[j] + qi * x;
        }
        if (snap) std::memcpy(snap + i * d + j0, row, static_cast<size_t>(w) * sizeof(float));
      }
      std::memcpy(st.o + t * st.ldo + j0, acc, static_cast<size_t>(w) * sizeof(float));
    }
    for (int64_t i = 0; i < d; ++i)
      std::memcpy(st.state + i * d + j0, blk + i * kColBlock, static_cast<size_t>(w) * sizeof(float));
  }
}

}  // namespace kda

void RegisterKda(Napi::Env env, Napi::Object exports) {
  exports.Set("kdaForward", Napi::Function::New(env, Guarded<KdaForwardBinding>, "kdaForward"));
  exports.Set("kdaGate", Napi::Function::New(env, Guarded<KdaGateBinding>, "kdaGate"));
  exports.Set("kdaForwardAsync", Napi::Function::New(env, Guarded<KdaForwardAsyncBinding>, "kdaForwardAsync"));
}

}  // namespace specd
