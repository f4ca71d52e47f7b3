// The harness's training entry points (train/): `culprit train` and the function it runs. The
// configuration they take is culprit/harness.h's.
#pragma once
#include <functional>
#include <string>

#include "culprit/command.h"
#include "culprit/env.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/status.h"
#include "culprit/watchdog.h"

namespace culprit::harness {

// Trains. Collective over comm: every rank returns the same Status. env: the seam a test wraps
// (culprit/env.h: e.g. a slow copy of the checkpoint's state); `culprit train` runs Env::Default().
Status train(const TrainConfig& cfg, const Comm& comm, Env* env = Env::Default());

// What w says goes to cfg's run: a silent rank becomes a collective-timeout incident (its host, at
// w's step: what a job script excludes); a writer stuck on a full disk is an I/O failure instead.
// cfg must outlive w's use. step >= 0: the incident's step whatever step w was at (a diagnosis's
// replays move it; the job resumes before the halt's step).
void report_to_the_run(Watchdog* w, const TrainConfig& cfg, std::int64_t step = -1);

// `culprit train`. after_halt: what --on-detect diagnose runs once a detection halted the run (on
// the same ranks); it gets the halt's exit code and returns the one to exit with. culprit_bisect
// provides it (bisect::diagnose_after_halt); the executable wires the two together.
using AfterHalt = std::function<int(const Comm& comm, const std::string& run_dir, int halt_code)>;
cli::Command train_command(AfterHalt after_halt);

}  // namespace culprit::harness
