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

// `text` made safe to print on one line: valid UTF-8 is kept; control characters and bytes that are
// not valid UTF-8 (names and strings read from damaged files) become \xNN. keep_newlines: for
// multi-line reports.
std::string printable(const std::string& text, bool keep_newlines = false);

}  // namespace culprit

#define CULPRIT_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::culprit::Status _culprit_s = (expr);   \
    if (!_culprit_s.ok()) return _culprit_s; \
  } while (0)
