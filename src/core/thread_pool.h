// A fixed pool of worker threads for data-parallel loops (matrix products, quantization, model
// generation). parallel_for splits [0, n) into contiguous ranges, one per thread, and runs them with
// the calling thread taking part; it returns when all ranges are done.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ds {

class ThreadPool {
 public:
  // n_threads counts the caller: 1 means no workers. 0 picks the number of hardware threads.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // fn(begin, end, thread_index) over a partition of [0, n) into at most n_threads ranges whose
  // sizes are multiples of `grain` (except the last). Not reentrant: do not call from inside fn.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

  // Process-wide pool used when no pool is passed explicitly; sized by set_default_threads().
  static ThreadPool& global();
  static void set_default_threads(int n_threads);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;                  // guards sleeping on cv_work_
  std::condition_variable cv_work_;
  // The current job; written by the caller before generation_ is bumped.
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};       // worker ranges of the current job not yet finished
  std::atomic<bool> stop_{false};
};

// parallel_for on the process's pool for passes over host memory (snapshot copies and checksums),
// apart from the compute pool, so a disk writer's pass cannot collide with a forward's loop: at most
// 8 threads, the caller's included; callers on several threads take turns.
void host_parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

}  // namespace ds
