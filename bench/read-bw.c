// Read bandwidth of T threads (STREAM-like "sum" without the arithmetic): each thread reads its contiguous
// 1/T of a MIB-MiB buffer with 64-byte AVX-512 loads (4 independent XOR chains, no stores), 9 passes, the
// threads started together by a barrier; bandwidth = bytes ÷ the slowest thread's best pass. For the decode
// bound of issue 16 (model bytes read per step ÷ this). Bench-only, never part of the addon:
//
//   cc -O2 -march=native -pthread bench/read-bw.c -o /tmp/read-bw && /tmp/read-bw 2 256
//   -> "threads 2, 256 MiB: read 75.2 GB/s"
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t g_bytes;
static char* g_buf;
static int g_threads;
static pthread_barrier_t g_barrier;
static double g_best[64];
static volatile int g_sink;

static void* Run(void* arg) {
  const long id = (long)arg;
  const size_t per = g_bytes / g_threads / 256 * 256;
  const char* p = g_buf + id * per;
  double best = 1e30;
  for (int pass = 0; pass < 9; ++pass) {
    pthread_barrier_wait(&g_barrier);
    const double t0 = now_s();
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < per; i += 256) {
      s0 = _mm512_xor_si512(s0, _mm512_load_si512(p + i));
      s1 = _mm512_xor_si512(s1, _mm512_load_si512(p + i + 64));
      s2 = _mm512_xor_si512(s2, _mm512_load_si512(p + i + 128));
      s3 = _mm512_xor_si512(s3, _mm512_load_si512(p + i + 192));
    }
    g_sink = _mm512_reduce_add_epi32(_mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3)));
    const double t = now_s() - t0;
    if (t < best) best = t;
    pthread_barrier_wait(&g_barrier);
  }
  g_best[id] = best;
  return NULL;
}

int main(int argc, char** argv) {
  g_threads = argc > 1 ? atoi(argv[1]) : 2;
  const long mib = argc > 2 ? atol(argv[2]) : 256;
  if (g_threads < 1 || g_threads > 64 || mib < 1) {
    fprintf(stderr, "usage: read-bw THREADS(1..64) MIB\n");
    return 2;
  }
  g_bytes = (size_t)mib << 20;
  g_buf = aligned_alloc(4096, g_bytes);
  if (g_buf == NULL) return 1;
  memset(g_buf, 1, g_bytes);
  pthread_barrier_init(&g_barrier, NULL, g_threads);
  pthread_t th[64];
  for (long i = 0; i < g_threads; ++i) pthread_create(&th[i], NULL, Run, (void*)i);
  for (int i = 0; i < g_threads; ++i) pthread_join(th[i], NULL);
  double slowest = 0;
  for (int i = 0; i < g_threads; ++i)
    if (g_best[i] > slowest) slowest = g_best[i];
  const size_t read = g_bytes / g_threads / 256 * 256 * g_threads;
  printf("threads %d, %ld MiB: read %.1f GB/s\n", g_threads, mib, read / slowest / 1e9);
  free(g_buf);
  return 0;
}
