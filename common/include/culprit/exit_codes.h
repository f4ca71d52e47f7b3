// Named exit codes of the culprit executable (documented in README.md), and the one place that maps
// a Status's category to its exit code.
#pragma once

#include <string>

#include "culprit/status.h"

namespace culprit {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,     // an unexpected internal failure
  kExitUsage = 2,       // bad command line, configuration or input
  kExitMpi = 3,         // an MPI call failed
  kExitDamaged = 4,     // a checkpoint, trace or run record is damaged (verify; any command reading it)
  kExitDiffers = 5,     // diff: the checkpoints differ; replay, audit: the replay differs from the trace
  kExitIo = 6,          // a file could not be read, written, synced or renamed (full disk, permissions)
  // train --on-detect halt: what the detectors suspect (docs/detection.md).
  kExitHardware = 10,   // hardware suspected: replicas diverged, corrupted communication
  kExitNumerical = 11,  // numerical: NaN/Inf in loss, gradients or parameters
  kExitInvariant = 12,  // a training invariant was violated
  kExitSilentRank = 13,  // a rank stopped responding (died or stuck): --collective-timeout
  // bisect: the verdict (docs/bisect.md); "none" exits 0.
  kExitHardwareTransient = 20,
  kExitHardwarePersistent = 21,
  kExitSoftwareNondeterminism = 22,
  kExitNumericalInstability = 23,
  kExitData = 24,
  kExitInconclusive = 25,         // nothing found, but part of the run was not examined
  kExitHardwareUnconfirmed = 26,  // a rank computed wrongly; its device was not rerun
  // bisect's damaged-record verdict exits kExitDamaged (4).
};

// What an exit code that reports a finding means (5, 10-13, 20-26), as the last line culprit prints:
// "culprit: verdict hardware-transient (exit 20): this is a diagnosis, not a failure; see
// RUN/diagnosis.json". Under mpirun that line comes before Open MPI's own "process returned a
// non-zero exit code" banner, which reads as a crash (README.md, "Exit codes"). "" for any other code
// (0, and the errors, which end with their own `culprit: error:` line). `run_dir` may be "".
std::string exit_note(int code, const std::string& run_dir);

// The exit code of a Status's category (kExitOk for OK).
int exit_code(StatusCode code);
inline int exit_code(const Status& s) { return exit_code(s.code()); }

}  // namespace culprit
