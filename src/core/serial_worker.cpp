// SerialWorker: a queue under one mutex, a thread that pops and runs, a condition for idleness.
#include "core/serial_worker.h"

namespace ds {

SerialWorker::SerialWorker() : thread_([this] { loop(); }) {}

SerialWorker::~SerialWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SerialWorker::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

size_t SerialWorker::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return jobs_.size();
}

void SerialWorker::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return jobs_.empty() && !running_; });
}

void SerialWorker::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopped and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
    }
    job();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    idle_.notify_all();
  }
}

}  // namespace ds
