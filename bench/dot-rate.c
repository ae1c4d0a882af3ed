// Peak dot-product rates of this CPU, for bench:peer's prefill bound: int8 and bf16 multiply-adds issued
// from registers only (no memory traffic), on T threads at once. Bench-only: bench/peer.mjs compiles it with
// `cc -O2 -march=native -pthread` into the git-ignored .cache/peer/ and runs it; never part of the addon.
//
//   dot-rate THREADS SECONDS  ->  one JSON line: {"vnni_int8": GOP/s, "avx512_bf16": GFLOP/s,
//                                 "amx_int8": GOP/s, "amx_bf16": GFLOP/s, "avx512_f32": GFLOP/s} (a key is null when the
//                                 compiler or CPU lacks the instructions, or the kernel refuses AMX state)
// One op = one multiply or one add (a multiply-add = 2 ops), as GEMM FLOPs count them. Per instruction:
//   vpdpbusd zmm (AVX512-VNNI): 16 lanes × 4 u8·s8 products, accumulated into i32 = 64 MACs;
//   vdpbf16ps zmm (AVX512-BF16): 16 lanes × 2 bf16 products into f32 = 32 MACs;
//   vfmadd231ps zmm (AVX-512 F): 16 fp32 MACs (the fp32-activation GEMM's instruction, for comparison);
//   tdpbusd (AMX-INT8): C[16×16 i32] += A[16×64 u8] · B[64×16 s8] = 16·16·64 MACs;
//   tdpbf16ps (AMX-BF16): C[16×16 f32] += A[16×32 bf16] · B[32×16 bf16] = 16·16·32 MACs.
// 8 independent accumulators (VNNI/BF16) and 4 (AMX: tiles 0–3 accumulate, 4–7 hold A and B) hide the
// instructions' latency; each thread runs the loop for SECONDS and the rates of the threads are summed.
// Source of the AMX permission request: the Linux kernel's Documentation/arch/x86/xstate.rst.
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef double (*kernel_fn)(double seconds);  // returns ops done

// Eight named accumulators (an array would live in memory across the clock calls and time the stores).
#define DOT8(op, a, b)  \
  do {                  \
    c0 = op(c0, a, b);  \
    c1 = op(c1, a, b);  \
    c2 = op(c2, a, b);  \
    c3 = op(c3, a, b);  \
    c4 = op(c4, a, b);  \
    c5 = op(c5, a, b);  \
    c6 = op(c6, a, b);  \
    c7 = op(c7, a, b);  \
  } while (0)

#if defined(__AVX512VNNI__)
static double vnni(double seconds) {
  __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
          c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
          c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7);  // distinct: the compiler may not merge them
  __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
  __asm__ volatile("" : "+v"(a), "+v"(b));  // opaque inputs: nothing folded at compile time
  double ops = 0, t0 = now_s();
  while (now_s() - t0 < seconds) {
    for (int r = 0; r < 4096; r++) DOT8(_mm512_dpbusd_epi32, a, b);
    ops += 4096.0 * 8 * 64 * 2;
  }
  __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                 _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return ops;
}
#endif

#if defined(__AVX512BF16__)
static double bf16(double seconds) {
  __m512 c0 = _mm512_set1_ps(0), c1 = _mm512_set1_ps(1), c2 = _mm512_set1_ps(2), c3 = _mm512_set1_ps(3),
         c4 = _mm512_set1_ps(4), c5 = _mm512_set1_ps(5), c6 = _mm512_set1_ps(6), c7 = _mm512_set1_ps(7);
  __m512i ai = _mm512_set1_epi16(0x3f80), bi = _mm512_set1_epi16(0x3f80);
  __asm__ volatile("" : "+v"(ai), "+v"(bi));
  const __m512bh a = (__m512bh)ai, b = (__m512bh)bi;
  double ops = 0, t0 = now_s();
  while (now_s() - t0 < seconds) {
    for (int r = 0; r < 4096; r++) DOT8(_mm512_dpbf16_ps, a, b);
    ops += 4096.0 * 8 * 32 * 2;
  }
  __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return ops;
}
#endif

#if defined(__AVX512F__)
static double f32fma(double seconds) {
  __m512 c0 = _mm512_set1_ps(0), c1 = _mm512_set1_ps(1), c2 = _mm512_set1_ps(2), c3 = _mm512_set1_ps(3),
         c4 = _mm512_set1_ps(4), c5 = _mm512_set1_ps(5), c6 = _mm512_set1_ps(6), c7 = _mm512_set1_ps(7);
  __m512 a = _mm512_set1_ps(1e-8f), b = _mm512_set1_ps(1.0f);
  __asm__ volatile("" : "+v"(a), "+v"(b));
  double ops = 0, t0 = now_s();
  while (now_s() - t0 < seconds) {
    for (int r = 0; r < 4096; r++) {
      c0 = _mm512_fmadd_ps(a, b, c0);
      c1 = _mm512_fmadd_ps(a, b, c1);
      c2 = _mm512_fmadd_ps(a, b, c2);
      c3 = _mm512_fmadd_ps(a, b, c3);
      c4 = _mm512_fmadd_ps(a, b, c4);
      c5 = _mm512_fmadd_ps(a, b, c5);
      c6 = _mm512_fmadd_ps(a, b, c6);
      c7 = _mm512_fmadd_ps(a, b, c7);
    }
    ops += 4096.0 * 8 * 16 * 2;
  }
  __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return ops;
}
#endif

#if defined(__AMX_INT8__) && defined(__AMX_BF16__)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

struct tile_config {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

static void tiles_on(void) {
  _Alignas(64) struct tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // gcc 12 drops the stores above at -O2 (it does not see ldtilecfg read them): a memory barrier keeps them.
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
  static uint8_t zeros[16 * 64];
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  _tile_zero(0);  // tile numbers are immediates
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

static double amx_int8(double seconds) {
  tiles_on();
  double ops = 0, t0 = now_s();
  while (now_s() - t0 < seconds) {
    for (int r = 0; r < 1024; r++) {
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
    ops += 1024.0 * 4 * 16 * 16 * 64 * 2;
  }
  _tile_release();
  return ops;
}

static double amx_bf16(double seconds) {
  tiles_on();
  double ops = 0, t0 = now_s();
  while (now_s() - t0 < seconds) {
    for (int r = 0; r < 1024; r++) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    ops += 1024.0 * 4 * 16 * 16 * 32 * 2;
  }
  _tile_release();
  return ops;
}
#endif

enum { kVnni, kBf16, kAmxInt8, kAmxBf16, kF32, kKernels };

struct job {
  double seconds;
  int amx;  // AMX permission granted
  pthread_barrier_t* barrier;
  double ops[kKernels], elapsed[kKernels];
};

static void timed(struct job* j, int k, kernel_fn fn) {
  pthread_barrier_wait(j->barrier);  // every thread runs the same kernel at the same time
  double t0 = now_s();
  j->ops[k] = fn(j->seconds);
  j->elapsed[k] = now_s() - t0;
}

// One set of threads runs every kernel in turn, created after the AMX permission was granted.
static void* run_job(void* p) {
  struct job* j = (struct job*)p;
#if defined(__AVX512VNNI__)
  timed(j, kVnni, vnni);
#endif
#if defined(__AVX512BF16__)
  timed(j, kBf16, bf16);
#endif
#if defined(__AVX512F__)
  timed(j, kF32, f32fma);
#endif
#if defined(__AMX_INT8__) && defined(__AMX_BF16__)
  if (j->amx) {
    timed(j, kAmxInt8, amx_int8);
    timed(j, kAmxBf16, amx_bf16);
  }
#endif
  return NULL;
}

static void print_rate(const char* key, double value, int last) {
  if (value < 0)
    printf("\"%s\": null%s", key, last ? "" : ", ");
  else
    printf("\"%s\": %.1f%s", key, value, last ? "" : ", ");
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  double seconds = argc > 2 ? atof(argv[2]) : 0.5;
  if (threads < 1 || threads > 64 || !(seconds > 0)) {
    fprintf(stderr, "dot-rate: usage: dot-rate THREADS(1..64) SECONDS(>0)\n");
    return 2;
  }
  int amx = 0;
#if defined(__AMX_INT8__) && defined(__AMX_BF16__)
  amx = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)threads);
  pthread_t tid[64];
  static struct job jobs[64];
  for (int i = 0; i < threads; i++) {
    jobs[i] = (struct job){.seconds = seconds, .amx = amx, .barrier = &barrier};
    for (int k = 0; k < kKernels; k++) jobs[i].ops[k] = -1;
    pthread_create(&tid[i], NULL, run_job, &jobs[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
  double rates[kKernels];
  for (int k = 0; k < kKernels; k++) {
    double ops = 0, elapsed = 0;
    for (int i = 0; i < threads; i++) {
      ops += jobs[i].ops[k];
      if (jobs[i].elapsed[k] > elapsed) elapsed = jobs[i].elapsed[k];
    }
    rates[k] = jobs[0].ops[k] < 0 ? -1 : ops / elapsed / 1e9;  // Σ ops over the slowest thread's time
  }
  double vnni_rate = rates[kVnni], bf16_rate = rates[kBf16], amx_i8 = rates[kAmxInt8], amx_b16 = rates[kAmxBf16];
  printf("{");
  print_rate("vnni_int8", vnni_rate, 0);
  print_rate("avx512_bf16", bf16_rate, 0);
  print_rate("amx_int8", amx_i8, 0);
  print_rate("amx_bf16", amx_b16, 0);
  print_rate("avx512_f32", rates[kF32], 1);
  printf("}\n");
  return 0;
}
