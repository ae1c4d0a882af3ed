// @specd/native-cuda: a whole Llama model on the GPU in one native call per forward (issue 18). The runner owns
// its device memory (bf16 weights uploaded once, fp32 KV pages, activations sized for `maxTokens` rows, pinned host
// staging) and one CUDA stream; JavaScript holds an opaque handle and passes each forward's batch metadata as i32
// arrays (the CPU path's PagedBatch: token ids, positions, KV slots, cuSeqlensQ, kvLens, block tables). A forward
// returns the argmax of each wanted logit row (−1 where a row is not finite), the residual stream leaving the last
// layer, the asked taps and, only when asked, the logits: greedy decoding moves token ids, not logits.
//
// Per layer: RMSNorm → bf16, q|k|v GEMM, RoPE + KV page write, paged attention → bf16, o GEMM accumulated into the
// residual, RMSNorm → bf16, gate|up GEMM, SwiGLU → bf16, down GEMM accumulated into the residual. Batches of at
// most 32 rows (decode steps, verify blocks) use llama.cu's small GEMM on the tensor cores, row-invariant, with the
// RMSNorms in its prologue, RoPE + the KV page write in the q|k|v epilogue (the q|k|v weights are stored with each
// neox RoPE pair in adjacent rows, specdRopePairedRows), SwiGLU in the gate|up epilogue and the residual adds in the
// o/down epilogues: six launches per layer (two for attention). Larger batches use cuBLASLt (β = 1 for
// the residual adds), separate RMSNorm / SwiGLU launches and, for prefill-like batches, the query-tiled attention on
// the tensor cores (kernels.cu, FlashAttention-2's tiling in TF32). Kernels go out with programmatic dependent launch
// on sm_90+. Batches of at most kGraphRows rows run as CUDA graphs, one per (padded row count, tap set, attention
// kind, key span of the partitioned attention), captured at the first forward of each (vLLM's decode graphs): a step
// is one graph launch. Rows pad to a power of two (padded rows: token 0, position 0, no KV slot, a
// sequence without keys); a row's logits are the same bits whether it is decoded alone or verified in a batch of up
// to 32 rows (greedy speculation equals plain decoding, one sequence or several): the small GEMM is row-invariant,
// and with it off (llamaSetOptions) every batch of ≤ 16 rows uses cuBLASLt's plan for 16 rows (invariance up to 16).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <napi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels.h"
#include "runner_util.h"
#include "sampler.h"

namespace {

constexpr int kGraphRows = 256;
// Taps a forward of at most kGraphRows rows brings back through the pinned staging buffer (more: pageable copies).
constexpr int kStagedTaps = 4;
constexpr size_t kWorkspaceBytes = 32u << 20;

/** Rows a GEMM plan is made for: 16 for every batch of ≤ 16 rows (row invariance), else the padded rows. */
int gemmRows(int rows) { return rows <= 16 ? 16 : rows <= kGraphRows ? rows : (rows + 127) / 128 * 128; }

struct Dims {
  int layers = 0, hidden = 0, inter = 0, qHeads = 0, kvHeads = 0, headDim = 0, vocab = 0;
  double ropeTheta = 0;
  float eps = 0;
  bool neox = true, tied = true;
  int pageSize = 0, numPages = 0, maxModelLen = 0, maxTokens = 0;
};

struct LayerWeights {
  float* attnNorm = nullptr;
  void* qkv = nullptr;
  void* o = nullptr;
  float* mlpNorm = nullptr;
  void* gateUp = nullptr;
  void* down = nullptr;
};

/** The batch of one forward, as given (host i32). */
struct Batch {
  int T = 0, S = 0, R = 0;
  const int32_t *ids = nullptr, *positions = nullptr, *slots = nullptr, *cu = nullptr, *kvLens = nullptr,
                *tables = nullptr, *logitRows = nullptr;
};

class LlamaRunner : public RunnerMemory {
 public:
  explicit LlamaRunner(const Dims& dims) : d(dims) {
    qw = d.qHeads * d.headDim;
    kw = d.kvHeads * d.headDim;
    maxRows = std::max(d.maxTokens, kGraphRows);
    mPadMax = gemmRows(maxRows);
    try {
      ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) throw CudaFailure("cublasLtCreate failed");
      ws = dev(kWorkspaceBytes, "cuBLASLt workspace");
      // activations: every buffer GEMMs read or write holds mPadMax rows (zeroed once: padding rows stay finite)
      const int64_t M = mPadMax;
      x = static_cast<float*>(dev(M * d.hidden * 4, "residual"));
      xb = dev(M * std::max(d.hidden, qw) * 2, "normed rows");
      qkv = static_cast<float*>(dev(M * (qw + 2 * kw) * 4, "q|k|v"));
      q = static_cast<float*>(dev(M * qw * 4, "q"));
      attnB = dev(M * qw * 2, "attention output");
      gu = static_cast<float*>(dev(M * 2 * d.inter * 4, "gate|up"));
      hb = dev(M * d.inter * 2, "SwiGLU output");
      logits = static_cast<float*>(dev(M * d.vocab * 4, "logits"));
      argmax = static_cast<int32_t*>(dev(M * 4, "argmax"));
      argmaxWs = dev(specdArgmaxWorkspaceBytes(static_cast<int>(M), d.vocab), "argmax partials");
      taps = static_cast<float*>(dev(static_cast<size_t>(d.layers + 1) * maxRows * d.hidden * 4, "taps"));
      ok(cudaMallocHost(&hArgmax, static_cast<size_t>(maxRows) * 4), "cudaMallocHost (argmax)");
      ok(cudaMallocHost(&hOut, static_cast<size_t>(kGraphRows) * (1 + kStagedTaps) * d.hidden * 4),
         "cudaMallocHost (output staging)");
      layers.resize(d.layers);
      ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the zeroed buffers)");
    } catch (...) {
      release();
      throw;
    }
  }

  /**
   * Allocates the KV pool (per layer K then V, each [numPages · pageSize, kvHeads · headDim] f32), the RoPE table
   * and the per-batch structures for sequences of up to maxModelLen tokens. Once per runner; a failed allocation
   * frees what it made.
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
    kvBytes = 2 * poolFloats * 4 * d.layers;
    kv = static_cast<float*>(dev(kvBytes, "KV pool"));
    cosSin = ropeTable(d.ropeTheta, d.headDim, maxModelLen);
    parts = std::max(1, specdAttentionParts(maxBlocks * pageSize));
    part = static_cast<float*>(
        dev(static_cast<size_t>(mPadMax) * d.qHeads * parts * (2 + d.headDim) * 4, "attention partitions"));
    metaInts = 5 * static_cast<size_t>(maxRows) + 1 + static_cast<size_t>(maxRows) * maxBlocks + maxRows;
    meta = static_cast<int32_t*>(dev(metaInts * 4, "batch metadata"));
    ok(cudaMallocHost(&hMeta, metaInts * 4), "cudaMallocHost (batch metadata)");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the zeroed buffers)");
  }
  bool hasKv() const { return kv != nullptr; }

  /** Frees the KV pool and what was sized with it, and the CUDA graphs (which name its buffers). */
  void freeKv() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (auto& [k, v] : graphs) cudaGraphExecDestroy(v);
    graphs.clear();
    lastGraph = nullptr;
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
  ~LlamaRunner() { release(); }

  Dims d;
  int qw = 0, kw = 0, maxBlocks = 0, maxRows = 0, mPadMax = 0, parts = 0;
  size_t poolFloats = 0, kvBytes = 0, metaInts = 0;
  bool disposed = false;

  /** Uploads one weight: `name` of layer `layer` (−1 for the model's own), `bytes` from host `src`. */
  void setWeight(const std::string& name, int layer, const void* src, size_t bytes) {
    const size_t D = d.hidden;
    auto matrix = [&](void** slot, size_t rows, size_t cols) {
      expect(bytes, rows * cols * 2, name);
      upload(slot, src, bytes, name);
    };
    auto vector = [&](float** slot) {
      expect(bytes, D * 4, name);
      upload(reinterpret_cast<void**>(slot), src, bytes, name);
    };
    if (layer < 0) {
      if (name == "embed") return matrix(&embed, d.vocab, D);
      if (name == "lmHead") return matrix(&lmHead, d.vocab, D);
      if (name == "finalNorm") return vector(&finalNorm);
      throw std::invalid_argument("name: unknown model weight " + name);
    }
    if (layer >= d.layers) throw std::invalid_argument("layer: " + std::to_string(layer) + " is not a layer");
    LayerWeights& w = layers[layer];
    if (name == "attnNorm") return vector(&w.attnNorm);
    if (name == "qkv")
      return uploadQkv(&w.qkv, src, bytes, d.qHeads, d.kvHeads, d.headDim, static_cast<int>(D), d.neox, name);
    if (name == "o") return matrix(&w.o, D, qw);
    if (name == "mlpNorm") return vector(&w.mlpNorm);
    if (name == "gateUp") return matrix(&w.gateUp, 2 * static_cast<size_t>(d.inter), D);
    if (name == "down") return matrix(&w.down, D, d.inter);
    throw std::invalid_argument("name: unknown layer weight " + name);
  }

  /** The first weight not uploaded yet, or "" when the model is complete (remembered: weights are never removed). */
  std::string missing() {
    if (complete) return "";
    if (embed == nullptr) return "embed";
    if (!d.tied && lmHead == nullptr) return "lmHead";
    if (finalNorm == nullptr) return "finalNorm";
    for (int l = 0; l < d.layers; l++) {
      const LayerWeights& w = layers[l];
      const std::string at = " of layer " + std::to_string(l);
      if (w.attnNorm == nullptr) return "attnNorm" + at;
      if (w.qkv == nullptr) return "qkv" + at;
      if (w.o == nullptr) return "o" + at;
      if (w.mlpNorm == nullptr) return "mlpNorm" + at;
      if (w.gateUp == nullptr) return "gateUp" + at;
      if (w.down == nullptr) return "down" + at;
    }
    complete = true;
    return "";
  }
  bool complete = false;

  /**
   * One forward of batch `b` (checked by the caller), taps `tapMask` (bit t: tap t), graph replay when `useGraph`
   * and the batch fits kGraphRows rows. Leaves the results on the device; `fetch` brings them back.
   */
  void forward(const Batch& b, uint64_t tapMask, bool useGraph) {
    const auto t0 = Clock::now();
    const bool graph = useGraph && b.T <= kGraphRows;
    const int Tp = graph ? pow2Ceil(b.T) : b.T;
    const int Sp = graph ? Tp : b.S;
    const int Rp = graph ? Tp : b.R;
    pack(b, Tp, Sp, Rp);
    lastShape[0] = Tp;
    lastShape[1] = Sp;
    lastShape[2] = Rp;
    lastMask = tapMask;
    // the query-tiled attention for prefill-like batches (on average ≥ 8 rows a sequence, more than 32 rows);
    // decode steps and verify blocks of many sequences keep the partitioned kernel
    tiledAttn = b.T > kSmallGemmRows && b.T >= 8 * b.S && specdPrefillAttentionFits(d.headDim);
    // the partitioned attention's key span: the batch's longest context rounded up to a power of two ≥ 64 (one graph
    // per span; a query's bits do not depend on how many partitions are launched)
    int maxKv = 64;
    for (int s = 0; s < b.S; s++) maxKv = std::max(maxKv, b.kvLens[s]);
    attnKeys = tiledAttn ? 0 : std::min(maxBlocks * d.pageSize, pow2Ceil(maxKv));
    ok(cudaMemcpyAsync(meta, hMeta, metaUsed(Tp, Sp, Rp) * 4, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    if (!graph) {
      lastGraph = nullptr;
      launchAll(Tp, Sp, Rp, tapMask);
    } else {
      const std::tuple<int, uint64_t, bool, int> key(Tp, tapMask, tiledAttn, attnKeys);
      auto it = graphs.find(key);
      if (it == graphs.end()) {
        launchAll(Tp, Sp, Rp, tapMask);  // this forward's results; makes the GEMM plans outside the capture
        cudaGraphExec_t exec = captureGraph(stream, [&] { launchAll(Tp, Sp, Rp, tapMask); });
        graphs.emplace(key, exec);
        lastGraph = exec;
      } else {
        ok(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch");
        lastGraph = it->second;
      }
    }
    host.forwards++;
    host.launchUs += us(t0, Clock::now());
  }

  /**
   * Copies the results of the last forward to host memory, then waits for the stream. Batches of at most kGraphRows
   * rows with at most kStagedTaps taps go through pinned staging (asynchronous copies, one wait, then host memcpy: a
   * copy into pageable memory waits for the stream each time); larger ones straight into the JavaScript arrays.
   */
  void fetch(int T, int R, int32_t* ids, float* hidden, const std::vector<std::pair<int, float*>>& tapOut,
             float* logitsOut) {
    const auto t0 = Clock::now();
    const size_t rowBytes = static_cast<size_t>(T) * d.hidden * 4;
    const bool staged = T <= kGraphRows && tapOut.size() <= static_cast<size_t>(kStagedTaps);
    ok(cudaMemcpyAsync(hArgmax, argmax, static_cast<size_t>(R) * 4, cudaMemcpyDeviceToHost, stream), "argmax copy");
    if (hidden != nullptr)
      ok(cudaMemcpyAsync(staged ? hOut : hidden, x, rowBytes, cudaMemcpyDeviceToHost, stream), "hidden copy");
    for (size_t i = 0; i < tapOut.size(); i++)
      ok(cudaMemcpyAsync(staged ? hOut + (1 + i) * static_cast<size_t>(kGraphRows) * d.hidden : tapOut[i].second,
                         taps + static_cast<size_t>(tapOut[i].first) * maxRows * d.hidden, rowBytes,
                         cudaMemcpyDeviceToHost, stream),
         "tap copy");
    if (logitsOut != nullptr)
      ok(cudaMemcpyAsync(logitsOut, logits, static_cast<size_t>(R) * d.vocab * 4, cudaMemcpyDeviceToHost, stream),
         "logits copy");
    ok(cudaStreamSynchronize(stream), "the forward (cudaStreamSynchronize)");
    const auto t1 = Clock::now();
    std::memcpy(ids, hArgmax, static_cast<size_t>(R) * 4);
    if (staged) {
      if (hidden != nullptr) std::memcpy(hidden, hOut, rowBytes);
      for (size_t i = 0; i < tapOut.size(); i++)
        std::memcpy(tapOut[i].second, hOut + (1 + i) * static_cast<size_t>(kGraphRows) * d.hidden, rowBytes);
    }
    host.waitUs += us(t0, t1);
    host.copyUs += us(t1, Clock::now());
  }

  /**
   * Host time of the forwards so far, µs, cumulative (benches take differences): `checkUs` the argument checks and
   * result arrays, `launchUs` packing the metadata, its copy and the graph launch (or the kernels' launches),
   * `waitUs` issuing the result copies and waiting for the stream (the GPU's time, once the host is ahead),
   * `copyUs` the staged results into the JavaScript arrays.
   */
  struct HostTimes {
    double forwards = 0, checkUs = 0, launchUs = 0, waitUs = 0, copyUs = 0;
  } host;
  using Clock = std::chrono::steady_clock;
  static double us(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  }

  /**
   * The output projection alone (no final norm): logits [rows, vocab] f32 of x [rows, hidden] f32 (host), through
   * the same bf16 rounding and GEMM plans as a forward's lm_head. Uses the forward's scratch buffers.
   */
  void lmHeadRows(const float* xHost, int rows, float* out) {
    const int D = d.hidden;
    lastLogitRows = 0;  // the logits buffer no longer holds a forward's rows
    ok(cudaMemcpyAsync(qkv, xHost, static_cast<size_t>(rows) * D * 4, cudaMemcpyHostToDevice, stream), "x copy");
    launched(specdToBf16(xb, qkv, static_cast<int64_t>(rows) * D, stream), "toBf16");
    launched(specdGemmBf16(lt, logits, xb, d.tied ? embed : lmHead, gemmRows(rows), gemmRows(rows), d.vocab, D, ws,
                           kWorkspaceBytes, stream, false),
             "lm_head GEMM");
    ok(cudaMemcpyAsync(out, logits, static_cast<size_t>(rows) * d.vocab * 4, cudaMemcpyDeviceToHost, stream),
       "logits copy");
    ok(cudaStreamSynchronize(stream), "lm_head (cudaStreamSynchronize)");
  }

  /**
   * GPU milliseconds of the last forward's CUDA graph replayed `reps` times back to back (cudaEvent timing; the
   * replays rewrite the same KV slots with the same values). −1 when the last forward did not run as a graph.
   */
  double replayMs(int reps) { return lastGraph == nullptr ? -1 : replayGraphMs(lastGraph, stream, reps); }

  /** Captured graphs as "rows×taps" labels. */
  std::vector<std::string> graphLabels() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : graphs)
      out.push_back(std::to_string(std::get<0>(k)) + (std::get<1>(k) != 0 ? " rows + taps" : " rows") +
                    (std::get<2>(k) ? " (prefill attention)" : ", " + std::to_string(std::get<3>(k)) + " keys"));
    return out;
  }

  /**
   * Sampling and rejection acceptance (sampling.cu) over the logit rows of the last forward, on the runner's stream;
   * → the groups' (accepted, token) pairs. @throws std::invalid_argument when no forward's logits are there.
   */
  std::vector<int32_t> sample(const SampleRequest& req) {
    if (lastLogitRows == 0) throw std::invalid_argument("llamaSample: no forward's logits to sample from");
    if (!sampler) sampler = std::make_unique<DeviceSampler>();
    try {
      return sampler->run(req, logits, d.vocab, stream);
    } catch (const std::runtime_error& e) {
      throw CudaFailure(e.what());
    }
  }

  /** Logit rows the last forward left in the device's logits buffer (0 after llamaLmHead or a profile). */
  int lastLogitRows = 0;

  void release() {
    sampler.reset();
    freeKv();
    for (void* p : allocs) cudaFree(p);
    allocs.clear();
    if (hArgmax != nullptr) cudaFreeHost(hArgmax);
    hArgmax = nullptr;
    if (hOut != nullptr) cudaFreeHost(hOut);
    hOut = nullptr;
    if (lt != nullptr) cublasLtDestroy(lt);
    lt = nullptr;
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
    disposed = true;
  }

 private:
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* ws = nullptr;
  void *embed = nullptr, *lmHead = nullptr;
  float* finalNorm = nullptr;
  std::vector<LayerWeights> layers;
  float *kv = nullptr, *cosSin = nullptr, *x = nullptr, *qkv = nullptr, *q = nullptr, *gu = nullptr;
  float *logits = nullptr, *part = nullptr, *taps = nullptr;
  void *xb = nullptr, *attnB = nullptr, *hb = nullptr, *argmaxWs = nullptr;
  int32_t *argmax = nullptr, *meta = nullptr, *hMeta = nullptr, *hArgmax = nullptr;
  float* hOut = nullptr;  // pinned: hidden then kStagedTaps taps, kGraphRows rows each
  std::map<std::tuple<int, uint64_t, bool, int>, cudaGraphExec_t> graphs;
  bool tiledAttn = false;  // this forward's attention: query-tiled (prefill-like batch) or partitioned
  int attnKeys = 0;        // the partitioned attention's key span (a power of two ≥ the batch's longest context)
  cudaGraphExec_t lastGraph = nullptr;
  std::unique_ptr<DeviceSampler> sampler;  // made at the first llamaSample

  // metadata layout: ids[Tp] positions[Tp] slots[Tp] cu[Sp + 1] kvLens[Sp] tables[Sp · maxBlocks] logitRows[Rp]
  size_t metaUsed(int Tp, int Sp, int Rp) const {
    return 3 * static_cast<size_t>(Tp) + 2 * static_cast<size_t>(Sp) + 1 + static_cast<size_t>(Sp) * maxBlocks + Rp;
  }
  void pack(const Batch& b, int Tp, int Sp, int Rp) {
    int32_t* m = hMeta;
    auto put = [&](const int32_t* src, int n, int total, int32_t pad) {
      std::memcpy(m, src, static_cast<size_t>(n) * 4);
      std::fill(m + n, m + total, pad);
      m += total;
    };
    put(b.ids, b.T, Tp, 0);
    put(b.positions, b.T, Tp, 0);
    put(b.slots, b.T, Tp, -1);
    put(b.cu, b.S + 1, Sp + 1, b.T);
    put(b.kvLens, b.S, Sp, 0);
    put(b.tables, b.S * maxBlocks, Sp * maxBlocks, 0);
    put(b.logitRows, b.R, Rp, 0);
  }

  /** One launch (or copy) of a forward, named for profiles. */
  struct Op {
    const char* name;
    int layer;  // −1: outside the layers
    std::function<void()> run;
  };

  /**
   * Every launch of one forward over Tp rows, Sp sequences and Rp logit rows, metadata already in `meta` (see the
   * file comment for the two GEMM paths). The logits of at most kSmallGemmRows rows take the small GEMM too.
   */
  std::vector<Op> forwardOps(int Tp, int Sp, int Rp, uint64_t tapMask) {
    const int D = d.hidden;
    const int M = gemmRows(Tp), MR = gemmRows(Rp);
    const int32_t* ids = meta;
    const int32_t* pos = ids + Tp;
    const int32_t* slots = pos + Tp;
    const int32_t* cu = slots + Tp;
    const int32_t* kvLens = cu + Sp + 1;
    const int32_t* tables = kvLens + Sp;
    const int32_t* logitRows = tables + static_cast<size_t>(Sp) * maxBlocks;
    const bool small =
        smallGemmOn && specdSmallGemmFits(Tp, D) && specdSmallGemmFits(Tp, qw) && specdSmallGemmFits(Tp, d.inter);
    const bool smallHead = smallGemmOn && specdSmallGemmFits(Rp, D);
    std::vector<Op> ops;
    auto add = [&](const char* name, int layer, std::function<void()> f) {
      ops.push_back({name, layer, std::move(f)});
    };
    auto gemm = [this](float* out, const void* in, const void* w, int m, int n, int k, bool acc, const char* what) {
      launched(specdGemmBf16(lt, out, in, w, m, m, n, k, ws, kWorkspaceBytes, stream, acc), what);
    };
    auto tap = [&](int t) {
      if (tapMask >> t & 1u)
        add("tap copy", t < d.layers ? t : -1, [this, t, Tp, D] {
          ok(cudaMemcpyAsync(taps + static_cast<size_t>(t) * maxRows * D, x, static_cast<size_t>(Tp) * D * 4,
                             cudaMemcpyDeviceToDevice, stream),
             "tap copy");
        });
    };
    add("embed", -1, [=, this] { launched(specdEmbed(x, embed, ids, Tp, D, stream), "embed"); });
    const float scale = 1.f / std::sqrt(static_cast<float>(d.headDim));
    for (int l = 0; l < d.layers; l++) {
      const LayerWeights& w = layers[l];
      float* kPool = kv + static_cast<size_t>(2 * l) * poolFloats;
      float* vPool = kPool + poolFloats;
      tap(l);
      if (small) {
        add("norm + q|k|v GEMM + RoPE + KV write", l, [=, &w, this] {
          launched(specdSmallGemmNormRope(q, kPool, vPool, cosSin, pos, slots, d.qHeads, d.kvHeads, d.headDim, d.neox,
                                          x, w.attnNorm, d.eps, w.qkv, Tp, D, stream),
                   "q|k|v GEMM + RoPE");
        });
      } else {
        add("attention rmsNorm", l,
            [=, &w, this] { launched(specdRmsNormBf16(xb, x, w.attnNorm, nullptr, Tp, D, d.eps, stream), "rmsNorm"); });
        add("q|k|v GEMM", l, [=, &w] { gemm(qkv, xb, w.qkv, M, qw + 2 * kw, D, false, "q|k|v GEMM"); });
        add("RoPE + KV write", l, [=, this] {
          launched(
              specdRopeKv(q, kPool, vPool, qkv, cosSin, pos, slots, Tp, d.qHeads, d.kvHeads, d.headDim, d.neox, stream),
              "RoPE + KV write");
        });
      }
      if (tiledAttn)
        add("prefill attention", l, [=, this] {
          launched(specdPrefillAttention(nullptr, attnB, q, kPool, vPool, cu, kvLens, tables, pos, Sp, Tp, maxBlocks,
                                         d.pageSize, d.qHeads, d.kvHeads, d.headDim, scale, stream),
                   "prefill attention");
        });
      else
        add("paged attention (2 launches)", l, [=, this] {
          launched(
              specdPagedAttention(nullptr, attnB, part, q, kPool, vPool, cu, kvLens, tables, pos, Sp, Tp, maxBlocks,
                                  d.pageSize, d.qHeads, d.kvHeads, d.headDim, scale, true, attnKeys, stream),
              "paged attention");
        });
      if (small)
        add("o GEMM + residual", l,
            [=, &w, this] { launched(specdSmallGemm(x, attnB, w.o, Tp, D, qw, true, stream), "o GEMM"); });
      else add("o GEMM + residual", l, [=, &w] { gemm(x, attnB, w.o, M, D, qw, true, "o GEMM"); });
      if (small) {
        add("norm + gate|up GEMM + SwiGLU", l, [=, &w, this] {
          launched(specdSmallGemmNorm(nullptr, hb, x, w.mlpNorm, nullptr, d.eps, w.gateUp, Tp, d.inter, D, stream),
                   "gate|up GEMM");
        });
        add("down GEMM + residual", l,
            [=, &w, this] { launched(specdSmallGemm(x, hb, w.down, Tp, D, d.inter, true, stream), "down GEMM"); });
      } else {
        add("MLP rmsNorm", l,
            [=, &w, this] { launched(specdRmsNormBf16(xb, x, w.mlpNorm, nullptr, Tp, D, d.eps, stream), "rmsNorm"); });
        add("gate|up GEMM", l, [=, &w] { gemm(gu, xb, w.gateUp, M, 2 * d.inter, D, false, "gate|up GEMM"); });
        add("SwiGLU", l, [=, this] { launched(specdSwigluBf16(hb, gu, Tp, d.inter, stream), "SwiGLU"); });
        add("down GEMM + residual", l, [=, &w] { gemm(x, hb, w.down, M, D, d.inter, true, "down GEMM"); });
      }
    }
    tap(d.layers);
    const void* head = d.tied ? embed : lmHead;
    if (smallHead) {
      add("final norm + lm_head", -1, [=, this] {
        launched(specdSmallGemmNorm(logits, nullptr, x, finalNorm, logitRows, d.eps, head, Rp, d.vocab, D, stream),
                 "lm_head GEMM");
      });
    } else {
      add("final rmsNorm", -1, [=, this] {
        launched(specdRmsNormBf16(xb, x, finalNorm, logitRows, Rp, D, d.eps, stream), "final rmsNorm");
      });
      add("lm_head", -1, [=] { gemm(logits, xb, head, MR, d.vocab, D, false, "lm_head GEMM"); });
    }
    add("argmax (2 launches)", -1,
        [=, this] { launched(specdArgmaxTwoPass(argmax, argmaxWs, logits, Rp, d.vocab, stream), "argmax"); });
    return ops;
  }

  void launchAll(int Tp, int Sp, int Rp, uint64_t tapMask) {
    for (const Op& op : forwardOps(Tp, Sp, Rp, tapMask)) op.run();
  }

 public:
  /** Use the small GEMM for batches of ≤ 32 rows (default on; off: cuBLASLt everywhere, for A/B benches). */
  bool smallGemmOn = true;

  /** Drops the captured CUDA graphs (after a launch option changed). */
  void dropGraphs() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (auto& [k, v] : graphs) cudaGraphExecDestroy(v);
    graphs.clear();
    lastGraph = nullptr;
  }

  /**
   * GPU µs of each launch of layer 0 and of the head for the last forward's batch shape, each timed as a CUDA graph
   * of `reps` back-to-back copies (so launch gaps inside a graph count, host gaps do not). Overwrites activations
   * and rewrites the batch's KV slots with other values: for benches at the end of a run only.
   */
  std::vector<std::pair<std::string, double>> profile(int reps) {
    lastLogitRows = 0;  // the replays overwrite the logits
    std::vector<std::pair<std::string, double>> out;
    if (lastShape[0] == 0) return out;
    const std::vector<Op> ops = forwardOps(lastShape[0], lastShape[1], lastShape[2], lastMask);
    for (const Op& op : ops) {
      if (op.layer > 0) continue;
      op.run();  // outside the capture first (plans, attributes)
      cudaGraphExec_t exec = captureGraph(stream, [&] {
        for (int r = 0; r < reps; r++) op.run();
      });
      cudaGraphLaunch(exec, stream);  // warm
      double ms = 0;
      try {
        ms = replayGraphMs(exec, stream, 1);
      } catch (...) {
        cudaGraphExecDestroy(exec);
        throw;
      }
      cudaGraphExecDestroy(exec);
      out.emplace_back(std::string(op.name) + (op.layer < 0 ? "" : " (a layer)"), 1000.0 * ms / reps);
    }
    return out;
  }

 private:
  int lastShape[3] = {0, 0, 0};
  uint64_t lastMask = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// N-API

LlamaRunner* runnerOf(const Napi::CallbackInfo& info) { return runnerArg<LlamaRunner>(info, "llamaCreate"); }

/**
 * llamaCreate({numLayers, hiddenSize, intermediateSize, numHeads, numKvHeads, headDim, vocabSize, ropeTheta,
 * rmsNormEps, neox, tiedEmbeddings, maxTokens}) → a runner handle with its activations for batches of up to
 * `maxTokens` rows (at least 256: the graph buckets) allocated; the KV pool comes with llamaAllocKv.
 * @throws RangeError for a bad field; Error naming the failed CUDA call (e.g. cudaMalloc of the KV pool).
 */
Napi::Value LlamaCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw Napi::TypeError::New(env, "options: expected an object");
  Napi::Object o = info[0].As<Napi::Object>();
  Dims d;
  d.layers = intField(o, "numLayers", 1, 4096);
  d.hidden = intField(o, "hiddenSize", 1, 1 << 16);
  d.inter = intField(o, "intermediateSize", 1, 1 << 18);
  d.qHeads = intField(o, "numHeads", 1, 1024);
  d.kvHeads = intField(o, "numKvHeads", 1, 1024);
  d.headDim = intField(o, "headDim", 2, 256);
  d.vocab = intField(o, "vocabSize", 1, 1 << 24);
  d.ropeTheta = numField(o, "ropeTheta");
  d.eps = static_cast<float>(numField(o, "rmsNormEps"));
  d.neox = o.Get("neox").ToBoolean().Value();
  d.tied = o.Get("tiedEmbeddings").ToBoolean().Value();
  d.maxTokens = intField(o, "maxTokens", 1, 1 << 16);
  if (d.qHeads % d.kvHeads != 0) throw Napi::RangeError::New(env, "numHeads: must be a multiple of numKvHeads");
  if (d.headDim % 2 != 0) throw Napi::RangeError::New(env, "headDim: must be even");
  if (d.layers > 63) throw Napi::RangeError::New(env, "numLayers: at most 63 (taps are a 64-bit mask)");
  return guarded(env, [&]() -> Napi::Value {
    auto* r = new LlamaRunner(d);
    return Napi::External<LlamaRunner>::New(env, r, [](Napi::Env, LlamaRunner* p) { delete p; });
  });
}

/**
 * llamaAllocKv(runner, pageSize, numPages, maxModelLen): allocates the KV pool (numPages · pageSize tokens, fp32 K
 * and V of every layer) and the structures for sequences of up to maxModelLen tokens, at once: a pool that does not
 * fit fails here naming its bytes, never during a forward. A second call replaces the first pool (its contents and
 * the CUDA graphs are dropped).
 * @throws RangeError for a bad size; Error naming the failed CUDA call.
 */
Napi::Value LlamaAllocKv(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LlamaRunner* r = runnerOf(info);
  for (size_t i = 1; i <= 3; i++)
    if (!info[i].IsNumber()) throw Napi::TypeError::New(env, "pageSize, numPages, maxModelLen: expected numbers");
  const int pageSize = info[1].As<Napi::Number>().Int32Value(), numPages = info[2].As<Napi::Number>().Int32Value(),
            maxModelLen = info[3].As<Napi::Number>().Int32Value();
  if (pageSize < 1 || numPages < 1 || maxModelLen < 1 || maxModelLen > (1 << 20))
    throw Napi::RangeError::New(env,
                                "pageSize, numPages, maxModelLen: expected positive integers (maxModelLen <= 2^20)");
  guarded(env, [&]() { r->allocKv(pageSize, numPages, maxModelLen); });
  return env.Undefined();
}

/** llamaSetWeight(runner, name, layer, data): uploads a weight (bf16 bits as Uint16Array; norms Float32Array). */
Napi::Value LlamaSetWeight(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LlamaRunner* r = runnerOf(info);
  if (!info[1].IsString()) throw Napi::TypeError::New(env, "name: expected a string");
  const std::string name = info[1].As<Napi::String>().Utf8Value();
  if (!info[2].IsNumber()) throw Napi::TypeError::New(env, "layer: expected a number");
  const int layer = info[2].As<Napi::Number>().Int32Value();
  if (!info[3].IsTypedArray()) throw Napi::TypeError::New(env, "data: expected a typed array");
  Napi::TypedArray t = info[3].As<Napi::TypedArray>();
  const bool isNorm = name == "finalNorm" || name == "attnNorm" || name == "mlpNorm";
  if (t.TypedArrayType() != (isNorm ? napi_float32_array : napi_uint16_array))
    throw Napi::TypeError::New(env, name + ": expected " + (isNorm ? "a Float32Array" : "a Uint16Array of bf16 bits"));
  const uint8_t* src = static_cast<const uint8_t*>(t.ArrayBuffer().Data()) + t.ByteOffset();
  guarded(env, [&]() { r->setWeight(name, layer, src, t.ByteLength()); });
  return env.Undefined();
}

/**
 * llamaForward(runner, ids, positions, slots, cuSeqlensQ, kvLens, blockTables, logitRows, taps, wantLogits,
 * useGraph) → {tokens, hidden, taps, logits}: T = ids.length token rows of S = kvLens.length sequences (rows
 * [cuSeqlensQ[s], cuSeqlensQ[s + 1]) are sequence s, its keys kvLens[s] tokens through blockTables[s · maxBlocks …],
 * maxBlocks = ceil(maxModelLen / pageSize), unused entries 0), every token's K/V written at slots[t] (page ·
 * pageSize + offset; −1: not written). tokens [R] i32: the argmax of logit row r = the final-normed row
 * logitRows[r] (−1 if not finite); hidden [T, hiddenSize] f32 after the last layer; taps[i] [T, hiddenSize] f32,
 * tap taps[i] = the residual entering layer taps[i] (numLayers: after the last); logits [R, vocabSize] f32 when
 * `wantLogits`, else undefined. Everything is checked here before anything runs on the device.
 * @throws RangeError naming the argument; Error naming a failed CUDA call.
 */
Napi::Value LlamaForward(const Napi::CallbackInfo& info) {
  const auto t0 = LlamaRunner::Clock::now();
  Napi::Env env = info.Env();
  LlamaRunner* r = runnerOf(info);
  const Dims& d = r->d;
  auto len = [&](size_t i, const char* name) -> size_t {
    if (!info[i].IsTypedArray()) throw Napi::TypeError::New(env, std::string(name) + ": expected an Int32Array");
    return info[i].As<Napi::TypedArray>().ElementLength();
  };
  if (!r->hasKv()) throw Napi::Error::New(env, "llamaForward: no KV pool yet (llamaAllocKv)");
  Batch b;
  b.T = static_cast<int>(len(1, "ids"));
  b.S = static_cast<int>(len(5, "kvLens"));
  b.R = static_cast<int>(len(7, "logitRows"));
  if (b.T < 1 || b.T > d.maxTokens)
    throw Napi::RangeError::New(
        env, "ids: " + std::to_string(b.T) + " tokens, expected 1 to maxTokens " + std::to_string(d.maxTokens));
  if (b.S < 1 || b.S > b.T) throw Napi::RangeError::New(env, "kvLens: expected 1 to ids.length sequences");
  if (b.R < 1 || b.R > b.T) throw Napi::RangeError::New(env, "logitRows: expected 1 to ids.length rows");
  b.ids = i32(info, 1, "ids", b.T);
  b.positions = i32(info, 2, "positions", b.T);
  b.slots = i32(info, 3, "slots", b.T);
  b.cu = i32(info, 4, "cuSeqlensQ", b.S + 1);
  b.kvLens = i32(info, 5, "kvLens", b.S);
  b.tables = i32(info, 6, "blockTables", static_cast<size_t>(b.S) * r->maxBlocks);
  b.logitRows = i32(info, 7, "logitRows", b.R);
  const int64_t slotsTotal = static_cast<int64_t>(d.numPages) * d.pageSize;
  auto bad = [&](const std::string& m) { return Napi::RangeError::New(env, m); };
  for (int t = 0; t < b.T; t++) {
    if (b.ids[t] < 0 || b.ids[t] >= d.vocab) throw bad("ids[" + std::to_string(t) + "]: outside the vocabulary");
    if (b.positions[t] < 0 || b.positions[t] >= d.maxModelLen)
      throw bad("positions[" + std::to_string(t) + "]: outside [0, maxModelLen)");
    if (b.slots[t] < -1 || b.slots[t] >= slotsTotal)
      throw bad("slots[" + std::to_string(t) + "]: outside [-1, numPages * pageSize)");
  }
  if (b.cu[0] != 0 || b.cu[b.S] != b.T) throw bad("cuSeqlensQ: must start at 0 and end at ids.length");
  for (int s = 0; s < b.S; s++) {
    const int n = b.cu[s + 1] - b.cu[s];
    if (n < 1) throw bad("cuSeqlensQ: sequence " + std::to_string(s) + " has no rows");
    if (b.kvLens[s] < n || b.kvLens[s] > d.maxModelLen)
      throw bad("kvLens[" + std::to_string(s) + "]: expected rows of the sequence to maxModelLen");
    const int used = (b.kvLens[s] + d.pageSize - 1) / d.pageSize;
    for (int j = 0; j < used; j++) {
      const int32_t p = b.tables[static_cast<size_t>(s) * r->maxBlocks + j];
      if (p < 0 || p >= d.numPages)
        throw bad("blockTables: sequence " + std::to_string(s) + " names page " + std::to_string(p) +
                  ", outside [0, numPages)");
    }
  }
  for (int i = 0; i < b.R; i++)
    if (b.logitRows[i] < 0 || b.logitRows[i] >= b.T) throw bad("logitRows: row outside [0, ids.length)");
  if (!info[8].IsTypedArray() || info[8].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw Napi::TypeError::New(env, "taps: expected an Int32Array");
  Napi::Int32Array tapIds = info[8].As<Napi::Int32Array>();
  uint64_t mask = 0;
  for (size_t i = 0; i < tapIds.ElementLength(); i++) {
    if (tapIds[i] < 0 || tapIds[i] > d.layers) throw bad("taps: a tap outside [0, numLayers]");
    mask |= uint64_t{1} << tapIds[i];
  }
  const bool wantLogits = info[9].ToBoolean().Value();
  const bool useGraph = info[10].ToBoolean().Value();
  const std::string missing = r->missing();
  if (!missing.empty()) throw Napi::Error::New(env, "llamaForward: weight " + missing + " was not uploaded");
  Napi::Int32Array tokens = Napi::Int32Array::New(env, b.R);
  Napi::Float32Array hidden = Napi::Float32Array::New(env, static_cast<size_t>(b.T) * d.hidden);
  Napi::Array tapArrays = Napi::Array::New(env, tapIds.ElementLength());
  std::vector<std::pair<int, float*>> tapOut;
  for (size_t i = 0; i < tapIds.ElementLength(); i++) {
    Napi::Float32Array a = Napi::Float32Array::New(env, static_cast<size_t>(b.T) * d.hidden);
    tapArrays.Set(static_cast<uint32_t>(i), a);
    tapOut.emplace_back(tapIds[i], a.Data());
  }
  Napi::Value logitsValue = env.Undefined();
  float* logitsOut = nullptr;
  if (wantLogits) {
    Napi::Float32Array a = Napi::Float32Array::New(env, static_cast<size_t>(b.R) * d.vocab);
    logitsOut = a.Data();
    logitsValue = a;
  }
  r->host.checkUs += LlamaRunner::us(t0, LlamaRunner::Clock::now());
  guarded(env, [&]() {
    r->lastLogitRows = 0;
    r->forward(b, mask, useGraph);
    r->fetch(b.T, b.R, tokens.Data(), hidden.Data(), tapOut, logitsOut);
    r->lastLogitRows = b.R;
  });
  Napi::Object out = Napi::Object::New(env);
  out.Set("tokens", tokens);
  out.Set("hidden", hidden);
  out.Set("taps", tapArrays);
  out.Set("logits", logitsValue);
  return out;
}

/**
 * llamaLmHead(runner, x, rows) → logits [rows, vocabSize] f32 of x [rows, hiddenSize] f32 (no final norm; rows ≤
 * maxTokens). @throws RangeError for a mis-sized x; Error naming a failed CUDA call.
 */
Napi::Value LlamaLmHead(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LlamaRunner* r = runnerOf(info);
  if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    throw Napi::TypeError::New(env, "x: expected a Float32Array");
  Napi::Float32Array x = info[1].As<Napi::Float32Array>();
  const int rows = info[2].As<Napi::Number>().Int32Value();
  if (rows < 1 || rows > r->d.maxTokens || x.ElementLength() != static_cast<size_t>(rows) * r->d.hidden)
    throw Napi::RangeError::New(env, "x: expected [rows, hiddenSize] f32 with 1 <= rows <= maxTokens");
  const std::string missing = r->missing();
  if (!missing.empty()) throw Napi::Error::New(env, "llamaLmHead: weight " + missing + " was not uploaded");
  Napi::Float32Array out = Napi::Float32Array::New(env, static_cast<size_t>(rows) * r->d.vocab);
  guarded(env, [&]() { r->lmHeadRows(x.Data(), rows, out.Data()); });
  return out;
}

/**
 * llamaSample(runner, request) → Int32Array [groups · 2]: sampling and rejection acceptance on the device over the
 * logit rows of the last llamaForward (row r = its logitRows[r]; sampler.h's parseSample for `request`): per group
 * (a sequence) the accepted drafts and the token drawn (the recovered token at the first rejection, else the bonus
 * token), the token −1 when a row the group used holds a NaN / +Inf / no finite value (accepted then names that row).
 * Only these ids come back; the logits stay on the device.
 * @throws TypeError / RangeError naming a malformed request or no forward before; Error naming a failed CUDA call.
 */
Napi::Value LlamaSample(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LlamaRunner* r = runnerOf(info);
  if (!info[1].IsObject()) throw Napi::TypeError::New(env, "request: expected an object");
  if (r->lastLogitRows == 0) throw Napi::RangeError::New(env, "llamaSample: no forward's logits to sample from");
  const SampleRequest req = parseSample(info[1].As<Napi::Object>(), r->lastLogitRows, r->d.vocab);
  std::vector<int32_t> res;
  guarded(env, [&]() { res = r->sample(req); });
  Napi::Int32Array out = Napi::Int32Array::New(env, res.size());
  std::copy(res.begin(), res.end(), out.Data());
  return out;
}

/** llamaReplayMs(runner, reps) → GPU ms per replay of the last forward's CUDA graph (−1: it ran without one). */
Napi::Value LlamaReplayMs(const Napi::CallbackInfo& info) {
  LlamaRunner* r = runnerOf(info);
  const int reps = info[1].IsNumber() ? std::max(1, info[1].As<Napi::Number>().Int32Value()) : 20;
  return guarded(info.Env(), [&]() { return Napi::Number::New(info.Env(), r->replayMs(reps)); });
}

/**
 * llamaSetOptions(runner, {smallGemm?, pdl?}): the launch choices for later forwards (A/B benches), dropping the
 * captured CUDA graphs. smallGemm: batches of ≤ 32 rows use the small GEMM with fused RMSNorm / SwiGLU (default
 * true; false: cuBLASLt and separate launches). pdl: programmatic dependent launch on sm_90+ (default true; process
 * wide).
 */
Napi::Value LlamaSetOptions(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LlamaRunner* r = runnerOf(info);
  if (!info[1].IsObject()) throw Napi::TypeError::New(env, "options: expected an object");
  Napi::Object o = info[1].As<Napi::Object>();
  if (o.Has("smallGemm")) r->smallGemmOn = o.Get("smallGemm").ToBoolean().Value();
  if (o.Has("pdl")) specdSetPdl(o.Get("pdl").ToBoolean().Value());
  r->dropGraphs();
  return env.Undefined();
}

/**
 * llamaProfile(runner, reps) → [{name, us}]: GPU µs of each launch of layer 0 and of the head at the last forward's
 * batch shape, each replayed as a graph of `reps` copies. Overwrites activations and that batch's KV slots: benches
 * only, at the end.
 */
Napi::Value LlamaProfile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LlamaRunner* r = runnerOf(info);
  const int reps = info[1].IsNumber() ? std::max(1, info[1].As<Napi::Number>().Int32Value()) : 20;
  std::vector<std::pair<std::string, double>> rows;
  guarded(env, [&]() { rows = r->profile(reps); });
  Napi::Array out = Napi::Array::New(env, rows.size());
  for (size_t i = 0; i < rows.size(); i++) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("name", rows[i].first);
    o.Set("us", rows[i].second);
    out.Set(static_cast<uint32_t>(i), o);
  }
  return out;
}

/**
 * llamaInfo(runner) → {weightBytes, kvBytes, activationBytes, maxBlocks, graphs, hostUs}: sizes, captured graphs and
 * the host time of the forwards so far (LlamaRunner::HostTimes, cumulative µs).
 */
Napi::Value LlamaInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LlamaRunner* r = runnerOf(info);
  Napi::Object o = runnerInfo(env, r);
  Napi::Object h = Napi::Object::New(env);
  h.Set("forwards", r->host.forwards);
  h.Set("checkUs", r->host.checkUs);
  h.Set("launchUs", r->host.launchUs);
  h.Set("waitUs", r->host.waitUs);
  h.Set("copyUs", r->host.copyUs);
  o.Set("hostUs", h);
  return o;
}

/** llamaDispose(runner): frees the runner's device memory, graphs and stream now (a later use throws). */
Napi::Value LlamaDispose(const Napi::CallbackInfo& info) {
  runnerOf(info)->release();
  return info.Env().Undefined();
}

}  // namespace

void RegisterLlama(Napi::Env env, Napi::Object exports) {
  exports.Set("llamaCreate", Napi::Function::New(env, LlamaCreate));
  exports.Set("llamaAllocKv", Napi::Function::New(env, LlamaAllocKv));
  exports.Set("llamaSetWeight", Napi::Function::New(env, LlamaSetWeight));
  exports.Set("llamaForward", Napi::Function::New(env, LlamaForward));
  exports.Set("llamaLmHead", Napi::Function::New(env, LlamaLmHead));
  exports.Set("llamaSample", Napi::Function::New(env, LlamaSample));
  exports.Set("llamaReplayMs", Napi::Function::New(env, LlamaReplayMs));
  exports.Set("llamaInfo", Napi::Function::New(env, LlamaInfo));
  exports.Set("llamaSetOptions", Napi::Function::New(env, LlamaSetOptions));
  exports.Set("llamaProfile", Napi::Function::New(env, LlamaProfile));
  exports.Set("llamaDispose", Napi::Function::New(env, LlamaDispose));
}
