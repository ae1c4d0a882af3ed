// Run-time instruction-set selection.
//
// At module load the path is chosen once: kAvx512 when the build has the *_avx512.cc files
// (x86-64) AND cpuid reports AVX512F, AVX512BW, AVX512VL, AVX512_BF16 and AVX512_VNNI AND the OS
// saves the ZMM state (XGETBV), else kPortable. SPECD_ISA=portable forces the portable path;
// SPECD_ISA=avx512 demands AVX-512 and makes the module load fail on a CPU without it;
// SPECD_ISA=auto (or unset) detects. SetIsa() changes the path later (tests use it to run both
// paths in one process). Kernels read CurrentIsa() on every call.
#pragma once
#include <string>

namespace specd {

enum class Isa { kPortable = 0, kAvx512 = 1 };

/** True when this build contains AVX-512 code and this CPU/OS can run it. */
bool Avx512Available();

/**
 * True when AMX-TILE and AMX-BF16 are usable: cpuid, OS state (XCR0) and, on Linux, the
 * process-wide permission for tile data (arch_prctl ARCH_REQ_XCOMP_PERM, requested at load).
 * Used only by the opt-in bf16-activation GEMM, and only on the avx512 path.
 */
bool AmxAvailable();

/**
 * True when the AVX-512 path is available (Avx512Available) and the CPU has AVX512_VBMI (VPERMB);
 * the int8-activation quantized GEMM (quant_i8_avx512.cc) needs it, else it runs portable.
 */
bool Avx512VbmiAvailable();

/** True when AmxAvailable() and the CPU has AMX-INT8 (TDPBSUD: the int8-activation quantized GEMM). */
bool AmxInt8Available();

/** The path kernels use now. */
Isa CurrentIsa();

/** "portable" or "avx512". */
const char* IsaName(Isa isa);

/**
 * Selects the path by name: "auto", "portable" or "avx512". Throws std::runtime_error naming
 * `source` (e.g. "SPECD_ISA" or "setIsa") for an unknown name or an unsupported ISA.
 */
void SetIsaByName(const std::string& name, const char* source);

}  // namespace specd
