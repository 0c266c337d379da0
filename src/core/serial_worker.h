// SerialWorker: one thread that runs jobs in the order they were submitted, off the caller's path
// (the engine's snapshot copies, each after its parent's; the disk store's writes).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ds {

class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();  // runs the jobs still queued, then joins
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void submit(std::function<void()> job);
  // Jobs waiting to run (not counting one that runs).
  size_t queued() const;
  // Returns once every job submitted before the call has run.
  void wait_idle();

 private:
  void loop();

  mutable std::mutex mutex_;  // guards the queue and flags
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false, stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace ds
