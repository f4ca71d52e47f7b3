// Named exit codes of the culprit executable (documented in README.md).
#pragma once

namespace culprit {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,     // an unexpected internal failure
  kExitUsage = 2,       // bad command line, configuration or input
  kExitMpi = 3,         // an MPI call failed
  kExitDamaged = 4,     // verify: a checkpoint or trace is damaged
  kExitDiffers = 5,     // diff: the checkpoints differ
};

}  // namespace culprit
