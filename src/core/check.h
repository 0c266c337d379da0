// DS_CHECK: always-on invariant checks for bugs (never for bad user input, which gets a Status).
#pragma once

#include <fmt/format.h>

namespace ds::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}

#define DS_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) [[unlikely]] {                                                              \
      ::ds::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
    }                                                                                        \
  } while (0)

#ifndef NDEBUG
#define DS_DCHECK(cond, ...) DS_CHECK(cond, __VA_ARGS__)
#else
#define DS_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#endif
