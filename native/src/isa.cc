// cpuid-based ISA detection (see isa.h).
#include "isa.h"

#include <atomic>
#include <stdexcept>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace specd {
namespace {

bool DetectAvx512() {
#if defined(SPECD_HAVE_AVX512_BUILD) && defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool osxsave = (c >> 27) & 1;
  if (!osxsave) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  // XMM (1), YMM (2), opmask (5), ZMM_Hi256 (6), Hi16_ZMM (7) state enabled by the OS.
  if ((xcr0_lo & 0xE6u) != 0xE6u) return false;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1, avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1,
             fma_ok = true, vnni = (c >> 11) & 1;
  __cpuid_count(7, 1, a, b, c, d);
  const bool bf16 = (a >> 5) & 1;
  return avx512f && avx512dq && avx512bw && avx512vl && fma_ok && vnni && bf16;
#else
  return false;
#endif
}

bool DetectVbmi() {
#if defined(SPECD_HAVE_AVX512_BUILD) && defined(__x86_64__)
  if (!DetectAvx512()) return false;
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  return (c >> 1) & 1;  // CPUID.(EAX=7,ECX=0):ECX[1] AVX512_VBMI
#else
  return false;
#endif
}

bool DetectAmxInt8() {
#if defined(SPECD_HAVE_AVX512_BUILD) && defined(__x86_64__)
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  return (d >> 25) & 1;  // CPUID.(EAX=7,ECX=0):EDX[25] AMX-INT8
#else
  return false;
#endif
}

bool DetectAmx() {
#if defined(SPECD_HAVE_AVX512_BUILD) && defined(__x86_64__) && defined(__linux__)
  if (!DetectAvx512()) return false;
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if (((xcr0_lo >> 17) & 3u) != 3u) return false;  // XTILECFG and XTILEDATA state enabled
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

const bool g_avx512_available = DetectAvx512();
const bool g_amx_available = DetectAmx();
const bool g_vbmi_available = DetectVbmi();
const bool g_amx_int8_available = g_amx_available && DetectAmxInt8();
std::atomic<int> g_isa{static_cast<int>(g_avx512_available ? Isa::kAvx512 : Isa::kPortable)};

}  // namespace

bool Avx512Available() { return g_avx512_available; }

bool AmxAvailable() { return g_amx_available; }

bool Avx512VbmiAvailable() { return g_vbmi_available; }

bool AmxInt8Available() { return g_amx_int8_available; }

Isa CurrentIsa() { return static_cast<Isa>(g_isa.load(std::memory_order_relaxed)); }

const char* IsaName(Isa isa) { return isa == Isa::kAvx512 ? "avx512" : "portable"; }

void SetIsaByName(const std::string& name, const char* source) {
  if (name == "auto" || name.empty()) {
    g_isa.store(static_cast<int>(g_avx512_available ? Isa::kAvx512 : Isa::kPortable));
  } else if (name == "portable") {
    g_isa.store(static_cast<int>(Isa::kPortable));
  } else if (name == "avx512") {
    if (!g_avx512_available) {
      throw std::runtime_error(std::string(source) +
                               ": \"avx512\" requested but this build or CPU lacks AVX512F/BW/VL/BF16/VNNI");
    }
    g_isa.store(static_cast<int>(Isa::kAvx512));
  } else {
    throw std::runtime_error(std::string(source) + ": expected \"auto\", \"portable\" or \"avx512\", got \"" + name +
                             "\"");
  }
}

}  // namespace specd
