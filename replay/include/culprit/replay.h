// `culprit replay`: re-execute a recorded step on chosen ranks and compare every fingerprint with the
// trace (docs/replay.md); `culprit audit`: every checkpoint interval of a run, or two runs against
// each other.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "culprit/command.h"
#include "culprit/compare.h"
#include "culprit/mpi_util.h"
#include "culprit/records.h"
#include "culprit/status.h"

namespace culprit::replay {

struct Options {
  std::string run_dir;
  std::int64_t step = 0;       // the step to examine (1-based)
  std::vector<int> ranks;      // ranks that recompute step's micro-shards (empty: every rank)
  int micro_shard = -1;        // only this micro-shard (-1: all)
  trace::Level trace = trace::Level::kStep;  // layer: per-layer fingerprints (compared where the trace has them)
  bool json = false;           // rank 0 prints the report as JSON (docs/records.md) instead of text
  double collective_timeout = 300;  // as train's: a stopped rank is named (exit 13), not waited for
};

// ---- what culprit replay found (its JSON: docs/records.md, "replay") ----

// A step before the examined one, replayed as the run computed it.
struct PriorStep {
  std::int64_t step = 0;
  bool recorded = true;  // the trace holds the step (false: retired or not traced; nothing compared)
  struct Shard {
    int rank = 0;  // the replaying rank
    ShardMismatch mismatch;
  };
  std::vector<Shard> shards;  // the micro-shards that differ from the record, by rank
  UpdateDifference update;
};

// One rank's recomputation of one micro-shard of the examined step.
struct ShardReplay {
  int rank = 0;
  std::string host;
  bool in_trace = true;
  ShardDifference diff;  // against the record
  Fingerprint grad_fp = 0;
};

// Two replays of a micro-shard that disagree: their first differing gradient element.
struct Disagreement {
  int rank_a = 0, rank_b = 0;
  std::int64_t element = 0;
  float a = 0, b = 0;
};

struct ShardReport {
  int shard = 0;
  bool recorded = false;
  int recorded_by = -1;
  std::string recorded_host;
  float recorded_loss = 0;
  Fingerprint recorded_grad = 0;
  std::vector<ShardReplay> replays;  // by rank
  std::optional<Disagreement> disagreement;
  int mismatches() const;
};

struct ReplayReport {
  std::string run_dir, checkpoint;
  std::int64_t step = 0;
  int world_size = 1;
  bool layers_compared = false;
  std::vector<PriorStep> before;
  std::vector<ShardReport> shards;
  UpdateDifference update;
  int mismatches() const;
};

std::string to_json(const ReplayReport& r);  // one JSON document
std::string to_text(const ReplayReport& r);  // the printed report, line by line

// Collective. Loads the newest valid checkpoint before `step`, re-executes up to it (comparing every
// step with the trace), then recomputes the step's micro-shards on the chosen ranks and compares each
// with the trace, and the step's update. Rank 0 prints the report (text or --json). OK when everything
// matches; otherwise a kDiffers error counting the mismatches. *out (optional): the report, on rank 0.
Status run(const Options& opt, const Comm& comm, ReplayReport* out = nullptr);

// ---- culprit audit ----

// culprit audit --run-dir RUN (collective, any world size): every interval between consecutive valid
// checkpoints is replayed from its first checkpoint, the intervals spread over the ranks (each rank
// alone), and must reproduce the trace and the next checkpoint bitwise. Rank 0 prints one line per
// interval. OK when all reproduce; a kDiffers error naming the first that does not. Writes
// RUN/audit.json (docs/records.md). With a share I of N (a Slurm array task): only intervals i with
// i mod N == I, and the report goes to RUN/audit/part-IIII-of-NNNN.json for merge_audit.
struct AuditOptions {
  std::string run_dir;
  int share = 0, shares = 1;
  double collective_timeout = 300;  // as train's: a stopped rank is named (exit 13), not waited for
};
Status audit(const AuditOptions& opt, const Comm& comm);
// culprit audit --merge RUN (one process): every share's part present and covering the run's
// intervals; writes RUN/audit.json and prints the report. kDiffers when an interval does not
// reproduce; an error naming the missing share(s) or foreign parts otherwise.
Status merge_audit(const std::string& run_dir);

// culprit audit --compare A B (one process): two runs meant to be identical. A binary search over
// their common checkpoints brackets the divergence, their traces then give the first differing step
// and tensor. *report is printable; OK when they agree, a kDiffers error when not.
Status compare_runs(const std::string& run_a, const std::string& run_b, std::string* report);

// `culprit replay` and `culprit audit`, with their options (commands.cpp).
cli::Command replay_command();
cli::Command audit_command();

}  // namespace culprit::replay
