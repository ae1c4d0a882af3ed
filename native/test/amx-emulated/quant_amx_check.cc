// The int8- and int16-activation GEMMs' AMX kernel (quant_i8_amx.cc, compiled with amx_emu.h force-included)
// against the VNNI kernel (quant_i8_avx512.cc), bit for bit: every quant type, int8 and int16 activations, shapes
// with full and partial panels and panel groups, m = 1 … 100 (one and several row tiles). Built and run by
// native/test/amx-emulated.test.ts on CPUs with AVX-512 VNNI and VBMI. Prints one line per mismatch and a summary;
// exit status 1 on any mismatch.
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "quant_kernels.h"

using specd::quant::ActsI8;
using specd::quant::ProblemI8;
using specd::quant::Type;
namespace q = specd::quant;

int main() {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  long checked = 0, differ = 0;
  for (Type type : {Type::kQ4_0, Type::kQ4_1, Type::kQ8_0})
    for (bool wide : {false, true})
      for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{960, 576}, {200, 96}, {72, 1536}, {17, 32}}) {
        const int64_t blocks = k / q::kBlock, block_bytes = q::PanelBlockBytes(type);
        // random quants; each panel block's f16 scales d (16) and, Q4_1, m (16) finite: d in [0.002, 0.022],
        // m in [-0.02, 0]
        std::vector<uint8_t> packed(static_cast<size_t>(q::PackedBytes(type, n, k)));
        for (auto& b : packed) b = static_cast<uint8_t>(gen());
        for (int64_t pb = 0; pb < q::Panels(n) * blocks; ++pb)
          for (int64_t h = 0; h < q::ScaleBytes(type) / 2; ++h) {
            const float v = h < 16 ? 0.002f + 0.01f * (uniform(gen) + 1.f) : -0.01f * (uniform(gen) + 1.f);
            const uint16_t bits = _cvtss_sh(v, 0);
            std::memcpy(&packed[static_cast<size_t>(pb * block_bytes + 2 * h)], &bits, 2);
          }
        for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 96, 100}) {
          std::vector<float> x(static_cast<size_t>(m * k));
          for (size_t i = 0; i < x.size(); ++i) x[i] = uniform(gen) * (i % 97 == 0 ? 30.f : 1.f);  // outliers
          std::vector<int8_t> hi(x.size()), lo(x.size());
          std::vector<float> d(static_cast<size_t>(m * blocks)), s(d.size());
          std::vector<int32_t> sum(d.size());
          const ActsI8 acts{hi.data(), d.data(), s.data(), sum.data(), wide ? lo.data() : nullptr};
          q::QuantizeActsAvx512(x.data(), k, k, 0, m, acts);
          std::vector<float> y_vnni(static_cast<size_t>(m * n), -1.f), y_amx(y_vnni.size(), -2.f);
          q::PanelsI8Vnni(ProblemI8{acts, packed.data(), y_vnni.data(), n, m, n, k, type}, 0, q::Panels(n));
          std::vector<uint8_t> raw(static_cast<size_t>(q::ScratchBytesI8Amx(k) + 64));
          uint8_t* scratch = raw.data() + (64 - reinterpret_cast<uintptr_t>(raw.data()) % 64) % 64;
          q::PanelsI8Amx(ProblemI8{acts, packed.data(), y_amx.data(), n, m, n, k, type}, 0, q::Panels(n), scratch);
          ++checked;
          for (size_t i = 0; i < y_vnni.size(); ++i)
            if (std::memcmp(&y_vnni[i], &y_amx[i], 4) != 0) {
              std::printf("mismatch: type %d, %s, n %ld, k %ld, m %ld, row %ld, column %ld: VNNI %.9g, AMX %.9g\n",
                          static_cast<int>(type), wide ? "int16" : "int8", static_cast<long>(n), static_cast<long>(k),
                          static_cast<long>(m), static_cast<long>(i / n), static_cast<long>(i % n), y_vnni[i],
                          y_amx[i]);
              ++differ;
              break;
            }
        }
      }
  std::printf("%ld GEMMs checked (VNNI against emulated AMX tiles), %ld differ\n", checked, differ);
  return differ == 0 ? 0 : 1;
}
