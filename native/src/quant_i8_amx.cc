// AMX-INT8 kernel for the int8- and int16-activation GEMM over packed GGUF-quantized weights (numerics:
// quant_kernels.h, "int8 activations", "int16 activations"). Compiled with the AVX-512 + AMX-TILE/INT8 flags;
// called only when isa.cc reports AMX-INT8 usable, for m >= kAmxMinRows (int16: kAmxMinRowsWide). Intrinsics only,
// no STL.
//
// The integer block sums are exact, so computing them with TDPBSUD (signed activations × unsigned
// weight bytes) instead of VPDPBUSD gives the same int32 values, and the fp32 combination below is
// the VNNI path's, operation for operation: the AMX path, the VNNI GEMV and the portable path agree
// bit for bit (row i of a GEMM still equals the GEMV of row i).
//
// Per group of <= 4 panels: all of K transformed once (TransformPanelsI8: the 8 × 64 B operands of a
// panel block are one B tile, 8 rows of 4 k × 16 columns) — with one row tile (m <= 16) a block at a time instead,
// into a ring of three L1 slots two blocks ahead; then per row tile of <= 16 rows and per
// block: C0..C3 = 0, A = 16 rows × 32 k of int8 activations, C_b += A · B_b, the C tiles stored and
// combined with AVX-512 into fp32 accumulators in scratch (t = (d_w·d_x)·isum (+ m_w·s_x); acc + t), one block
// behind the tile products (two int32 buffers), so the two units overlap.
// int16 activations (ActsI8::lo set): the high plane in tile 4 and the low plane in tile 7, two panels at a time
// (C0, C1 the high sums, C2, C3 the low ones, against the same B tiles), and isum = 256·high + low + the bias term
// before the same combination: the VNNI path's int32 sum, so the same bits.
// The logic is checked on CPUs without AMX by native/test/amx-emulated.test.ts (software tiles, bit for bit
// against the VNNI kernel).
#include <immintrin.h>

#include "amx_tiles.h"
#include "quant_kernels.h"

namespace specd {
namespace quant {
namespace {

using TileConfig = AmxTileConfig;

void Configure(int rows) {
  TileConfig cfg = {};
  cfg.palette_id = 1;
  for (int t = 0; t < 4; ++t) {  // C: rows × 16 int32
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = 64;
  }
  cfg.rows[4] = static_cast<uint8_t>(rows);  // A: rows × 32 int8 (int16: the high plane)
  cfg.colsb[4] = 32;
  for (int t = 5; t < 7; ++t) {  // B: 8 × (16 columns × 4 k) uint8
    cfg.rows[t] = 8;
    cfg.colsb[t] = 64;
  }
  cfg.rows[7] = static_cast<uint8_t>(rows);  // int16: the low plane, rows × 32 int8
  cfg.colsb[7] = 32;
  _tile_loadconfig(&cfg);
}

inline void StoreRow(float* y, int64_t col, int64_t n, __m512 v) {
  const int64_t valid = n - col;
  if (valid >= 16) {
    _mm512_storeu_ps(y + col, v);
  } else if (valid > 0) {
    _mm512_mask_storeu_ps(y + col, static_cast<__mmask16>((1u << valid) - 1u), v);
  }
}

// The tile products of one block for row tile row0 (Configure'd rows) and the nb <= 4 panels of wb: the int32 block
// sums stored to ih ([4][16][16]; int16: the high plane's, and the low plane's to il).
template <bool W>
inline void BlockSums(const ProblemI8& p, const uint8_t* wb, int nb, int64_t row0, int64_t blk, int32_t* ih,
                      int32_t* il) {
  if constexpr (W) {
    // int16: the high plane (tile 4) and the low plane (tile 7) against the same B tiles, two panels at a time
    // (C0, C1 high; C2, C3 low), each C stored to its int32 buffer.
    _tile_loadd(4, p.x.q + row0 * p.k + blk * kBlock, p.k);
    _tile_loadd(7, p.x.lo + row0 * p.k + blk * kBlock, p.k);
    for (int b = 0; b < nb; b += 2) {
      _tile_zero(0);
      _tile_zero(2);
      _tile_loadd(5, wb + b * 640, 64);
      _tile_dpbsud(0, 4, 5);
      _tile_dpbsud(2, 7, 5);
      if (b + 1 < nb) {
        _tile_zero(1);
        _tile_zero(3);
        _tile_loadd(6, wb + (b + 1) * 640, 64);
        _tile_dpbsud(1, 4, 6);
        _tile_dpbsud(3, 7, 6);
      }
      _tile_stored(0, ih + b * 256, 64);
      _tile_stored(2, il + b * 256, 64);
      if (b + 1 < nb) {
        _tile_stored(1, ih + (b + 1) * 256, 64);
        _tile_stored(3, il + (b + 1) * 256, 64);
      }
    }
  } else {
    _tile_loadd(4, p.x.q + row0 * p.k + blk * kBlock, p.k);
    _tile_zero(0);
    _tile_loadd(5, wb, 64);
    _tile_dpbsud(0, 4, 5);
    if (nb > 1) {
      _tile_zero(1);
      _tile_loadd(6, wb + 640, 64);
      _tile_dpbsud(1, 4, 6);
    }
    if (nb > 2) {
      _tile_zero(2);
      _tile_loadd(5, wb + 2 * 640, 64);
      _tile_dpbsud(2, 4, 5);
    }
    if (nb > 3) {
      _tile_zero(3);
      _tile_loadd(6, wb + 3 * 640, 64);
      _tile_dpbsud(3, 4, 6);
    }
    _tile_stored(0, ih, 64);
    if (nb > 1) _tile_stored(1, ih + 256, 64);
    if (nb > 2) _tile_stored(2, ih + 512, 64);
    if (nb > 3) _tile_stored(3, ih + 768, 64);
  }
}

// One block's int32 sums (ih, il) combined into the fp32 accumulators fs ([16][4][16]) of rows row0 ..
// row0 + rows - 1: t = (d_w·d_x)·isum (+ m_w·s_x), acc + t, as the VNNI path does.
template <Type T, bool W>
inline void CombineBlock(const ProblemI8& p, const uint8_t* wb, int nb, int rows, int64_t row0, int64_t blk,
                         const int32_t* ih, const int32_t* il, float* fs) {
  constexpr int bias = T == Type::kQ4_0 ? -8 : T == Type::kQ8_0 ? -128 : 0;
  const int64_t blocks = p.k / kBlock;
  __m512 dw[4], mw[4];
  for (int b = 0; b < nb; ++b) {
    dw[b] = _mm512_load_ps(reinterpret_cast<const float*>(wb + b * 640 + 512));
    mw[b] = T == Type::kQ4_1 ? _mm512_load_ps(reinterpret_cast<const float*>(wb + b * 640 + 576)) : _mm512_setzero_ps();
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t at = (row0 + r) * blocks + blk;
    const __m512 dx = _mm512_set1_ps(p.x.d[at]);
    const __m512 sx = _mm512_set1_ps(p.x.s[at]);
    const __m512i off = _mm512_set1_epi32(bias * p.x.sum[at]);
    for (int b = 0; b < nb; ++b) {
      __m512i isum = _mm512_load_si512(ih + b * 256 + r * 16);
      // int16: isum = 256·high + (low + bias·Σq), the VNNI path's int32 sum (exact, any order)
      if constexpr (W) isum = _mm512_add_epi32(_mm512_slli_epi32(isum, 8), _mm512_load_si512(il + b * 256 + r * 16));
      if (bias != 0) isum = _mm512_add_epi32(isum, off);
      // As the VNNI path: (dw·dx)·isum (+ mw·sx), then acc + t, each rounded, no FMA.
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(dw[b], dx), _mm512_cvtepi32_ps(isum));
      if (T == Type::kQ4_1) v = _mm512_add_ps(v, _mm512_mul_ps(mw[b], sx));
      float* acc = fs + (r * 4 + b) * 16;
      _mm512_store_ps(acc, _mm512_add_ps(_mm512_load_ps(acc), v));
    }
  }
}

template <Type T, bool W>
void Panels(const ProblemI8& p, int64_t panel_begin, int64_t panel_end, uint8_t* scratch) {
  const int64_t blocks = p.k / kBlock;
  uint8_t* ws = scratch;
  // [2][4][16][16] int32: block j's sums in buffer j & 1 (int16: the high plane's; the low plane's in ilo)
  int32_t* ibuf = reinterpret_cast<int32_t*>(scratch + blocks * 4 * 640);
  float* fs = reinterpret_cast<float*>(scratch + blocks * 4 * 640 + 8192);        // [16][4][16]
  int32_t* ilo = reinterpret_cast<int32_t*>(scratch + blocks * 4 * 640 + 12288);  // int16: [2][4][16][16]
  int configured = -1;
  const int64_t tiles = (p.m + 15) / 16;
  for (int64_t panel = panel_begin; panel < panel_end; panel += 4) {
    const int nb = static_cast<int>(panel_end - panel < 4 ? panel_end - panel : 4);
    // One row tile (m <= 16, the verify blocks): each block's weights are used once, so they are transformed a block
    // at a time into a ring of three L1-resident slots instead of all of K into ws first (which, past L1, the B tile
    // loads then read back from L2). Block j + 2 is transformed while block j + 1's tile products are issued and
    // block j is combined: the tile loads never wait on the transform's stores just issued, and the combination reads
    // block j's scales from its slot. Same operands, same order: the same bits.
    const bool ring = tiles == 1 && blocks >= 3;
    const int64_t slot = static_cast<int64_t>(nb) * 640;
    // block blk's operands: its ring slot, or its place in all of K
    const auto wb = [&](int64_t blk) { return ws + (ring ? blk % 3 : blk) * slot; };
    if (ring) {
      TransformPanelsI8(p, panel, nb, 0, 1, wb(0));
      TransformPanelsI8(p, panel, nb, 1, 2, wb(1));
    } else {
      TransformPanelsI8(p, panel, nb, 0, blocks, ws);
    }
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t row0 = p.m * t / tiles;
      const int rows = static_cast<int>(p.m * (t + 1) / tiles - row0);
      if (rows != configured) {
        Configure(rows);
        configured = rows;
      }
      for (int i = 0; i < rows * 4; ++i) _mm512_store_ps(fs + i * 16, _mm512_setzero_ps());
      // Software-pipelined by one block: block j + 1's tile products are issued before block j's sums, stored one
      // iteration earlier, are combined, so the AMX unit and the AVX-512 combination overlap and the combination's
      // loads never wait on the tile stores just issued. The combination runs in block order, so the bits are the
      // unpipelined kernel's.
      BlockSums<W>(p, wb(0), nb, row0, 0, ibuf, ilo);
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t cur = (blk & 1) * 1024, nxt = ((blk + 1) & 1) * 1024;
        if (ring && blk + 2 < blocks) TransformPanelsI8(p, panel, nb, blk + 2, blk + 3, wb(blk + 2));
        if (blk + 1 < blocks) BlockSums<W>(p, wb(blk + 1), nb, row0, blk + 1, ibuf + nxt, ilo + nxt);
        CombineBlock<T, W>(p, wb(blk), nb, rows, row0, blk, ibuf + cur, ilo + cur, fs);
      }
      for (int r = 0; r < rows; ++r)
        for (int b = 0; b < nb; ++b)
          StoreRow(p.y + (row0 + r) * p.ldy, (panel + b) * kLanes, p.n, _mm512_load_ps(fs + (r * 4 + b) * 16));
    }
  }
  _tile_release();
}

}  // namespace

void PanelsI8Amx(const ProblemI8& p, int64_t panel_begin, int64_t panel_end, uint8_t* scratch) {
  const bool wide = p.x.lo != nullptr;
  switch (p.type) {
    case Type::kQ4_0:
      return wide ? Panels<Type::kQ4_0, true>(p, panel_begin, panel_end, scratch)
                  : Panels<Type::kQ4_0, false>(p, panel_begin, panel_end, scratch);
    case Type::kQ4_1:
      return wide ? Panels<Type::kQ4_1, true>(p, panel_begin, panel_end, scratch)
                  : Panels<Type::kQ4_1, false>(p, panel_begin, panel_end, scratch);
    case Type::kQ8_0:
      return wide ? Panels<Type::kQ8_0, true>(p, panel_begin, panel_end, scratch)
                  : Panels<Type::kQ8_0, false>(p, panel_begin, panel_end, scratch);
  }
}

}  // namespace quant
}  // namespace specd
