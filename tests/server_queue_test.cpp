// The generation queue on its own: FIFO order, one job at a time, the waiting bound (an idle engine
// still takes a job when the bound is 0), skipping jobs cancelled while they wait, and cancel_all.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

#include "server/request_queue.h"

namespace ds {
namespace {

using namespace std::chrono_literals;

TEST(ServerQueue, FifoOneAtATimeAndBounded) {
  GenerationQueue q(2);
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> active{0};
  std::atomic<bool> overlap{false};
  std::atomic<bool> release{false};
  auto make = [&](int id) {
    return [&, id](const GenerationJob&) {
      if (active.fetch_add(1) != 0) overlap = true;
      while (id == 0 && !release.load()) std::this_thread::sleep_for(1ms);
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(id);
      }
      active.fetch_sub(1);
    };
  };
  auto j0 = q.submit(make(0));
  ASSERT_TRUE(j0.is_ok());
  while (!(*j0)->started()) std::this_thread::sleep_for(1ms);
  auto j1 = q.submit(make(1));
  auto j2 = q.submit(make(2));
  ASSERT_TRUE(j1.is_ok());
  ASSERT_TRUE(j2.is_ok());
  EXPECT_EQ(q.waiting(), 2);
  EXPECT_EQ(q.in_flight(), 1);
  auto j3 = q.submit(make(3));
  ASSERT_FALSE(j3.is_ok());
  EXPECT_EQ(j3.status().code(), StatusCode::kResourceExhausted);
  release = true;
  EXPECT_TRUE((*j2)->wait_done(5000ms));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(overlap.load());
}

TEST(ServerQueue, IdleEngineTakesAJobWithZeroWaiting) {
  GenerationQueue q(0);
  std::atomic<int> ran{0};
  auto j = q.submit([&](const GenerationJob&) { ran++; });
  ASSERT_TRUE(j.is_ok()) << j.status().to_string();
  EXPECT_TRUE((*j)->wait_done(5000ms));
  EXPECT_EQ(ran.load(), 1);
}

TEST(ServerQueue, CancelledWhileWaitingIsSkipped) {
  GenerationQueue q(4);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  auto blocker = q.submit([&](const GenerationJob& job) {
    while (!release.load() && !job.cancelled()) std::this_thread::sleep_for(1ms);
  });
  auto waiting = q.submit([&](const GenerationJob&) { ran++; });
  ASSERT_TRUE(waiting.is_ok());
  (*waiting)->cancel();
  release = true;
  EXPECT_TRUE((*waiting)->wait_done(5000ms));
  EXPECT_EQ(ran.load(), 0);
  // cancel_all reaches the running job.
  auto running = q.submit([&](const GenerationJob& job) {
    while (!job.cancelled()) std::this_thread::sleep_for(1ms);
    ran++;
  });
  while (!(*running)->started()) std::this_thread::sleep_for(1ms);
  q.cancel_all();
  EXPECT_TRUE((*running)->wait_done(5000ms));
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace ds
