// Bounded FIFO of generation jobs run one at a time on a single worker thread. Non-obvious choice:
// the engine is only ever called from this one thread (device contexts and per-thread scratch stay
// put), while HTTP threads wait for their job, send keep-alives and watch for their client leaving.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "core/status.h"

namespace ds {

class GenerationJob {
 public:
  explicit GenerationJob(std::function<void(const GenerationJob&)> fn) : fn_(std::move(fn)) {}
  // Set by the HTTP side when the client is gone; a job not yet started is skipped.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  bool started() const;
  // Waits up to `timeout` for the job to finish; returns true when it has.
  bool wait_done(std::chrono::milliseconds timeout);

 private:
  friend class GenerationQueue;
  std::function<void(const GenerationJob&)> fn_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;  // protects started_, done_
  std::condition_variable cv_;
  bool started_ = false;
  bool done_ = false;
};

class GenerationQueue {
 public:
  explicit GenerationQueue(int32_t max_waiting);
  ~GenerationQueue();  // finishes the running job, skips waiting ones, joins the worker

  // Queues `fn`; kResourceExhausted when max_waiting jobs are already waiting for their turn.
  Result<std::shared_ptr<GenerationJob>> submit(std::function<void(const GenerationJob&)> fn);
  int32_t waiting() const;    // queued, not started
  int32_t in_flight() const;  // 0 or 1
  // Cancels every waiting job and the running one (used at shutdown).
  void cancel_all();

 private:
  void worker_loop();

  const int32_t max_waiting_;
  mutable std::mutex mu_;  // protects jobs_, running_, stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenerationJob>> jobs_;
  std::shared_ptr<GenerationJob> running_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace ds
