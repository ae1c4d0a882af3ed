// @specd/native-cuda: the EAGLE-3 draft model on the GPU (issue 18), beside the whole-model Llama runner
// (llama_runner.cc) whose taps it reads. Same math as the CPU drafter (packages/plugin-eagle3/src/eagle3.ts, module
// comment; oracle tools/reference/specd_ref/eagle3.py), with bf16 weights and fp32 activations and accumulation. The
// runner owns its device memory: the draft weights (fc [D, T·D], q|k|v [(H + 2·KV)·hd, 2D], o, gate|up, down, the
// four norms, lm_head [draftVocab, D], d2t), a copy of the target's bf16 token embedding (uploaded once: the
// target runner's buffer is not shared, so neither runner depends on the other's lifetime), the draft KV pool (one
// layer, fp32 K and V pages, NHD: [numPages · pageSize, KV · hd] each; the page bookkeeping stays in TypeScript,
// core's DraftKvCache with storage 'device'), the last-feature slots g [maxSequences, D] f32, activations, one CUDA
// stream and one cuBLASLt handle. JavaScript holds an opaque handle.
//
// Context write (eagle3ContextWrite; eagle3.ts "Context entry"): for rows of the target's taps [n, T·D] f32 (or of
// g itself [n, D] f32): g = fc(taps) (one bf16 GEMM over the concatenated taps, fp32 accumulation), x = [rms(embed(
// next)) · input_layernorm ; rms(g) · hidden_norm] → bf16, q|k|v GEMM, K = RoPE_neox(k) and V = v written into the
// pages at the rows' slots (RoPE + KV write in the q|k|v GEMM's epilogue for ≤ 32 rows, llama.cu; the q|k|v weight
// is stored with each RoPE pair in adjacent rows; q is computed and dropped), and g of each sequence's last row
// copied into its slot. No host round trip (nothing comes back).
//
// Step (eagle3.ts "Chain"): from the step's input tokens and g rows: x as above, h = g (or hidden_norm(g)), q|k|v
// GEMM with RoPE + the step's K/V entry (none at step 1: its entry is the last context entry), paged attention over
// the sequence's context and chain entries → bf16, h += o(attn) (GEMM epilogue, β = 1), h +=
// down(SwiGLU(gate|up(post_attention_layernorm(h)))), logits = lm_head(norm(h)) [rows, draftVocab], argmax on the
// device; for ≤ 32 rows the two norms run in the prologue of the small GEMM after them (nine launches a step). A
// greedy chain (eagle3Chain) runs k steps with the argmax mapped through d2t (in the argmax's second pass) as the
// next step's token and h as its g, on the device, as one CUDA graph per (padded rows, k, key span) captured at the
// first chain of that shape: one H2D copy of the metadata, one graph launch, one D2H copy of the draft ids. A sampled
// chain (eagle3Step) runs one step per call and returns the draft-vocabulary logits, so the host samples with the
// request's generator and keeps q (rejection sampling stays lossless); the host feeds the sampled token to the next
// call. Rows pad to 2^⌈log2 S⌉ (padded rows: token 0, g zeros, no keys, no KV write; up to 32 rows every GEMM is the
// row-invariant small GEMM), and the paged attention launches the partitions of a key span bucketed by the longest
// context (attnSpan; a query's bits do not depend on it), so a chain's drafts are the same bits whether it runs as a
// graph, eagerly or step by step.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <napi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "eagle3_kernels.h"
#include "kernels.h"
#include "runner_util.h"
#include "sampler.h"

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
/** Rows of one context-write chunk (a longer write is split). */
constexpr int kCtxRows = 512;

struct E3Dims {
  int hidden = 0, heads = 0, kvHeads = 0, headDim = 0, inter = 0, vocab = 0, draftVocab = 0, taps = 0;
  int maxSequences = 0, maxDrafts = 0;
  double ropeTheta = 0;
  float eps = 0;
  bool normBeforeResidual = false;
  int pageSize = 0, numPages = 0, maxModelLen = 0;
};

/** One chain or step call, as checked by the N-API layer (host i32). */
struct ChainArgs {
  int S = 0, K = 0;
  const int32_t *gSlots = nullptr, *tokens = nullptr, *positions = nullptr, *tables = nullptr, *stepSlots = nullptr,
                *lengths = nullptr;
};

class Eagle3Runner : public RunnerMemory {
 public:
  explicit Eagle3Runner(const E3Dims& dims) : d(dims) {
    qw = d.heads * d.headDim;
    kw = d.kvHeads * d.headDim;
    qkvW = qw + 2 * kw;
    chainRows = padRows(d.maxSequences);
    rows = std::max(kCtxRows, chainRows);
    try {
      ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) throw CudaFailure("cublasLtCreate failed");
      const int64_t R = rows, D = d.hidden, TD = static_cast<int64_t>(d.taps) * d.hidden;
      ws = dev(kWorkspaceBytes, "cuBLASLt workspace");
      tapsF = static_cast<float*>(dev(kCtxRows * TD * 4, "taps"));
      tapsB = dev(kCtxRows * TD * 2, "taps bf16");
      gCtx = static_cast<float*>(dev(R * D * 4, "context g"));
      xb = dev(R * 2 * D * 2, "layer input");
      qkv = static_cast<float*>(dev(R * qkvW * 4, "q|k|v"));
      q = static_cast<float*>(dev(R * qw * 4, "q"));
      attnB = dev(R * qw * 2, "attention output");
      for (float*& h : hbuf) h = static_cast<float*>(dev(R * D * 4, "residual"));
      hb = dev(R * D * 2, "normed residual");
      gu = static_cast<float*>(dev(R * 2 * d.inter * 4, "gate|up"));
      sb = dev(R * d.inter * 2, "SwiGLU output");
      logits = static_cast<float*>(dev(static_cast<int64_t>(chainRows) * d.draftVocab * 4, "draft logits"));
      argmax = static_cast<int32_t*>(dev(chainRows * 4, "argmax"));
      argmaxWs = dev(specdArgmaxWorkspaceBytes(chainRows, d.draftVocab), "argmax partials");
      next = static_cast<int32_t*>(dev(chainRows * 4, "next tokens"));
      drafts = static_cast<int32_t*>(dev(static_cast<int64_t>(d.maxDrafts) * chainRows * 4, "drafts"));
      gSlotPool = static_cast<float*>(dev(static_cast<int64_t>(d.maxSequences) * D * 4, "g slots"));
      ctxMeta = static_cast<int32_t*>(dev(static_cast<int64_t>(kCtxRows) * 5 * 4, "context metadata"));
      ok(cudaMallocHost(&hDrafts, static_cast<size_t>(d.maxDrafts) * chainRows * 4), "cudaMallocHost (drafts)");
      ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the zeroed buffers)");
    } catch (...) {
      release();
      throw;
    }
  }
  ~Eagle3Runner() { release(); }

  E3Dims d;
  int qw = 0, kw = 0, qkvW = 0, chainRows = 0, rows = 0, maxBlocks = 0, parts = 0;
  size_t kvBytes = 0;
  bool disposed = false;

  /**
   * Allocates the draft KV pool (K then V, each [numPages · pageSize, KV · hd] f32), the RoPE table (the draft's
   * theta, neox, the CPU path's formula: inv_freq in double) and the chain metadata for sequences of up to
   * maxModelLen positions. A second call replaces the first (its contents and the CUDA graphs are dropped).
   */
  void allocKv(int pageSize, int numPages, int maxModelLen) {
    allocKvPhase([&] { allocKvBuffers(pageSize, numPages, maxModelLen); }, [&] { freeKv(); });
  }
  void allocKvBuffers(int pageSize, int numPages, int maxModelLen) {
    d.pageSize = pageSize;
    d.numPages = numPages;
    d.maxModelLen = maxModelLen;
    maxBlocks = (maxModelLen + pageSize - 1) / pageSize;
    poolFloats = static_cast<size_t>(numPages) * pageSize * kw;
    kvBytes = 2 * poolFloats * 4;
    kv = static_cast<float*>(dev(kvBytes, "draft KV pool"));
    cosSin = ropeTable(d.ropeTheta, d.headDim, maxModelLen);
    parts = std::max(1, specdAttentionParts(maxBlocks * pageSize));
    part = static_cast<float*>(
        dev(static_cast<size_t>(chainRows) * d.heads * parts * (2 + d.headDim) * 4, "attention partitions"));
    metaInts = metaSize(chainRows, d.maxDrafts);
    meta = static_cast<int32_t*>(dev(metaInts * 4, "chain metadata"));
    ok(cudaMallocHost(&hMeta, metaInts * 4), "cudaMallocHost (chain metadata)");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the zeroed buffers)");
  }
  bool hasKv() const { return kv != nullptr; }
  int64_t slotsTotal() const { return static_cast<int64_t>(d.numPages) * d.pageSize; }

  void freeKv() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (auto& [k, v] : graphs) cudaGraphExecDestroy(v);
    graphs.clear();
    lastGraph = nullptr;
    stepNext = 0;
    for (void* p : kvAllocs) cudaFree(p);
    kvAllocs.clear();
    if (hMeta != nullptr) cudaFreeHost(hMeta);
    hMeta = nullptr;
    kv = nullptr;
    cosSin = nullptr;
    part = nullptr;
    meta = nullptr;
    kvBytes = 0;
  }

  void release() {
    freeKv();
    sampler.reset();
    if (qFull != nullptr) specdForgetDeviceRows(qFull);
    qDraft = qFull = nullptr;
    for (void* p : allocs) cudaFree(p);
    allocs.clear();
    if (hDrafts != nullptr) cudaFreeHost(hDrafts);
    hDrafts = nullptr;
    if (lt != nullptr) cublasLtDestroy(lt);
    lt = nullptr;
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
    disposed = true;
  }

  /** Uploads weight `name` (bytes checked against its shape). */
  void setWeight(const std::string& name, const void* src, size_t bytes) {
    const size_t D = d.hidden;
    auto matrix = [&](void** slot, size_t r, size_t c) {
      expect(bytes, r * c * 2, name);
      upload(slot, src, bytes, name);
    };
    auto vector = [&](float** slot) {
      expect(bytes, D * 4, name);
      upload(reinterpret_cast<void**>(slot), src, bytes, name);
    };
    if (name == "embed") return matrix(&embed, d.vocab, D);
    if (name == "fc") return matrix(&fc, D, static_cast<size_t>(d.taps) * D);
    if (name == "qkv")  // the draft model's RoPE is neox
      return uploadQkv(&wQkv, src, bytes, d.heads, d.kvHeads, d.headDim, static_cast<int>(2 * D), true, name);
    if (name == "o") return matrix(&wO, D, qw);
    if (name == "gateUp") return matrix(&wGateUp, 2 * static_cast<size_t>(d.inter), D);
    if (name == "down") return matrix(&wDown, D, d.inter);
    if (name == "lmHead") return matrix(&lmHead, d.draftVocab, D);
    if (name == "inputNorm") return vector(&inputNorm);
    if (name == "hiddenNorm") return vector(&hiddenNorm);
    if (name == "postNorm") return vector(&postNorm);
    if (name == "finalNorm") return vector(&finalNorm);
    if (name == "d2t") {
      expect(bytes, static_cast<size_t>(d.draftVocab) * 4, name);
      const int32_t* ids = static_cast<const int32_t*>(src);
      for (int i = 0; i < d.draftVocab; i++)
        if (ids[i] < 0 || ids[i] >= d.vocab)
          throw std::invalid_argument("d2t: entry " + std::to_string(i) + " = " + std::to_string(ids[i]) +
                                      " is outside the target vocabulary [0, " + std::to_string(d.vocab) + ")");
      return upload(reinterpret_cast<void**>(&d2t), src, bytes, name);
    }
    throw std::invalid_argument("name: unknown EAGLE-3 weight " + name);
  }

  /** The first weight not uploaded yet, or "". */
  std::string missing() const {
    const std::pair<const void*, const char*> all[] = {{embed, "embed"},
                                                       {fc, "fc"},
                                                       {wQkv, "qkv"},
                                                       {wO, "o"},
                                                       {wGateUp, "gateUp"},
                                                       {wDown, "down"},
                                                       {lmHead, "lmHead"},
                                                       {inputNorm, "inputNorm"},
                                                       {hiddenNorm, "hiddenNorm"},
                                                       {postNorm, "postNorm"},
                                                       {finalNorm, "finalNorm"},
                                                       {d2t, "d2t"}};
    for (const auto& [p, name] : all)
      if (p == nullptr) return name;
    return "";
  }

  /**
   * Context entries of `n` rows (checked by the caller): `src` [n, T·D] taps (fromTaps) or [n, D] g, f32 host;
   * `nextIds`, `positions`, `slots`, `gSlotOfRow` [n] i32. Enqueued on the stream; nothing is waited for.
   */
  void contextWrite(const float* src, bool fromTaps, int n, const int32_t* nextIds, const int32_t* positions,
                    const int32_t* slots, const int32_t* gSlotOfRow) {
    const int D = d.hidden, TD = d.taps * d.hidden;
    float* kPool = kv;
    float* vPool = kv + poolFloats;
    std::vector<int32_t> m(static_cast<size_t>(kCtxRows) * 5);
    for (int a = 0; a < n; a += kCtxRows) {
      const int rowsHere = std::min(kCtxRows, n - a);
      const int M = padRows(rowsHere);
      if (fromTaps) {
        ok(cudaMemcpyAsync(tapsF, src + static_cast<size_t>(a) * TD, static_cast<size_t>(rowsHere) * TD * 4,
                           cudaMemcpyHostToDevice, stream),
           "taps copy");
        launched(specdToBf16(tapsB, tapsF, static_cast<int64_t>(rowsHere) * TD, stream), "toBf16 (taps)");
        if (specdSmallGemmFits(rowsHere, TD))  // a step's few rows: one launch, no cuBLASLt call on the host
          launched(specdSmallGemm(gCtx, tapsB, fc, rowsHere, D, TD, false, stream), "fc GEMM");
        else gemm(gCtx, tapsB, fc, M, D, TD, false, "fc GEMM");
      } else {
        ok(cudaMemcpyAsync(gCtx, src + static_cast<size_t>(a) * D, static_cast<size_t>(rowsHere) * D * 4,
                           cudaMemcpyHostToDevice, stream),
           "g copy");
      }
      // metadata: next ids, positions, slots [rowsHere] each, then the g copies (dst slot, src row) [copies] each
      int copies = 0;
      std::memcpy(m.data(), nextIds + a, static_cast<size_t>(rowsHere) * 4);
      std::memcpy(m.data() + rowsHere, positions + a, static_cast<size_t>(rowsHere) * 4);
      std::memcpy(m.data() + 2 * rowsHere, slots + a, static_cast<size_t>(rowsHere) * 4);
      for (int r = 0; r < rowsHere; r++)
        if (gSlotOfRow[a + r] >= 0) copies++;
      int32_t* dst = m.data() + 3 * rowsHere;
      int32_t* srcRows = dst + copies;
      for (int r = 0, c = 0; r < rowsHere; r++)
        if (gSlotOfRow[a + r] >= 0) {
          dst[c] = gSlotOfRow[a + r];
          srcRows[c++] = r;
        }
      ok(cudaMemcpyAsync(ctxMeta, m.data(), (3 * static_cast<size_t>(rowsHere) + 2 * copies) * 4,
                         cudaMemcpyHostToDevice, stream),
         "context metadata copy");
      const int32_t* ids = ctxMeta;
      const int32_t* pos = ids + rowsHere;
      const int32_t* sl = pos + rowsHere;
      launched(specdEagle3Input(xb, nullptr, embed, ids, d.vocab, gCtx, nullptr, inputNorm, hiddenNorm, rowsHere, D,
                                d.eps, d.normBeforeResidual, stream),
               "layer input");
      if (specdSmallGemmFits(rowsHere, 2 * D)) {
        launched(specdSmallGemmRope(q, kPool, vPool, cosSin, pos, sl, d.heads, d.kvHeads, d.headDim, true, xb, wQkv,
                                    rowsHere, 2 * D, stream),
                 "q|k|v GEMM + RoPE + KV write");
      } else {
        gemm(qkv, xb, wQkv, M, qkvW, 2 * D, false, "q|k|v GEMM");
        launched(
            specdRopeKv(q, kPool, vPool, qkv, cosSin, pos, sl, rowsHere, d.heads, d.kvHeads, d.headDim, true, stream),
            "RoPE + KV write");
      }
      launched(specdCopyRows(gSlotPool, sl + rowsHere, gCtx, sl + rowsHere + copies, copies, D, stream), "g slots");
    }
  }

  /**
   * A greedy chain (checked by the caller): K steps for c.S sequences, draft ids [S, K] i32 into `out` (entries
   * past a sequence's length are 0). As a CUDA graph per (padded rows, K) when `useGraph`.
   */
  void chain(const ChainArgs& c, bool useGraph, int32_t* out) {
    const int Sp = padRows(c.S);
    pack(c, Sp, c.K, true);
    ok(cudaMemcpyAsync(meta, hMeta, metaSize(Sp, c.K) * 4, cudaMemcpyHostToDevice, stream), "metadata copy");
    stepNext = 0;  // the chain reuses the residual buffers a stepwise chain continues from
    int maxKv = 0;
    for (int s = 0; s < c.S; s++) maxKv = std::max(maxKv, c.positions[s] + std::min(c.K, c.lengths[s]) - 1);
    attnKeys = attnSpan(maxKv, maxBlocks * d.pageSize);
    if (!useGraph) {
      lastGraph = nullptr;
      launchChain(Sp, c.K);
    } else {
      const std::tuple<int, int, int> key(Sp, c.K, attnKeys);
      auto it = graphs.find(key);
      if (it == graphs.end()) {
        launchChain(Sp, c.K);  // this chain's results; makes the GEMM plans outside the capture
        cudaGraphExec_t exec = captureGraph(stream, [&] { launchChain(Sp, c.K); });
        graphs.emplace(key, exec);
        lastGraph = exec;
      } else {
        ok(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch");
        lastGraph = it->second;
      }
    }
    ok(cudaMemcpyAsync(hDrafts, drafts, static_cast<size_t>(c.K) * Sp * 4, cudaMemcpyDeviceToHost, stream),
       "drafts copy");
    ok(cudaStreamSynchronize(stream), "the chain (cudaStreamSynchronize)");
    for (int s = 0; s < c.S; s++)
      for (int j = 0; j < c.K; j++)
        out[static_cast<size_t>(s) * c.K + j] = j < c.lengths[s] ? hDrafts[static_cast<size_t>(j) * Sp + s] : 0;
  }

  /**
   * Step j (1-based) of a stepwise chain (checked by the caller; j > 1 continues the previous call's rows): the
   * argmax [S] i32 and the draft-vocabulary logits [S, draftVocab] f32 into `argmaxOut` / `logitsOut`.
   */
  void step(int j, const ChainArgs& c, int32_t* argmaxOut, float* logitsOut) {
    const int Sp = launchSingleStep(j, c);
    ok(cudaMemcpyAsync(argmaxOut, argmax, static_cast<size_t>(c.S) * 4, cudaMemcpyDeviceToHost, stream), "argmax copy");
    ok(cudaMemcpyAsync(logitsOut, logits, static_cast<size_t>(c.S) * d.draftVocab * 4, cudaMemcpyDeviceToHost, stream),
       "logits copy");
    ok(cudaStreamSynchronize(stream), "the step (cudaStreamSynchronize)");
    stepNext = j + 1;
    stepRows = Sp;
  }

  /**
   * Step j of a sampled chain on the device (checked by the caller; j > 1 continues the previous call's rows): the
   * step's forward as `step`, then each sequence's draft drawn from its draft-vocabulary row by the sampling kernels
   * (`req`: one group per sequence, row s, no drafts; temperature / top-k / top-p and the draw of the request's
   * generator) → the drawn draft ids into `idsOut` [S] (−1: the row is not finite). Its q, scattered into the target
   * vocabulary through d2t, stays on the device at row s · maxDrafts + j − 1 of the lent q buffer (`probsAddress`;
   * rows of a sequence's chain contiguous), zeroed at step 1.
   */
  void sampledStep(int j, const ChainArgs& c, const SampleRequest& req, int32_t* idsOut) {
    if (!sampler) sampler = std::make_unique<DeviceSampler>();
    const size_t qRows = static_cast<size_t>(d.maxSequences) * d.maxDrafts;
    if (qFull == nullptr) {
      qDraft = static_cast<float*>(dev(static_cast<size_t>(chainRows) * d.draftVocab * 4, "draft q"));
      qFull = static_cast<float*>(dev(qRows * d.vocab * 4, "draft q, target vocabulary"));
      specdRegisterDeviceRows(qFull, qRows * d.vocab * 4);
    }
    const int Sp = launchSingleStep(j, c);
    if (j == 1)
      ok(cudaMemsetAsync(qFull, 0, static_cast<size_t>(c.S) * d.maxDrafts * d.vocab * 4, stream),
         "cudaMemsetAsync (q)");
    std::vector<int32_t> res;
    try {
      res = sampler->run(req, logits, d.draftVocab, stream, qDraft);  // waits for the stream
    } catch (const std::runtime_error& e) {
      throw CudaFailure(e.what());
    }
    launched(specdScatterCols(qFull, qDraft, d2t, c.S, d.draftVocab, d.vocab, d.maxDrafts, j - 1, stream),
             "draft q into the target vocabulary");
    ok(cudaStreamSynchronize(stream), "the sampled step (cudaStreamSynchronize)");
    for (int s = 0; s < c.S; s++) idsOut[s] = res[2 * s + 1];
    stepNext = j + 1;
    stepRows = Sp;
    sampledChains = c.S;
  }

  /** Rows [row, row + rows) of the sampled chain's q (target vocabulary) into host `out` [rows, vocab] f32. */
  void probs(int row, int rows, float* out) {
    if (qFull == nullptr || row < 0 || rows < 0 || row + rows > sampledChains * d.maxDrafts)
      throw std::invalid_argument("eagle3Probs: rows " + std::to_string(row) + " … " + std::to_string(row + rows) +
                                  " outside the sampled chain's q");
    ok(cudaMemcpyAsync(out, qFull + static_cast<size_t>(row) * d.vocab, static_cast<size_t>(rows) * d.vocab * 4,
                       cudaMemcpyDeviceToHost, stream),
       "draft q copy");
    ok(cudaStreamSynchronize(stream), "eagle3Probs (cudaStreamSynchronize)");
  }

  /** The device address of the sampled chains' q [maxSequences · maxDrafts, vocab] f32 (lent), null before any. */
  const float* probsAddress() const { return qFull; }

  /** Waits for the stream (a context write's errors surface here). */
  void sync() { ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }

  /** GPU ms per replay of the last chain's CUDA graph (−1 without one). Rewrites the chain's temporary entries. */
  double replayMs(int reps) { return lastGraph == nullptr ? -1 : replayGraphMs(lastGraph, stream, reps); }
  /**
   * GPU ms per replay of the captured chain of k steps over `rows` padded rows at the last chain's key span (−1: none
   * captured).
   */
  double replayMs(int reps, int rows, int k) {
    const auto it = graphs.find(std::tuple<int, int, int>(padRows(rows), k, attnKeys));
    return it == graphs.end() ? -1 : replayGraphMs(it->second, stream, reps);
  }

  std::vector<std::string> graphLabels() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : graphs)
      out.push_back(std::to_string(std::get<0>(k)) + " rows x " + std::to_string(std::get<1>(k)) + " steps, " +
                    std::to_string(std::get<2>(k)) + " keys");
    return out;
  }

 private:
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void *ws = nullptr, *argmaxWs = nullptr;
  void *embed = nullptr, *fc = nullptr, *wQkv = nullptr, *wO = nullptr, *wGateUp = nullptr, *wDown = nullptr,
       *lmHead = nullptr;
  float *inputNorm = nullptr, *hiddenNorm = nullptr, *postNorm = nullptr, *finalNorm = nullptr;
  int32_t* d2t = nullptr;
  float *tapsF = nullptr, *gCtx = nullptr, *qkv = nullptr, *q = nullptr, *gu = nullptr, *logits = nullptr;
  float* hbuf[2] = {nullptr, nullptr};
  float* gSlotPool = nullptr;
  void *tapsB = nullptr, *xb = nullptr, *attnB = nullptr, *hb = nullptr, *sb = nullptr;
  int32_t *argmax = nullptr, *next = nullptr, *drafts = nullptr, *ctxMeta = nullptr;
  int32_t* hDrafts = nullptr;
  // sized by allocKv
  float *kv = nullptr, *cosSin = nullptr, *part = nullptr;
  size_t poolFloats = 0, metaInts = 0;
  int32_t *meta = nullptr, *hMeta = nullptr;
  std::map<std::tuple<int, int, int>, cudaGraphExec_t> graphs;
  cudaGraphExec_t lastGraph = nullptr;
  int stepNext = 0, stepRows = 0;
  int attnKeys = 64;                          // the paged attention's key span of the current chain or step (attnSpan)
  std::unique_ptr<DeviceSampler> sampler;     // made at the first sampled step
  float *qDraft = nullptr, *qFull = nullptr;  // a sampled step's q [chainRows, draftVocab]; the chains' q (lent)
  int sampledChains = 0;                      // sequences of the last sampled chain

  void gemm(float* out, const void* in, const void* w, int m, int n, int k, bool acc, const char* what) {
    launched(specdGemmBf16(lt, out, in, w, m, m, n, k, ws, kWorkspaceBytes, stream, acc), what);
  }
  /** gemm as a callable for draftMlp / draftHead. */
  auto gemmFn() {
    return [this](float* out, const void* in, const void* w, int m, int n, int k, bool acc, const char* what) {
      gemm(out, in, w, m, n, k, acc, what);
    };
  }

  // metadata: tokens[Sp] gIdx[Sp] cu[Sp + 1] tables[Sp · maxBlocks], then per step: positions[Sp] slots[Sp] kvLens[Sp]
  size_t metaSize(int Sp, int K) const {
    return 3 * static_cast<size_t>(Sp) + 1 + static_cast<size_t>(Sp) * maxBlocks + 3 * static_cast<size_t>(K) * Sp;
  }

  /**
   * Packs a chain's metadata for Sp rows into hMeta: steps 1 … K (`chain`), or the single step `onlyStep` (K = 1).
   * Step j of sequence s runs as step min(j, length): query position p − 1 (step 1) or p + j − 2, keys p + j − 1,
   * its K/V entry at stepSlots[(j − 2) · S + s] (steps 2 … length; −1 otherwise). Padded rows: token 0, no g, no
   * keys, position 0, no slot.
   */
  void pack(const ChainArgs& c, int Sp, int K, bool isChain, int onlyStep = 1) {
    int32_t* m = hMeta;
    std::fill(m, m + metaSize(Sp, K), 0);
    int32_t* tok = m;
    int32_t* gIdx = tok + Sp;
    int32_t* cu = gIdx + Sp;
    int32_t* tables = cu + Sp + 1;
    int32_t* steps = tables + static_cast<size_t>(Sp) * maxBlocks;
    for (int s = 0; s < Sp; s++) {
      gIdx[s] = s < c.S ? c.gSlots[s] : -1;
      tok[s] = s < c.S ? c.tokens[s] : 0;
    }
    for (int s = 0; s <= Sp; s++) cu[s] = s;
    std::memcpy(tables, c.tables, static_cast<size_t>(c.S) * maxBlocks * 4);
    for (int k = 0; k < K; k++) {
      const int j = isChain ? k + 1 : onlyStep;
      int32_t* pos = steps + static_cast<size_t>(k) * 3 * Sp;
      int32_t* sl = pos + Sp;
      int32_t* kvLens = sl + Sp;
      for (int s = 0; s < Sp; s++) {
        sl[s] = -1;
        if (s >= c.S) continue;
        const int p = c.positions[s];
        const int je = std::min(j, c.lengths[s]);
        pos[s] = je == 1 ? p - 1 : p + je - 2;
        kvLens[s] = p + je - 1;
        if (j >= 2 && j <= c.lengths[s])
          sl[s] = isChain ? c.stepSlots[static_cast<size_t>(j - 2) * c.S + s] : c.stepSlots[s];
      }
    }
  }

  /**
   * The forward of step j (1-based) of a chain computed one call per step (`step`, `sampledStep`), for c's sequences:
   * checks that j continues the previous call (j = 1, or the next step over the same padded rows), packs and copies
   * the step's metadata, and launches it; the logits and argmax are left on the device (nothing is waited for).
   * → the padded rows. @throws std::invalid_argument when j does not continue the previous step.
   */
  int launchSingleStep(int j, const ChainArgs& c) {
    const int Sp = padRows(c.S);
    if (j > 1 && (j != stepNext || Sp != stepRows))
      throw std::invalid_argument("j: step " + std::to_string(j) + " does not continue the previous step (expected " +
                                  (stepNext == 0 ? std::string("j = 1") : "j = " + std::to_string(stepNext)) +
                                  " over the same sequences)");
    pack(c, Sp, 1, false, j);
    ok(cudaMemcpyAsync(meta, hMeta, metaSize(Sp, 1) * 4, cudaMemcpyHostToDevice, stream), "metadata copy");
    int maxKv = 0;
    for (int s = 0; s < c.S; s++) maxKv = std::max(maxKv, c.positions[s] + std::min(j, c.lengths[s]) - 1);
    attnKeys = attnSpan(maxKv, maxBlocks * d.pageSize);
    lastGraph = nullptr;
    stepNext = 0;
    const int32_t* tok = meta;
    const int32_t* gIdx = tok + Sp;
    const int32_t* cu = gIdx + Sp;
    const int32_t* tables = cu + Sp + 1;
    const int32_t* pos = tables + static_cast<size_t>(Sp) * maxBlocks;
    launchStep(Sp, tok, j == 1 ? gSlotPool : hbuf[(j - 1) & 1], j == 1 ? gIdx : nullptr, hbuf[j & 1], cu, tables, pos,
               pos + Sp, pos + 2 * Sp);
    return Sp;
  }

  /** Chain steps 1 … K over Sp rows, metadata in `meta`; step j's argmax → drafts[j − 1] and the next tokens. */
  void launchChain(int Sp, int K) {
    const int32_t* tok0 = meta;
    const int32_t* gIdx = tok0 + Sp;
    const int32_t* cu = gIdx + Sp;
    const int32_t* tables = cu + Sp + 1;
    const int32_t* steps = tables + static_cast<size_t>(Sp) * maxBlocks;
    for (int j = 1; j <= K; j++) {
      const int32_t* pos = steps + static_cast<size_t>(j - 1) * 3 * Sp;
      // the argmax's second pass records step j's draft ids and maps them through d2t to the next step's tokens
      launchStep(Sp, j == 1 ? tok0 : next, j == 1 ? gSlotPool : hbuf[(j - 1) & 1], j == 1 ? gIdx : nullptr, hbuf[j & 1],
                 cu, tables, pos, pos + Sp, pos + 2 * Sp, drafts + static_cast<size_t>(j - 1) * Sp, next, d2t);
    }
  }

  /**
   * One step over Sp rows (module comment, "Step"): input tokens `tok`, g rows `g` (gathered by `gRows` when
   * given), residual → `h`; leaves the logits in `logits` and their argmax in `argmax` (and, with `pickD2t`, the
   * argmax in `pickDrafts` and d2t of it in `pickNext`: a chain step's pick).
   */
  void launchStep(int Sp, const int32_t* tok, const float* g, const int32_t* gRows, float* h, const int32_t* cu,
                  const int32_t* tables, const int32_t* pos, const int32_t* slots, const int32_t* kvLens,
                  int32_t* pickDrafts = nullptr, int32_t* pickNext = nullptr, const int32_t* pickD2t = nullptr) {
    const int D = d.hidden;
    float* kPool = kv;
    float* vPool = kv + poolFloats;
    launched(specdEagle3Input(xb, h, embed, tok, d.vocab, g, gRows, inputNorm, hiddenNorm, Sp, D, d.eps,
                              d.normBeforeResidual, stream),
             "layer input");
    // batches of ≤ 32 rows (every chain of ≤ 32 sequences): the small GEMM on the tensor cores, SwiGLU in its epilogue
    const bool small = specdSmallGemmFits(Sp, 2 * D) && specdSmallGemmFits(Sp, qw) && specdSmallGemmFits(Sp, D) &&
                       specdSmallGemmFits(Sp, d.inter);
    auto mm = [&](float* out, const void* in, const void* w, int n, int k, bool acc, const char* what) {
      if (small) launched(specdSmallGemm(out, in, w, Sp, n, k, acc, stream), what);
      else gemm(out, in, w, Sp, n, k, acc, what);
    };
    if (small) {
      launched(specdSmallGemmRope(q, kPool, vPool, cosSin, pos, slots, d.heads, d.kvHeads, d.headDim, true, xb, wQkv,
                                  Sp, 2 * D, stream),
               "q|k|v GEMM + RoPE + KV write");
    } else {
      mm(qkv, xb, wQkv, qkvW, 2 * D, false, "q|k|v GEMM");
      launched(specdRopeKv(q, kPool, vPool, qkv, cosSin, pos, slots, Sp, d.heads, d.kvHeads, d.headDim, true, stream),
               "RoPE + KV write");
    }
    const float scale = 1.f / std::sqrt(static_cast<float>(d.headDim));
    launched(specdPagedAttention(nullptr, attnB, part, q, kPool, vPool, cu, kvLens, tables, pos, Sp, Sp, maxBlocks,
                                 d.pageSize, d.heads, d.kvHeads, d.headDim, scale, true, attnKeys, stream),
             "paged attention");
    mm(h, attnB, wO, D, qw, true, "o GEMM");
    draftMlp(small, gemmFn(), stream, h, hb, gu, sb, postNorm, wGateUp, wDown, Sp, D, d.inter, d.eps);
    draftHead(small, gemmFn(), stream, logits, h, hb, finalNorm, nullptr, lmHead, Sp, d.draftVocab, D, d.eps);
    launched(specdArgmaxTwoPass(argmax, argmaxWs, logits, Sp, d.draftVocab, stream, pickDrafts, pickNext, pickD2t),
             "argmax");
  }
};

// ---------------------------------------------------------------------------------------------------------------
// N-API

Eagle3Runner* runnerOf(const Napi::CallbackInfo& info) { return runnerArg<Eagle3Runner>(info, "eagle3Create"); }

/**
 * eagle3Create({hiddenSize, numHeads, numKvHeads, headDim, intermediateSize, vocabSize, draftVocabSize, numTaps,
 * ropeTheta, rmsNormEps, normBeforeResidual, maxSequences, maxDraftTokens}) → a runner handle with its activations
 * and g slots [maxSequences, hiddenSize] allocated (zeroed); weights come with eagle3SetWeight, the draft KV pool
 * with eagle3AllocKv. vocabSize is the target's (the embedding's rows, d2t's range).
 * @throws RangeError for a bad field (headDim a multiple of 16 up to 256: the paged attention kernel's); Error
 *   naming the failed CUDA call.
 */
Napi::Value Eagle3Create(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw Napi::TypeError::New(env, "options: expected an object");
  Napi::Object o = info[0].As<Napi::Object>();
  E3Dims d;
  d.hidden = intField(o, "hiddenSize", 1, 1 << 16);
  d.heads = intField(o, "numHeads", 1, 1024);
  d.kvHeads = intField(o, "numKvHeads", 1, 1024);
  d.headDim = intField(o, "headDim", 16, 256);
  d.inter = intField(o, "intermediateSize", 1, 1 << 18);
  d.vocab = intField(o, "vocabSize", 1, 1 << 24);
  d.draftVocab = intField(o, "draftVocabSize", 1, 1 << 24);
  d.taps = intField(o, "numTaps", 1, 64);
  d.ropeTheta = numField(o, "ropeTheta", true);
  d.eps = static_cast<float>(numField(o, "rmsNormEps", false));
  d.normBeforeResidual = o.Get("normBeforeResidual").ToBoolean().Value();
  d.maxSequences = intField(o, "maxSequences", 1, 4096);
  d.maxDrafts = intField(o, "maxDraftTokens", 1, 256);
  if (d.heads % d.kvHeads != 0) throw Napi::RangeError::New(env, "numHeads: must be a multiple of numKvHeads");
  if (d.headDim % 16 != 0) throw Napi::RangeError::New(env, "headDim: must be a multiple of 16 (paged attention)");
  if (d.draftVocab > d.vocab) throw Napi::RangeError::New(env, "draftVocabSize: must not exceed vocabSize");
  return guarded(env, [&]() -> Napi::Value {
    auto* r = new Eagle3Runner(d);
    return Napi::External<Eagle3Runner>::New(env, r, [](Napi::Env, Eagle3Runner* p) { delete p; });
  });
}

/**
 * eagle3AllocKv(runner, pageSize, numPages, maxModelLen): the draft KV pool (numPages · pageSize token slots, K and
 * V f32) and what is sized with it (RoPE table, chain metadata) for positions below maxModelLen, allocated at once.
 * A second call replaces the first (contents and CUDA graphs dropped).
 * @throws RangeError for a bad size; Error naming the failed CUDA call.
 */
Napi::Value Eagle3AllocKv(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Eagle3Runner* r = runnerOf(info);
  const int pageSize = intArg(info, 1, "pageSize", 1, 1 << 16);
  const int numPages = intArg(info, 2, "numPages", 1, 1 << 24);
  const int maxModelLen = intArg(info, 3, "maxModelLen", 1, 1 << 20);
  guarded(env, [&]() { r->allocKv(pageSize, numPages, maxModelLen); });
  return env.Undefined();
}

/**
 * eagle3SetWeight(runner, name, data): uploads a weight — bf16 bits (Uint16Array): embed [vocabSize, D], fc
 * [D, numTaps · D], qkv [(H + 2·KV)·hd, 2D], o [D, H·hd], gateUp [2I, D], down [D, I], lmHead [draftVocabSize, D];
 * Float32Array [D]: inputNorm, hiddenNorm, postNorm, finalNorm; Int32Array [draftVocabSize]: d2t (target id of each
 * draft id, already offset: i + d2t[i]).
 * @throws TypeError for the wrong array type; RangeError for an unknown name, a wrong size or a d2t entry outside
 *   the target vocabulary; Error naming the failed CUDA call.
 */
Napi::Value Eagle3SetWeight(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Eagle3Runner* r = runnerOf(info);
  if (!info[1].IsString()) throw Napi::TypeError::New(env, "name: expected a string");
  const std::string name = info[1].As<Napi::String>().Utf8Value();
  if (!info[2].IsTypedArray()) throw Napi::TypeError::New(env, "data: expected a typed array");
  Napi::TypedArray t = info[2].As<Napi::TypedArray>();
  const bool isNorm = name == "inputNorm" || name == "hiddenNorm" || name == "postNorm" || name == "finalNorm";
  const napi_typedarray_type want = isNorm ? napi_float32_array : name == "d2t" ? napi_int32_array : napi_uint16_array;
  if (t.TypedArrayType() != want)
    throw Napi::TypeError::New(env, name + ": expected " +
                                        (isNorm          ? "a Float32Array"
                                         : name == "d2t" ? "an Int32Array"
                                                         : "a Uint16Array of bf16 bits"));
  const uint8_t* src = static_cast<const uint8_t*>(t.ArrayBuffer().Data()) + t.ByteOffset();
  guarded(env, [&]() { r->setWeight(name, src, t.ByteLength()); });
  return env.Undefined();
}

/** Throws unless the runner has its KV pool and every weight. */
void ready(Napi::Env env, Eagle3Runner* r, const char* call) { requireReady(env, r, call, "eagle3AllocKv"); }

/**
 * eagle3ContextWrite(runner, rows, fromTaps, nextTokens, positions, slots, gSlotOfRow): the draft context entries
 * of n = nextTokens.length rows (module comment): rows [n, numTaps · D] f32 — the target's taps of each row,
 * concatenated in the drafter's tap order (fc's column blocks) — when `fromTaps`, else g itself [n, D] f32; the
 * entry of row i (at position positions[i], the token after it nextTokens[i]) written at draft KV slot slots[i]
 * (page · pageSize + offset); g of row i kept in slot gSlotOfRow[i] (−1: not kept; a sequence's last row names its
 * slot). Everything is checked before the device is touched; the work is enqueued and not waited for (its errors
 * surface at the next chain or step).
 * @throws RangeError naming the argument; Error naming a failed CUDA call.
 */
Napi::Value Eagle3ContextWrite(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Eagle3Runner* r = runnerOf(info);
  ready(env, r, "eagle3ContextWrite");
  const E3Dims& d = r->d;
  const int n = static_cast<int>(typedLength(info, 3, "nextTokens"));
  if (n < 1) throw Napi::RangeError::New(env, "nextTokens: expected at least one row");
  const bool fromTaps = info[2].ToBoolean().Value();
  Napi::Float32Array rows =
      f32Rows(info, 1, "rows", static_cast<size_t>(n), static_cast<size_t>(fromTaps ? d.taps : 1) * d.hidden);
  const int32_t* next = i32(info, 3, "nextTokens", n);
  const int32_t* positions = i32(info, 4, "positions", n);
  const int32_t* slots = i32(info, 5, "slots", n);
  const int32_t* gSlotOfRow = i32(info, 6, "gSlotOfRow", n);
  for (int i = 0; i < n; i++) {
    const std::string at = "[" + std::to_string(i) + "]";
    if (next[i] < 0 || next[i] >= d.vocab)
      throw Napi::RangeError::New(env, "nextTokens" + at + ": outside the target vocabulary");
    if (positions[i] < 0 || positions[i] >= d.maxModelLen)
      throw Napi::RangeError::New(env, "positions" + at + ": outside [0, maxModelLen)");
    if (slots[i] < 0 || slots[i] >= r->slotsTotal())
      throw Napi::RangeError::New(env, "slots" + at + ": outside [0, numPages * pageSize)");
    if (gSlotOfRow[i] < -1 || gSlotOfRow[i] >= d.maxSequences)
      throw Napi::RangeError::New(env, "gSlotOfRow" + at + ": outside [-1, maxSequences)");
  }
  guarded(env, [&]() { r->contextWrite(rows.Data(), fromTaps, n, next, positions, slots, gSlotOfRow); });
  return env.Undefined();
}

/**
 * Checks the per-sequence arguments shared by eagle3Chain and eagle3Step from argument `first` on: gSlots [S],
 * tokens [S], positions [S], blockTables [S · maxBlocks], stepSlots ([(K − 1) · S] for a chain, [S] for a step),
 * lengths [S], for a chain of K steps (a step: K = j).
 */
ChainArgs chainArgs(const Napi::CallbackInfo& info, Eagle3Runner* r, size_t first, bool isChain, int K) {
  Napi::Env env = info.Env();
  const E3Dims& d = r->d;
  ChainArgs c;
  c.K = K;
  c.S = static_cast<int>(typedLength(info, first, "gSlots"));
  if (c.S < 1 || c.S > d.maxSequences)
    throw Napi::RangeError::New(env, "gSlots: expected 1 to maxSequences " + std::to_string(d.maxSequences) +
                                         " sequences, got " + std::to_string(c.S));
  c.gSlots = i32(info, first, "gSlots", c.S);
  c.tokens = i32(info, first + 1, "tokens", c.S);
  c.positions = i32(info, first + 2, "positions", c.S);
  c.tables = i32(info, first + 3, "blockTables", static_cast<size_t>(c.S) * r->maxBlocks);
  c.stepSlots = i32(info, first + 4, "stepSlots", isChain ? static_cast<size_t>(K - 1) * c.S : c.S);
  c.lengths = i32(info, first + 5, "lengths", c.S);
  for (int s = 0; s < c.S; s++) {
    const std::string at = "[" + std::to_string(s) + "]";
    if (c.gSlots[s] < 0 || c.gSlots[s] >= d.maxSequences)
      throw Napi::RangeError::New(env, "gSlots" + at + ": outside [0, maxSequences)");
    if (c.tokens[s] < 0 || c.tokens[s] >= d.vocab)
      throw Napi::RangeError::New(env, "tokens" + at + ": outside the target vocabulary");
    if (c.lengths[s] < 1 || (isChain && c.lengths[s] > K) || c.lengths[s] > d.maxDrafts)
      throw Napi::RangeError::New(env, "lengths" + at + ": expected 1 to " + std::to_string(isChain ? K : d.maxDrafts));
    const int p = c.positions[s];
    const int keys = p + c.lengths[s] - 1;  // the context and the chain's entries
    if (p < 1 || keys > d.maxModelLen)
      throw Napi::RangeError::New(env, "positions" + at + ": expected 1 to maxModelLen - lengths + 1 (" +
                                           std::to_string(d.maxModelLen - c.lengths[s] + 1) + "), got " +
                                           std::to_string(p));
    const int used = (keys + d.pageSize - 1) / d.pageSize;
    for (int b = 0; b < used; b++) {
      const int32_t page = c.tables[static_cast<size_t>(s) * r->maxBlocks + b];
      if (page < 0 || page >= d.numPages)
        throw Napi::RangeError::New(env, "blockTables: sequence " + std::to_string(s) + " names page " +
                                             std::to_string(page) + ", outside [0, numPages)");
    }
    for (int j = isChain ? 2 : K; j <= std::min(K, c.lengths[s]); j++) {
      if (j < 2) continue;
      const int32_t slot = isChain ? c.stepSlots[static_cast<size_t>(j - 2) * c.S + s] : c.stepSlots[s];
      if (slot < 0 || slot >= r->slotsTotal())
        throw Napi::RangeError::New(env, "stepSlots: step " + std::to_string(j) + " of sequence " + std::to_string(s) +
                                             ": slot outside [0, numPages * pageSize)");
    }
  }
  return c;
}

/**
 * eagle3Chain(runner, gSlots, tokens, positions, blockTables, stepSlots, lengths, k, useGraph) → draft ids [S, k]
 * i32 (draft vocabulary; −1 where a step's logits were not finite; entries past lengths[s] are 0): the greedy chain
 * of S = gSlots.length sequences (module comment), sequence s from g slot gSlots[s], last verified token tokens[s]
 * at position positions[s] = p (its draft context length, ≥ 1), keys through blockTables[s · maxBlocks …]
 * (eagle3Info().maxBlocks entries per sequence), lengths[s] ≤ k steps; the entry of step j ≥ 2 (position p + j − 2)
 * written at stepSlots[(j − 2) · S + s] — temporary rows the caller reserved and drops afterwards. As a CUDA graph
 * per (padded S, k) when `useGraph`.
 * @throws RangeError naming the argument (all checked before the device is touched); Error naming a failed CUDA
 *   call.
 */
Napi::Value Eagle3Chain(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Eagle3Runner* r = runnerOf(info);
  ready(env, r, "eagle3Chain");
  const int K = intArg(info, 7, "k", 1, r->d.maxDrafts);
  const ChainArgs c = chainArgs(info, r, 1, true, K);
  const bool useGraph = info[8].ToBoolean().Value();
  Napi::Int32Array out = Napi::Int32Array::New(env, static_cast<size_t>(c.S) * K);
  guarded(env, [&]() { r->chain(c, useGraph, out.Data()); });
  return out;
}

/**
 * eagle3Step(runner, j, gSlots, tokens, positions, blockTables, stepSlots, lengths) → {argmax [S] i32, logits
 * [S, draftVocabSize] f32}: step j (1-based) of a chain computed one step per call (sampled drafting: the host picks
 * each step's draft from the logits). tokens[s]: the step's input token (step 1: the last verified token; step j >
 * 1: the target id of the draft picked at step j − 1); step 1 reads g from gSlots[s], step j > 1 continues from the
 * previous call's rows (the same sequences, j − 1 the previous call's step); stepSlots[s]: the slot of step j's
 * entry (read for 2 ≤ j ≤ lengths[s]); a sequence with lengths[s] < j repeats its last step without writing
 * (ignore its row).
 * @throws RangeError naming the argument, or for a j that does not continue the previous step; Error naming a
 *   failed CUDA call.
 */
Napi::Value Eagle3Step(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Eagle3Runner* r = runnerOf(info);
  ready(env, r, "eagle3Step");
  const int j = intArg(info, 1, "j", 1, r->d.maxDrafts);
  const ChainArgs c = chainArgs(info, r, 2, false, j);
  Napi::Int32Array am = Napi::Int32Array::New(env, c.S);
  Napi::Float32Array lg = Napi::Float32Array::New(env, static_cast<size_t>(c.S) * r->d.draftVocab);
  guarded(env, [&]() { r->step(j, c, am.Data(), lg.Data()); });
  Napi::Object out = Napi::Object::New(env);
  out.Set("argmax", am);
  out.Set("logits", lg);
  return out;
}

/**
 * eagle3StepSample(runner, j, gSlots, tokens, positions, blockTables, stepSlots, lengths, request) → {ids [S] i32,
 * qAddress: BigInt}: step j of a sampled chain on the device (eagle3Step's arguments and continuation rules), each
 * sequence's draft drawn from its draft-vocabulary logits by the sampling kernels: `request` as llamaSample's with one
 * group per sequence (row s, 0 drafts, −1, top-k), temperature / topP [S], drafts empty, uniforms [S] (the draw of
 * each sequence's generator; any value for a sequence past its length, whose row is ignored). ids: the drawn draft
 * ids (draft vocabulary; −1: the row is not finite). q stays on the device: sequence s's step-j row is row
 * s · maxDraftTokens + j − 1 at qAddress, in the target vocabulary (lent to llamaSample; valid until the next sampled
 * step 1).
 * @throws RangeError / TypeError naming the argument; Error naming a failed CUDA call.
 */
Napi::Value Eagle3StepSample(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Eagle3Runner* r = runnerOf(info);
  ready(env, r, "eagle3StepSample");
  const int j = intArg(info, 1, "j", 1, r->d.maxDrafts);
  const ChainArgs c = chainArgs(info, r, 2, false, j);
  if (!info[8].IsObject()) throw Napi::TypeError::New(env, "request: expected an object");
  const SampleRequest req = parseSample(info[8].As<Napi::Object>(), c.S, r->d.draftVocab);
  if (req.G != c.S || req.N != req.G)
    throw Napi::RangeError::New(env, "request: expected one group per sequence, one row each, no drafts");
  for (int g = 0; g < req.G; g++)
    if (req.ints[6 * g] != g) throw Napi::RangeError::New(env, "request: group " + std::to_string(g) + ": row != g");
  Napi::Int32Array ids = Napi::Int32Array::New(env, c.S);
  guarded(env, [&]() { r->sampledStep(j, c, req, ids.Data()); });
  Napi::Object out = Napi::Object::New(env);
  out.Set("ids", ids);
  out.Set("qAddress", Napi::BigInt::New(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(r->probsAddress()))));
  return out;
}

/**
 * eagle3Probs(runner, row, rows) → Float32Array [rows, vocabSize]: rows [row, row + rows) of the sampled chains' q
 * copied to the host (a sampled proposal's q when the host samples after all).
 * @throws RangeError for rows outside the last sampled chain's; Error naming a failed CUDA call.
 */
Napi::Value Eagle3Probs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Eagle3Runner* r = runnerOf(info);
  const int row = intArg(info, 1, "row", 0, 1 << 24);
  const int rows = intArg(info, 2, "rows", 0, 1 << 24);
  Napi::Float32Array out = Napi::Float32Array::New(env, static_cast<size_t>(rows) * r->d.vocab);
  guarded(env, [&]() { r->probs(row, rows, out.Data()); });
  return out;
}

/** eagle3Synchronize(runner): waits for the runner's stream (a context write's errors are thrown here). */
Napi::Value Eagle3Synchronize(const Napi::CallbackInfo& info) {
  Eagle3Runner* r = runnerOf(info);
  guarded(info.Env(), [&]() { r->sync(); });
  return info.Env().Undefined();
}

/**
 * eagle3ReplayMs(runner, reps, k?, sequences?) → GPU ms per replay of the last chain's CUDA graph, or with k that of
 * the chain of k steps over `sequences` (default 1) — −1 when there is none.
 */
Napi::Value Eagle3ReplayMs(const Napi::CallbackInfo& info) {
  Eagle3Runner* r = runnerOf(info);
  const int reps = info[1].IsNumber() ? std::max(1, info[1].As<Napi::Number>().Int32Value()) : 20;
  const int k = info[2].IsNumber() ? info[2].As<Napi::Number>().Int32Value() : 0;
  const int seqs = info[3].IsNumber() ? std::max(1, info[3].As<Napi::Number>().Int32Value()) : 1;
  return guarded(info.Env(), [&]() -> Napi::Value {
    return Napi::Number::New(info.Env(), k > 0 ? r->replayMs(reps, seqs, k) : r->replayMs(reps));
  });
}

/** eagle3Info(runner) → {weightBytes, kvBytes, activationBytes, maxBlocks, graphs}. */
Napi::Value Eagle3Info(const Napi::CallbackInfo& info) { return runnerInfo(info.Env(), runnerOf(info)); }

/** eagle3Dispose(runner): frees the runner's device memory, graphs and stream now (a later use throws). */
Napi::Value Eagle3Dispose(const Napi::CallbackInfo& info) { return disposeRunner<Eagle3Runner>(info, "eagle3Create"); }

}  // namespace

void RegisterEagle3(Napi::Env env, Napi::Object exports) {
  exports.Set("eagle3Create", Napi::Function::New(env, Eagle3Create));
  exports.Set("eagle3AllocKv", Napi::Function::New(env, Eagle3AllocKv));
  exports.Set("eagle3SetWeight", Napi::Function::New(env, Eagle3SetWeight));
  exports.Set("eagle3ContextWrite", Napi::Function::New(env, Eagle3ContextWrite));
  exports.Set("eagle3Chain", Napi::Function::New(env, Eagle3Chain));
  exports.Set("eagle3Step", Napi::Function::New(env, Eagle3Step));
  exports.Set("eagle3StepSample", Napi::Function::New(env, Eagle3StepSample));
  exports.Set("eagle3Probs", Napi::Function::New(env, Eagle3Probs));
  exports.Set("eagle3Synchronize", Napi::Function::New(env, Eagle3Synchronize));
  exports.Set("eagle3ReplayMs", Napi::Function::New(env, Eagle3ReplayMs));
  exports.Set("eagle3Info", Napi::Function::New(env, Eagle3Info));
  exports.Set("eagle3Dispose", Napi::Function::New(env, Eagle3Dispose));
}
