// `culprit screen`'s options, declared once (culprit/options.h), and the command.
#include "culprit/screen.h"
#include "culprit/system.h"

namespace culprit::harness {

namespace {
using S = ScreenOptions;
}

const opts::Table<ScreenOptions>& screen_options() {
  using opts::Range;
  static const opts::Table<S> table("culprit screen options", {
      opts::number<S>("seconds", &S::seconds, "repeat the tests for about this long (at least once)",
                      Range<double>{0, 604800}),
      opts::number<S>("size", &S::size, "matrix size N (N x N float32)", Range<int>{1, 8192}),
      opts::choice<S>("device", &S::device,
                      "cpu | cuda: the CPU path, or the GPU of the rank's local index (builds with nvcc)"),
      // More threads than cores only slows the screen (and thousands of threads can hang it).
      opts::number<S>("threads", &S::threads, "intra-op threads per rank (cores: those the system lets the rank run on)",
                      Range<int>{1, system_cores()}.because(cores_reason(), "[1, cores]")),
      opts::text<S>("report", &S::report, "write the JSON report here (rank 0; docs/records.md)"),
      opts::texts<S>("inject", &S::inject,
                     "a fault for testing the screen: layer=matmul|reduce|pointwise, step=repetition, rank, kind, "
                     "mode (as culprit train --inject)"),
  });
  return table;
}

cli::Command screen_command() {
  return {"screen", "known-answer test of every rank's device; prints verdicts and a ready --exclude list",
          [] { return screen_options().help(); },
          [](const std::vector<std::string>& args) {
            return cli::run_mpi<S>(args, screen_options(), "mpirun -np W culprit screen [options]   (one rank per device)",
                                   nullptr, [](const S& opt, const Comm& comm, int*) { return screen(opt, comm); });
          }};
}

}  // namespace culprit::harness
