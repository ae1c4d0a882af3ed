// The chunked (WY form) KDA math of one chunk of one head, as plain loops in a header so that the
// same source is compiled twice: for the baseline ISA in kda.cc (ChunkPortable) and with the
// AVX-512 flags in kda_avx512.cc (ChunkAvx512), where the compiler vectorises it 16 lanes wide.
// Plain header, static inline only, no STL (safe for the ISA files, see CMakeLists.txt).
//
// Within a chunk of L tokens, with G_t = g_0 + ... + g_t per key channel (<= 0; kimi.py kda_chunked):
//   Akk[t][s] = sum_i k_t k_s e^{G_t - G_s} (s < t),  Aqk[t][s] = sum_i q_t k_s e^{G_t - G_s} (s <= t)
//   u_t = beta_t (v_t - (k_t . e^{G_t}) S0) - sum_{s<t} beta_t Akk[t][s] u_s     (forward substitution)
//   o_t = (q_t . e^{G_t}) S0 + sum_{s<=t} Aqk[t][s] u_s
//   S   = e^{G_L-1} . S0 + sum_s (k_s . e^{G_L-1 - G_s}) u_s^T
// Every exponent is <= 0, so nothing overflows in fp32. Fixed summation orders: the pairwise dot
// products use 16 interleaved partial sums (Dot below), every other sum runs over its index in
// ascending order with one accumulator per output element; nothing depends on other heads,
// sequences or threads.
#pragma once
#include <cstdint>

#include "kda_math.h"

namespace specd {
namespace kda {

/** One chunk of one head. All pointers are the caller's; scratch sizes in comments. */
struct ChunkArgs {
  float* state;       // S0 in, S out: [d][d]
  int64_t d, L;       // head dim, tokens in this chunk (<= stride)
  int64_t stride;     // row stride of akk/aqk (the chunk size)
  const float* q;     // [L][d] normalised, scaled
  const float* k;     // [L][d] normalised
  const float* v;     // [L][d]
  const float* G;     // [L][d] cumulative log decay within the chunk
  const float* beta;  // [L]
  float* out;         // o_t at out + t * ldo
  int64_t ldo;
  float *u, *r, *o;  // [L][d] each
  float *akk, *aqk;  // [L][stride] each
  float *wrow, *ke;  // [stride], [d]
};

/**
 * sum_i a[i] * b[i] with 16 interleaved partial sums (lane l takes i = l mod 16, in order), then
 * the partials and the tail added in index order: a fixed order, vectorisable without
 * reassociation.
 */
static inline float ChunkDot(const float* a, const float* b, int64_t n) {
  float part[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int64_t l = 0; l < 16; ++l) part[l] = part[l] + a[i + l] * b[i + l];
  float sum = 0.0f;
  for (int64_t l = 0; l < 16; ++l) sum = sum + part[l];
  for (; i < n; ++i) sum = sum + a[i] * b[i];
  return sum;
}

static inline void ChunkMath(const ChunkArgs& c) {
  const int64_t d = c.d, L = c.L, C = c.stride;
  const float *q = c.q, *k = c.k, *v = c.v, *G = c.G;
  float *u = c.u, *r = c.r, *o = c.o, *akk = c.akk, *aqk = c.aqk, *wrow = c.wrow, *ke = c.ke;
  float* state = c.state;
  // Pairwise products with e^{G_t - G_s}, s <= t.
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t s = 0; s <= t; ++s) {
      for (int64_t i = 0; i < d; ++i) ke[i] = G[t * d + i] - G[s * d + i];
      ExpArray(ke, ke, d);
      for (int64_t i = 0; i < d; ++i) ke[i] = k[s * d + i] * ke[i];
      akk[t * C + s] = ChunkDot(k + t * d, ke, d);
      aqk[t * C + s] = ChunkDot(q + t * d, ke, d);
    }
  }
  // Inter-chunk terms from S0: r_t = (k_t . e^{G_t}) S0 and o_t = (q_t . e^{G_t}) S0.
  for (int64_t t = 0; t < L; ++t) {
    float* rt = r + t * d;
    float* ot = o + t * d;
    for (int64_t j = 0; j < d; ++j) rt[j] = ot[j] = 0.0f;
    ExpArray(G + t * d, ke, d);
    for (int64_t i = 0; i < d; ++i) {
      const float kc = k[t * d + i] * ke[i], qc = q[t * d + i] * ke[i];
      const float* srow = state + i * d;
      for (int64_t j = 0; j < d; ++j) {
        rt[j] = rt[j] + kc * srow[j];
        ot[j] = ot[j] + qc * srow[j];
      }
    }
  }
  // U by forward substitution, then the intra-chunk output.
  for (int64_t t = 0; t < L; ++t) {
    const float bt = c.beta[t];
    float* ut = u + t * d;
    for (int64_t j = 0; j < d; ++j) ut[j] = bt * (v[t * d + j] - r[t * d + j]);
    for (int64_t s = 0; s < t; ++s) {
      const float a = bt * akk[t * C + s];
      const float* us = u + s * d;
      for (int64_t j = 0; j < d; ++j) ut[j] = ut[j] - a * us[j];
    }
  }
  for (int64_t t = 0; t < L; ++t) {
    float* ot = o + t * d;
    for (int64_t s = 0; s <= t; ++s) {
      const float a = aqk[t * C + s];
      const float* us = u + s * d;
      for (int64_t j = 0; j < d; ++j) ot[j] = ot[j] + a * us[j];
    }
    float* dst = c.out + t * c.ldo;
    for (int64_t j = 0; j < d; ++j) dst[j] = ot[j];
  }
  // State update.
  const float* Gl = G + (L - 1) * d;
  ExpArray(Gl, ke, d);
  for (int64_t i = 0; i < d; ++i) {
    float* srow = state + i * d;
    const float el = ke[i];
    for (int64_t j = 0; j < d; ++j) srow[j] = el * srow[j];
    for (int64_t s = 0; s < L; ++s) wrow[s] = Gl[i] - G[s * d + i];
    ExpArray(wrow, wrow, L);
    for (int64_t s = 0; s < L; ++s) wrow[s] = k[s * d + i] * wrow[s];
    for (int64_t s = 0; s < L; ++s) {
      const float cs = wrow[s];
      const float* us = u + s * d;
      for (int64_t j = 0; j < d; ++j) srow[j] = srow[j] + cs * us[j];
    }
  }
}

}  // namespace kda
}  // namespace specd
