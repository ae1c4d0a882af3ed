// @specd/native-cuda: the host side of sampling on the device (sampling.cu): the JavaScript request checked and
// packed, and the grow-only device buffers it is copied into. Used by the `sample` binding (binding.cc, kernel
// tests) and by the Llama runner's `llamaSample` (the logits of its last forward). Each TU gets its own copy.
#pragma once
#include <cuda_runtime.h>
#include <napi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.h"

namespace {

/**
 * A sampling request over `rows` logit rows of `vocab` entries, from the JavaScript object
 * `{groups, temperature, topP, drafts, uniforms, q?}`:
 *   groups       Int32Array [G · 4]: per group (a sequence) its first logit row `row0`, its draft count `k` (rows
 *                row0 … row0 + k are its verify rows), the first row of its q in `q` (−1: the drafts are point
 *                masses) and top-k (0: off)
 *   temperature  Float64Array [G], each finite and > 0; topP Float64Array [G], each in (0, 1]
 *   drafts       Int32Array [Σ k] in group order, each in [0, vocab)
 *   uniforms     Float64Array [Σ (k + 1)] in group order, each in [0, 1): k for the drafts, one for the draw
 *   q            Float32Array [qRows, vocab] (the drafters' probabilities), absent when every q row is −1
 *   qAddress     instead of q: a BigInt device address of [qRows, vocab] f32 rows on this device that another runner
 *                of this addon lent (specdRegisterDeviceRows; a drafter's q), with qRows a number
 */
struct SampleRequest {
  int G = 0, N = 0;           // groups, stats rows (Σ (k + 1))
  std::vector<int32_t> ints;  // gi [6 G] | rowGroup [N] | rowIndex [N] | statsRow0 [G] | drafts [Σ k]
  std::vector<double> gf;     // [2 G]: temperature, topP
  const double* u = nullptr;  // [N]
  const float* q = nullptr;   // [qRows, vocab]
  size_t qFloats = 0;
  const float* qDevice = nullptr;  // [qRows, vocab] on the device (lent; no copy), instead of q
};

template <typename A>
A typedField(Napi::Object o, const char* key, napi_typedarray_type type, const char* what) {
  Napi::Value v = o.Get(key);
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != type)
    throw Napi::TypeError::New(o.Env(), std::string("sample: ") + key + ": expected " + what);
  return v.As<A>();
}

/** @throws TypeError / RangeError naming the field of a malformed request (nothing runs then). */
SampleRequest parseSample(Napi::Object o, int rows, int vocab) {
  Napi::Env env = o.Env();
  auto bad = [&](const std::string& m) { return Napi::RangeError::New(env, "sample: " + m); };
  auto groups = typedField<Napi::Int32Array>(o, "groups", napi_int32_array, "an Int32Array [groups * 4]");
  if (groups.ElementLength() == 0 || groups.ElementLength() % 4 != 0)
    throw bad("groups: expected 4 entries per group, at least one group");
  SampleRequest r;
  r.G = static_cast<int>(groups.ElementLength() / 4);
  auto temp = typedField<Napi::Float64Array>(o, "temperature", napi_float64_array, "a Float64Array [groups]");
  auto topP = typedField<Napi::Float64Array>(o, "topP", napi_float64_array, "a Float64Array [groups]");
  auto drafts = typedField<Napi::Int32Array>(o, "drafts", napi_int32_array, "an Int32Array");
  auto uniforms = typedField<Napi::Float64Array>(o, "uniforms", napi_float64_array, "a Float64Array");
  if (temp.ElementLength() != static_cast<size_t>(r.G) || topP.ElementLength() != static_cast<size_t>(r.G))
    throw bad("temperature and topP: expected one entry per group (" + std::to_string(r.G) + ")");
  size_t qRows = 0;
  Napi::Value qv = o.Get("q");
  Napi::Value qa = o.Get("qAddress");
  if (!qa.IsUndefined() && !qa.IsNull()) {
    if (!qv.IsUndefined() && !qv.IsNull()) throw bad("q and qAddress: expected one of them");
    if (!qa.IsBigInt()) throw Napi::TypeError::New(env, "sample: qAddress: expected a BigInt (a device address)");
    bool lossless = false;
    const uint64_t address = qa.As<Napi::BigInt>().Uint64Value(&lossless);
    Napi::Value qn = o.Get("qRows");
    const double rowsIn = qn.IsNumber() ? qn.As<Napi::Number>().DoubleValue() : -1;
    if (!(rowsIn >= 1 && rowsIn <= (1 << 24) && rowsIn == std::floor(rowsIn)))
      throw bad("qRows: expected an integer >= 1 with qAddress");
    qRows = static_cast<size_t>(rowsIn);
    const void* p = reinterpret_cast<const void*>(static_cast<uintptr_t>(address));
    if (!lossless || !specdDeviceRowsValid(p, qRows * static_cast<size_t>(vocab) * 4))
      throw bad("qAddress: not " + std::to_string(qRows) + " rows of a device buffer this addon lends");
    r.qDevice = static_cast<const float*>(p);
  } else if (!qv.IsUndefined() && !qv.IsNull()) {
    auto q = typedField<Napi::Float32Array>(o, "q", napi_float32_array, "a Float32Array [rows, vocab]");
    if (q.ElementLength() % static_cast<size_t>(vocab) != 0) throw bad("q: expected whole rows of the vocabulary");
    r.q = q.Data();
    r.qFloats = q.ElementLength();
    qRows = q.ElementLength() / vocab;
  }
  std::vector<int32_t> gi(6 * r.G), statsRow0(r.G);
  size_t D = 0;
  for (int g = 0; g < r.G; g++) {
    const int row0 = groups[4 * g], k = groups[4 * g + 1], qRow = groups[4 * g + 2], topK = groups[4 * g + 3];
    const std::string at = "group " + std::to_string(g) + ": ";
    if (row0 < 0 || k < 0 || static_cast<int64_t>(row0) + k >= rows)
      throw bad(at + "rows " + std::to_string(row0) + " … " + std::to_string(row0 + k) + " outside the " +
                std::to_string(rows) + " logit rows");
    if (qRow < -1 || (qRow >= 0 && static_cast<size_t>(qRow) + k > qRows))
      throw bad(at + "q rows outside the " + std::to_string(qRows) + " rows of q");
    if (topK < 0) throw bad(at + "topK: expected >= 0");
    if (!(temp[g] > 0.0) || !std::isfinite(temp[g])) throw bad(at + "temperature: expected a finite number > 0");
    if (!(topP[g] > 0.0 && topP[g] <= 1.0)) throw bad(at + "topP: expected a number in (0, 1]");
    gi[6 * g] = row0;
    gi[6 * g + 1] = k;
    gi[6 * g + 2] = static_cast<int32_t>(D);
    gi[6 * g + 3] = r.N;
    gi[6 * g + 4] = qRow;
    gi[6 * g + 5] = topK;
    statsRow0[g] = r.N;
    D += k;
    r.N += k + 1;
  }
  if (drafts.ElementLength() != D)
    throw bad("drafts: length " + std::to_string(drafts.ElementLength()) + ", expected the groups' " +
              std::to_string(D));
  if (uniforms.ElementLength() != static_cast<size_t>(r.N))
    throw bad("uniforms: length " + std::to_string(uniforms.ElementLength()) + ", expected " + std::to_string(r.N));
  for (size_t i = 0; i < D; i++)
    if (drafts[i] < 0 || drafts[i] >= vocab) throw bad("drafts[" + std::to_string(i) + "]: outside the vocabulary");
  for (int i = 0; i < r.N; i++)
    if (!(uniforms[i] >= 0.0 && uniforms[i] < 1.0)) throw bad("uniforms[" + std::to_string(i) + "]: outside [0, 1)");
  r.u = uniforms.Data();
  r.ints = std::move(gi);
  r.ints.resize(6 * r.G + 2 * r.N + r.G + D);
  int32_t* rowGroup = r.ints.data() + 6 * r.G;
  int32_t* rowIndex = rowGroup + r.N;
  for (int g = 0; g < r.G; g++)
    for (int j = 0; j <= groups[4 * g + 1]; j++) {
      rowGroup[statsRow0[g] + j] = g;
      rowIndex[statsRow0[g] + j] = groups[4 * g] + j;
    }
  std::copy(statsRow0.begin(), statsRow0.end(), rowIndex + r.N);
  std::copy(drafts.Data(), drafts.Data() + D, rowIndex + r.N + r.G);
  r.gf.resize(2 * r.G);
  for (int g = 0; g < r.G; g++) {
    r.gf[2 * g] = temp[g];
    r.gf[2 * g + 1] = topP[g];
  }
  return r;
}

/**
 * Device buffers for sampling requests, grown as requests need (never shrunk; freed with the owner). `run` copies a
 * request in, launches specdSampleAccept on `stream` over `logits` (device, [rows, vocab] f32), and returns the
 * groups' (accepted, token) pairs; with `probsOut` (device, [N, vocab] f32) also the probability rows.
 */
class DeviceSampler {
 public:
  ~DeviceSampler() {
    for (void* p : {ints_, floats_, u_, q_, stats_, results_})
      if (p != nullptr) cudaFree(p);
    if (hResults_ != nullptr) cudaFreeHost(hResults_);
  }

  /** @throws std::runtime_error naming a failed CUDA call (callers turn it into a JavaScript Error). */
  std::vector<int32_t> run(const SampleRequest& r, const float* logits, int vocab, cudaStream_t stream,
                           float* probsOut = nullptr) {
    grow(&ints_, &intsCap_, r.ints.size() * 4);
    grow(&floats_, &floatsCap_, r.gf.size() * 8);
    grow(&u_, &uCap_, static_cast<size_t>(r.N) * 8);
    grow(&stats_, &statsCap_, specdSampleStatsBytes(r.N));
    grow(&results_, &resultsCap_, static_cast<size_t>(r.G) * 8);
    if (r.qFloats > 0) grow(&q_, &qCap_, r.qFloats * 4);
    if (hResultsCap_ < static_cast<size_t>(r.G) * 8) {
      if (hResults_ != nullptr) cudaFreeHost(hResults_);
      hResults_ = nullptr;
      hResultsCap_ = 0;
      check(cudaMallocHost(&hResults_, static_cast<size_t>(r.G) * 8), "cudaMallocHost (sample results)");
      hResultsCap_ = static_cast<size_t>(r.G) * 8;
    }
    check(cudaMemcpyAsync(ints_, r.ints.data(), r.ints.size() * 4, cudaMemcpyHostToDevice, stream), "sample copy");
    check(cudaMemcpyAsync(floats_, r.gf.data(), r.gf.size() * 8, cudaMemcpyHostToDevice, stream), "sample copy");
    check(cudaMemcpyAsync(u_, r.u, static_cast<size_t>(r.N) * 8, cudaMemcpyHostToDevice, stream), "sample copy");
    if (r.qFloats > 0)
      check(cudaMemcpyAsync(q_, r.q, r.qFloats * 4, cudaMemcpyHostToDevice, stream), "sample copy (q)");
    const auto* gi = static_cast<const int32_t*>(ints_);
    const int32_t* rowGroup = gi + 6 * r.G;
    const int32_t* rowIndex = rowGroup + r.N;
    const int32_t* statsRow0 = rowIndex + r.N;
    const int32_t* drafts = statsRow0 + r.G;
    const int e = specdSampleAccept(static_cast<int32_t*>(results_), stats_, probsOut, logits, vocab, r.G, r.N,
                                    rowGroup, rowIndex, statsRow0, gi, static_cast<const double*>(floats_), drafts,
                                    static_cast<const double*>(u_),
                                    r.qDevice != nullptr ? r.qDevice : static_cast<const float*>(q_), stream);
    if (e != 0) throw std::runtime_error("sample: kernel launch failed with status " + std::to_string(e));
    check(cudaMemcpyAsync(hResults_, results_, static_cast<size_t>(r.G) * 8, cudaMemcpyDeviceToHost, stream),
          "sample results copy");
    check(cudaStreamSynchronize(stream), "sample (cudaStreamSynchronize)");
    return std::vector<int32_t>(hResults_, hResults_ + 2 * r.G);
  }

 private:
  void *ints_ = nullptr, *floats_ = nullptr, *u_ = nullptr, *q_ = nullptr, *stats_ = nullptr, *results_ = nullptr;
  size_t intsCap_ = 0, floatsCap_ = 0, uCap_ = 0, qCap_ = 0, statsCap_ = 0, resultsCap_ = 0;
  int32_t* hResults_ = nullptr;
  size_t hResultsCap_ = 0;

  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
  void grow(void** p, size_t* cap, size_t bytes) {
    if (bytes <= *cap) return;
    size_t want = *cap * 2 > bytes ? *cap * 2 : bytes;
    if (*p != nullptr) {
      check(cudaDeviceSynchronize(), "sample (cudaDeviceSynchronize)");  // the old buffer may be in use
      cudaFree(*p);
      *p = nullptr;
      *cap = 0;
    }
    check(cudaMalloc(p, want), "cudaMalloc (sample buffers)");
    *cap = want;
  }
};

}  // namespace
