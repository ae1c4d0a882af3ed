// One persistent process-wide thread pool for all kernels.
//
// Size: the number of CPUs this process may run on (sched_getaffinity), or SPECD_NUM_THREADS
// when set (an integer >= 1). The calling thread takes part, so a pool of size T owns T-1 worker
// threads. Workers spin briefly (~50 us) after a job, then sleep on a condition variable.
//
// ParallelFor(n, fn) splits [0, n) into T' = min(T, n) contiguous ranges with the static rule
// range i = [n*i/T', n*(i+1)/T') and calls fn(begin, end) once per range, range 0 on the caller.
// The partition depends only on (n, T), never on timing: kernels that give each output element
// to exactly one range (e.g. GEMM partitions over N only, never K) are deterministic and
// independent of the thread count.
//
// The pool is process-wide: the main thread, AsyncWorkers on libuv threads and every Node
// worker_thread that loads the addon (e.g. TP ranks) share it, and concurrent callers are
// serialised by a mutex: one ParallelFor runs at a time (the cores are shared anyway). When n == 1
// or the pool has one thread, fn runs inline on the caller. fn must not call ParallelFor (that would deadlock);
// the first exception thrown by any range is rethrown on the caller after all ranges finish.
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

/** Runs fn over a static partition of [0, n); see the file comment. */
void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace specd
