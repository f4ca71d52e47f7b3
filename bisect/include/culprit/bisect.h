// `culprit bisect`: name the faulty step, layer, phase and rank of a run, with a verdict
// (docs/bisect.md). The search is an explicit state machine (bisect/src/machine.h); what it finds
// is RUN/diagnosis.json (records::Diagnosis, docs/records.md) and RUN/diagnosis.html.
#pragma once
#include <string>

#include "culprit/command.h"
#include "culprit/mpi_util.h"
#include "culprit/records.h"
#include "culprit/status.h"

namespace culprit::bisect {

struct Options {
  std::string run_dir;
  int reruns = 8;  // reruns of the faulty micro-shard on the blamed rank (transient or persistent)
  // After a finding whose device fires again (hardware-persistent, or -unconfirmed: never rerun)
  // after the checkpoint the search started from, the steps before that checkpoint searched too, up
  // to this many (-1: two of the run's checkpoint intervals; 0: none). docs/bisect.md, "Cost".
  std::int64_t search_back = -1;
  // Seconds a rank waits in a collective before the stopped rank(s) are named and the job ends
  // (exit 13), as `culprit train --collective-timeout`; a diagnosis inside train uses the run's.
  double collective_timeout = 300;
};

// Collective (any world size). Removes the previous RUN/diagnosis.json and .html once the run is
// locked (a failed bisection leaves none), writes them on rank 0 and prints
// a summary there; *out is the diagnosis on every rank. Its verdict's exit code:
// verdict_exit_code (culprit/records.h).
Status run(const Options& opt, const Comm& comm, records::Diagnosis* out);

// culprit train --on-detect diagnose, after a detection halted the run with exit code halt_code:
// the bisection on the same ranks. Returns the verdict's exit code (the halt's own when the verdict
// is none; the failure's, e.g. 6 for a full disk, when the diagnosis fails, with no diagnosis.json
// left behind); for a hardware verdict rank 0 names the host to exclude.
int diagnose_after_halt(const Comm& comm, const std::string& run_dir, int halt_code);

// `culprit bisect`, with its options (commands.cpp).
cli::Command bisect_command();

}  // namespace culprit::bisect
