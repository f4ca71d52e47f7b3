// Status: the result of an operation at an I/O or validation boundary.
// Either OK or an error carrying one human-readable line.
#pragma once
#include <string>
#include <utility>

namespace culprit {

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  // `code` is the process exit code this error leads to (culprit/exit_codes.h; 2: bad input).
  static Status Error(std::string message, int code = 2) {
    Status s;
    s.ok_ = false;
    s.message_ = std::move(message);
    s.code_ = code;
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }
  int code() const { return ok_ ? 0 : code_; }

 private:
  bool ok_ = true;
  std::string message_;
  int code_ = 0;
};

}  // namespace culprit

#define CULPRIT_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::culprit::Status _culprit_s = (expr);   \
    if (!_culprit_s.ok()) return _culprit_s; \
  } while (0)
