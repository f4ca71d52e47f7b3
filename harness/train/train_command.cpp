// `culprit train`: the options (train_options.cpp), training, and --on-detect diagnose's hand-over.
#include <cstdio>

#include "culprit/exit_codes.h"
#include "culprit/harness.h"
#include "culprit/records.h"
#include "culprit/train.h"

namespace culprit::harness {

namespace {

// The step a detection halted the run at: its first incident that shows a fault (-1: none readable).
std::int64_t halted_step(const std::string& run_dir) {
  std::vector<records::Incident> all;
  if (!records::read_incidents(run_dir, &all).ok()) return -1;
  const records::Incident* first = records::first_fault(all);
  return first ? first->step : -1;
}

int run_train(const std::vector<std::string>& args, const AfterHalt& after_halt) {
  const Comm comm = cli::start_mpi();
  TrainConfig cfg;
  bool help = false;
  Status st = agree(comm, parse_train_options(args, &cfg, &help));
  if (st.ok() && help) {
    if (comm.rank == 0) std::printf("usage: culprit train --run-dir RUN [options]\n\n%s", train_options().help().c_str());
    return cli::finish_mpi(kExitOk);
  }
  if (st.ok()) st = train(cfg, comm);
  if (st.ok()) return cli::finish_mpi(kExitOk);
  if (comm.rank == 0) cli::error_line(st.message());
  int code = exit_code(st);
  const bool detected = st.code() == StatusCode::kHardware || st.code() == StatusCode::kNumerical ||
                        st.code() == StatusCode::kInvariant;
  if (detected && cfg.detect.on_detect == OnDetect::kDiagnose && after_halt) {
    // The diagnosis's collectives are bounded as training's were: a rank stopped during it is named
    // and its host goes to the run's incidents at the halt's step, as during training.
    Watchdog watchdog(comm, cfg.detect.collective_timeout);
    report_to_the_run(&watchdog, cfg, halted_step(cfg.run_dir));
    Comm watched = comm;
    watched.watchdog = &watchdog;
    code = after_halt(watched, cfg.run_dir, code);
  }
  // A halt or the diagnosis's verdict: the last line says what the code means.
  if (comm.rank == 0) cli::exit_line(code, cfg.run_dir);
  return cli::finish_mpi(code);
}

}  // namespace

cli::Command train_command(AfterHalt after_halt) {
  return {"train", "deterministic, world-size-invariant data-parallel training",
          [] { return train_options().help(); },
          [after_halt](const std::vector<std::string>& args) { return run_train(args, after_halt); }};
}

}  // namespace culprit::harness
