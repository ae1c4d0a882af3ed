// AVX-512 VNNI kernels for the int8- and int16-activation GEMM over packed GGUF-quantized weights (activation
// quantization, integer dot products and fp32 combination order: quant_kernels.h, "int8
// activations"). Compiled with the AVX-512 flags plus AVX512_VBMI (CMakeLists.txt); called only
// when isa.cc reports AVX-512 and VBMI. Intrinsics only, no STL (see CMakeLists.txt on ODR).
//
// Schedule (TileDirect), for one thread's range of panels, every m: for each tile of B panels, for each
// row tile, per block: the B panel blocks' 8 VPERMB operands (below) made in registers and fed straight
// to 2 VPDPBUSD chains per row and panel, then the fp32 combination. The first row tile streams the
// tile's weights from memory; the others re-read them from L1 (B panels: 5.6–31 KiB for k = 576–1536).
//   B = 1 (one weight stream) in row tiles of <= 8 rows (int16 Q8_0: <= 6): int8 up to m = 16, int16 up to
//     m = 7; the odd last panel of a range;
//   B = 2 (DirectPairs: 2 panel streams, each activation broadcast feeds both panels' VPDPBUSD) in row
//     tiles of <= 3 rows (int8: <= 4): int8 from m = 17, int16 from m = 8.
// The operands: each VPERMB turns 4 quant lines [k][lane] into 16 dwords [lane][4 consecutive k]
// (Q4: low and high nibbles ANDed apart; Q8_0: XOR 0x80, the +128 bias).
// The row tiles prefetch (T0) the thread's next tile while they read the current one, each its share of
// every block's lines (the first tile alone before 2026-12-07: 2 % at m = 16–24, int16), swept
// linearly at the rate it is read (as quant_avx512.cc; the last tile of a range prefetches
// kPrefetchBytes ahead in each panel instead).
// Against the former path for every m (the weights of a chunk of 8 blocks transformed once into an L1
// scratch, then row tiles of <= 6 over them), from DRAM, one thread, AMD EPYC Zen 5: m = 1–4 ×1.6–2.8,
// m = 8 ×1.7–2.1, m = 16 ×1.1–1.3 (docs/BENCHMARKS.md, "m ≤ 16 on AMD EPYC Zen 5"); the SmolLM2 forward's
// GEMMs, 1–2 threads: int16 m = 17–64 ×1.15–1.35, m = 65–512 ×1.3–1.5; int8 m = 17–64 ×0.96–1.25 (no loss
// past the noise), m = 65–512 ×1.1–1.2 (docs/BENCHMARKS.md, "m = 17–32 on the direct path").
// TransformChunk remains for the AMX kernel.
// Each output still sees one fp32 accumulator updated block by block in the fixed order of
// quant_kernels.h, whatever its tile or thread: batch and thread invariant.
// int16 activations (template flag W, ActsI8::lo set): the same weight operands, twice the VPDPBUSD
// (high and low activation planes), isum = 256·high + low, then the same combination.
// The int16 speed (docs/BENCHMARKS.md, "int16 activations"): ×1.0–1.2 of int8's time at m = 1–2,
// ×1.35–1.6 at m = 4–16. From m ≈ 8 on the call is bound by the core, not the weight stream: VPDPBUSD
// and the combination's 3 VMULPS share two ports on Zen 5 and ~70–75 % of the VPDPBUSD peak is reached,
// so each row past 16 adds ~5 % of t(16) at int16 (docs/BENCHMARKS.md, "m = 17–32 on the direct path").
#include <immintrin.h>

#include "quant_kernels.h"

namespace specd {
namespace quant {
namespace {

#ifndef SPECD_QUANT_PREFETCH
#define SPECD_QUANT_PREFETCH 4096
#endif
constexpr int64_t kPrefetchBytes = SPECD_QUANT_PREFETCH;
constexpr int64_t kOpBytes = 512;      // 8 operands × 64 B per panel block
constexpr int64_t kWBlockBytes = 640;  // operands | d[16] f32 | m[16] f32
// Rows per B = 1 tile: int8 up to 8; int16 up to 8 for Q4_0 / Q4_1 and 6 for Q8_0 (two int32 chains per row, and
// Q8_0's 8 operands a block against Q4's 4). One tile where m fits: each extra row tile makes the block's VPERMB
// operands again for its rows. The SmolLM2 forward's Q4_1 GEMMs (30 layers, weights from DRAM, 2 threads, Zen 5),
// against the former int16 tiles (<= 4 rows B = 1, DirectPairs <= 3 rows from m = 5), alternated A/Bs: m = 5–6
// ×1.10–1.28, m = 7–16 ×1.03–1.18 faster; its Q8_0 lm_head m = 5–6 ×1.06–1.28, m = 7–16 within the noise
// (docs/BENCHMARKS.md, "int16 `gemmQuant`: row tiles of up to 8 rows").
constexpr int64_t kDirectTileRows = 8;
template <Type T>
constexpr int64_t DirectTileRowsWide() {
  return T == Type::kQ8_0 ? 6 : 8;
}
// DirectPairs: TileDirect over 2 panels at once (B = 2), so each activation broadcast feeds two VPDPBUSD
// and a tile has 4·R independent int32 chains (VPDPBUSD's latency wants ~8–12 in flight, and a broadcast
// from memory per VPDPBUSD caps the rate near 0.6–0.85 of the register-only one on Zen 5). Row tiles of
// <= 3 rows at int16 (12 chains; 4 rows: ×0.95 in L2), <= 4 at int8 (16 chains; vs 3 rows ×1.1 in L2).
// int8 from m = 17: one thread, Zen 5, vs B = 1 tiles: int8 (all the SmolLM2 GEMMs) m = 17–64 ×1.13–1.23
// (docs/BENCHMARKS.md, "m = 17–32 on the direct path"); 2 threads, m = 5–8 ×0.89–0.95, 16 ×1.12.
// int16 from m = 8: the SmolLM2 forward's GEMMs, 2 threads, Zen 5, from DRAM, vs B = 1 tiles of <= 8 rows
// (<= 6 for Q8_0), alternated: m = 5–7 ×0.93–1.01, m = 8 ×1.04–1.10, 10–14 ×1.11–1.16, 16 ×1.15–1.28 — the
// Q8_0 lm_head most (×1.16–1.46 at 8–16: three B = 1 tiles at 16 rows); docs/BENCHMARKS.md, "int16 from 8 rows
// on the paired tiles". (Until 2026-12-06 int16 Q4 took them from m = 5 against B = 1 tiles of <= 4 rows, then
// from m = 17 against the 8-row tiles; measured again on 2026-12-07 with the paired tiles as they are now.)
constexpr int64_t kDirectPairRows = 3;
constexpr int64_t kDirectPairRowsI8 = 4;
constexpr int64_t kPairsFromI8 = 17;   // from this m, DirectPairs for int8 activations (every type)
constexpr int64_t kPairsFromWide = 8;  // from this m, DirectPairs for int16 activations (every type)
template <bool W>
constexpr bool DirectPairs(int64_t m) {
  return m >= (W ? kPairsFromWide : kPairsFromI8);
}

// VPERMB index: output byte 4·lane + j takes input byte 16·j + lane (4 lines of 16 lanes -> dwords).
alignas(64) constexpr unsigned char kTranspose[64] = {0,  16, 32, 48, 1,  17, 33, 49, 2,  18, 34, 50, 3,  19, 35, 51,
                                                      4,  20, 36, 52, 5,  21, 37, 53, 6,  22, 38, 54, 7,  23, 39, 55,
                                                      8,  24, 40, 56, 9,  25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59,
                                                      12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};

constexpr int64_t PbbOf(Type t) { return t == Type::kQ4_0 ? 288 : t == Type::kQ4_1 ? 320 : 544; }

inline void StoreRow(float* y, int64_t col, int64_t n, __m512 v) {
  const int64_t valid = n - col;
  if (valid >= 16) {
    _mm512_storeu_ps(y + col, v);
  } else if (valid > 0) {
    _mm512_mask_storeu_ps(y + col, static_cast<__mmask16>((1u << valid) - 1u), v);
  }
}

/**
 * Weights of blocks [b0, b1) of panels panel0 .. panel0+B−1 into ws[(blk − b0)·B + b] (TransformPanelsI8,
 * the AMX kernel's operands); prefetches each panel kPrefetchBytes ahead.
 */
template <Type T, int B>
void TransformChunk(const ProblemI8& p, int64_t panel0, int64_t b0, int64_t b1, uint8_t* ws) {
  constexpr int64_t pbb = PbbOf(T);
  constexpr int64_t sb = T == Type::kQ4_1 ? 64 : 32;
  const int64_t panel_stride = (p.k / kBlock) * pbb;
  const __m512i idx = _mm512_load_si512(reinterpret_cast<const void*>(kTranspose));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t blk = b0; blk < b1; ++blk) {
    for (int b = 0; b < B; ++b) {
      const uint8_t* pb = p.packed + (panel0 + b) * panel_stride + blk * pbb;
      for (int64_t off = 0; off < pbb; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pb + kPrefetchBytes + off), _MM_HINT_T0);
      uint8_t* o = ws + ((blk - b0) * B + b) * kWBlockBytes;
      const uint8_t* qs = pb + sb;
      if (T == Type::kQ8_0) {
        for (int g = 0; g < 8; ++g) {
          const __m512i v = _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(qs + 64 * g));
          _mm512_store_si512(o + 64 * g, _mm512_xor_si512(v, bias));
        }
      } else {
        for (int g = 0; g < 4; ++g) {
          const __m512i v = _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(qs + 64 * g));
          _mm512_store_si512(o + 64 * g, _mm512_and_si512(v, low4));
          _mm512_store_si512(o + 256 + 64 * g, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
        }
      }
      _mm512_store_ps(o + kOpBytes, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb))));
      if (T == Type::kQ4_1)
        _mm512_store_ps(o + kOpBytes + 64,
                        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 32))));
    }
  }
}

/**
 * Rows row0 .. row0+R−1 (R <= 8) of Y over panels panel0 .. panel0+B−1 (B = 2 only for DirectPairs), all
 * of K: per block, each panel block's VPERMB operands are made in registers and consumed at once by the R
 * rows; per output the integer block sum (exact in any order), then the fp32 combination of
 * quant_kernels.h ("int8 activations"): the same bits as the portable path and the AMX kernel. With
 * pf != nullptr, prefetches bytes [pf_lo, pf_hi) of each block's pf_step bytes of the next tile (PanelTile shares
 * them among its row tiles); with pf = nullptr and `stream`, each panel kPrefetchBytes ahead. W (int16 mode): the two
 * chains are the high plane's and the low plane's, isum = 256·high + low.
 */
template <Type T, int R, bool W, int B = 1>
void TileDirect(const ProblemI8& p, int64_t row0, int64_t panel0, bool stream, const uint8_t* pf, int64_t pf_step,
                int64_t pf_lo, int64_t pf_hi) {
  constexpr int64_t pbb = PbbOf(T);
  constexpr int64_t sb = T == Type::kQ4_1 ? 64 : 32;
  constexpr int bias = T == Type::kQ4_0 ? -8 : T == Type::kQ8_0 ? -128 : 0;
  // Operand g of quant_kernels.h's order: Q4 g < 4 the low nibbles of lines 4g..4g+3 (k = 4g..)
  // and g + 4 their high nibbles (k = 16 + 4g..); Q8_0 g < 8 lines 4g..4g+3 (k = 4g..).
  constexpr int kGroups = T == Type::kQ8_0 ? 8 : 4;
  const int64_t blocks = p.k / kBlock;
  const int64_t panel_stride = blocks * pbb;
  const __m512i idx = _mm512_load_si512(reinterpret_cast<const void*>(kTranspose));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    if (pf != nullptr)
      for (int64_t off = pf_lo; off < pf_hi; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf + blk * pf_step + off), _MM_HINT_T0);
    const uint8_t* pb[B];
    for (int b = 0; b < B; ++b) {
      pb[b] = p.packed + (panel0 + b) * panel_stride + blk * pbb;
      if (stream && pf == nullptr)
        for (int64_t off = 0; off < pbb; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pb[b] + kPrefetchBytes + off), _MM_HINT_T0);
    }
    // Two VPDPBUSD chains per output (int8: Q4 low / high nibbles, Q8_0 even / odd groups, added at
    // the end of the block; int16: the high / low activation planes, isum = 256·high + low): integer
    // sums, exact in any order.
    __m512i isum[R][B], isum2[R][B];
    for (int r = 0; r < R; ++r) {
      const __m512i init =
          bias == 0 ? _mm512_setzero_si512() : _mm512_set1_epi32(bias * p.x.sum[(row0 + r) * blocks + blk]);
      for (int b = 0; b < B; ++b) {
        isum[r][b] = W ? _mm512_setzero_si512() : init;
        isum2[r][b] = W ? init : _mm512_setzero_si512();
      }
    }
    const int8_t* xq = p.x.q + row0 * p.k + blk * kBlock;
    const int8_t* xlo = W ? p.x.lo + row0 * p.k + blk * kBlock : nullptr;
    for (int g = 0; g < kGroups; ++g) {
      __m512i lo[B], hi[B];
      for (int b = 0; b < B; ++b) {
        const __m512i v = _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(pb[b] + sb + 64 * g));
        if (T == Type::kQ8_0) {
          lo[b] = _mm512_xor_si512(v, sign);
        } else {
          lo[b] = _mm512_and_si512(v, low4);
          hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
      }
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        if constexpr (W) {
          // high plane -> isum, low plane -> isum2; Q4: low-nibble operand with k = 4g.., high with 16 + 4g..
          __builtin_memcpy(&quad, xq + r * p.k + 4 * g, 4);
          const __m512i xl = _mm512_set1_epi32(quad);
          __builtin_memcpy(&quad, xlo + r * p.k + 4 * g, 4);
          const __m512i yl = _mm512_set1_epi32(quad);
          for (int b = 0; b < B; ++b) {
            isum[r][b] = _mm512_dpbusd_epi32(isum[r][b], lo[b], xl);
            isum2[r][b] = _mm512_dpbusd_epi32(isum2[r][b], lo[b], yl);
          }
          if (T != Type::kQ8_0) {
            __builtin_memcpy(&quad, xq + r * p.k + 16 + 4 * g, 4);
            const __m512i xh = _mm512_set1_epi32(quad);
            __builtin_memcpy(&quad, xlo + r * p.k + 16 + 4 * g, 4);
            const __m512i yh = _mm512_set1_epi32(quad);
            for (int b = 0; b < B; ++b) {
              isum[r][b] = _mm512_dpbusd_epi32(isum[r][b], hi[b], xh);
              isum2[r][b] = _mm512_dpbusd_epi32(isum2[r][b], hi[b], yh);
            }
          }
          continue;
        }
        __builtin_memcpy(&quad, xq + r * p.k + 4 * g, 4);
        const __m512i xl = _mm512_set1_epi32(quad);
        if (T == Type::kQ8_0 && (g & 1) != 0) {
          for (int b = 0; b < B; ++b) isum2[r][b] = _mm512_dpbusd_epi32(isum2[r][b], lo[b], xl);
        } else {
          for (int b = 0; b < B; ++b) isum[r][b] = _mm512_dpbusd_epi32(isum[r][b], lo[b], xl);
        }
        if (T != Type::kQ8_0) {
          __builtin_memcpy(&quad, xq + r * p.k + 16 + 4 * g, 4);
          const __m512i xh = _mm512_set1_epi32(quad);
          for (int b = 0; b < B; ++b) isum2[r][b] = _mm512_dpbusd_epi32(isum2[r][b], hi[b], xh);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < B; ++b)
        isum[r][b] = _mm512_add_epi32(W ? _mm512_slli_epi32(isum[r][b], 8) : isum[r][b], isum2[r][b]);
    for (int b = 0; b < B; ++b) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb[b])));
      const __m512 mw = T == Type::kQ4_1
                            ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb[b] + 32)))
                            : _mm512_setzero_ps();
      for (int r = 0; r < R; ++r) {
        const int64_t at = (row0 + r) * blocks + blk;
        // (dw·dx)·isum (+ mw·sx), then acc + t, each rounded, no FMA (quant_kernels.h).
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(p.x.d[at])), _mm512_cvtepi32_ps(isum[r][b]));
        if (T == Type::kQ4_1) t = _mm512_add_ps(t, _mm512_mul_ps(mw, _mm512_set1_ps(p.x.s[at])));
        acc[r][b] = _mm512_add_ps(acc[r][b], t);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) StoreRow(p.y + (row0 + r) * p.ldy, (panel0 + b) * kLanes, p.n, acc[r][b]);
}

// Calls fn(t, row0, rows) for the balanced row tiles of m rows, at most max_rows each (m = 13, 8 -> 7 + 6):
// tiling never changes an output's reduction order.
template <typename Fn>
inline void BalancedRowTiles(int64_t m, int64_t max_rows, Fn fn) {
  const int64_t tiles = (m + max_rows - 1) / max_rows;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t row = m * t / tiles;
    fn(t, row, m * (t + 1) / tiles - row);
  }
}

/**
 * Rows 0 .. m−1 of Y over panels panel0 .. panel0+B−1 (B = 2: DirectPairs), all of K; panel_end ends the
 * thread's range (the next tile, prefetched, lies before it).
 */
template <Type T, int B, bool W>
void PanelTile(const ProblemI8& p, int64_t panel0, int64_t panel_end) {
  const int64_t blocks = p.k / kBlock;
  // The next tile: up to B panels after this one, within the thread's range (contiguous bytes).
  const int64_t next = panel_end - (panel0 + B) < B ? panel_end - (panel0 + B) : B;
  const uint8_t* pf = next > 0 ? p.packed + (panel0 + B) * blocks * PbbOf(T) : nullptr;
  const int64_t step = next * PbbOf(T);
  // Row tile t of `tiles` prefetches its share of each block's lines of the next tile, so that the weight stream
  // runs through every row tile, not only the first (which reads the current tile from memory; the others re-read it
  // from L1).
  const int64_t lines = (step + 63) / 64;
  const auto share = [&](int64_t t, int64_t tiles, int64_t& lo, int64_t& hi) {
    lo = lines * t / tiles * 64;
    hi = lines * (t + 1) / tiles * 64;
  };
  if constexpr (B == 2) {
    // Balanced row tiles of <= 3 rows (int8: <= 4) over 2 panels; the first streams both. (W ? 3 : 4
    // only avoids instantiating int16 tiles of 4 rows, which never run.)
    constexpr int64_t kPairRows = W ? kDirectPairRows : kDirectPairRowsI8;
    const int64_t tiles = (p.m + kPairRows - 1) / kPairRows;
    BalancedRowTiles(p.m, kPairRows, [&](int64_t t, int64_t row, int64_t rows) {
      int64_t lo, hi;
      share(t, tiles, lo, hi);
      switch (rows) {
        case 1: TileDirect<T, 1, W, 2>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        case 2: TileDirect<T, 2, W, 2>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        case 3: TileDirect<T, 3, W, 2>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        default: TileDirect<T, W ? 3 : 4, W, 2>(p, row, panel0, t == 0, pf, step, lo, hi); break;
      }
    });
  } else {
    // Balanced row tiles of <= 8 rows (m = 13 -> 6 + 7; int16 Q8_0 <= 6); the first streams the panel from
    // memory, the others re-read it from L1 (5.6–15 KiB for k = 576–1536).
    constexpr int64_t kTileRows = W ? DirectTileRowsWide<T>() : kDirectTileRows;
    constexpr int kMax = static_cast<int>(kTileRows);
    const int64_t tiles = (p.m + kTileRows - 1) / kTileRows;
    BalancedRowTiles(p.m, kTileRows, [&](int64_t t, int64_t row, int64_t rows) {
      int64_t lo, hi;
      share(t, tiles, lo, hi);
      // int16 Q8_0 tiles have <= 6 rows: cases 7–8 never run there (the min only avoids instantiating them).
      switch (rows) {
        case 1: TileDirect<T, 1, W>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        case 2: TileDirect<T, 2, W>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        case 3: TileDirect<T, 3, W>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        case 4: TileDirect<T, 4, W>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        case 5: TileDirect<T, 5, W>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        case 6: TileDirect<T, 6, W>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        case 7: TileDirect<T, (kMax < 7 ? kMax : 7), W>(p, row, panel0, t == 0, pf, step, lo, hi); break;
        default: TileDirect<T, kMax, W>(p, row, panel0, t == 0, pf, step, lo, hi); break;
      }
    });
  }
}

template <Type T, bool W>
void PanelsOf(const ProblemI8& p, int64_t panel_begin, int64_t panel_end) {
  int64_t panel = panel_begin;
  // One panel at a time, so that the weights are one sequential stream; DirectPairs two at a time, then
  // the odd last panel alone.
  if (DirectPairs<W>(p.m)) {
    for (; panel + 2 <= panel_end; panel += 2) PanelTile<T, 2, W>(p, panel, panel_end);
  }
  for (; panel < panel_end; ++panel) PanelTile<T, 1, W>(p, panel, panel_end);
}

template <Type T>
void PanelsOf(const ProblemI8& p, int64_t panel_begin, int64_t panel_end) {
  if (p.x.lo != nullptr) return PanelsOf<T, true>(p, panel_begin, panel_end);
  PanelsOf<T, false>(p, panel_begin, panel_end);
}

}  // namespace

void QuantizeActsAvx512(const float* x, int64_t ldx, int64_t k, int64_t row_begin, int64_t row_end, ActsI8 out) {
  const int64_t blocks = k / kBlock;
  const bool wide = out.lo != nullptr;  // int16 mode
  const int32_t qmax = wide ? kI16Max : 127;
  const __m512 fmax = _mm512_set1_ps(3.4028234663852886e38f);
  const __m512i lim = _mm512_set1_epi32(qmax);
  const __m512i neg_lim = _mm512_set1_epi32(-qmax);
  const __m512i half = _mm512_set1_epi32(128);
  for (int64_t r = row_begin; r < row_end; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * ldx + b * kBlock;
      int8_t* q = out.q + r * k + b * kBlock;
      int8_t* lo8 = wide ? out.lo + r * k + b * kBlock : nullptr;
      const int64_t at = r * blocks + b;
      const __m512 lo = _mm512_loadu_ps(xb);
      const __m512 hi = _mm512_loadu_ps(xb + 16);
      const __m512 alo = _mm512_abs_ps(lo);
      const __m512 ahi = _mm512_abs_ps(hi);
      // not (|x| <= FLT_MAX), unordered true: NaN or ±Inf
      const __mmask16 bad = _mm512_cmp_ps_mask(alo, fmax, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(ahi, fmax, _CMP_NLE_UQ);
      if (bad != 0) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_setzero_si256());
        if (wide) _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo8), _mm256_setzero_si256());
        out.d[at] = __builtin_nanf("");
        out.s[at] = __builtin_nanf("");
        out.sum[at] = 0;
        continue;
      }
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(alo, ahi));
      const float d = amax / static_cast<float>(qmax);
      __m512i qlo = _mm512_setzero_si512(), qhi = _mm512_setzero_si512();
      if (d != 0.0f) {
        const __m512 dv = _mm512_set1_ps(d);
        // VCVTPS2DQ rounds to nearest even (default MXCSR), as the portable path's RoundEven.
        qlo = _mm512_max_epi32(neg_lim, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_div_ps(lo, dv))));
        qhi = _mm512_max_epi32(neg_lim, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_div_ps(hi, dv))));
      }
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
      if (wide) {
        // q = 256·hi + lo: hi = (q + 128) >> 8 (arithmetic: floor), lo = q − 256·hi (quant_kernels.h).
        const __m512i hlo = _mm512_srai_epi32(_mm512_add_epi32(qlo, half), 8);
        const __m512i hhi = _mm512_srai_epi32(_mm512_add_epi32(qhi, half), 8);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(lo8),
                         _mm512_cvtepi32_epi8(_mm512_sub_epi32(qlo, _mm512_slli_epi32(hlo, 8))));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(lo8 + 16),
                         _mm512_cvtepi32_epi8(_mm512_sub_epi32(qhi, _mm512_slli_epi32(hhi, 8))));
        qlo = hlo;
        qhi = hhi;
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qhi));
      out.d[at] = d;
      out.sum[at] = sum;
      out.s[at] = d * static_cast<float>(sum);
    }
}

void TransformPanelsI8(const ProblemI8& p, int64_t panel0, int panels, int64_t b0, int64_t b1, uint8_t* ws) {
#define SPECD_TRANSFORM(T)                                       \
  switch (panels) {                                              \
    case 1: TransformChunk<T, 1>(p, panel0, b0, b1, ws); break;  \
    case 2: TransformChunk<T, 2>(p, panel0, b0, b1, ws); break;  \
    case 3: TransformChunk<T, 3>(p, panel0, b0, b1, ws); break;  \
    default: TransformChunk<T, 4>(p, panel0, b0, b1, ws); break; \
  }
  switch (p.type) {
    case Type::kQ4_0: SPECD_TRANSFORM(Type::kQ4_0); break;
    case Type::kQ4_1: SPECD_TRANSFORM(Type::kQ4_1); break;
    case Type::kQ8_0: SPECD_TRANSFORM(Type::kQ8_0); break;
  }
#undef SPECD_TRANSFORM
}

void PanelsI8Vnni(const ProblemI8& p, int64_t panel_begin, int64_t panel_end) {
  switch (p.type) {
    case Type::kQ4_0: PanelsOf<Type::kQ4_0>(p, panel_begin, panel_end); break;
    case Type::kQ4_1: PanelsOf<Type::kQ4_1>(p, panel_begin, panel_end); break;
    case Type::kQ8_0: PanelsOf<Type::kQ8_0>(p, panel_begin, panel_end); break;
  }
}

}  // namespace quant
}  // namespace specd
