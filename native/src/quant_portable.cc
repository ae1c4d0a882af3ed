// Portable GEMM kernels over packed GGUF-quantized weights (layout, numerics and reduction order:
// quant_kernels.h). Baseline target, no -m flags, -ffp-contract=off: the weights of a block are
// dequantized into fp32 (w = d·q + m, d·q exact), then acc = acc + x·w with two roundings, in the
// fixed per-block order. The 16-lane inner loops are plain C++ that the SLP vectoriser handles.
#include <cstring>

#include "quant_kernels.h"

namespace specd {
namespace quant {
namespace {

constexpr int kRowTile = 4;

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);  // GGUF and the packed layout are little-endian
  return v;
}

/** Dequantizes one panel block into w[kk][lane], kk the summation order of quant_kernels.h. */
inline void DequantBlock(Type type, const uint8_t* blk, float (&w)[kBlock][kLanes]) {
  float d[kLanes], m[kLanes];
  for (int l = 0; l < kLanes; ++l) d[l] = F16ToF32(LoadU16(blk + 2 * l));
  if (type == Type::kQ4_1) {
    for (int l = 0; l < kLanes; ++l) m[l] = F16ToF32(LoadU16(blk + 32 + 2 * l));
  } else {
    for (int l = 0; l < kLanes; ++l) m[l] = -8.0f * d[l];
  }
  const uint8_t* qs = blk + ScaleBytes(type);
  if (type == Type::kQ8_0) {
    for (int kk = 0; kk < kBlock; ++kk)
      for (int l = 0; l < kLanes; ++l) w[kk][l] = d[l] * static_cast<float>(static_cast<int8_t>(qs[kk * kLanes + l]));
    return;
  }
  for (int j = 0; j < 16; ++j)
    for (int l = 0; l < kLanes; ++l) {
      const uint8_t q = qs[j * kLanes + l];
      w[2 * j][l] = d[l] * static_cast<float>(q & 0xF) + m[l];
      w[2 * j + 1][l] = d[l] * static_cast<float>(q >> 4) + m[l];
    }
}

// Loop vectorisation off, as for gemm_portable.cc's tile: GCC 12 -O3 turned a loop over rows of X
// into a strided group load that read past X. The 16-lane loops are still SLP-vectorised.
template <int R>
__attribute__((optimize("no-tree-loop-vectorize"))) void Tile(const Problem& p, int64_t row0, int64_t panel) {
  const int64_t blocks = p.k / kBlock;
  const int64_t pbb = PanelBlockBytes(p.type);
  const uint8_t* base = p.packed + panel * blocks * pbb;
  int kpos[kBlock];  // position within the block of the kk-th term of the sum
  for (int kk = 0; kk < kBlock; ++kk) kpos[kk] = p.type == Type::kQ8_0 ? kk : (kk & 1) * 16 + kk / 2;
  float acc[R][kLanes];
  std::memset(acc, 0, sizeof acc);  // +0
  float w[kBlock][kLanes];
  for (int64_t b = 0; b < blocks; ++b) {
    DequantBlock(p.type, base + b * pbb, w);
    for (int r = 0; r < R; ++r) {
      const float* x = p.x + (row0 + r) * p.ldx + b * kBlock;
      for (int kk = 0; kk < kBlock; ++kk) {
        const float xv = x[kpos[kk]];
        for (int l = 0; l < kLanes; ++l) acc[r][l] = acc[r][l] + xv * w[kk][l];
      }
    }
  }
  const int64_t col0 = panel * kLanes;
  const int64_t valid = p.n - col0 < kLanes ? p.n - col0 : kLanes;
  for (int r = 0; r < R; ++r) std::memcpy(p.y + (row0 + r) * p.ldy + col0, acc[r], valid * sizeof(float));
}

}  // namespace

void PanelsPortable(const Problem& p, int64_t panel_begin, int64_t panel_end, float*) {
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    int64_t row = 0;
    for (; row + kRowTile <= p.m; row += kRowTile) Tile<kRowTile>(p, row, panel);
    switch (p.m - row) {
      case 1: Tile<1>(p, row, panel); break;
      case 2: Tile<2>(p, row, panel); break;
      case 3: Tile<3>(p, row, panel); break;
      default: break;
    }
  }
}

}  // namespace quant
}  // namespace specd
