// Status and Result<T>: every public entry point reports what is wrong instead of throwing.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace radixtier {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,     ///< bad input: the cache's state is unchanged
  kNotFound,            ///< unknown handle or id
  kOutOfMemory,         ///< a tier is full and nothing can be evicted
  kTransferFailed,      ///< a copy failed or the engine refused it (its message says which)
  kPending,             ///< an async operation has not finished yet
  kFailedPrecondition,  ///< the call is valid but not in this state
  kDeviceLost,          ///< the GPU context is lost (sticky CUDA error): restart the process
  kDataLoss,            ///< persisted bytes failed their check (checksum, truncation): lost
};

const char* to_string(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) {
  return {ErrorCode::kInvalidArgument, std::move(msg)};
}
inline Status not_found(std::string msg) {
  return {ErrorCode::kNotFound, std::move(msg)};
}
inline Status out_of_memory(std::string msg) {
  return {ErrorCode::kOutOfMemory, std::move(msg)};
}

/// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).is_ok()); }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  /// By value: a range-for over `f().value()` must not dangle.
  T value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace radixtier
