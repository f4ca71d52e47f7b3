// `culprit bisect`: name the faulty step, layer, phase and rank of a run, with a verdict
// (docs/bisect.md). The search is an explicit state machine (bisect/src/machine.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/mpi_util.h"
#include "culprit/status.h"

namespace culprit::bisect {

struct Options {
  std::string run_dir;
  int reruns = 8;  // reruns of the faulty micro-shard on the blamed rank (transient or persistent)
};

// What diagnosis.json holds (docs/bisect.md). step, layer, phase and rank use --inject's names.
struct Diagnosis {
  std::string verdict = "none";  // hardware-transient | hardware-persistent | software-nondeterminism |
                                 // numerical-instability | data | none
  std::int64_t step = -1;
  std::string layer, phase;
  int rank = -1;
  std::string host, device;
  int reruns = 0, reproduced = 0;
  std::vector<std::string> evidence;
  std::int64_t steps_replayed = 0;
  double seconds = 0;
  double startup_seconds = 0;  // of `seconds`: reading the run and opening the replay engine
};

// Collective (any world size). Writes RUN/diagnosis.json on rank 0 and prints a summary there.
Status run(const Options& opt, const Comm& comm, Diagnosis* out);
// The exit code of a verdict (README's table).
int exit_code(const std::string& verdict);

}  // namespace culprit::bisect
