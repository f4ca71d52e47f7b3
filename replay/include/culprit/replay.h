// `culprit replay`: re-execute a recorded step on chosen ranks and compare every fingerprint with the
// trace (docs/replay.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/mpi_util.h"
#include "culprit/status.h"

namespace culprit::replay {

struct Options {
  std::string run_dir;
  std::int64_t step = 0;       // the step to examine (1-based)
  std::vector<int> ranks;      // ranks that recompute step's micro-shards (empty: every rank)
  int micro_shard = -1;        // only this micro-shard (-1: all)
  bool layer = false;          // per-layer fingerprints (the trace must have them to compare)
};

// Collective. Loads the newest valid checkpoint before `step`, re-executes up to it (comparing every
// step with the trace), then recomputes the step's micro-shards on the chosen ranks and compares each
// with the trace, and the step's update. Rank 0 prints the report. OK when everything matches;
// otherwise an error with kExitDiffers whose message counts the mismatches.
Status run(const Options& opt, const Comm& comm);

// culprit audit --run-dir RUN (collective, any world size): every interval between consecutive valid
// checkpoints is replayed from its first checkpoint, the intervals spread over the ranks (each rank
// alone), and must reproduce the trace and the next checkpoint bitwise. Rank 0 prints one line per
// interval. OK when all reproduce; an error with kExitDiffers naming the first that does not.
// Writes RUN/audit.json (docs/replay.md).
Status audit(const std::string& run_dir, const Comm& comm);
// With a share I of N (a Slurm array task): only intervals i with i mod N == I, and the report goes
// to RUN/audit/part-IIII-of-NNNN.json for merge_audit.
struct AuditOptions {
  int share = 0, shares = 1;
};
Status audit(const std::string& run_dir, const Comm& comm, const AuditOptions& opt);
std::string audit_part_path(const std::string& run_dir, int share, int shares);
// culprit audit --merge RUN (one process): every share's part present and covering the run's
// intervals; writes RUN/audit.json and prints the report. kExitDiffers when an interval does not
// reproduce; an error naming the missing share(s) or foreign parts otherwise.
Status merge_audit(const std::string& run_dir);

// culprit audit --compare A B (one process): two runs meant to be identical. A binary search over
// their common checkpoints brackets the divergence, their traces then give the first differing step
// and tensor. *report is printable; OK when they agree, an error with kExitDiffers when not.
Status compare_runs(const std::string& run_a, const std::string& run_b, std::string* report);

}  // namespace culprit::replay
