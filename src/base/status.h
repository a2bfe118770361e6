// Status and Result<T>: how expected failures travel (dead peer, timeout, bad
// request, malformed file). Layer: base; used by every layer above.
// Bugs and broken invariants use TESSERA_CHECK (check.h) instead.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "base/check.h"

namespace tessera {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kResourceExhausted,
  kDeadlineExceeded,
  kUnavailable,
  kPermissionDenied,
  kAborted,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DeadlineExceeded: rank 3 (10.0.0.7:29500) did not answer within 5 s".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context`: "context: message".
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status ResourceExhaustedError(std::string message);
Status DeadlineExceededError(std::string message);
Status UnavailableError(std::string message);
Status PermissionDeniedError(std::string message);
Status AbortedError(std::string message);
Status InternalError(std::string message);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    TESSERA_CHECK(!status_.ok()) << "Result constructed from an OK status without a value";
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & {
    TESSERA_CHECK(ok()) << status_.ToString();
    return *value_;
  }
  const T& value() const& {
    TESSERA_CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T&& value() && {
    TESSERA_CHECK(ok()) << status_.ToString();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tessera

#define TESSERA_STATUS_CONCAT_INNER(a, b) a##b
#define TESSERA_STATUS_CONCAT(a, b) TESSERA_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define TESSERA_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    ::tessera::Status tessera_status_ = (expr);       \
    if (!tessera_status_.ok()) return tessera_status_; \
  } while (0)

// `TESSERA_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a Result or returns its error.
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL(TESSERA_STATUS_CONCAT(tessera_result_, __LINE__), lhs, expr)
#define TESSERA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
