// Portable int8- and int16-activation kernels over packed GGUF-quantized weights (activation quantization,
// integer dot products and the fp32 combination order: quant_kernels.h, "int8 activations").
// Baseline target, -ffp-contract=off: the same bits as the VNNI path (quant_i8_avx512.cc).
#include <cstring>

#include "quant_kernels.h"

namespace specd {
namespace quant {
namespace {

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);  // the packed layout is little-endian
  return v;
}

/**
 * Round to nearest even of |v| < 2^22, in fp32 ops only: adding and subtracting 1.5·2^23 leaves
 * the integer part (default rounding mode), as VCVTPS2DQ does on the AVX-512 path.
 */
inline float RoundEven(float v) {
  const float big = 12582912.0f;  // no -ffast-math: (v + big) − big is not folded into v
  return (v + big) - big;
}

}  // namespace

void QuantizeActsPortable(const float* x, int64_t ldx, int64_t k, int64_t row_begin, int64_t row_end, ActsI8 out) {
  const int64_t blocks = k / kBlock;
  const bool wide = out.lo != nullptr;  // int16 mode
  for (int64_t r = row_begin; r < row_end; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * ldx + b * kBlock;
      int8_t* q = out.q + r * k + b * kBlock;
      int8_t* lo = wide ? out.lo + r * k + b * kBlock : nullptr;
      const int64_t at = r * blocks + b;
      float amax = 0.0f;
      bool finite = true;
      for (int j = 0; j < kBlock; ++j) {
        const float a = xb[j] < 0.0f ? -xb[j] : xb[j];
        finite = finite && a <= 3.4028234663852886e38f;  // false for NaN and ±Inf
        amax = a > amax ? a : amax;
      }
      if (!finite) {
        std::memset(q, 0, kBlock);
        if (wide) std::memset(lo, 0, kBlock);
        out.d[at] = __builtin_nanf("");
        out.s[at] = __builtin_nanf("");
        out.sum[at] = 0;
        continue;
      }
      const float qmax = wide ? static_cast<float>(kI16Max) : 127.0f;
      const float d = amax / qmax;
      int32_t sum = 0;
      for (int j = 0; j < kBlock; ++j) {
        float v = d != 0.0f ? RoundEven(xb[j] / d) : 0.0f;
        v = v > qmax ? qmax : v < -qmax ? -qmax : v;
        const int32_t vi = static_cast<int32_t>(v);
        if (wide) {
          const int32_t hi = (vi + 128 + 32768) / 256 - 128;  // floor((vi + 128) / 256), a positive division
          q[j] = static_cast<int8_t>(hi);
          lo[j] = static_cast<int8_t>(vi - 256 * hi);
        } else {
          q[j] = static_cast<int8_t>(vi);
        }
        sum += vi;
      }
      out.d[at] = d;
      out.sum[at] = sum;
      out.s[at] = d * static_cast<float>(sum);
    }
}

void PanelsI8Portable(const ProblemI8& p, int64_t panel_begin, int64_t panel_end) {
  const int64_t blocks = p.k / kBlock;
  const int64_t pbb = PanelBlockBytes(p.type);
  const int64_t sb = ScaleBytes(p.type);
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    const uint8_t* base = p.packed + panel * blocks * pbb;
    const int64_t col0 = panel * kLanes;
    const int64_t valid = p.n - col0 < kLanes ? p.n - col0 : kLanes;
    for (int64_t r = 0; r < p.m; ++r) {
      float acc[kLanes];
      for (int l = 0; l < kLanes; ++l) acc[l] = 0.0f;  // +0
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = base + b * pbb;
        const uint8_t* qs = blk + sb;
        const int64_t at = r * blocks + b;
        const float dx = p.x.d[at];
        const float sx = p.x.s[at];
        // The block's activation quants (int16 mode: 256·hi + lo, the planes' value).
        int32_t xq[kBlock];
        for (int j = 0; j < kBlock; ++j) {
          xq[j] = p.x.q[r * p.k + b * kBlock + j];
          if (p.x.lo != nullptr) xq[j] = 256 * xq[j] + p.x.lo[r * p.k + b * kBlock + j];
        }
        for (int l = 0; l < kLanes; ++l) {
          int32_t isum = 0;
          if (p.type == Type::kQ8_0) {
            for (int j = 0; j < kBlock; ++j) isum += static_cast<int8_t>(qs[j * kLanes + l]) * xq[j];
          } else {
            const int32_t bias = p.type == Type::kQ4_0 ? 8 : 0;
            for (int j = 0; j < 16; ++j) {
              const uint8_t q = qs[j * kLanes + l];
              isum += ((q & 0xF) - bias) * xq[j] + ((q >> 4) - bias) * xq[j + 16];
            }
          }
          const float dw = F16ToF32(LoadU16(blk + 2 * l));
          float t = (dw * dx) * static_cast<float>(isum);  // float(isum): RNE, as VCVTDQ2PS
          if (p.type == Type::kQ4_1) t = t + F16ToF32(LoadU16(blk + 32 + 2 * l)) * sx;
          acc[l] = acc[l] + t;
        }
      }
      std::memcpy(p.y + r * p.ldy + col0, acc, valid * sizeof(float));
    }
  }
}

}  // namespace quant
}  // namespace specd
