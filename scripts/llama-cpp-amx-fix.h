/* Forced into every translation unit of bench:peer's llama.cpp build (scripts/install-llama-cpp-python.mjs,
 * `-include`), only when that build uses GCC and the CPU has AMX. GCC 12's _tile_loadconfig tells the compiler
 * that ldtilecfg reads 8 bytes of the 64-byte tile configuration, so at -O2 it drops the stores of the row and
 * column sizes of a configuration built on the stack; llama.cpp's AMX kernels then fault with SIGILL on their
 * first tile instruction (seen with llama-cpp-python 0.3.36; upstream: ggml-org/llama.cpp pull request 26954).
 * This redefinition declares the whole 64 bytes as read. */
#if defined(__AMX_TILE__) && !defined(SPECD_LLAMA_CPP_AMX_FIX)
#define SPECD_LLAMA_CPP_AMX_FIX
#include <immintrin.h>
typedef struct {
  char bytes[64];
} specd_tile_config_bytes;
static inline void specd_tile_loadconfig(const void* config) {
  __asm__ volatile("ldtilecfg %0" : : "m"(*(const specd_tile_config_bytes*)config) : "memory");
}
#undef _tile_loadconfig
#define _tile_loadconfig(config) specd_tile_loadconfig(config)
#endif
