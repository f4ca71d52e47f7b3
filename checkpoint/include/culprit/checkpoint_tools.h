// `culprit inspect`, `verify` and `diff`: reading checkpoints and traces for people and scripts.
#pragma once
#include <string>
#include <vector>

#include "culprit/command.h"

#include "culprit/status.h"

namespace culprit::ckpt {

// A readable table (or JSON) of a checkpoint or trace file. Damaged datasets are marked, not fatal.
Status inspect(const std::string& path, bool json, std::string* out);

// Rechecks every fingerprint of a checkpoint file, or of every checkpoint and trace of a run
// directory. *report gets one line per file; *clean is false on any damage. A failure to read a
// file (permissions, EIO) is reported on its line too, and *unreadable set (verify's exit 6 when
// nothing was found damaged). A run directory another job is writing is refused (BadInput "in use",
// files::check_not_in_use): its newest rows and checkpoints are in the middle of being written.
Status verify(const std::string& path, std::string* report, bool* clean, bool* unreadable = nullptr);

// Compares two checkpoints tensor by tensor. *identical is true when every tensor matches bitwise.
Status diff(const std::string& a, const std::string& b, std::string* report, bool* identical);

// The one-process commands over a run's files, with their options (commands.cpp): inspect, verify,
// diff, and report and log over the JSON records (culprit/records.h).
std::vector<cli::Command> commands();

}  // namespace culprit::ckpt
