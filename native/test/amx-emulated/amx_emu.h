// AMX-INT8 tiles in software, so that the AMX kernels' logic (tile shapes, operand layout, the combination of the
// block sums) is checked against the VNNI path on CPUs without AMX, as CI's are. Force-included (-include) when
// compiling an *_amx.cc for the check in this folder, never in the addon. It replaces the compiler's _tile_*
// intrinsics (macros in GCC's amxtileintrin.h) with functions over 8 tile registers of 16 rows × 64 bytes and the
// configuration last loaded, and aborts on what the hardware refuses (#UD): a tile used beyond its configured shape,
// or a TDPBSUD whose A, B and C shapes disagree (Intel SDM vol. 2, TDPBSUD: C is M × N int32, A M × 4K int8, B K ×
// 4N uint8 with B.rows = A.colsb / 4 and B.colsb = C.colsb). TDPBSUD: C[m][n] += Σ_k Σ_i A[m][4k+i] · B[k][4n+i],
// A signed, B unsigned, int32 sums wrapping.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbsud
#undef _tile_loadconfig
#undef _tile_release

namespace amx_emulated {

struct Config {
  uint8_t palette_id, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
inline Config g_config;
inline uint8_t g_tiles[8][16][64];

inline void Check(int t, const char* op) {
  if (t < 0 || t > 7 || g_config.palette_id != 1 || g_config.rows[t] == 0 || g_config.rows[t] > 16 ||
      g_config.colsb[t] == 0 || g_config.colsb[t] > 64) {
    std::fprintf(stderr, "amx_emu: %s on tile %d outside its configuration (rows %d, colsb %d)\n", op, t,
                 t >= 0 && t < 8 ? g_config.rows[t] : -1, t >= 0 && t < 8 ? g_config.colsb[t] : -1);
    std::abort();
  }
}
inline void Load(int t, const void* base, long stride) {
  Check(t, "tileloadd");
  std::memset(g_tiles[t], 0, sizeof g_tiles[t]);
  for (int r = 0; r < g_config.rows[t]; ++r)
    std::memcpy(g_tiles[t][r], static_cast<const uint8_t*>(base) + r * stride, g_config.colsb[t]);
}
inline void Store(int t, void* base, long stride) {
  Check(t, "tilestored");
  for (int r = 0; r < g_config.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, g_tiles[t][r], g_config.colsb[t]);
}
inline void Zero(int t) {
  Check(t, "tilezero");
  std::memset(g_tiles[t], 0, sizeof g_tiles[t]);
}
inline void DotSignedUnsigned(int c, int a, int b) {
  Check(c, "tdpbsud C");
  Check(a, "tdpbsud A");
  Check(b, "tdpbsud B");
  const int rows = g_config.rows[c], cols = g_config.colsb[c] / 4, depth = g_config.colsb[a] / 4;
  if (g_config.rows[a] != rows || g_config.rows[b] != depth || g_config.colsb[b] != g_config.colsb[c]) {
    std::fprintf(stderr, "amx_emu: tdpbsud shapes disagree (C %d, A %d, B %d)\n", c, a, b);
    std::abort();
  }
  for (int m = 0; m < rows; ++m)
    for (int n = 0; n < cols; ++n) {
      uint32_t acc;
      std::memcpy(&acc, &g_tiles[c][m][4 * n], 4);
      for (int k = 0; k < depth; ++k)
        for (int i = 0; i < 4; ++i)
          acc += static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(g_tiles[a][m][4 * k + i])) *
                                       static_cast<int32_t>(g_tiles[b][k][4 * n + i]));
      std::memcpy(&g_tiles[c][m][4 * n], &acc, 4);
    }
}

}  // namespace amx_emulated

#define _tile_loadconfig(config) std::memcpy(&amx_emulated::g_config, (config), 64)
#define _tile_release() ((void)0)
#define _tile_loadd(t, base, stride) amx_emulated::Load((t), (base), (stride))
#define _tile_stored(t, base, stride) amx_emulated::Store((t), (base), (stride))
#define _tile_zero(t) amx_emulated::Zero((t))
#define _tile_dpbsud(c, a, b) amx_emulated::DotSignedUnsigned((c), (a), (b))
