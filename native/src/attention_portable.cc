// Portable attention kernels (baseline ISA, -ffp-contract=off): the reduction order of
// attention_kernels.h with scalar std::exp, separate multiply and add, and 8-lane partial dot
// products (written elementwise so the compiler may vectorise them without reassociating).
#include <cmath>
#include <limits>

#include "attention_kernels.h"

namespace specd {
namespace attn {
namespace {

/** dot(a, b) over n: 8 partial sums (lane = i mod 8 over full groups of 8), tail into lane 0..,
 *  combined as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)). */
inline float Dot(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] = s[l] + a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) s[l] = s[l] + a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

void AttendTilePortable(const Tile& t, float* scratch) {
  const int64_t dk = t.k.dim;
  const int64_t dv = t.v.dim;
  float* acc = scratch;  // [dv] of the current row
  float s[kChunk];
  const float* vp[kChunk];
  for (int r = 0; r < t.rows; ++r) {
    const Row& row = t.row[r];
    if (row.hi <= row.lo) {
      for (int64_t d = 0; d < dv; ++d) row.out[d] = 0.0f;
      continue;
    }
    for (int64_t d = 0; d < dv; ++d) acc[d] = 0.0f;
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    for (int64_t c0 = row.lo / kChunk * kChunk; c0 < row.hi; c0 += kChunk) {
      const int64_t jb = row.lo > c0 ? row.lo : c0;
      const int64_t je = row.hi < c0 + kChunk ? row.hi : c0 + kChunk;
      float mc = -std::numeric_limits<float>::infinity();
      const float* kp[kChunk];
      RowPtrs(t.k, t.table, t.page_size, jb, je, t.kv_head, kp);
      RowPtrs(t.v, t.table, t.page_size, jb, je, t.kv_head, vp);
      for (int64_t j = jb; j < je; ++j) {
        s[j - jb] = Dot(row.q, kp[j - jb], dk) * t.scale;
        mc = s[j - jb] > mc ? s[j - jb] : mc;
      }
      const float mn = m > mc ? m : mc;
      const float alpha = std::exp(m - mn);  // exp(-inf) = 0 on the first chunk
      float sum = 0.0f;
      for (int64_t j = 0; j < je - jb; ++j) {
        s[j] = std::exp(s[j] - mn);
        sum = sum + s[j];
      }
      l = l * alpha + sum;
      for (int64_t d = 0; d < dv; ++d) acc[d] = acc[d] * alpha;
      for (int64_t j = 0; j < je - jb; ++j) {
        const float pj = s[j];
        const float* v = vp[j];
        for (int64_t d = 0; d < dv; ++d) acc[d] = acc[d] + pj * v[d];
      }
      m = mn;
    }
    const float inv = 1.0f / l;
    for (int64_t d = 0; d < dv; ++d) row.out[d] = acc[d] * inv;
  }
}

void RowsTimesMatrixPortable(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t k, int64_t n, float* y,
                             int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * ldy;
    for (int64_t j = 0; j < n; ++j) yr[j] = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const float xi = x[r * ldx + i];
      const float* wi = w + i * n;
      for (int64_t j = 0; j < n; ++j) yr[j] = yr[j] + xi * wi[j];
    }
  }
}

}  // namespace attn
}  // namespace specd
