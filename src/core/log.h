// Leveled logging to stderr. Formatting happens only when the level is enabled.
// Logs carry ids, lengths and timings; never prompt or completion text at info level.
#pragma once

#include <fmt/format.h>

#include <string>

namespace ds {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

LogLevel log_level();
void set_log_level(LogLevel level);
// Parses "debug|info|warn|error|off"; returns false on an unknown name.
bool parse_log_level(const std::string& name, LogLevel* out);
void log_write(LogLevel level, const std::string& msg);

}  // namespace ds

#define DS_LOG(level, ...)                                               \
  do {                                                                   \
    if (static_cast<int>(level) >= static_cast<int>(::ds::log_level())) \
      ::ds::log_write(level, ::fmt::format(__VA_ARGS__));                \
  } while (0)
#define DS_LOG_DEBUG(...) DS_LOG(::ds::LogLevel::kDebug, __VA_ARGS__)
#define DS_LOG_INFO(...) DS_LOG(::ds::LogLevel::kInfo, __VA_ARGS__)
#define DS_LOG_WARN(...) DS_LOG(::ds::LogLevel::kWarn, __VA_ARGS__)
#define DS_LOG_ERROR(...) DS_LOG(::ds::LogLevel::kError, __VA_ARGS__)
