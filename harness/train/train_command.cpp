// `culprit train`: the options (train_options.cpp), training, and --on-detect diagnose's hand-over.
#include <cstdio>

#include "culprit/exit_codes.h"
#include "culprit/harness.h"
#include "culprit/train.h"

namespace culprit::harness {

namespace {

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
  if (detected && cfg.detect.on_detect == OnDetect::kDiagnose && after_halt) code = after_halt(comm, cfg.run_dir, code);
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
