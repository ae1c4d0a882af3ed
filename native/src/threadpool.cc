// Persistent thread pool (see threadpool.h for the contract).
#include "threadpool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPECD_CPU_RELAX() _mm_pause()
#else
#define SPECD_CPU_RELAX() std::this_thread::yield()
#endif

namespace specd {
namespace {

constexpr auto kSpin = std::chrono::microseconds(50);

class Pool {
 public:
  explicit Pool(int threads) : size_(threads < 1 ? 1 : threads) {
    for (int w = 1; w < size_; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return size_; }

  /** Runs fn over `parts` (2 ≤ parts ≤ size) static ranges of [0, n); see threadpool.h. */
  void Run(int64_t n, int parts, const std::function<void(int64_t, int64_t)>& fn) {
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      parts_ = parts;
      error_ = nullptr;
      finished_.store(0, std::memory_order_relaxed);
      gen = generation_.load(std::memory_order_relaxed) + 1;
      claim_.store(gen << kIndexBits, std::memory_order_relaxed);  // (generation, next range 0)
      generation_.store(gen, std::memory_order_release);
    }
    wake_.notify_all();
    // Take ranges until none is left; workers that are running take the others.
    RunClaimed(gen, n, parts, fn);
    // Wait for ranges a worker claimed and is still running: spin first, then sleep.
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    while (finished_.load(std::memory_order_acquire) != parts && std::chrono::steady_clock::now() < spin_until) {
      SPECD_CPU_RELAX();
    }
    if (finished_.load(std::memory_order_acquire) != parts) {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [&] { return finished_.load(std::memory_order_acquire) == parts; });
    }
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(mu_);
      error = error_;
      fn_ = nullptr;
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  static constexpr int kIndexBits = 16;  // parts <= 1024 < 2^16

  /**
   * Claims ranges of job `gen` one by one and runs them. A claim succeeds only while the claim word
   * still holds `gen`, so a late worker never runs a range of a newer job with an older fn.
   */
  void RunClaimed(uint64_t gen, int64_t n, int parts, const std::function<void(int64_t, int64_t)>& fn) {
    for (;;) {
      uint64_t word = claim_.load(std::memory_order_acquire);
      int64_t index = 0;
      do {
        if ((word >> kIndexBits) != gen) return;
        index = static_cast<int64_t>(word & ((uint64_t{1} << kIndexBits) - 1));
        if (index >= parts) return;
      } while (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire));
      try {
        fn(n * index / parts, n * (index + 1) / parts);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();  // the first error by range order of completion
      }
      if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts) {
        std::lock_guard<std::mutex> lock(mu_);
        done_.notify_all();
      }
    }
  }

  void WorkerLoop(int /*index*/) {
    uint64_t seen = 0;
    for (;;) {
      const auto spin_until = std::chrono::steady_clock::now() + kSpin;
      while (generation_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < spin_until) {
        SPECD_CPU_RELAX();
      }
      const std::function<void(int64_t, int64_t)>* fn = nullptr;
      int64_t n = 0;
      int parts = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen || stop_; });
        if (stop_) return;
        seen = generation_.load(std::memory_order_acquire);
        fn = fn_;
        n = n_;
        parts = parts_;
      }
      if (fn == nullptr) continue;  // the job already finished
      RunClaimed(seen, n, parts, *fn);
    }
  }

  const int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> claim_{0};  // (generation << kIndexBits) | next unclaimed range
  std::atomic<int> finished_{0};    // ranges of the current job that returned
  bool stop_ = false;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0;
  std::exception_ptr error_;
};

// Process-lifetime objects, deliberately never destroyed: no static-destruction-order hazards and
// no join at exit while a libuv thread may still be inside ParallelFor.
std::mutex& RunMutex() {  // one ParallelFor at a time; also guards pool replacement
  static std::mutex* mu = new std::mutex();
  return *mu;
}
Pool* g_pool = nullptr;
// Pool size for the lock-free inline test; 0 until the pool exists (then the slow path builds it).
std::atomic<int> g_size{0};

Pool& GetPool() {
  if (g_pool == nullptr) {
    g_pool = new Pool(DefaultPoolSize());
    g_size.store(g_pool->size(), std::memory_order_release);
  }
  return *g_pool;
}

}  // namespace

namespace {

/** The integer env var `name` in [lo, hi], or `fallback` when unset or empty; throws naming it when malformed. */
int64_t EnvInteger(const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (end == env || *end != '\0' || v < lo || v > hi) {
    throw std::runtime_error(std::string("specd native: ") + name + ": expected an integer in [" + std::to_string(lo) +
                             ", " + std::to_string(hi) + "], got \"" + env + "\"");
  }
  return static_cast<int64_t>(v);
}

}  // namespace

int DefaultPoolSize() {
  if (const int64_t n = EnvInteger("SPECD_NUM_THREADS", 1, 1024, 0); n > 0) return static_cast<int>(n);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

int64_t DefaultMinWorkPerThread() {
  return EnvInteger("SPECD_PARALLEL_MIN_WORK", 1, kMaxMinWorkPerThread, kMinWorkPerThread);
}

int PoolSize() {
  std::lock_guard<std::mutex> lock(RunMutex());
  return GetPool().size();
}

void SetPoolSize(int threads) {
  std::lock_guard<std::mutex> lock(RunMutex());
  delete g_pool;  // joins the old workers (idle: no ParallelFor can run while we hold the mutex)
  g_pool = new Pool(threads);
  g_size.store(g_pool->size(), std::memory_order_release);
}

namespace {
std::atomic<int64_t> g_min_work{kMinWorkPerThread};
}  // namespace

void SetMinWorkPerThread(int64_t units) {
  g_min_work.store(std::clamp<int64_t>(units, 1, kMaxMinWorkPerThread), std::memory_order_relaxed);
}
int64_t MinWorkPerThread() { return g_min_work.load(std::memory_order_relaxed); }

int64_t PartitionCount(int64_t n, int64_t workPerItem, int threads) {
  if (n <= 0) return 0;
  int64_t parts = n < threads ? n : threads;
  const int64_t w = workPerItem < 1 ? 1 : workPerItem;
  // n * w / min_work without overflow: at most `parts` matters.
  const int64_t min_work = MinWorkPerThread();
  const int64_t by_work = n > (INT64_MAX / w) ? parts : n * w / min_work;
  if (by_work < parts) parts = by_work < 1 ? 1 : by_work;
  return parts;
}

void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t workPerItem) {
  if (n <= 0) return;
  // Inline calls skip the pool and its mutex entirely: they share nothing with a running job.
  const int size = g_size.load(std::memory_order_acquire);
  if (size > 0 && PartitionCount(n, workPerItem, size) <= 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> lock(RunMutex());
  Pool& pool = GetPool();
  const int64_t parts = PartitionCount(n, workPerItem, pool.size());
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  pool.Run(n, static_cast<int>(parts), fn);
}

}  // namespace specd
