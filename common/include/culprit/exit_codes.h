// Named exit codes of the culprit executable (documented in README.md).
#pragma once

namespace culprit {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,     // an unexpected internal failure
  kExitUsage = 2,       // bad command line, configuration or input
  kExitMpi = 3,         // an MPI call failed
  kExitDamaged = 4,     // verify: a checkpoint or trace is damaged
  kExitDiffers = 5,     // diff: the checkpoints differ; replay: the replay differs from the trace
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
};

}  // namespace culprit
