// Generation queue: one worker thread, FIFO order, bounded waiting list (see request_queue.h).
#include "server/request_queue.h"

namespace ds {

bool GenerationJob::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

bool GenerationJob::wait_done(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return done_; });
}

GenerationQueue::GenerationQueue(int32_t max_waiting) : max_waiting_(max_waiting) {
  worker_ = std::thread([this] { worker_loop(); });
}

GenerationQueue::~GenerationQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (auto& j : jobs_) j->cancel();
  }
  cv_.notify_all();
  worker_.join();
}

Result<std::shared_ptr<GenerationJob>> GenerationQueue::submit(std::function<void(const GenerationJob&)> fn) {
  auto job = std::make_shared<GenerationJob>(std::move(fn));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return resource_exhausted("generation queue: shutting down");
    // An idle engine takes a job even with max_waiting 0; otherwise at most max_waiting wait.
    const bool idle = jobs_.empty() && !running_;
    if (!idle && static_cast<int32_t>(jobs_.size()) >= max_waiting_) {
      return resource_exhausted("generation queue full: {} requests waiting (--max-queue {})", jobs_.size(),
                                max_waiting_);
    }
    jobs_.push_back(job);
  }
  cv_.notify_all();
  return job;
}

int32_t GenerationQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(jobs_.size());
}

int32_t GenerationQueue::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_ ? 1 : 0;
}

void GenerationQueue::cancel_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& j : jobs_) j->cancel();
  if (running_) running_->cancel();
}

void GenerationQueue::worker_loop() {
  for (;;) {
    std::shared_ptr<GenerationJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      job = jobs_.front();
      jobs_.pop_front();
      running_ = job;
    }
    {
      std::lock_guard<std::mutex> lock(job->mu_);
      job->started_ = true;
    }
    // A job whose client left while waiting is skipped; the job function sees cancelled() itself.
    if (!job->cancelled()) job->fn_(*job);
    {
      std::lock_guard<std::mutex> lock(job->mu_);
      job->done_ = true;
    }
    job->cv_.notify_all();
    std::lock_guard<std::mutex> lock(mu_);
    running_.reset();
  }
}

}  // namespace ds
