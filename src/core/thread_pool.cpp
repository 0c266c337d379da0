// ThreadPool: a job is published by bumping an atomic generation counter; workers spin on it for a
// short while after each job (decode issues hundreds of small parallel loops per token, microseconds
// apart, and a condition-variable wake per loop would cost more than the loop), then sleep on a
// condition variable. The caller spin-waits for the job's ranges to finish.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DS_CPU_RELAX() _mm_pause()
#else
#define DS_CPU_RELAX() std::this_thread::yield()
#endif

namespace ds {
namespace {
std::atomic<int> g_default_threads{0};
// How long an idle worker keeps polling for the next job before sleeping.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(200);
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for the next generation, then sleep.
    const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
    int polls = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed)) {
      DS_CPU_RELAX();
      if (++polls % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_work_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
        break;
      }
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    const int64_t begin = std::min(n_, chunk_ * index);
    const int64_t end = std::min(n_, begin + chunk_);
    if (begin < end) (*fn_)(begin, end, index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_grains = (n + grain - 1) / grain;
  if (n_threads_ == 1 || n_grains == 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t chunk = (n_grains + n_threads_ - 1) / n_threads_ * grain;
  // Workers read the job fields only after observing the new generation (acquire/release pair).
  fn_ = &fn;
  n_ = n;
  chunk_ = chunk;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Taking the lock orders the bump against a worker that is about to sleep.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_work_.notify_all();
  fn(0, std::min(n, chunk), 0);
  int polls = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    DS_CPU_RELAX();
    if (++polls % 1024 == 0) std::this_thread::yield();
  }
  fn_ = nullptr;
}

ThreadPool& ThreadPool::global() {
  static std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(g_default_threads.load());
  return *pool;
}

void ThreadPool::set_default_threads(int n_threads) { g_default_threads.store(n_threads); }

void host_parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  static std::mutex turn;
  static ThreadPool pool(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  std::lock_guard<std::mutex> lock(turn);
  pool.parallel_for(n, fn, grain);
}

}  // namespace ds
