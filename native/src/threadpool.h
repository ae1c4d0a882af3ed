// One persistent process-wide thread pool for all kernels.
//
// Size: the number of CPUs this process may run on (sched_getaffinity), or SPECD_NUM_THREADS
// when set (an integer >= 1). The calling thread takes part, so a pool of size T owns T-1 worker
// threads. Workers spin briefly (~50 us) after a job, then sleep on a condition variable.
//
// ParallelFor(n, fn, workPerItem) splits [0, n) into P contiguous ranges with the static rule
// range i = [n*i/P, n*(i+1)/P) and calls fn(begin, end) once per range, where
//   P = min(T, n, max(1, n * workPerItem / MinWorkPerThread())):
// a call too small to repay a hand-off (one row of 256 to normalise) runs inline on the caller (P = 1)
// without touching the pool, its mutex or the workers. The partition depends only on (n, workPerItem, T)
// and the threshold, never on timing: kernels that give each output element to
// exactly one range (e.g. GEMM partitions over N only, never K) are deterministic and independent
// of the partition, hence of the thread count and of the inline threshold.
//
// Ranges are claimed, not assigned: the caller and the woken workers take the next unclaimed range
// (one atomic per claim) until none is left, so a worker that the OS has not scheduled yet (a
// loaded 2-vCPU VM: ~100 µs) never holds up the call; the caller does its range itself. Which
// thread runs a range never changes what the range computes.
//
// The pool is process-wide: the main thread, AsyncWorkers on libuv threads and every Node
// worker_thread that loads the addon (e.g. TP ranks) share it, and concurrent callers are
// serialised by a mutex: one ParallelFor runs at a time (the cores are shared anyway). When P == 1
// (n == 1, a small call, or a pool of one thread), fn runs inline on the caller. fn must not call ParallelFor (that
// would deadlock); the first exception thrown by any range is rethrown on the caller after all ranges finish.
#pragma once
#include <cstdint>
#include <functional>

namespace specd {

/** Number of threads (caller included) ParallelFor uses. */
int PoolSize();

/** Rebuilds the pool with `threads` >= 1 threads (waits for a running ParallelFor). */
void SetPoolSize(int threads);

/** Thread count from SPECD_NUM_THREADS or the CPU affinity mask; throws on a malformed env var. */
int DefaultPoolSize();

/**
 * Default work units (≈ one f32 element read or written, or one multiply-add; ~0.1–1 ns on one core) a
 * range must hold before ParallelFor splits a call: below 2 × this the call runs inline. 2^17 until
 * 2026-12-05; 2^14 since (docs/BENCHMARKS.md, "Native dispatch: the split threshold lowered"): the
 * workers spin ~50 µs after a job, so within a forward a hand-off costs a few µs, and kimi-k3-tiny's
 * 256-wide GEMMs, MoE experts and KDA heads ran on one thread (one-sequence decode ×1.38 faster split).
 */
constexpr int64_t kMinWorkPerThread = int64_t{1} << 14;

/** Largest threshold SetMinWorkPerThread takes. */
constexpr int64_t kMaxMinWorkPerThread = int64_t{1} << 30;

/** Sets the threshold above (process-wide; clamped to [1, kMaxMinWorkPerThread]); never changes a result. */
void SetMinWorkPerThread(int64_t units);
/** The threshold in use. */
int64_t MinWorkPerThread();
/** SPECD_PARALLEL_MIN_WORK when set, else kMinWorkPerThread; throws on a malformed env var. */
int64_t DefaultMinWorkPerThread();

/** Work per item when the caller gives none: always split (the partition of older callers). */
constexpr int64_t kUnknownWork = kMaxMinWorkPerThread;

/**
 * Runs fn over a static partition of [0, n); see the file comment. `workPerItem` ≥ 1: the cost of
 * one index in work units (e.g. a row of `dim` elements: `dim`; a GEMM panel: 16·k·m).
 */
void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                 int64_t workPerItem = kUnknownWork);

/** Ranges ParallelFor(n, ·, workPerItem) would use with `threads` threads (tests, benches). */
int64_t PartitionCount(int64_t n, int64_t workPerItem, int threads);

}  // namespace specd
