// `culprit verify RUN`, the run as a whole (docs/checkpoint-format.md, "Verifying a run"): every
// file is the run's, nothing the run needs is missing, metrics.jsonl agrees with the trace.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "culprit/checkpoint.h"
#include "culprit/status.h"
#include "culprit/trace.h"

namespace culprit::ckpt {

struct RunFacts {
  bool has_run_json = false;
  std::string run_id;     // "" for a run from before identities
  int world_size = 0;     // of the run's latest job
  bool traced = true;     // its configuration's --trace is not off
  std::int64_t trace_keep = 0;  // its --trace-keep (0: the whole trace is kept)
};

// RUN/run.json's facts; has_run_json false when there is none (a bare directory of files).
Status read_run_facts(const std::string& run_dir, RunFacts* out);

// Appends "FAIL ..." lines to `os` (and clears *clean) for: a checkpoint or trace of another run, a
// run without a checkpoint, a rank's trace missing, metrics.jsonl steps out of order or repeated,
// its losses disagreeing with the lowest rank's trace, a checkpoint newer than the metrics, a trace
// a resume moved aside as damaged (RUN/trace/rank-RRRRR.h5.damaged-N), a rank whose rows stop
// before the newest checkpoint or start after a checkpoint its world wrote (rows lost).
void verify_run_whole(const std::string& run_dir, const RunFacts& facts,
                      const std::map<std::string, std::string>& file_run_ids,  // checkpoints' and traces'
                      const std::map<std::int64_t, int>& checkpoint_worlds,    // step: world size
                      const std::map<int, trace::TraceFile>& traces, std::ostringstream& os, bool* clean);

}  // namespace culprit::ckpt
