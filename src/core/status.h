// Status / Result<T>: expected failures (bad input, corrupt files, full disks) travel as values.
// Bugs use DS_CHECK (check.h) and abort. Messages name the file/tensor/offset, expected and actual.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ds {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // caller passed something malformed (bad flag, bad request field)
  kNotFound,          // file, key, tensor or model missing
  kCorrupt,           // file contents violate the format (GGUF, safetensors, snapshot)
  kUnsupported,       // valid but not handled (tensor type, architecture)
  kIoError,           // read/write/fsync failed
  kOutOfMemory,       // host or device allocation failed at reservation
  kResourceExhausted, // a bounded queue, pool or budget is full
  kCancelled,         // client went away
  kInternal,          // a library call failed in a way we cannot classify
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corrupt: model.gguf: offset 24: ..." form for logs and CLI errors.
  std::string to_string() const;
  // Prepends context: "loading model: " + message.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
#define DS_STATUS_FACTORY(fn, code)                                        \
  template <typename... Args>                                              \
  Status fn(fmt::format_string<Args...> f, Args&&... args) {               \
    return Status(StatusCode::code, fmt::format(f, std::forward<Args>(args)...)); \
  }
DS_STATUS_FACTORY(invalid_argument, kInvalidArgument)
DS_STATUS_FACTORY(not_found, kNotFound)
DS_STATUS_FACTORY(corrupt, kCorrupt)
DS_STATUS_FACTORY(unsupported, kUnsupported)
DS_STATUS_FACTORY(io_error, kIoError)
DS_STATUS_FACTORY(out_of_memory, kOutOfMemory)
DS_STATUS_FACTORY(resource_exhausted, kResourceExhausted)
DS_STATUS_FACTORY(cancelled, kCancelled)
DS_STATUS_FACTORY(internal_error, kInternal)
#undef DS_STATUS_FACTORY

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) {}

  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<1>(v_);
  }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ds

#define DS_CONCAT_INNER(a, b) a##b
#define DS_CONCAT(a, b) DS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define DS_TRY(expr)                                   \
  do {                                                 \
    ::ds::Status ds_try_status_ = (expr);              \
    if (!ds_try_status_.is_ok()) return ds_try_status_; \
  } while (0)

// `DS_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define DS_ASSIGN_OR_RETURN(lhs, expr) DS_ASSIGN_OR_RETURN_IMPL(DS_CONCAT(ds_res_, __LINE__), lhs, expr)
#define DS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
