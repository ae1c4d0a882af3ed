// Persistent thread pool (see threadpool.h for the contract).
#include "threadpool.h"

#include <sched.h>

#include <atomic>
#include <chrono>
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

  void Run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    const int parts = static_cast<int>(n < size_ ? n : size_);
    if (parts == 1) {
      fn(0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      parts_ = parts;
      error_ = nullptr;
      pending_.store(parts - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      fn(0, n / parts);
    } catch (...) {
      mine = std::current_exception();
    }
    // Wait for the other ranges: spin first, then sleep.
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    while (pending_.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < spin_until) {
      SPECD_CPU_RELAX();
    }
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    std::exception_ptr theirs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      theirs = error_;
      fn_ = nullptr;
    }
    if (mine) std::rethrow_exception(mine);
    if (theirs) std::rethrow_exception(theirs);
  }

 private:
  void WorkerLoop(int index) {
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
      if (fn == nullptr || index >= parts) continue;  // not needed for this job
      try {
        (*fn)(n * index / parts, n * (index + 1) / parts);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        done_.notify_all();
      }
    }
  }

  const int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
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

Pool& GetPool() {
  if (g_pool == nullptr) g_pool = new Pool(DefaultPoolSize());
  return *g_pool;
}

}  // namespace

int DefaultPoolSize() {
  if (const char* env = std::getenv("SPECD_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || v < 1 || v > 1024) {
      throw std::runtime_error(std::string("specd native: SPECD_NUM_THREADS: expected an integer in [1, 1024], got \"") +
                               env + "\"");
    }
    return static_cast<int>(v);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

int PoolSize() {
  std::lock_guard<std::mutex> lock(RunMutex());
  return GetPool().size();
}

void SetPoolSize(int threads) {
  std::lock_guard<std::mutex> lock(RunMutex());
  delete g_pool;  // joins the old workers (idle: no ParallelFor can run while we hold the mutex)
  g_pool = new Pool(threads);
}

void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  std::lock_guard<std::mutex> lock(RunMutex());
  GetPool().Run(n, fn);
}

}  // namespace specd
