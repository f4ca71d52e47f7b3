// The run directory (docs/cli.md "Outputs"): preparing it, finding the checkpoint to resume from,
// checking that it belongs to this run, rewinding metrics.jsonl. No libtorch.
#pragma once
#include <cstdint>
#include <string>

#include "culprit/checkpoint.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/status.h"
#include "culprit/data.h"

namespace culprit::harness {

inline bool resuming(const TrainConfig& cfg) { return cfg.resume || !cfg.resume_from.empty(); }
// A fresh run needs an empty or new directory; a resumed one its run.json.
Status prepare_run_dir(const TrainConfig& cfg);
// The checkpoint to resume from: --resume-from, or the newest one that verifies. Damaged ones are
// reported (file, dataset, fingerprints) and skipped, never used. Collective.
Status find_checkpoint(const TrainConfig& cfg, const Comm& comm, ckpt::Checkpoint* c, std::string* from);
// A checkpoint of another run (other seed, model, ...) must not be resumed silently.
// The run's identity on every rank: run.json's on --resume (a run from before identities gets a
// new one), a new one otherwise. Collective.
Status establish_run_id(const TrainConfig& cfg, const Comm& comm, std::string* id);
Status check_compatible(const TrainConfig& cfg, const Dataset& data, const ckpt::Checkpoint& c, const std::string& from);
// Keeps the lines of metrics.jsonl up to step `keep` (a resumed run rewrites what follows).
Status truncate_metrics(const std::string& path, std::int64_t keep);

}  // namespace culprit::harness
