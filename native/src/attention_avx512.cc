// AVX-512 attention kernels (reduction order: attention_kernels.h). Compiled with the AVX-512
// flags; called only when isa.cc reports AVX-512. Intrinsics only, no STL (ODR, CMakeLists.txt).
//
// Per tile: the rows' visible key intervals are united; for each 16-key chunk the K and V row
// addresses are resolved once through the block table (slots outside the union read a zero row)
// and the next chunk's rows are prefetched. Tiles of >= kPackRows rows (>= 4 where a row stride is a
// multiple of 4 KiB) first copy the chunk's rows into a blocked buffer [dim/16][16 slots][16 floats]
// (one head's rows sit numKvHeads*headDim*4 bytes apart in NHD pages, 4 KiB for 8 heads of 128: they
// would fight for the same L1 sets; the copy holds the same values, so it never changes a result).
// Then every row of the tile computes
//   scores: 16 accumulators, one per key slot i, acc_i += q[16b..] * k_i[16b..] for the 16-float
//           blocks b = 0, 1, … of dim in order (masked tail block last); then one fixed
//           transpose-and-add tree turns acc_0..acc_15 into the score vector (lane i = key slot i):
//           pairs (unpacklo + unpackhi), quads (shuffle_ps 0x44 + 0xEE), 128-bit lanes
//           (shuffle_f32x4 0x88 + 0xDD, twice); times scale. In lane terms: score_i = (G_0 + G_1) +
//           (G_2 + G_3), G_g = (acc_i[4g] + acc_i[4g+2]) + (acc_i[4g+1] + acc_i[4g+3]). Packed tiles of at
//           least kTransposedRows rows (prefill chunks, long verify blocks; headDim a multiple of 16) compute the
//           same chains and the same tree from the chunk's K transposed once ([dim][16 slots]: key slots in the
//           lanes), which needs no transposes per row and loads each K vector once for 4 rows (ScoresT);
//   its online-softmax update (vector exp, Cephes-style polynomial, ~1 ulp; l = fma(l, alpha, Σ p) with Σ p
//           in SumTree16's fixed tree); the tiles that score from the transposed K run this update for 16 rows at a
//           time (maxima, alpha and the sums as vectors over the rows: the same operations per row);
//   its P·V update: acc = acc * alpha, then acc = fma(p_j, v_j, acc) for its visible j ascending;
//           up to 4 consecutive rows that see the same keys of the chunk share the V loads.
// Rows share loads only, never arithmetic: each row's result is the same in any tile.
#include <immintrin.h>

#include "attention_kernels.h"

namespace specd {
namespace attn {
namespace {

/** exp(x) for x in [-88, 88] (clamped): n = round(x log2 e), r = x - n ln2 (two-part), degree-5
 *  polynomial (Cephes expf), times 2^n. exp(0) = 1 exactly. */
inline __m512 Exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

inline __mmask16 TailMask(int64_t valid) {
  return valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1u);
}

/**
 * The chunk's 16 K (or V) rows: row pointers (slots outside the union point to a zero row), or a
 * packed copy in blocks [dim/16][16 slots][16 floats] (block b of slot i at blocked + (b*16+i)*16),
 * which reads with constant offsets and no L1 set conflicts. Both give the same values.
 */
struct ChunkRows {
  const float* const* ptr;
  const float* blocked;
};

template <bool Blocked>
inline const float* At(const ChunkRows& c, int64_t i, int64_t d) {
  return Blocked ? c.blocked + ((d >> 4) * 16 + i) * 16 : c.ptr[i] + d;
}

/** Scores of 16 key slots for one row: s[i] = dot(q, k_i) over n (see the file comment). */
template <bool Blocked>
inline __m512 Scores16(const float* q, const ChunkRows& k, int64_t n) {
  __m512 a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    const __m512 qb = _mm512_loadu_ps(q + d);
    for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(qb, _mm512_loadu_ps(At<Blocked>(k, i, d)), a[i]);
  }
  if (d < n) {
    const __mmask16 m = TailMask(n - d);
    const __m512 qb = _mm512_maskz_loadu_ps(m, q + d);
    for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(qb, _mm512_maskz_loadu_ps(m, At<Blocked>(k, i, d)), a[i]);
  }
  __m512 x[8];
  for (int i = 0; i < 8; ++i)
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  __m512 y[4];
  for (int i = 0; i < 4; ++i)
    y[i] =
        _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44), _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xEE));
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88), _mm512_shuffle_f32x4(y[2], y[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
}

/** Copies row src[0:n] into slot i of a blocked chunk buffer (tail lanes of the last block zero). */
inline void PackRow(float* blocked, int64_t i, const float* src, int64_t n) {
  for (int64_t d = 0; d < n; d += 16) {
    const __mmask16 m = TailMask(n - d);
    _mm512_storeu_ps(blocked + ((d >> 4) * 16 + i) * 16, _mm512_maskz_loadu_ps(m, src + d));
  }
}

/** Prefetches the n floats at p into L1, one hint per 64-byte line. */
inline void PrefetchRow(const float* p, int64_t n) {
  for (int64_t d = 0; d < n; d += 16) _mm_prefetch(reinterpret_cast<const char*>(p + d), _MM_HINT_T0);
}

/**
 * P·V update of N rows that see the same key slots [jb, je) of a chunk: per row and lane,
 * acc = acc * alpha, then acc = fma(p_j, v_j, acc) for j ascending (the rows share V loads only).
 */
template <int N, bool Blocked>
inline void PvGroup(float* const* a, const float* const* p, const float* alpha, int jb, int je, const ChunkRows& vr,
                    int64_t dv, __mmask16 vtail) {
  __m512 va[N];
  for (int n = 0; n < N; ++n) va[n] = _mm512_set1_ps(alpha[n]);
  int64_t d = 0;
  for (; d + 64 <= dv; d += 64) {  // 4 vectors per row: each p_j broadcast feeds 4 FMAs
    __m512 x[N][4];
    for (int n = 0; n < N; ++n)
      for (int u = 0; u < 4; ++u) x[n][u] = _mm512_mul_ps(_mm512_loadu_ps(a[n] + d + 16 * u), va[n]);
    for (int j = jb; j < je; ++j) {
      __m512 v[4];
      for (int u = 0; u < 4; ++u) v[u] = _mm512_loadu_ps(At<Blocked>(vr, j, d + 16 * u));
      for (int n = 0; n < N; ++n) {
        const __m512 pj = _mm512_set1_ps(p[n][j]);
        for (int u = 0; u < 4; ++u) x[n][u] = _mm512_fmadd_ps(pj, v[u], x[n][u]);
      }
    }
    for (int n = 0; n < N; ++n)
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(a[n] + d + 16 * u, x[n][u]);
  }
  for (; d + 32 <= dv; d += 32) {
    __m512 x[N][2];
    for (int n = 0; n < N; ++n) {
      x[n][0] = _mm512_mul_ps(_mm512_loadu_ps(a[n] + d), va[n]);
      x[n][1] = _mm512_mul_ps(_mm512_loadu_ps(a[n] + d + 16), va[n]);
    }
    for (int j = jb; j < je; ++j) {
      const __m512 v0 = _mm512_loadu_ps(At<Blocked>(vr, j, d));
      const __m512 v1 = _mm512_loadu_ps(At<Blocked>(vr, j, d + 16));
      for (int n = 0; n < N; ++n) {
        const __m512 pj = _mm512_set1_ps(p[n][j]);
        x[n][0] = _mm512_fmadd_ps(pj, v0, x[n][0]);
        x[n][1] = _mm512_fmadd_ps(pj, v1, x[n][1]);
      }
    }
    for (int n = 0; n < N; ++n) {
      _mm512_storeu_ps(a[n] + d, x[n][0]);
      _mm512_storeu_ps(a[n] + d + 16, x[n][1]);
    }
  }
  for (; d < dv; d += 16) {
    const __mmask16 dm = d + 16 <= dv ? static_cast<__mmask16>(0xFFFF) : vtail;
    __m512 x[N];
    for (int n = 0; n < N; ++n) x[n] = _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, a[n] + d), va[n]);
    for (int j = jb; j < je; ++j) {
      const __m512 v = _mm512_maskz_loadu_ps(dm, At<Blocked>(vr, j, d));
      for (int n = 0; n < N; ++n) x[n] = _mm512_fmadd_ps(_mm512_set1_ps(p[n][j]), v, x[n]);
    }
    for (int n = 0; n < N; ++n) _mm512_mask_storeu_ps(a[n] + d, dm, x[n]);
  }
}

/** In place: r[l] lane i becomes the old r[i] lane l (a 16 x 16 transpose in registers). */
inline void Transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  // now r[4q + e], 128-bit lane c = column 4c + e of rows 4q..4q+3; two lane shuffles gather each column
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

/** dst[l][i] = src[i][l] for a 16 x 16 block (row strides 16 floats). */
inline void Transpose16(const float* src, float* dst) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + 16 * i);
  Transpose16(r);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + 16 * i, r[i]);
}

/**
 * The sum of a row's 16 lanes in a fixed tree (GCC's _mm512_reduce_add_ps, written out so that every compiler
 * and the row-vectorised softmax below give the same bits): ((a0 + a8) + (a4 + a12)) + ((a2 + a10) + (a6 + a14)),
 * plus the same over the odd lanes, the even half first.
 */
inline float SumTree16(__m512 a) {
  const __m256 h =
      _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = _mm_add_ps(q, _mm_shuffle_ps(q, q, 0x4E));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 0x55)));
}

/** SumTree16 of 16 rows at once: u[j] lane r = lane j of row r (a transposed block); lane r of the result. */
inline __m512 SumTree16Rows(const __m512* u) {
  const auto pair = [&](int j) {  // (u_j + u_{j+8}) + (u_{j+4} + u_{j+12})
    return _mm512_add_ps(_mm512_add_ps(u[j], u[j + 8]), _mm512_add_ps(u[j + 4], u[j + 12]));
  };
  return _mm512_add_ps(_mm512_add_ps(pair(0), pair(2)), _mm512_add_ps(pair(1), pair(3)));
}

/**
 * Scores of 16 key slots for N rows from the chunk's transposed K (kt[d][slot], dk a multiple of 16):
 * the same arithmetic as Scores16 (lane l of key i's accumulator is the FMA chain over blocks b of
 * q[16b+l]*k_i[16b+l]; the lanes then add in Scores16's tree, (l, l+2), (l+1, l+3) within each quad,
 * quads 0+1 and 2+3, then the halves), with the key slots in the lanes instead of the dimensions: no
 * transposes per row, and each K vector loaded once for the N rows.
 */
template <int N>
inline void ScoresT(const float* const* q, const float* kt, int64_t dk, __m512* s) {
  __m512 half[N];
  for (int g = 0; g < 4; ++g) {
    __m512 a[N][4];
    for (int n = 0; n < N; ++n)
      for (int e = 0; e < 4; ++e) a[n][e] = _mm512_setzero_ps();
    for (int64_t b = 0; b < dk; b += 16) {
      for (int e = 0; e < 4; ++e) {
        const int64_t d = b + 4 * g + e;
        const __m512 kv = _mm512_loadu_ps(kt + 16 * d);
        for (int n = 0; n < N; ++n) a[n][e] = _mm512_fmadd_ps(_mm512_set1_ps(q[n][d]), kv, a[n][e]);
      }
    }
    for (int n = 0; n < N; ++n) {
      const __m512 h = _mm512_add_ps(_mm512_add_ps(a[n][0], a[n][2]), _mm512_add_ps(a[n][1], a[n][3]));
      if (g == 0 || g == 2) half[n] = h;
      else if (g == 1) s[n] = _mm512_add_ps(half[n], h);
      else s[n] = _mm512_add_ps(s[n], _mm512_add_ps(half[n], h));
    }
  }
}

constexpr float kNegInf = -__builtin_inff();

}  // namespace

/** Raw scores of the tile rows rows[0..N) into sbuf[row][kChunk] (ScoresT). */
template <int N>
static void ScoresRows(const Tile& t, const int* rows, const float* kt, int64_t dk, float* sbuf) {
  const float* q[N];
  for (int n = 0; n < N; ++n) q[n] = t.row[rows[n]].q;
  __m512 s[N];
  ScoresT<N>(q, kt, dk, s);
  for (int n = 0; n < N; ++n) _mm512_storeu_ps(sbuf + rows[n] * kChunk, s[n]);
}

template <bool Blocked>
static void PvDispatch(int n, float* const* ar, const float* const* pp, const float* al, int jb, int je,
                       const ChunkRows& vr, int64_t dv, __mmask16 vtail) {
  switch (n) {
    case 1: PvGroup<1, Blocked>(ar, pp, al, jb, je, vr, dv, vtail); break;
    case 2: PvGroup<2, Blocked>(ar, pp, al, jb, je, vr, dv, vtail); break;
    case 3: PvGroup<3, Blocked>(ar, pp, al, jb, je, vr, dv, vtail); break;
    default: PvGroup<4, Blocked>(ar, pp, al, jb, je, vr, dv, vtail); break;
  }
}

void AttendTileAvx512(const Tile& t, float* scratch) {
  const int64_t dk = t.k.dim;
  const int64_t dv = t.v.dim;
  const int64_t dk_pad = (dk + 15) / 16 * 16;
  const int64_t dv_pad = (dv + 15) / 16 * 16;
  float* acc = scratch;                  // [kMaxRows][dv]
  float* pr = acc + kMaxRows * dv;       // [kMaxRows][kChunk] probabilities of the current chunk
  float* m = pr + kMaxRows * kChunk;     // [kMaxRows] running max
  float* l = m + kMaxRows;               // [kMaxRows] running sum
  float* zero = l + kMaxRows;            // [dk] zeros: K row of the key slots outside the union
  float* kbuf = zero + dk_pad;           // [dk_pad/16][kChunk][16] packed K rows of the chunk
  float* vbuf = kbuf + kChunk * dk_pad;  // [dv_pad/16][kChunk][16] packed V rows
  float* kt = vbuf + kChunk * dv_pad;    // [dk][kChunk] transposed K rows (ScoresT)
  float* sbuf = kt + kChunk * dk_pad;    // [kMaxRows][kChunk] raw scores of the chunk (ScoresT)
  for (int64_t d = 0; d < dk; ++d) zero[d] = 0.0f;
  // V rows that are prefixes of the K rows (MLA latent) are read from the packed K rows.
  const bool shared_rows = t.v.base == t.k.base && t.v.page_stride == t.k.page_stride &&
                           t.v.token_stride == t.k.token_stride && t.v.head_stride == t.k.head_stride && dv <= dk;
  // Packing copies the same values (it never changes a result). It pays where one head's rows would share L1 sets
  // (a row stride of a multiple of 4 KiB) from 4 rows, and otherwise from kPackRows rows, enough to reuse each copy:
  // below that the copy costs more than it saves (SmolLM2's 3 KV heads × 64, 8 sequences × 2 query rows: 177–191 µs
  // packed, 148–165 not; docs/BENCHMARKS.md, "Paged attention: small tiles read their rows in place").
  const bool aliased = (t.k.token_stride * 4) % 4096 == 0 || (t.v.token_stride * 4) % 4096 == 0;
  const bool pack = t.rows >= (aliased ? 4 : kPackRows);
  // Large packed tiles (prefill, long verify blocks) score from the transposed K: the same bits as Scores16.
  const bool transposed = pack && t.rows >= kTransposedRows && dk % 16 == 0;
  int64_t lo = INT64_MAX;
  int64_t hi = INT64_MIN;
  for (int r = 0; r < t.rows; ++r) {
    const Row& row = t.row[r];
    if (row.hi <= row.lo) {
      for (int64_t d = 0; d < dv; ++d) row.out[d] = 0.0f;
      continue;
    }
    lo = row.lo < lo ? row.lo : lo;
    hi = row.hi > hi ? row.hi : hi;
    for (int64_t d = 0; d < dv; ++d) acc[r * dv + d] = 0.0f;
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  if (lo >= hi) return;
  const float* kp[kChunk];
  const float* vp[kChunk];
  const ChunkRows kr{kp, kbuf};
  const ChunkRows vr{vp, shared_rows ? kbuf : vbuf};
  float al[kMaxRows];                // alpha of each row for the current chunk
  int rbs[kMaxRows], res[kMaxRows];  // the row's visible slots [rbs, res) of the current chunk
  const __mmask16 vtail = TailMask(dv % 16 == 0 ? 16 : dv % 16);
  (void)dv_pad;
  for (int64_t c0 = lo / kChunk * kChunk; c0 < hi; c0 += kChunk) {
    const int64_t jb = lo > c0 ? lo : c0;
    const int64_t je = hi < c0 + kChunk ? hi : c0 + kChunk;
    for (int64_t i = 0; i < kChunk; ++i) kp[i] = zero;
    RowPtrs(t.k, t.table, t.page_size, jb, je, t.kv_head, kp + (jb - c0));
    RowPtrs(t.v, t.table, t.page_size, jb, je, t.kv_head, vp + (jb - c0));
    for (int64_t j = jb; j < je; ++j) {
      const int64_t i = j - c0;
      if (pack) {
        PackRow(kbuf, i, kp[i], dk);
        if (!shared_rows) PackRow(vbuf, i, vp[i], dv);
      }
    }
    if (pack) {  // slots outside the union: finite values (their lanes are masked out)
      for (int64_t i = 0; i < kChunk; ++i)
        if (i < jb - c0 || i >= je - c0) PackRow(kbuf, i, zero, dk);
    }
    if (transposed) {
      for (int64_t b = 0; b < dk; b += 16) Transpose16(kbuf + b * kChunk, kt + b * kChunk);
      int act[kMaxRows];
      int na = 0;
      for (int r = 0; r < t.rows; ++r) {
        const Row& row = t.row[r];
        if ((row.lo > c0 ? row.lo : c0) < (row.hi < c0 + kChunk ? row.hi : c0 + kChunk)) act[na++] = r;
      }
      int i = 0;
      for (; i + 4 <= na; i += 4) ScoresRows<4>(t, act + i, kt, dk, sbuf);
      switch (na - i) {
        case 3: ScoresRows<3>(t, act + i, kt, dk, sbuf); break;
        case 2: ScoresRows<2>(t, act + i, kt, dk, sbuf); break;
        case 1: ScoresRows<1>(t, act + i, kt, dk, sbuf); break;
        default: break;
      }
    }
    const int64_t ne = hi < c0 + 2 * kChunk ? hi : c0 + 2 * kChunk;  // next chunk: prefetch its rows
    if (c0 + kChunk < ne) {
      const float* next[2 * kChunk];
      const int64_t nn = ne - (c0 + kChunk);
      RowPtrs(t.k, t.table, t.page_size, c0 + kChunk, ne, t.kv_head, next);
      if (!shared_rows) RowPtrs(t.v, t.table, t.page_size, c0 + kChunk, ne, t.kv_head, next + kChunk);
      for (int64_t i = 0; i < nn; ++i) {
        PrefetchRow(next[i], dk);
        if (!shared_rows) PrefetchRow(next[kChunk + i], dv);
      }
    }
    if (transposed) {
      // The same online-softmax update as the per-row loop below, 16 rows at a time: the row maxima, alpha and
      // the row sums of p are vectors over the rows (a row max is the same in any order; the sums add in
      // SumTree16's tree), and only each row's exp of its scores stays per row.
      for (int r0 = 0; r0 < t.rows; r0 += 16) {
        const int nr = t.rows - r0 < 16 ? t.rows - r0 : 16;
        __m512 u[16];
        __mmask16 km[16];
        __mmask16 active = 0;
        for (int i = 0; i < 16; ++i) {
          const int r = r0 + i;
          km[i] = 0;
          u[i] = _mm512_set1_ps(kNegInf);
          if (i >= nr) continue;
          const Row& row = t.row[r];
          const int64_t rb = row.lo > c0 ? row.lo : c0;
          const int64_t re = row.hi < c0 + kChunk ? row.hi : c0 + kChunk;
          rbs[r] = res[r] = 0;
          if (rb >= re) continue;
          km[i] = static_cast<__mmask16>(TailMask(re - c0) & ~TailMask(rb - c0));
          active = static_cast<__mmask16>(active | (1u << i));
          u[i] = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), km[i],
                                    _mm512_mul_ps(_mm512_loadu_ps(sbuf + r * kChunk), _mm512_set1_ps(t.scale)));
          rbs[r] = static_cast<int>(rb - c0);
          res[r] = static_cast<int>(re - c0);
        }
        if (active == 0) continue;
        __m512 sv[16];
        for (int i = 0; i < 16; ++i) sv[i] = u[i];
        Transpose16(u);
        __m512 mc = u[0];
        for (int j = 1; j < 16; ++j) mc = _mm512_max_ps(mc, u[j]);
        const __m512 mo = _mm512_maskz_loadu_ps(active, m + r0);
        const __m512 mn = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mo, mc, _CMP_GT_OQ), mc, mo);
        const __m512 alpha =
            _mm512_mask_mov_ps(Exp(_mm512_sub_ps(mo, mn)), _mm512_cmp_ps_mask(mo, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ),
                               _mm512_setzero_ps());
        alignas(64) float mnv[16];
        _mm512_store_ps(mnv, mn);
        for (int i = 0; i < 16; ++i) {
          if (!((active >> i) & 1)) {
            u[i] = _mm512_setzero_ps();
            continue;
          }
          u[i] = _mm512_maskz_mov_ps(km[i], Exp(_mm512_sub_ps(sv[i], _mm512_set1_ps(mnv[i]))));
          _mm512_storeu_ps(pr + (r0 + i) * kChunk, u[i]);
        }
        Transpose16(u);
        const __m512 lv = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(active, l + r0), alpha, SumTree16Rows(u));
        _mm512_mask_storeu_ps(l + r0, active, lv);
        _mm512_mask_storeu_ps(m + r0, active, mn);
        _mm512_mask_storeu_ps(al + r0, active, alpha);
      }
    } else {
      for (int r = 0; r < t.rows; ++r) {
        const Row& row = t.row[r];
        const int64_t rb = row.lo > c0 ? row.lo : c0;
        const int64_t re = row.hi < c0 + kChunk ? row.hi : c0 + kChunk;
        rbs[r] = res[r] = 0;
        if (rb >= re) continue;
        const __mmask16 mask = static_cast<__mmask16>(TailMask(re - c0) & ~TailMask(rb - c0));
        const __m512 sc = pack ? Scores16<true>(row.q, kr, dk) : Scores16<false>(row.q, kr, dk);
        const __m512 sv = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), mask, _mm512_mul_ps(sc, _mm512_set1_ps(t.scale)));
        const float mc = _mm512_reduce_max_ps(sv);
        const float mn = m[r] > mc ? m[r] : mc;
        const __m512 e = _mm512_maskz_mov_ps(mask, Exp(_mm512_sub_ps(sv, _mm512_set1_ps(mn))));
        const float alpha = m[r] == kNegInf ? 0.0f : _mm512_cvtss_f32(Exp(_mm512_set1_ps(m[r] - mn)));
        l[r] = __builtin_fmaf(l[r], alpha, SumTree16(e));  // l·alpha + Σ p, one rounding
        m[r] = mn;
        _mm512_storeu_ps(pr + r * kChunk, e);
        al[r] = alpha;
        rbs[r] = static_cast<int>(rb - c0);
        res[r] = static_cast<int>(re - c0);
      }
    }
    // P·V: runs of up to 4 consecutive rows that see the same keys of this chunk share the V loads.
    for (int r = 0; r < t.rows;) {
      if (res[r] <= rbs[r]) {
        ++r;
        continue;
      }
      int n = 1;
      while (n < 4 && r + n < t.rows && rbs[r + n] == rbs[r] && res[r + n] == res[r]) ++n;
      float* ar[4];
      const float* pp[4];
      for (int i = 0; i < n; ++i) {
        ar[i] = acc + (r + i) * dv;
        pp[i] = pr + (r + i) * kChunk;
      }
      if (pack) PvDispatch<true>(n, ar, pp, al + r, rbs[r], res[r], vr, dv, vtail);
      else PvDispatch<false>(n, ar, pp, al + r, rbs[r], res[r], vr, dv, vtail);
      r += n;
    }
  }
  for (int r = 0; r < t.rows; ++r) {
    const Row& row = t.row[r];
    if (row.hi <= row.lo) continue;
    const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
    const float* a = acc + r * dv;
    for (int64_t d = 0; d < dv; d += 16) {
      const __mmask16 dm = d + 16 <= dv ? static_cast<__mmask16>(0xFFFF) : vtail;
      _mm512_mask_storeu_ps(row.out + d, dm, _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, a + d), inv));
    }
  }
}

void RowsTimesMatrixAvx512(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t k, int64_t n, float* y,
                           int64_t ldy) {
  for (int64_t j0 = 0; j0 < n; j0 += 64) {
    const int64_t width = n - j0 < 64 ? n - j0 : 64;
    const int nb = static_cast<int>((width + 15) / 16);
    __mmask16 bm[4];
    for (int b = 0; b < 4; ++b) bm[b] = TailMask(width - 16 * b > 0 ? width - 16 * b : 0);
    int64_t r = 0;
    if (nb == 4 && width == 64) {
      // 4 rows per pass over the weight panel: 16 independent accumulators (the FMA latency hidden) and a quarter
      // of the weight loads. Each output's FMA chain is unchanged (i = 0..k-1 in order), so the bits are too.
      for (; r + 4 <= rows; r += 4) {
        const float* x0 = x + r * ldx;
        const float* x1 = x0 + ldx;
        const float* x2 = x1 + ldx;
        const float* x3 = x2 + ldx;
        __m512 acc[4][4];
        for (int u = 0; u < 4; ++u)
          for (int b = 0; b < 4; ++b) acc[u][b] = _mm512_setzero_ps();
        for (int64_t i = 0; i < k; ++i) {
          const float* wi = w + i * n + j0;
          const __m512 w0 = _mm512_loadu_ps(wi), w1 = _mm512_loadu_ps(wi + 16), w2 = _mm512_loadu_ps(wi + 32),
                       w3 = _mm512_loadu_ps(wi + 48);
          const float* xs[4] = {x0, x1, x2, x3};
          for (int u = 0; u < 4; ++u) {
            const __m512 xi = _mm512_set1_ps(xs[u][i]);
            acc[u][0] = _mm512_fmadd_ps(xi, w0, acc[u][0]);
            acc[u][1] = _mm512_fmadd_ps(xi, w1, acc[u][1]);
            acc[u][2] = _mm512_fmadd_ps(xi, w2, acc[u][2]);
            acc[u][3] = _mm512_fmadd_ps(xi, w3, acc[u][3]);
          }
        }
        for (int u = 0; u < 4; ++u) {
          float* yr = y + (r + u) * ldy + j0;
          for (int b = 0; b < 4; ++b) _mm512_storeu_ps(yr + 16 * b, acc[u][b]);
        }
      }
    }
    for (; r < rows; ++r) {
      const float* xr = x + r * ldx;
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
      if (nb == 4 && width == 64) {
        for (int64_t i = 0; i < k; ++i) {
          const __m512 xi = _mm512_set1_ps(xr[i]);
          const float* wi = w + i * n + j0;
          a0 = _mm512_fmadd_ps(xi, _mm512_loadu_ps(wi), a0);
          a1 = _mm512_fmadd_ps(xi, _mm512_loadu_ps(wi + 16), a1);
          a2 = _mm512_fmadd_ps(xi, _mm512_loadu_ps(wi + 32), a2);
          a3 = _mm512_fmadd_ps(xi, _mm512_loadu_ps(wi + 48), a3);
        }
      } else {
        for (int64_t i = 0; i < k; ++i) {
          const __m512 xi = _mm512_set1_ps(xr[i]);
          const float* wi = w + i * n + j0;
          a0 = _mm512_fmadd_ps(xi, _mm512_maskz_loadu_ps(bm[0], wi), a0);
          if (nb > 1) a1 = _mm512_fmadd_ps(xi, _mm512_maskz_loadu_ps(bm[1], wi + 16), a1);
          if (nb > 2) a2 = _mm512_fmadd_ps(xi, _mm512_maskz_loadu_ps(bm[2], wi + 32), a2);
          if (nb > 3) a3 = _mm512_fmadd_ps(xi, _mm512_maskz_loadu_ps(bm[3], wi + 48), a3);
        }
      }
      float* yr = y + r * ldy + j0;
      _mm512_mask_storeu_ps(yr, bm[0], a0);
      if (nb > 1) _mm512_mask_storeu_ps(yr + 16, bm[1], a1);
      if (nb > 2) _mm512_mask_storeu_ps(yr + 32, bm[2], a2);
      if (nb > 3) _mm512_mask_storeu_ps(yr + 48, bm[3], a3);
    }
  }
}

}  // namespace attn
}  // namespace specd
