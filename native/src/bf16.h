// bf16 <-> f32 scalar helpers. Header-only, no STL, no napi: safe to include from *_avx512.cc.
//
// bf16 = the upper 16 bits of an IEEE-754 binary32 (1 sign, 8 exponent, 7 mantissa bits).
// Widening is exact (shift left by 16). Narrowing rounds to nearest, ties to even; NaN stays a
// (quiet) NaN, +-Inf stays +-Inf, finite values above the bf16 range round to +-Inf.
#pragma once
#include <cstdint>
#include <cstring>

namespace specd {

/** Exact widening of one bf16 value (given as its 16 raw bits) to f32. */
static inline float Bf16ToF32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/** f32 -> bf16 raw bits, round to nearest even; NaN -> quiet NaN with the same sign. */
static inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace specd
