// Status: the result of an operation at an I/O or validation boundary: OK, or an error of one
// category carrying one human-readable line. The category says what kind of failure it is and, in
// one place (exit_code() in culprit/exit_codes.h), which exit code it ends the process with.
#pragma once
#include <string>
#include <utility>

namespace culprit {

enum class StatusCode : int {
  kOk = 0,
  kBadInput,    // an option, configuration, input file, shape or label given by the user is wrong
  kIo,          // a file or directory could not be read, written, synced or renamed (full disk, ...)
  kDamaged,     // a checkpoint, trace or run record fails its checks (fingerprints, structure)
  kDiffers,     // a comparison found a difference (diff, replay, audit)
  kMpi,         // an MPI call failed
  kInternal,    // an unexpected failure inside culprit or a library it calls (libtorch, HDF5)
  kHardware,    // a detector suspects hardware; screen: a device failed
  kNumerical,   // a detector found NaN/Inf (or a spike, with --spike-action halt)
  kInvariant,   // a training invariant was violated
  kSilentRank,  // a rank stopped responding
};
// The category's name, as docs/architecture.md lists them ("bad-input", "io", ...).
const char* status_code_name(StatusCode code);

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status Error(StatusCode code, std::string message) {
    Status s;
    s.code_ = code == StatusCode::kOk ? StatusCode::kInternal : code;
    s.message_ = std::move(message);
    return s;
  }
  static Status BadInput(std::string m) { return Error(StatusCode::kBadInput, std::move(m)); }
  static Status IoError(std::string m) { return Error(StatusCode::kIo, std::move(m)); }
  static Status Damaged(std::string m) { return Error(StatusCode::kDamaged, std::move(m)); }
  static Status Differs(std::string m) { return Error(StatusCode::kDiffers, std::move(m)); }
  static Status Internal(std::string m) { return Error(StatusCode::kInternal, std::move(m)); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The same error, its message prefixed with "prefix: " (OK stays OK).
  Status prefixed(const std::string& prefix) const {
    return ok() ? *this : Error(code_, prefix + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
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
