// @specd/native-cuda: sampling and rejection acceptance on the device, so a sampled request's logits stay on the GPU
// and only token ids come back (issue 18). The same distribution as the CPU path (packages/core/src/engine/probs.ts,
// native/src/sampling.cc's samplingProbs): x = f32(logit / T) (the division in double), top-k keeps x ≥ the k-th
// largest (ties at the boundary all kept), top-p keeps the smallest prefix of the tokens sorted by (probability
// desc, index asc) of softmax(top-k-masked x) whose mass reaches p (at least one token), and the result is
// softmax over what is kept: p_i = expf(x_i − max) · f32(1 / Σ kept expf(x_j − max)), the sum in double.
//
// Two launches:
//   sampleRowStats  one block per logit row of the groups: the row's max, its top-k threshold (a radix select over
//                   the order-preserving bits of x, integer counts), its top-p cut (a radix select over the bits of
//                   the top-k probabilities weighted by their mass in 2^-40 fixed point: integer sums, so the bits
//                   do not depend on the order of the atomics; ties at the cut kept in index order), the two
//                   normalisers, and whether the row holds a NaN or +Inf or no finite value.
//   sampleDecide    one block per group (a sequence's k drafts and its k + 1 verify rows): rejection sampling
//                   (Leviathan et al., arXiv 2211.17192; REFERENCE.md §6): draft j is accepted when
//                   u_j · q_j(x_j) < p_j(x_j) (q a point mass when the drafter gave no probabilities); at the first
//                   rejection a token is drawn from norm(max(0, p_j − q_j)) (p_j itself when that is all zero), and
//                   when every draft is accepted the bonus token from p_k, both with u_k: k + 1 uniforms a group.
//                   The draw is the inverse CDF over the vocabulary in index order: each thread owns a contiguous
//                   chunk, chunk sums in double are scanned in a fixed order, and the thread whose range holds u ·
//                   total walks its chunk. Every sum has a fixed order, so a group's result depends on its own rows,
//                   drafts, q and uniforms only: the same seed gives the same tokens on the same device.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.h"

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr double kMassOne = 1099511627776.0;  // 2^40: fixed-point unit of a probability in the top-p select

/** Per-row results of sampleRowStats (see the file comment). */
struct RowStats {
  float m;         // max over x (−Inf when none is finite)
  float kth;       // x threshold of top-k (−Inf: top-k off)
  float invZ1;     // f32(1 / Σ_{x ≥ kth} expf(x − m)): the top-k probabilities, whose bits top-p compares
  float invZ2;     // f32(1 / Σ_{kept} expf(x − m)): the sampling probabilities
  uint32_t pKey;   // top-p: keep probability bits > pKey, and == pKey up to index tieIdx (pKey 0, tieIdx −1: off)
  int32_t tieIdx;  //
  int32_t bad;     // the row holds a NaN or +Inf, or no finite value: nothing can be drawn from it
  int32_t topP;    // whether the top-p cut applies
};

/** x = f32(logit / T), the division in double as the CPU path's. */
__device__ __forceinline__ float scaled(float logit, double temperature) {
  return static_cast<float>(static_cast<double>(logit) / temperature);
}

/** An unsigned key with the order of the float x (−0 below +0; NaN never reaches here). */
__device__ __forceinline__ uint32_t orderKey(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float fromOrderKey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/** The sampling probability of token `i` with scaled value x in a row with stats `s` (0 when masked). */
__device__ __forceinline__ float probOf(const RowStats& s, float x, int i) {
  if (!(x >= s.kth)) return 0.f;
  const float e = expf(x - s.m);
  if (s.topP) {
    const uint32_t key = __float_as_uint(e * s.invZ1);
    if (key < s.pKey || (key == s.pKey && i > s.tieIdx)) return 0.f;
  }
  return e * s.invZ2;
}

/** Block sum of a per-thread double in a fixed order (warp butterfly, then warp 0 over the warps). */
__device__ double blockSum(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    double w = threadIdx.x < kWarps ? red[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) red[32] = w;
  }
  __syncthreads();
  const double r = red[32];
  __syncthreads();
  return r;
}

/**
 * Inclusive block scan of a per-thread value in thread order (fixed: shuffles within a warp, then the warps' totals
 * scanned by warp 0). `red` holds ≥ 32 values.
 */
template <typename T>
__device__ T blockScan(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < kWarps ? red[lane] : T(0);
    for (int o = 1; o < 32; o <<= 1) {
      const T n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    red[lane] = w;  // inclusive over the warps
  }
  __syncthreads();
  const T r = v + (warp > 0 ? red[warp - 1] : T(0));
  __syncthreads();
  return r;
}

/** The group of a verify row: rows[g] … rows[g] + k of group g (g found by a scan of the few groups). */
struct Group {
  int row0, k, draftOff, uOff, qOff, topK;
  double temperature, topP;
};

__device__ Group loadGroup(const int32_t* gi, const double* gf, int g) {
  Group r;
  r.row0 = gi[g * 6];
  r.k = gi[g * 6 + 1];
  r.draftOff = gi[g * 6 + 2];
  r.uOff = gi[g * 6 + 3];
  r.qOff = gi[g * 6 + 4];
  r.topK = gi[g * 6 + 5];
  r.temperature = gf[g * 2];
  r.topP = gf[g * 2 + 1];
  return r;
}

/**
 * One block per stats row: stats row `blockIdx.x` is logit row group.row0 + j of the group whose rows hold it
 * (`rowGroup[blockIdx.x]`, `rowIndex[blockIdx.x]` = that logit row). See the file comment.
 */
__global__ void __launch_bounds__(kThreads)
    sampleRowStats(RowStats* stats, const float* logits, int vocab, const int32_t* rowGroup, const int32_t* rowIndex,
                   const int32_t* gi, const double* gf) {
  __shared__ double red[33];
  __shared__ int ired[32];
  __shared__ unsigned int cnt[256];
  __shared__ unsigned long long mass[256];
  __shared__ uint32_t sel;
  __shared__ unsigned long long above, massSel;
  __shared__ int remaining, flags, keepAll;
  static_assert(kWarps <= 32, "one warp reduces the warps");
  __shared__ float smax, wmax[kWarps];
  __shared__ int wbad[kWarps], tieAt;
  const Group g = loadGroup(gi, gf, rowGroup[blockIdx.x]);
  const float* row = logits + static_cast<int64_t>(rowIndex[blockIdx.x]) * vocab;
  const int t = threadIdx.x;
  RowStats s;
  s.kth = -INFINITY;
  s.pKey = 0;
  s.tieIdx = -1;
  s.topP = 0;
  s.bad = 0;
  // the max and whether the row is bad (NaN or +Inf anywhere)
  float m = -INFINITY;
  int bad = 0;
  for (int i = t; i < vocab; i += kThreads) {
    const float x = scaled(row[i], g.temperature);
    if (x != x || x == INFINITY) bad = 1;
    else m = fmaxf(m, x);
  }
  for (int o = 16; o > 0; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    bad |= __shfl_xor_sync(0xffffffffu, bad, o);
  }
  if ((t & 31) == 0) {
    wmax[t >> 5] = m;
    wbad[t >> 5] = bad;
  }
  __syncthreads();
  if (t == 0) {
    float mm = -INFINITY;
    int bb = 0;
    for (int w = 0; w < kWarps; w++) {
      mm = fmaxf(mm, wmax[w]);
      bb |= wbad[w];
    }
    smax = mm;
    flags = bb;
  }
  __syncthreads();
  s.m = smax;
  s.bad = flags || s.m == -INFINITY;
  if (s.bad) {
    if (t == 0) stats[blockIdx.x] = s;
    return;
  }
  // top-k: the topK-th largest x by a radix select over orderKey (MSB digit first, integer counts)
  if (g.topK > 0 && g.topK < vocab) {
    uint32_t prefix = 0;
    if (t == 0) remaining = g.topK;
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (t < 256) cnt[t] = 0;
      __syncthreads();
      const uint32_t hiMask = shift == 24 ? 0u : ~((1u << (shift + 8)) - 1u);
      for (int i = t; i < vocab; i += kThreads) {
        const uint32_t key = orderKey(scaled(row[i], g.temperature));
        if ((key & hiMask) == (prefix & hiMask)) atomicAdd(&cnt[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (t == 0) {
        int need = remaining, b = 255;
        for (; b > 0; b--) {
          if (static_cast<int>(cnt[b]) >= need) break;
          need -= static_cast<int>(cnt[b]);
        }
        remaining = need;
        sel = static_cast<uint32_t>(b);
      }
      __syncthreads();
      prefix |= sel << shift;
      __syncthreads();
    }
    s.kth = fromOrderKey(prefix);
  }
  // Z1 over the top-k survivors
  double z = 0.0;
  for (int i = t; i < vocab; i += kThreads) {
    const float x = scaled(row[i], g.temperature);
    if (x >= s.kth) z += static_cast<double>(expf(x - s.m));
  }
  const double z1 = blockSum(z, red);
  s.invZ1 = static_cast<float>(1.0 / z1);
  s.invZ2 = s.invZ1;
  if (g.topP < 1.0) {
    // top-p: the probability bits at which the mass of the larger ones (ties in index order) reaches p
    s.topP = 1;
    const double P = g.topP * kMassOne;
    uint32_t prefix = 0;
    if (t == 0) {
      above = 0ull;
      keepAll = 0;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (t < 256) {
        cnt[t] = 0;
        mass[t] = 0ull;
      }
      __syncthreads();
      const uint32_t hiMask = shift == 24 ? 0u : ~((1u << (shift + 8)) - 1u);
      for (int i = t; i < vocab; i += kThreads) {
        const float x = scaled(row[i], g.temperature);
        if (!(x >= s.kth)) continue;
        const float pr = expf(x - s.m) * s.invZ1;
        const uint32_t key = __float_as_uint(pr);
        if ((key & hiMask) != (prefix & hiMask)) continue;
        const uint32_t b = (key >> shift) & 255u;
        atomicAdd(&cnt[b], 1u);
        atomicAdd(&mass[b], static_cast<unsigned long long>(llrint(static_cast<double>(pr) * kMassOne)));
      }
      __syncthreads();
      if (t == 0 && !keepAll) {
        unsigned long long a = above;
        int b = 255;
        for (; b >= 0; b--) {
          if (cnt[b] == 0) continue;
          if (static_cast<double>(a + mass[b]) >= P) break;
          a += mass[b];
        }
        if (b < 0) {
          keepAll = 1;  // the fixed-point mass fell short of p by rounding: keep every survivor of top-k
          b = 0;
        }
        above = a;
        massSel = mass[b];
        remaining = static_cast<int>(cnt[b]);
        sel = static_cast<uint32_t>(b);
      }
      __syncthreads();
      prefix |= sel << shift;
      __syncthreads();
    }
    if (keepAll) {
      s.topP = 0;
    } else {
      // `remaining` tokens tie at probability bits `prefix`, each of mass massSel / remaining: keep the first c of
      // them in index order, c the fewest that reach p
      const unsigned long long each = massSel / static_cast<unsigned long long>(remaining);
      const double short_ = P - static_cast<double>(above);
      int c = each == 0 ? remaining : static_cast<int>(ceil(short_ / static_cast<double>(each)));
      c = max(1, min(c, remaining));
      s.pKey = prefix;
      // the c-th tie in index order: contiguous chunks, counts scanned in thread order
      const int chunk = (vocab + kThreads - 1) / kThreads;
      const int lo = t * chunk, hi = min(vocab, lo + chunk);
      int mine = 0;
      for (int i = lo; i < hi; i++) {
        const float x = scaled(row[i], g.temperature);
        if (x >= s.kth && __float_as_uint(expf(x - s.m) * s.invZ1) == prefix) mine++;
      }
      if (t == 0) tieAt = -1;
      const int incl = blockScan(mine, ired);  // its syncs also publish tieAt
      if (incl - mine < c && c <= incl) {
        int seen = incl - mine;
        for (int i = lo; i < hi; i++) {
          const float x = scaled(row[i], g.temperature);
          if (x >= s.kth && __float_as_uint(expf(x - s.m) * s.invZ1) == prefix && ++seen == c) {
            tieAt = i;
            break;
          }
        }
      }
      __syncthreads();
      s.tieIdx = tieAt;
    }
  }
  // Z2 over what both cuts keep
  if (s.topP) {
    double z2 = 0.0;
    for (int i = t; i < vocab; i += kThreads) {
      const float x = scaled(row[i], g.temperature);
      if (!(x >= s.kth)) continue;
      const float e = expf(x - s.m);
      const uint32_t key = __float_as_uint(e * s.invZ1);
      if (key > s.pKey || (key == s.pKey && i <= s.tieIdx)) z2 += static_cast<double>(e);
    }
    s.invZ2 = static_cast<float>(1.0 / blockSum(z2, red));
  }
  if (t == 0) stats[blockIdx.x] = s;
}

/**
 * Draws from row `row` (stats `s`): weights w_i = p_i, or max(0, p_i − q_i) when `resid` (q a point mass at `point`
 * when `q` is null), by the inverse CDF at u · Σw in index order; −1 when the weights have no positive finite total.
 * Called by the whole block; every thread gets the token.
 */
__device__ int drawRow(const float* row, const RowStats& s, int vocab, double temperature, bool resid, const float* q,
                       int point, double u, double* red, int* pick) {
  const int t = threadIdx.x;
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int lo = min(vocab, t * chunk), hi = min(vocab, lo + chunk);
  auto weight = [&](int i) -> float {
    const float p = probOf(s, scaled(row[i], temperature), i);
    if (!resid) return p;
    const float qi = q != nullptr ? q[i] : (i == point ? 1.f : 0.f);
    return fmaxf(0.f, p - qi);
  };
  double sum = 0.0;
  int lastPos = -1;
  for (int i = lo; i < hi; i++) {
    const float w = weight(i);
    if (w > 0.f) {
      sum += static_cast<double>(w);
      lastPos = i;
    }
  }
  const double incl = blockScan(sum, red);
  if (t == kThreads - 1) red[32] = incl;
  if (t == 0) pick[0] = -1;
  __syncthreads();
  const double total = red[32];
  __syncthreads();
  if (!(total > 0.0 && total < INFINITY)) return -2;  // the caller falls back (residual) or fails the row
  const double target = u * total;
  const double excl = incl - sum;
  // the thread whose range holds target walks its chunk; target ≥ total (rounding at u → 1): the last positive token
  atomicMax(&pick[1], lastPos);  // pick[1] starts at −1 (set by the caller)
  if (sum > 0.0 && excl <= target && target < incl) {
    const double local = target - excl;
    double acc = 0.0;
    int chosen = lastPos;
    for (int i = lo; i < hi; i++) {
      const float w = weight(i);
      if (!(w > 0.f)) continue;
      acc += static_cast<double>(w);
      if (local < acc) {
        chosen = i;
        break;
      }
    }
    pick[0] = chosen;
  }
  __syncthreads();
  const int r = pick[0] >= 0 ? pick[0] : pick[1];
  __syncthreads();
  return r;
}

/**
 * One block per group: rejection sampling over its k drafts, then the draw (file comment). results[2g] = accepted
 * drafts, results[2g + 1] = the token drawn, or −1 when a row it used holds a NaN / +Inf / no finite value (accepted
 * then names that row).
 */
__global__ void __launch_bounds__(kThreads)
    sampleDecide(int32_t* results, const RowStats* stats, const int32_t* statsRow0, const float* logits, int vocab,
                 const int32_t* rowIndex, const int32_t* gi, const double* gf, const int32_t* drafts,
                 const double* uniforms, const float* q) {
  __shared__ double red[33];
  __shared__ int pick[2];
  __shared__ int decided;
  const int gIdx = blockIdx.x;
  const Group g = loadGroup(gi, gf, gIdx);
  const int base = statsRow0[gIdx];  // stats row of the group's verify row 0
  const double* u = uniforms + g.uOff;
  if (threadIdx.x == 0) {
    int j = 0;
    for (; j < g.k; j++) {
      const RowStats& s = stats[base + j];
      if (s.bad) break;
      const int x = drafts[g.draftOff + j];
      const float* row = logits + static_cast<int64_t>(rowIndex[base + j]) * vocab;
      const float px = probOf(s, scaled(row[x], g.temperature), x);
      const float qx = g.qOff >= 0 ? q[static_cast<int64_t>(g.qOff + j) * vocab + x] : 1.f;
      if (!(u[j] * static_cast<double>(qx) < static_cast<double>(px))) break;
    }
    decided = j;
  }
  __syncthreads();
  const int j = decided;
  const RowStats s = stats[base + j];
  if (s.bad) {
    if (threadIdx.x == 0) {
      results[2 * gIdx] = j;
      results[2 * gIdx + 1] = -1;
    }
    return;
  }
  const float* row = logits + static_cast<int64_t>(rowIndex[base + j]) * vocab;
  const bool rejected = j < g.k;
  const float* qRow = rejected && g.qOff >= 0 ? q + static_cast<int64_t>(g.qOff + j) * vocab : nullptr;
  const int point = rejected ? drafts[g.draftOff + j] : -1;
  if (threadIdx.x == 0) pick[1] = -1;
  __syncthreads();
  int tok = drawRow(row, s, vocab, g.temperature, rejected, qRow, point, u[g.k], red, pick);
  if (tok == -2 && rejected) {
    // the residual is all zero (p ≤ q everywhere): draw from p itself, as the CPU path
    if (threadIdx.x == 0) pick[1] = -1;
    __syncthreads();
    tok = drawRow(row, s, vocab, g.temperature, false, nullptr, -1, u[g.k], red, pick);
  }
  if (threadIdx.x == 0) {
    results[2 * gIdx] = j;
    results[2 * gIdx + 1] = tok < 0 ? -1 : tok;
  }
}

/** The probabilities of each stats row from its stats: out [rows, vocab] f32 (tests compare them with the CPU). */
__global__ void sampleProbRows(float* out, const RowStats* stats, const float* logits, int vocab,
                               const int32_t* rowGroup, const int32_t* rowIndex, const int32_t* gi, const double* gf) {
  const Group g = loadGroup(gi, gf, rowGroup[blockIdx.x]);
  const RowStats s = stats[blockIdx.x];
  const float* row = logits + static_cast<int64_t>(rowIndex[blockIdx.x]) * vocab;
  float* o = out + static_cast<int64_t>(blockIdx.x) * vocab;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    o[i] = s.bad ? NAN : probOf(s, scaled(row[i], g.temperature), i);
}

/** out[r · outRowStride + outRow0, cols[i]] = in[r, i] for i < inCols: one block per row (other entries untouched). */
__global__ void scatterColsRows(float* out, const float* in, const int32_t* cols, int inCols, int outCols,
                                int outRowStride, int outRow0) {
  const int64_t r = blockIdx.x;
  float* o = out + (r * outRowStride + outRow0) * outCols;
  for (int i = threadIdx.x; i < inCols; i += blockDim.x) o[cols[i]] = in[r * inCols + i];
}

}  // namespace

size_t specdSampleStatsBytes(int rows) { return static_cast<size_t>(rows) * sizeof(RowStats); }

int specdSampleAccept(int32_t* results, void* statsWs, float* probsOut, const float* logits, int vocab, int groups,
                      int statRows, const int32_t* rowGroup, const int32_t* rowIndex, const int32_t* statsRow0,
                      const int32_t* gi, const double* gf, const int32_t* drafts, const double* uniforms,
                      const float* q, cudaStream_t stream) {
  if (statRows <= 0 || groups <= 0) return 0;
  auto* stats = static_cast<RowStats*>(statsWs);
  sampleRowStats<<<statRows, kThreads, 0, stream>>>(stats, logits, vocab, rowGroup, rowIndex, gi, gf);
  if (probsOut != nullptr)
    sampleProbRows<<<statRows, 256, 0, stream>>>(probsOut, stats, logits, vocab, rowGroup, rowIndex, gi, gf);
  if (results != nullptr)
    sampleDecide<<<groups, kThreads, 0, stream>>>(results, stats, statsRow0, logits, vocab, rowIndex, gi, gf, drafts,
                                                  uniforms, q);
  return static_cast<int>(cudaGetLastError());
}

int specdScatterCols(float* out, const float* in, const int32_t* cols, int rows, int inCols, int outCols,
                     int outRowStride, int outRow0, cudaStream_t stream) {
  if (rows <= 0) return 0;
  scatterColsRows<<<rows, 256, 0, stream>>>(out, in, cols, inCols, outCols, outRowStride, outRow0);
  return static_cast<int>(cudaGetLastError());
}
