// @specd/native-cuda: the DFlash draft model on the GPU (issue 18), beside the whole-model Llama runner whose taps it
// reads. Same math as the CPU drafter (packages/plugin-dflash/src/dflash.ts, module comment; oracle
// tools/reference/specd_ref/dflash.py), bf16 weights, fp32 activations and accumulation. The runner owns its device
// memory: the draft weights (fc [D, T·D], hidden_norm, per layer q|k|v [(H + 2·KV)·hd, D], o, gate|up, down, the
// input / post-attention norms and the q / k norms [hd], the final norm), the draft head's rows [draftVocab, D] (the
// target lm_head's rows of the draft vocabulary, FR-Spec) and their token ids, a copy of the target's bf16 token
// embedding, the draft KV pool (every layer's K and V pages, fp32, NHD [numPages · pageSize, KV · hd]; the page
// bookkeeping stays in TypeScript, core's DraftKvCache with storage 'device'), activations, one CUDA stream and one
// cuBLASLt handle. JavaScript holds an opaque handle.
//
// Context write (dflashContextWrite; dflash.ts "Context"): rows of the target's taps [n, T·D] f32 (or projected
// features [n, D] f32): f = fc(taps) (one bf16 GEMM over the concatenated taps), then one GEMM of bf16(hidden_norm(f))
// against every layer's k_proj ; v_proj stacked [L · 2·KV·hd, D] (hidden_norm in the small GEMM's prologue for ≤ 32
// rows), and one launch (dflash.cu) that applies each layer's k_norm per head and RoPE and writes K and V into that
// layer's pages at the rows' slots. Nothing comes back and nothing is waited for.
//
// Block (dflashBlock; dflash.ts "Block"): for S sequences, rows [last verified token, MASK × (B − 1)] at positions
// p … p + B − 1 embedded; per layer: q|k|v GEMM of bf16(input_layernorm(h)) (the norm in the small GEMM's prologue
// for ≤ 32 rows), q / k norms per head + RoPE + the block's K/V written after the context (temporary rows the caller
// reserved), paged attention over context + block without a causal mask → bf16, h += o(attn) (β = 1), h +=
// down(SwiGLU(gate|up(post_attention_layernorm(h)))); then rows 1 … B − 1 of every block through the final norm and
// the draft head → logits [S · (B − 1), draftVocab] and their argmax mapped to token ids on the device. Sequences pad
// to 2^⌈log2 S⌉ (padded ones: token 0, no keys, no KV write); the block runs as one CUDA graph per (padded sequences,
// key span) captured at its first use: one H2D copy of the metadata, one graph launch, one D2H copy of the draft ids
// (and of the logits when the caller samples).
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

#include "dflash_kernels.h"
#include "kernels.h"
#include "runner_util.h"
#include "sampler.h"

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
/** Rows of one context-write chunk (a longer write is split). */
constexpr int kCtxRows = 512;

struct DfDims {
  int hidden = 0, heads = 0, kvHeads = 0, headDim = 0, inter = 0, vocab = 0, draftVocab = 0, taps = 0, layers = 0;
  int blockSize = 0, maskToken = 0, maxSequences = 0;
  double ropeTheta = 0;
  float eps = 0;
  int pageSize = 0, numPages = 0, maxModelLen = 0;
};

/** One block call, as checked by the N-API layer (host i32). */
struct BlockArgs {
  int S = 0;
  const int32_t *tokens = nullptr, *positions = nullptr, *tables = nullptr, *slots = nullptr;
};

class DFlashRunner : public RunnerMemory {
 public:
  explicit DFlashRunner(const DfDims& dims) : d(dims) {
    qw = d.heads * d.headDim;
    kw = d.kvHeads * d.headDim;
    qkvW = qw + 2 * kw;
    ctxW = d.layers * 2 * kw;
    seqRows = padRows(d.maxSequences);
    blockRows = seqRows * d.blockSize;
    headRows = seqRows * (d.blockSize - 1);
    const int64_t R = std::max(kCtxRows, blockRows), D = d.hidden, TD = static_cast<int64_t>(d.taps) * d.hidden;
    wQkv.assign(d.layers, nullptr);
    wO.assign(d.layers, nullptr);
    wGateUp.assign(d.layers, nullptr);
    wDown.assign(d.layers, nullptr);
    inputNorm.assign(d.layers, nullptr);
    postNorm.assign(d.layers, nullptr);
    qNorm.assign(d.layers, nullptr);
    kNormSet.assign(d.layers, false);
    try {
      ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) throw CudaFailure("cublasLtCreate failed");
      ws = dev(kWorkspaceBytes, "cuBLASLt workspace");
      tapsF = static_cast<float*>(dev(kCtxRows * TD * 4, "taps"));
      tapsB = dev(kCtxRows * TD * 2, "taps bf16");
      fCtx = static_cast<float*>(dev(kCtxRows * D * 4, "context features"));
      ctxKv = static_cast<float*>(dev(kCtxRows * static_cast<int64_t>(ctxW) * 4, "context k|v"));
      ctxMeta = static_cast<int32_t*>(dev(kCtxRows * 2 * 4, "context metadata"));
      h = static_cast<float*>(dev(R * D * 4, "residual"));
      hb = dev(R * D * 2, "normed residual");
      qkv = static_cast<float*>(dev(R * qkvW * 4, "q|k|v"));
      q = static_cast<float*>(dev(R * qw * 4, "q"));
      attnB = dev(R * qw * 2, "attention output");
      gu = static_cast<float*>(dev(R * 2 * d.inter * 4, "gate|up"));
      sb = dev(R * d.inter * 2, "SwiGLU output");
      logits = static_cast<float*>(dev(static_cast<int64_t>(headRows) * d.draftVocab * 4, "draft logits"));
      argmax = static_cast<int32_t*>(dev(headRows * 4, "argmax"));
      draftIdx = static_cast<int32_t*>(dev(headRows * 4, "draft indices"));
      draftIds = static_cast<int32_t*>(dev(headRows * 4, "draft token ids"));
      argmaxWs = dev(specdArgmaxWorkspaceBytes(headRows, d.draftVocab), "argmax partials");
      kNormAll = static_cast<float*>(dev(static_cast<size_t>(d.layers) * d.headDim * 4, "k norms"));
      wCtxKv = dev(static_cast<size_t>(ctxW) * D * 2, "context k|v weights");
      weightBytes += static_cast<size_t>(ctxW) * D * 2 + static_cast<size_t>(d.layers) * d.headDim * 4;
      activationBytes -= static_cast<size_t>(ctxW) * D * 2 + static_cast<size_t>(d.layers) * d.headDim * 4;
      ok(cudaMallocHost(&hIds, 2 * static_cast<size_t>(headRows) * 4), "cudaMallocHost (draft ids)");
      ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the zeroed buffers)");
    } catch (...) {
      release();
      throw;
    }
  }
  ~DFlashRunner() { release(); }

  DfDims d;
  int qw = 0, kw = 0, qkvW = 0, ctxW = 0, seqRows = 0, blockRows = 0, headRows = 0, maxBlocks = 0, parts = 0;
  size_t kvBytes = 0;
  bool disposed = false;

  /**
   * Allocates the draft KV pool (per layer K then V, each [numPages · pageSize, KV · hd] f32), the RoPE table (the
   * draft's theta, neox, inv_freq in double as the CPU path) and the block metadata for positions below maxModelLen.
   * A second call replaces the first (its contents and the CUDA graphs are dropped).
   */
  void allocKv(int pageSize, int numPages, int maxModelLen) {
    allocKvPhase([&] { allocKvBuffers(pageSize, numPages, maxModelLen); }, [&] { freeKv(); });
  }
  bool hasKv() const { return pools != nullptr; }
  int64_t slotsTotal() const { return static_cast<int64_t>(d.numPages) * d.pageSize; }

  void freeKv() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (auto& [k, v] : graphs) cudaGraphExecDestroy(v);
    graphs.clear();
    lastGraph = nullptr;
    for (void* p : kvAllocs) cudaFree(p);
    kvAllocs.clear();
    if (hMeta != nullptr) cudaFreeHost(hMeta);
    hMeta = nullptr;
    pools = nullptr;
    cosSin = nullptr;
    part = nullptr;
    meta = nullptr;
    kvBytes = 0;
  }

  void release() {
    freeKv();
    sampler.reset();
    freeQ();
    for (void* p : allocs) cudaFree(p);
    allocs.clear();
    if (hIds != nullptr) cudaFreeHost(hIds);
    hIds = nullptr;
    if (lt != nullptr) cublasLtDestroy(lt);
    lt = nullptr;
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
    disposed = true;
  }

  /** Uploads weight `name` of layer `layer` (−1 for the model-wide ones; bytes checked against its shape). */
  void setWeight(const std::string& name, int layer, const void* src, size_t bytes) {
    const size_t D = d.hidden;
    const bool perLayer = name == "qkv" || name == "o" || name == "gateUp" || name == "down" || name == "inputNorm" ||
                          name == "postNorm" || name == "qNorm" || name == "kNorm";
    if (perLayer && (layer < 0 || layer >= d.layers))
      throw std::invalid_argument("layer: " + name + " needs a layer in [0, " + std::to_string(d.layers) + "), got " +
                                  std::to_string(layer));
    if (!perLayer && layer != -1) throw std::invalid_argument("layer: " + name + " is not per layer (pass -1)");
    const std::string label = perLayer ? name + "[" + std::to_string(layer) + "]" : name;
    auto matrix = [&](void** slot, size_t r, size_t c) {
      expect(bytes, r * c * 2, label);
      upload(slot, src, bytes, label);
    };
    auto vector = [&](float** slot, size_t n) {
      expect(bytes, n * 4, label);
      upload(reinterpret_cast<void**>(slot), src, bytes, label);
    };
    if (name == "embed") return matrix(&embed, d.vocab, D);
    if (name == "fc") return matrix(&fc, D, static_cast<size_t>(d.taps) * D);
    if (name == "hiddenNorm") return vector(&hiddenNorm, D);
    if (name == "finalNorm") return vector(&finalNorm, D);
    if (name == "lmHead") return matrix(&lmHead, d.draftVocab, D);
    if (name == "ids") {
      expect(bytes, static_cast<size_t>(d.draftVocab) * 4, label);
      const int32_t* ids = static_cast<const int32_t*>(src);
      for (int i = 0; i < d.draftVocab; i++)
        if (ids[i] < 0 || ids[i] >= d.vocab)
          throw std::invalid_argument("ids: entry " + std::to_string(i) + " = " + std::to_string(ids[i]) +
                                      " is outside the target vocabulary [0, " + std::to_string(d.vocab) + ")");
      return upload(reinterpret_cast<void**>(&tokenIds), src, bytes, label);
    }
    if (name == "qkv") {
      matrix(&wQkv[layer], static_cast<size_t>(qkvW), D);
      // the context path's k_proj ; v_proj rows of this layer, stacked with the other layers' (one GEMM per write)
      const size_t kvBytesLayer = static_cast<size_t>(2 * kw) * D * 2;
      ok(cudaMemcpy(static_cast<char*>(wCtxKv) + layer * kvBytesLayer,
                    static_cast<const char*>(src) + static_cast<size_t>(qw) * D * 2, kvBytesLayer,
                    cudaMemcpyHostToDevice),
         "cudaMemcpy (weight " + label + ", context k|v rows)");
      return;
    }
    if (name == "o") return matrix(&wO[layer], D, qw);
    if (name == "gateUp") return matrix(&wGateUp[layer], 2 * static_cast<size_t>(d.inter), D);
    if (name == "down") return matrix(&wDown[layer], D, d.inter);
    if (name == "inputNorm") return vector(&inputNorm[layer], D);
    if (name == "postNorm") return vector(&postNorm[layer], D);
    if (name == "qNorm") return vector(&qNorm[layer], d.headDim);
    if (name == "kNorm") {
      expect(bytes, static_cast<size_t>(d.headDim) * 4, label);
      ok(cudaMemcpy(kNormAll + static_cast<size_t>(layer) * d.headDim, src, bytes, cudaMemcpyHostToDevice),
         "cudaMemcpy (weight " + label + ")");
      kNormSet[layer] = true;
      return;
    }
    throw std::invalid_argument("name: unknown DFlash weight " + name);
  }

  /** The first weight not uploaded yet, or "". */
  std::string missing() const {
    const std::pair<const void*, const char*> all[] = {{embed, "embed"},           {fc, "fc"},
                                                       {hiddenNorm, "hiddenNorm"}, {finalNorm, "finalNorm"},
                                                       {lmHead, "lmHead"},         {tokenIds, "ids"}};
    for (const auto& [p, name] : all)
      if (p == nullptr) return name;
    for (int l = 0; l < d.layers; l++) {
      const std::pair<const void*, const char*> layer[] = {{wQkv[l], "qkv"},
                                                           {wO[l], "o"},
                                                           {wGateUp[l], "gateUp"},
                                                           {wDown[l], "down"},
                                                           {inputNorm[l], "inputNorm"},
                                                           {postNorm[l], "postNorm"},
                                                           {qNorm[l], "qNorm"}};
      for (const auto& [p, name] : layer)
        if (p == nullptr) return std::string(name) + "[" + std::to_string(l) + "]";
      if (!kNormSet[l]) return "kNorm[" + std::to_string(l) + "]";
    }
    return "";
  }

  /**
   * Context rows (module comment; checked by the caller): `src` [n, T·D] taps (fromTaps) or [n, D] features, f32
   * host; `positions`, `slots` [n] i32. Enqueued on the stream; nothing is waited for.
   */
  void contextWrite(const float* src, bool fromTaps, int n, const int32_t* positions, const int32_t* slots) {
    const int D = d.hidden, TD = d.taps * d.hidden;
    std::vector<int32_t> m(static_cast<size_t>(kCtxRows) * 2);
    for (int a = 0; a < n; a += kCtxRows) {
      const int rows = std::min(kCtxRows, n - a);
      const int M = padRows(rows);
      if (fromTaps) {
        ok(cudaMemcpyAsync(tapsF, src + static_cast<size_t>(a) * TD, static_cast<size_t>(rows) * TD * 4,
                           cudaMemcpyHostToDevice, stream),
           "taps copy");
        launched(specdToBf16(tapsB, tapsF, static_cast<int64_t>(rows) * TD, stream), "toBf16 (taps)");
        if (specdSmallGemmFits(rows, TD))
          launched(specdSmallGemm(fCtx, tapsB, fc, rows, D, TD, false, stream), "fc GEMM");
        else gemm(fCtx, tapsB, fc, M, D, TD, false, "fc GEMM");
      } else {
        ok(cudaMemcpyAsync(fCtx, src + static_cast<size_t>(a) * D, static_cast<size_t>(rows) * D * 4,
                           cudaMemcpyHostToDevice, stream),
           "features copy");
      }
      std::memcpy(m.data(), positions + a, static_cast<size_t>(rows) * 4);
      std::memcpy(m.data() + rows, slots + a, static_cast<size_t>(rows) * 4);
      ok(cudaMemcpyAsync(ctxMeta, m.data(), 2 * static_cast<size_t>(rows) * 4, cudaMemcpyHostToDevice, stream),
         "context metadata copy");
      if (specdSmallGemmFits(rows, D)) {
        launched(specdSmallGemmNorm(ctxKv, nullptr, fCtx, hiddenNorm, nullptr, d.eps, wCtxKv, rows, ctxW, D, stream),
                 "hidden_norm + context k|v GEMM");
      } else {
        launched(specdRmsNormBf16(hb, fCtx, hiddenNorm, nullptr, M, D, d.eps, stream), "hidden_norm");
        gemm(ctxKv, hb, wCtxKv, M, ctxW, D, false, "context k|v GEMM");
      }
      launched(specdHeadNormRopeKv(nullptr, pools, poolFloats, ctxKv, ctxW, cosSin, ctxMeta, ctxMeta + rows, rows, 0,
                                   d.kvHeads, d.headDim, d.layers, 0, nullptr, kNormAll, d.eps, stream),
               "k_norm + RoPE + KV write");
    }
  }

  /**
   * One draft block per sequence (checked by the caller): the token ids of draft slots 1 … B − 1 into `idsOut`
   * [S, B − 1] (−1 where a row's logits are not finite) and, when `logitsOut` is given, the logits [S · (B − 1),
   * draftVocab] f32. As a CUDA graph per (padded sequences, key span) when `useGraph`.
   */
  void block(const BlockArgs& c, bool useGraph, int32_t* idsOut, float* logitsOut) {
    const int Sp = padRows(c.S);
    const int B = d.blockSize;
    pack(c, Sp);
    ok(cudaMemcpyAsync(meta, hMeta, metaSize(Sp) * 4, cudaMemcpyHostToDevice, stream), "metadata copy");
    int maxKv = 0;
    for (int s = 0; s < c.S; s++) maxKv = std::max(maxKv, c.positions[s] + B);
    attnKeys = attnSpan(maxKv, maxBlocks * d.pageSize);
    if (!useGraph) {
      lastGraph = nullptr;
      launchBlock(Sp);
    } else {
      const std::pair<int, int> key(Sp, attnKeys);
      auto it = graphs.find(key);
      if (it == graphs.end()) {
        launchBlock(Sp);  // this call's results; makes the GEMM plans outside the capture
        cudaGraphExec_t exec = captureGraph(stream, [&] { launchBlock(Sp); });
        graphs.emplace(key, exec);
        lastGraph = exec;
      } else {
        ok(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch");
        lastGraph = it->second;
      }
    }
    const size_t R = static_cast<size_t>(c.S) * (B - 1);  // the real sequences' rows come first
    lastHeadRows = static_cast<int>(R);
    ok(cudaMemcpyAsync(hIds, draftIds, R * 4, cudaMemcpyDeviceToHost, stream), "draft ids copy");
    ok(cudaMemcpyAsync(hIds + headRows, draftIdx, R * 4, cudaMemcpyDeviceToHost, stream), "draft indices copy");
    if (logitsOut != nullptr)
      ok(cudaMemcpyAsync(logitsOut, logits, R * d.draftVocab * 4, cudaMemcpyDeviceToHost, stream), "logits copy");
    ok(cudaStreamSynchronize(stream), "the block (cudaStreamSynchronize)");
    // the argmax's −1 (a row not finite) is mapped to token 0 on the device: kept as −1 here
    for (size_t r = 0; r < R; r++) idsOut[r] = hIds[headRows + r] < 0 ? -1 : hIds[r];
  }

  /**
   * Sampled drafts over the last block's head rows (sampling.cu through sampler.h; `req`'s groups are single rows
   * with no drafts, so each group's token is drawn from its row's distribution after temperature / top-k / top-p):
   * → the groups' (0, draft-head index) pairs, and each group's probabilities scattered into the target vocabulary
   * (zero outside the draft vocabulary) into host `qOut` [G, vocab] f32.
   * @throws std::invalid_argument when no block's logits are there.
   */
  std::vector<int32_t> sample(const SampleRequest& req, float* qOut) {
    if (lastHeadRows == 0) throw std::invalid_argument("dflashSample: no block's logits to sample from");
    if (!sampler) sampler = std::make_unique<DeviceSampler>();
    const size_t G = req.G;
    if (G > qRowsCap) {
      freeQ();
      ok(cudaMalloc(&qDraft, G * d.draftVocab * 4), "cudaMalloc (draft q)");
      ok(cudaMalloc(&qFull, G * d.vocab * 4), "cudaMalloc (draft q, target vocabulary)");
      specdRegisterDeviceRows(qFull, G * d.vocab * 4);
      qRowsCap = G;
    }
    sampledRows = 0;
    std::vector<int32_t> res;
    try {
      res = sampler->run(req, logits, d.draftVocab, stream, qDraft);
    } catch (const std::runtime_error& e) {
      throw CudaFailure(e.what());
    }
    ok(cudaMemsetAsync(qFull, 0, G * d.vocab * 4, stream), "cudaMemsetAsync (draft q)");
    launched(specdScatterCols(qFull, qDraft, tokenIds, static_cast<int>(G), d.draftVocab, d.vocab, 1, 0, stream),
             "draft q into the target vocabulary");
    if (qOut != nullptr)
      ok(cudaMemcpyAsync(qOut, qFull, G * d.vocab * 4, cudaMemcpyDeviceToHost, stream), "draft q copy");
    ok(cudaStreamSynchronize(stream), "dflashSample (cudaStreamSynchronize)");
    sampledRows = static_cast<int>(G);
    return res;
  }

  /** Rows [row, row + rows) of the last dflashSample's q (target vocabulary) into host `out` [rows, vocab] f32. */
  void probs(int row, int rows, float* out) {
    if (row < 0 || rows < 0 || row + rows > sampledRows)
      throw std::invalid_argument("dflashProbs: rows " + std::to_string(row) + " … " + std::to_string(row + rows) +
                                  " outside the last dflashSample's " + std::to_string(sampledRows));
    ok(cudaMemcpyAsync(out, qFull + static_cast<size_t>(row) * d.vocab, static_cast<size_t>(rows) * d.vocab * 4,
                       cudaMemcpyDeviceToHost, stream),
       "draft q copy");
    ok(cudaStreamSynchronize(stream), "dflashProbs (cudaStreamSynchronize)");
  }

  /** The device address of the last dflashSample's q [G, vocab] f32 (lent: specdRegisterDeviceRows). */
  const float* probsAddress() const { return qFull; }

  /** Rows of q the last dflashSample left (0 before any). */
  int sampledRows = 0;

  /** Head rows of the last block (the rows dflashSample may name). */
  int lastHeadRows = 0;

  /** Waits for the stream (a context write's errors surface here). */
  void sync() { ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }

  /** GPU ms per replay of the last block's CUDA graph (−1 without one). Rewrites that block's temporary rows. */
  double replayMs(int reps) { return lastGraph == nullptr ? -1 : replayGraphMs(lastGraph, stream, reps); }

  std::vector<std::string> graphLabels() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : graphs)
      out.push_back(std::to_string(k.first) + " sequences x " + std::to_string(d.blockSize) + " rows, " +
                    std::to_string(k.second) + " keys");
    return out;
  }

 private:
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void *ws = nullptr, *argmaxWs = nullptr;
  void *embed = nullptr, *fc = nullptr, *lmHead = nullptr, *wCtxKv = nullptr;
  float *hiddenNorm = nullptr, *finalNorm = nullptr, *kNormAll = nullptr;
  int32_t* tokenIds = nullptr;
  std::vector<void*> wQkv, wO, wGateUp, wDown;
  std::vector<float*> inputNorm, postNorm, qNorm;
  std::vector<bool> kNormSet;
  float *tapsF = nullptr, *fCtx = nullptr, *ctxKv = nullptr, *h = nullptr, *qkv = nullptr, *q = nullptr, *gu = nullptr,
        *logits = nullptr;
  void *tapsB = nullptr, *hb = nullptr, *attnB = nullptr, *sb = nullptr;
  int32_t *argmax = nullptr, *draftIdx = nullptr, *draftIds = nullptr, *ctxMeta = nullptr;
  int32_t* hIds = nullptr;  // [2, headRows]: token ids, then draft-head indices
  // sized by allocKv
  float *pools = nullptr, *cosSin = nullptr, *part = nullptr;
  int64_t poolFloats = 0;
  int32_t *meta = nullptr, *hMeta = nullptr;
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs;
  cudaGraphExec_t lastGraph = nullptr;
  int attnKeys = 64;                          // the paged attention's key span of the current block (attnSpan)
  std::unique_ptr<DeviceSampler> sampler;     // made at the first dflashSample
  float *qDraft = nullptr, *qFull = nullptr;  // [qRowsCap, draftVocab], [qRowsCap, vocab]: dflashSample's q
  size_t qRowsCap = 0;

  void allocKvBuffers(int pageSize, int numPages, int maxModelLen) {
    d.pageSize = pageSize;
    d.numPages = numPages;
    d.maxModelLen = maxModelLen;
    maxBlocks = (maxModelLen + pageSize - 1) / pageSize;
    poolFloats = static_cast<int64_t>(numPages) * pageSize * kw;
    kvBytes = 2 * static_cast<size_t>(d.layers) * poolFloats * 4;
    pools = static_cast<float*>(dev(kvBytes, "draft KV pool"));
    cosSin = ropeTable(d.ropeTheta, d.headDim, maxModelLen);
    parts = std::max(1, specdAttentionParts(maxBlocks * pageSize));
    part = static_cast<float*>(
        dev(static_cast<size_t>(blockRows) * d.heads * parts * (2 + d.headDim) * 4, "attention partitions"));
    meta = static_cast<int32_t*>(dev(metaSize(seqRows) * 4, "block metadata"));
    ok(cudaMallocHost(&hMeta, metaSize(seqRows) * 4), "cudaMallocHost (block metadata)");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the zeroed buffers)");
  }

  /** Frees the q buffers (unregistering the lent one). */
  void freeQ() {
    if (qFull != nullptr) specdForgetDeviceRows(qFull);
    if (qDraft != nullptr) cudaFree(qDraft);
    if (qFull != nullptr) cudaFree(qFull);
    qDraft = qFull = nullptr;
    qRowsCap = 0;
    sampledRows = 0;
  }

  void gemm(float* out, const void* in, const void* w, int m, int n, int k, bool acc, const char* what) {
    launched(specdGemmBf16(lt, out, in, w, m, m, n, k, ws, kWorkspaceBytes, stream, acc), what);
  }
  /** gemm as a callable for draftMlp / draftHead. */
  auto gemmFn() {
    return [this](float* out, const void* in, const void* w, int m, int n, int k, bool acc, const char* what) {
      gemm(out, in, w, m, n, k, acc, what);
    };
  }

  // metadata: tokens[Np] positions[Np] slots[Np] cu[Sp + 1] kvLens[Sp] tables[Sp · maxBlocks] headRows[Sp · (B − 1)]
  size_t metaSize(int Sp) const {
    const size_t B = d.blockSize;
    return 3 * Sp * B + 2 * static_cast<size_t>(Sp) + 1 + static_cast<size_t>(Sp) * maxBlocks + Sp * (B - 1);
  }

  /**
   * Packs a block call's metadata for Sp sequences into hMeta: sequence s's rows s·B … s·B + B − 1 hold its last
   * token then the mask token at positions p … p + B − 1, written at slots[s·B + j]; its keys are the p context rows
   * and the block's B (kvLens p + B). Padded sequences: token 0, position 0, no slot, no keys. Head rows: s·B + j
   * for j = 1 … B − 1, the real sequences' first.
   */
  void pack(const BlockArgs& c, int Sp) {
    const int B = d.blockSize;
    int32_t* m = hMeta;
    std::fill(m, m + metaSize(Sp), 0);
    int32_t* tok = m;
    int32_t* pos = tok + Sp * B;
    int32_t* sl = pos + Sp * B;
    int32_t* cu = sl + Sp * B;
    int32_t* kvLens = cu + Sp + 1;
    int32_t* tables = kvLens + Sp;
    int32_t* rows = tables + static_cast<size_t>(Sp) * maxBlocks;
    for (int s = 0; s <= Sp; s++) cu[s] = s * B;
    std::memcpy(tables, c.tables, static_cast<size_t>(c.S) * maxBlocks * 4);
    for (int s = 0; s < Sp; s++) {
      const bool real = s < c.S;
      for (int j = 0; j < B; j++) {
        const int r = s * B + j;
        tok[r] = !real ? 0 : j == 0 ? c.tokens[s] : d.maskToken;
        pos[r] = real ? c.positions[s] + j : 0;
        sl[r] = real ? c.slots[r] : -1;
      }
      kvLens[s] = real ? c.positions[s] + B : 0;
      for (int j = 1; j < B; j++) rows[s * (B - 1) + j - 1] = s * B + j;
    }
  }

  /** The block forward over Sp sequences, metadata in `meta` (module comment, "Block"). */
  void launchBlock(int Sp) {
    const int B = d.blockSize, D = d.hidden, Np = Sp * B, R = Sp * (B - 1);
    const int32_t* tok = meta;
    const int32_t* pos = tok + Np;
    const int32_t* sl = pos + Np;
    const int32_t* cu = sl + Np;
    const int32_t* kvLens = cu + Sp + 1;
    const int32_t* tables = kvLens + Sp;
    const int32_t* rows = tables + static_cast<size_t>(Sp) * maxBlocks;
    launched(specdEmbed(h, embed, tok, Np, D, stream), "embedding");
    const bool small = specdSmallGemmFits(Np, D) && specdSmallGemmFits(Np, qw) && specdSmallGemmFits(Np, d.inter);
    auto mm = [&](float* out, const void* in, const void* w, int n, int k, bool acc, const char* what) {
      if (small) launched(specdSmallGemm(out, in, w, Np, n, k, acc, stream), what);
      else gemm(out, in, w, Np, n, k, acc, what);
    };
    const float scale = 1.f / std::sqrt(static_cast<float>(d.headDim));
    for (int j = 0; j < d.layers; j++) {
      if (small) {
        launched(specdSmallGemmNorm(qkv, nullptr, h, inputNorm[j], nullptr, d.eps, wQkv[j], Np, qkvW, D, stream),
                 "input_layernorm + q|k|v GEMM");
      } else {
        launched(specdRmsNormBf16(hb, h, inputNorm[j], nullptr, Np, D, d.eps, stream), "input_layernorm");
        gemm(qkv, hb, wQkv[j], Np, qkvW, D, false, "q|k|v GEMM");
      }
      launched(specdHeadNormRopeKv(q, pools, poolFloats, qkv, qkvW, cosSin, pos, sl, Np, d.heads, d.kvHeads, d.headDim,
                                   1, j, qNorm[j], kNormAll + static_cast<size_t>(j) * d.headDim, d.eps, stream),
               "q/k norms + RoPE + KV write");
      float* kPool = pools + 2 * j * poolFloats;
      launched(
          specdPagedAttention(nullptr, attnB, part, q, kPool, kPool + poolFloats, cu, kvLens, tables, pos, Sp, Np,
                              maxBlocks, d.pageSize, d.heads, d.kvHeads, d.headDim, scale, false, attnKeys, stream),
          "paged attention (non-causal)");
      mm(h, attnB, wO[j], D, qw, true, "o GEMM");
      draftMlp(small, gemmFn(), stream, h, hb, gu, sb, postNorm[j], wGateUp[j], wDown[j], Np, D, d.inter, d.eps);
    }
    draftHead(specdSmallGemmFits(R, D), gemmFn(), stream, logits, h, hb, finalNorm, rows, lmHead, R, d.draftVocab, D,
              d.eps);
    launched(specdArgmaxTwoPass(argmax, argmaxWs, logits, R, d.draftVocab, stream, draftIdx, draftIds, tokenIds),
             "argmax");
  }
};

// ---------------------------------------------------------------------------------------------------------------
// N-API

DFlashRunner* runnerOf(const Napi::CallbackInfo& info) { return runnerArg<DFlashRunner>(info, "dflashCreate"); }

/**
 * dflashCreate({hiddenSize, numHeads, numKvHeads, headDim, intermediateSize, numLayers, vocabSize, draftVocabSize,
 * numTaps, blockSize, maskTokenId, ropeTheta, rmsNormEps, maxSequences}) → a runner handle with its activations
 * allocated (zeroed); weights come with dflashSetWeight, the draft KV pool with dflashAllocKv. vocabSize is the
 * target's (the embedding's rows, the ids' range).
 * @throws RangeError for a bad field (headDim a multiple of 16 up to 256: the paged attention kernel's; the mask
 *   token outside the vocabulary); Error naming the failed CUDA call.
 */
Napi::Value DFlashCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw Napi::TypeError::New(env, "options: expected an object");
  Napi::Object o = info[0].As<Napi::Object>();
  DfDims d;
  d.hidden = intField(o, "hiddenSize", 1, 1 << 16);
  d.heads = intField(o, "numHeads", 1, 1024);
  d.kvHeads = intField(o, "numKvHeads", 1, 1024);
  d.headDim = intField(o, "headDim", 16, 256);
  d.inter = intField(o, "intermediateSize", 1, 1 << 18);
  d.layers = intField(o, "numLayers", 1, 256);
  d.vocab = intField(o, "vocabSize", 1, 1 << 24);
  d.draftVocab = intField(o, "draftVocabSize", 1, 1 << 24);
  d.taps = intField(o, "numTaps", 1, 64);
  d.blockSize = intField(o, "blockSize", 2, 256);
  d.maskToken = intField(o, "maskTokenId", 0, 1 << 24);
  d.ropeTheta = numField(o, "ropeTheta", true);
  d.eps = static_cast<float>(numField(o, "rmsNormEps", false));
  d.maxSequences = intField(o, "maxSequences", 1, 4096);
  if (d.heads % d.kvHeads != 0) throw Napi::RangeError::New(env, "numHeads: must be a multiple of numKvHeads");
  if (d.headDim % 16 != 0) throw Napi::RangeError::New(env, "headDim: must be a multiple of 16 (paged attention)");
  if (d.draftVocab > d.vocab) throw Napi::RangeError::New(env, "draftVocabSize: must not exceed vocabSize");
  if (d.maskToken >= d.vocab) throw Napi::RangeError::New(env, "maskTokenId: outside the target vocabulary");
  return guarded(env, [&]() -> Napi::Value {
    auto* r = new DFlashRunner(d);
    return Napi::External<DFlashRunner>::New(env, r, [](Napi::Env, DFlashRunner* p) { delete p; });
  });
}

/**
 * dflashAllocKv(runner, pageSize, numPages, maxModelLen): the draft KV pool (numPages · pageSize token slots per
 * layer, K and V f32) and what is sized with it (RoPE table, block metadata) for positions below maxModelLen. A second
 * call replaces the first (contents and CUDA graphs dropped).
 * @throws RangeError for a bad size; Error naming the failed CUDA call.
 */
Napi::Value DFlashAllocKv(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DFlashRunner* r = runnerOf(info);
  const int pageSize = intArg(info, 1, "pageSize", 1, 1 << 16);
  const int numPages = intArg(info, 2, "numPages", 1, 1 << 24);
  const int maxModelLen = intArg(info, 3, "maxModelLen", r->d.blockSize, 1 << 20);
  guarded(env, [&]() { r->allocKv(pageSize, numPages, maxModelLen); });
  return env.Undefined();
}

/**
 * dflashSetWeight(runner, name, layer, data): uploads a weight. Model-wide (layer −1): bf16 bits (Uint16Array) embed
 * [vocabSize, D], fc [D, numTaps · D], lmHead [draftVocabSize, D] (the draft head's rows); Float32Array [D]:
 * hiddenNorm, finalNorm; Int32Array [draftVocabSize]: ids (the token id of each draft-head row). Per layer (0 …
 * numLayers − 1): bf16 qkv [(H + 2·KV)·hd, D] (q_proj ; k_proj ; v_proj), o [D, H·hd], gateUp [2I, D], down [D, I];
 * Float32Array inputNorm, postNorm [D], qNorm, kNorm [hd].
 * @throws TypeError for the wrong array type; RangeError for an unknown name, a wrong layer or size, or an id outside
 *   the target vocabulary; Error naming the failed CUDA call.
 */
Napi::Value DFlashSetWeight(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DFlashRunner* r = runnerOf(info);
  if (!info[1].IsString()) throw Napi::TypeError::New(env, "name: expected a string");
  const std::string name = info[1].As<Napi::String>().Utf8Value();
  const int layer = intArg(info, 2, "layer", -1, r->d.layers - 1);
  if (!info[3].IsTypedArray()) throw Napi::TypeError::New(env, "data: expected a typed array");
  Napi::TypedArray t = info[3].As<Napi::TypedArray>();
  const bool isNorm = name == "hiddenNorm" || name == "finalNorm" || name == "inputNorm" || name == "postNorm" ||
                      name == "qNorm" || name == "kNorm";
  const napi_typedarray_type want = isNorm ? napi_float32_array : name == "ids" ? napi_int32_array : napi_uint16_array;
  if (t.TypedArrayType() != want)
    throw Napi::TypeError::New(env, name + ": expected " +
                                        (isNorm          ? "a Float32Array"
                                         : name == "ids" ? "an Int32Array"
                                                         : "a Uint16Array of bf16 bits"));
  const uint8_t* src = static_cast<const uint8_t*>(t.ArrayBuffer().Data()) + t.ByteOffset();
  guarded(env, [&]() { r->setWeight(name, layer, src, t.ByteLength()); });
  return env.Undefined();
}

/** Throws unless the runner has its KV pool and every weight. */
void ready(Napi::Env env, DFlashRunner* r, const char* call) { requireReady(env, r, call, "dflashAllocKv"); }

/**
 * dflashContextWrite(runner, rows, fromTaps, positions, slots): the draft context rows of n = positions.length rows
 * (module comment): rows [n, numTaps · D] f32 — the target's taps of each row, concatenated in the drafter's tap order
 * (fc's column blocks) — when `fromTaps`, else the projected features (the fp32 sum before hidden_norm) [n, D] f32;
 * row i at position positions[i] written at draft KV slot slots[i] (page · pageSize + offset) of every layer. Checked
 * before the device is touched; enqueued and not waited for (its errors surface at the next block or synchronize).
 * @throws RangeError naming the argument; Error naming a failed CUDA call.
 */
Napi::Value DFlashContextWrite(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DFlashRunner* r = runnerOf(info);
  ready(env, r, "dflashContextWrite");
  const DfDims& d = r->d;
  const int n = static_cast<int>(typedLength(info, 3, "positions"));
  if (n < 1) throw Napi::RangeError::New(env, "positions: expected at least one row");
  const bool fromTaps = info[2].ToBoolean().Value();
  Napi::Float32Array rows =
      f32Rows(info, 1, "rows", static_cast<size_t>(n), static_cast<size_t>(fromTaps ? d.taps : 1) * d.hidden);
  const int32_t* positions = i32(info, 3, "positions", n);
  const int32_t* slots = i32(info, 4, "slots", n);
  for (int i = 0; i < n; i++) {
    const std::string at = "[" + std::to_string(i) + "]";
    if (positions[i] < 0 || positions[i] >= d.maxModelLen)
      throw Napi::RangeError::New(env, "positions" + at + ": outside [0, maxModelLen)");
    if (slots[i] < 0 || slots[i] >= r->slotsTotal())
      throw Napi::RangeError::New(env, "slots" + at + ": outside [0, numPages * pageSize)");
  }
  guarded(env, [&]() { r->contextWrite(rows.Data(), fromTaps, n, positions, slots); });
  return env.Undefined();
}

/**
 * dflashBlock(runner, tokens, positions, blockTables, slots, useGraph, wantLogits) → {ids [S · (B − 1)] i32, logits?
 * [S · (B − 1), draftVocabSize] f32}: one draft block for each of S = tokens.length sequences (module comment):
 * sequence s's last verified token tokens[s] at positions[s] = p (its draft context length), keys through
 * blockTables[s · maxBlocks …] (dflashInfo().maxBlocks entries per sequence), the block's B rows written at
 * slots[s · B + j] — temporary rows the caller reserved after the context and drops afterwards. ids[s · (B − 1) +
 * j − 1]: the greedy draft of slot j as a token id (−1 where the row's logits are not finite); logits only when
 * `wantLogits` (the host samples). As a CUDA graph per (padded S, key span) when `useGraph`.
 * @throws RangeError naming the argument (all checked before the device is touched); Error naming a failed CUDA
 *   call.
 */
Napi::Value DFlashBlock(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DFlashRunner* r = runnerOf(info);
  ready(env, r, "dflashBlock");
  const DfDims& d = r->d;
  const int B = d.blockSize;
  BlockArgs c;
  c.S = static_cast<int>(typedLength(info, 1, "tokens"));
  if (c.S < 1 || c.S > d.maxSequences)
    throw Napi::RangeError::New(env, "tokens: expected 1 to maxSequences " + std::to_string(d.maxSequences) +
                                         " sequences, got " + std::to_string(c.S));
  c.tokens = i32(info, 1, "tokens", c.S);
  c.positions = i32(info, 2, "positions", c.S);
  c.tables = i32(info, 3, "blockTables", static_cast<size_t>(c.S) * r->maxBlocks);
  c.slots = i32(info, 4, "slots", static_cast<size_t>(c.S) * B);
  for (int s = 0; s < c.S; s++) {
    const std::string at = "[" + std::to_string(s) + "]";
    if (c.tokens[s] < 0 || c.tokens[s] >= d.vocab)
      throw Napi::RangeError::New(env, "tokens" + at + ": outside the target vocabulary");
    const int p = c.positions[s];
    if (p < 0 || p + B > d.maxModelLen)
      throw Napi::RangeError::New(env, "positions" + at + ": expected 0 to maxModelLen - blockSize (" +
                                           std::to_string(d.maxModelLen - B) + "), got " + std::to_string(p));
    const int used = (p + B + d.pageSize - 1) / d.pageSize;
    for (int b = 0; b < used; b++) {
      const int32_t page = c.tables[static_cast<size_t>(s) * r->maxBlocks + b];
      if (page < 0 || page >= d.numPages)
        throw Napi::RangeError::New(env, "blockTables: sequence " + std::to_string(s) + " names page " +
                                             std::to_string(page) + ", outside [0, numPages)");
    }
    for (int j = 0; j < B; j++) {
      const int32_t slot = c.slots[static_cast<size_t>(s) * B + j];
      if (slot < 0 || slot >= r->slotsTotal())
        throw Napi::RangeError::New(env, "slots: row " + std::to_string(j) + " of sequence " + std::to_string(s) +
                                             ": outside [0, numPages * pageSize)");
    }
  }
  const bool useGraph = info[5].ToBoolean().Value();
  const bool wantLogits = info[6].ToBoolean().Value();
  const size_t R = static_cast<size_t>(c.S) * (B - 1);
  Napi::Int32Array ids = Napi::Int32Array::New(env, R);
  Napi::Object out = Napi::Object::New(env);
  if (wantLogits) {
    Napi::Float32Array lg = Napi::Float32Array::New(env, R * d.draftVocab);
    guarded(env, [&]() { r->block(c, useGraph, ids.Data(), lg.Data()); });
    out.Set("logits", lg);
  } else {
    guarded(env, [&]() { r->block(c, useGraph, ids.Data(), nullptr); });
  }
  out.Set("ids", ids);
  return out;
}

/**
 * dflashSample(runner, request, copyProbs) → {results [G · 2] i32, qAddress: BigInt, probs?: [G, vocabSize] f32}:
 * sampled drafts on the device over the head rows of the last dflashBlock (rows s · (B − 1) + j − 1 for slot j of
 * sequence s): `request` as llamaSample's (sampler.h) with every group one row and no drafts — groups [G · 4] (row, 0,
 * −1, top-k), temperature and topP [G], drafts empty, uniforms [G] (the draw of each row, from the request's
 * generator). results[2g + 1]: the drawn draft-head index (−1: the row is not finite). q — row g: the row's
 * probabilities in the target vocabulary — stays on the device at qAddress (lent to the target's sampler: llamaSample's
 * qAddress, valid until the next dflashSample) and comes back as `probs` only when `copyProbs`.
 * @throws TypeError / RangeError naming a malformed field, or without a block before; Error naming a failed CUDA
 *   call.
 */
Napi::Value DFlashSample(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DFlashRunner* r = runnerOf(info);
  if (!info[1].IsObject()) throw Napi::TypeError::New(env, "request: expected an object");
  if (r->lastHeadRows == 0) throw Napi::RangeError::New(env, "dflashSample: no block's logits to sample from");
  const SampleRequest req = parseSample(info[1].As<Napi::Object>(), r->lastHeadRows, r->d.draftVocab);
  if (req.N != req.G) throw Napi::RangeError::New(env, "dflashSample: every group must be one row with no drafts");
  const bool copy = info[2].ToBoolean().Value();
  Napi::Object out = Napi::Object::New(env);
  std::vector<int32_t> res;
  if (copy) {
    Napi::Float32Array probs = Napi::Float32Array::New(env, static_cast<size_t>(req.G) * r->d.vocab);
    guarded(env, [&]() { res = r->sample(req, probs.Data()); });
    out.Set("probs", probs);
  } else {
    guarded(env, [&]() { res = r->sample(req, nullptr); });
  }
  Napi::Int32Array results = Napi::Int32Array::New(env, res.size());
  std::copy(res.begin(), res.end(), results.Data());
  out.Set("results", results);
  out.Set("qAddress", Napi::BigInt::New(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(r->probsAddress()))));
  return out;
}

/**
 * dflashProbs(runner, row, rows) → Float32Array [rows, vocabSize]: rows [row, row + rows) of the last dflashSample's q
 * copied to the host (a sampled proposal's q when the host samples after all).
 * @throws RangeError for rows outside the last dflashSample's; Error naming a failed CUDA call.
 */
Napi::Value DFlashProbs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  DFlashRunner* r = runnerOf(info);
  const int row = intArg(info, 1, "row", 0, 1 << 24);
  const int rows = intArg(info, 2, "rows", 0, 1 << 24);
  Napi::Float32Array out = Napi::Float32Array::New(env, static_cast<size_t>(rows) * r->d.vocab);
  guarded(env, [&]() { r->probs(row, rows, out.Data()); });
  return out;
}

/** dflashSynchronize(runner): waits for the runner's stream (a context write's errors are thrown here). */
Napi::Value DFlashSynchronize(const Napi::CallbackInfo& info) {
  DFlashRunner* r = runnerOf(info);
  guarded(info.Env(), [&]() { r->sync(); });
  return info.Env().Undefined();
}

/** dflashReplayMs(runner, reps) → GPU ms per replay of the last block's CUDA graph, −1 when there is none. */
Napi::Value DFlashReplayMs(const Napi::CallbackInfo& info) {
  DFlashRunner* r = runnerOf(info);
  const int reps = info[1].IsNumber() ? std::max(1, info[1].As<Napi::Number>().Int32Value()) : 20;
  return guarded(info.Env(), [&]() -> Napi::Value { return Napi::Number::New(info.Env(), r->replayMs(reps)); });
}

/** dflashInfo(runner) → {weightBytes, kvBytes, activationBytes, maxBlocks, graphs}. */
Napi::Value DFlashInfo(const Napi::CallbackInfo& info) { return runnerInfo(info.Env(), runnerOf(info)); }

/** dflashDispose(runner): frees the runner's device memory, graphs and stream now (a later use throws). */
Napi::Value DFlashDispose(const Napi::CallbackInfo& info) { return disposeRunner<DFlashRunner>(info, "dflashCreate"); }

}  // namespace

void RegisterDFlash(Napi::Env env, Napi::Object exports) {
  exports.Set("dflashCreate", Napi::Function::New(env, DFlashCreate));
  exports.Set("dflashAllocKv", Napi::Function::New(env, DFlashAllocKv));
  exports.Set("dflashSetWeight", Napi::Function::New(env, DFlashSetWeight));
  exports.Set("dflashContextWrite", Napi::Function::New(env, DFlashContextWrite));
  exports.Set("dflashBlock", Napi::Function::New(env, DFlashBlock));
  exports.Set("dflashSample", Napi::Function::New(env, DFlashSample));
  exports.Set("dflashProbs", Napi::Function::New(env, DFlashProbs));
  exports.Set("dflashSynchronize", Napi::Function::New(env, DFlashSynchronize));
  exports.Set("dflashReplayMs", Napi::Function::New(env, DFlashReplayMs));
  exports.Set("dflashInfo", Napi::Function::New(env, DFlashInfo));
  exports.Set("dflashDispose", Napi::Function::New(env, DFlashDispose));
}
