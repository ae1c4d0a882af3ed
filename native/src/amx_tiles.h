// The AMX tile configuration block (Intel SDM vol. 2, LDTILECFG: 64 bytes, palette 1), shared by the AMX kernels
// (gemm_amx.cc, quant_i8_amx.cc). A plain struct: safe for the ISA files (no STL, no napi).
#pragma once
#include <cstdint>

namespace specd {

/** LDTILECFG's memory operand: per tile t, rows[t] rows of colsb[t] bytes. */
struct alignas(64) AmxTileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

}  // namespace specd
