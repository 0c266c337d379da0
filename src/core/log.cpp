// Logging and check-failure reporting. One mutex keeps lines from interleaving.
#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/check.h"

namespace ds {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_log_mutex;
}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool parse_log_level(const std::string& name, LogLevel* out) {
  static const std::pair<const char*, LogLevel> kNames[] = {
      {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo}, {"warn", LogLevel::kWarn},
      {"error", LogLevel::kError}, {"off", LogLevel::kOff}};
  for (const auto& [n, l] : kNames) {
    if (name == n) {
      *out = l;
      return true;
    }
  }
  return false;
}

void log_write(LogLevel level, const std::string& msg) {
  static const char* kTags[] = {"D", "I", "W", "E", "-"};
  using namespace std::chrono;
  const double t = duration<double>(steady_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::fprintf(stderr, "[%s %.3f] %s\n", kTags[static_cast<int>(level)], t, msg.c_str());
}

namespace detail {
void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    std::fprintf(stderr, "DS_CHECK failed at %s:%d: (%s) %s\n", file, line, cond, msg.c_str());
    std::fflush(stderr);
  }
  std::abort();
}
}  // namespace detail

}  // namespace ds
