// The exported file, written as culprit writes its own replaced files (a temporary beside it,
// fsync, rename, fsync of the directory) but outside any run directory: a reader never sees a
// half-written export, and an existing file is replaced only when asked.
#pragma once
#include <string>

#include "culprit/status.h"

namespace culprit::harness {

// Before any work: `path` is not a directory, and does not exist unless `replace` (BadInput
// naming it). Whether it can be written is found when it is (write_output).
Status check_output(const std::string& path, bool replace);

// Writes `bytes` to `path` atomically. Without `replace`, an existing `path` (also one created
// since check_output) is refused and left as it is; with it, it is replaced (a link there is
// replaced itself, its target untouched). An OS failure is IoError naming the file and the
// reason; nothing is left behind.
Status write_output(const std::string& path, const std::string& bytes, bool replace);

}  // namespace culprit::harness
