// `culprit bisect` and --on-detect diagnose's hand-over: the options, declared once.
#include <cstdio>
#include <string>

#include "culprit/bisect.h"
#include "culprit/exit_codes.h"
#include "culprit/watchdog.h"

namespace culprit::bisect {

namespace {

const opts::Table<Options>& bisect_options() {
  static const opts::Table<Options> table("culprit bisect options", {
      opts::text<Options>("run-dir", &Options::run_dir, "the run to diagnose", opts::kRequired),
      opts::number<Options>("reruns", &Options::reruns,
                            "reruns of the faulty micro-shard on the blamed rank (persistent or transient)",
                            opts::Range<int>{1, 1000}),
      opts::number<Options>("search-back", &Options::search_back,
                            "after a finding whose device fires again, also search this many steps before the "
                            "checkpoint the search started from, for an earlier silent firing (-1: two of the run's "
                            "checkpoint intervals; 0: none)",
                            opts::Range<std::int64_t>{-1, 1'000'000'000}),
      opts::number<Options>("collective-timeout", &Options::collective_timeout, kCollectiveTimeoutHelp,
                            opts::Range<double>{1, 604800}.or_zero("wait forever")),
  });
  return table;
}

}  // namespace

int diagnose_after_halt(const Comm& comm, const std::string& run_dir, int halt_code) {
  if (comm.rank == 0) std::fprintf(stderr, "culprit: diagnosing (culprit bisect --run-dir %s)\n", run_dir.c_str());
  Options opt;
  opt.run_dir = run_dir;
  records::Diagnosis d;
  const Status st = run(opt, comm, &d);
  if (!st.ok()) {
    // The failure's own code (6 for a full disk, 4 for a damaged record, ...), never the halt's: a
    // job script reads a hardware code as "the diagnosis named a host". run() agreed on st, so every
    // rank returns the same code; the previous diagnosis was removed before the search.
    const int code = exit_code(st);
    if (comm.rank == 0)
      cli::error_line("diagnosing the halt failed (exit " + std::to_string(code) + ", not the halt's " +
                      std::to_string(halt_code) + "): " + st.message() + "; fix that, then run culprit bisect --run-dir " +
                      run_dir);
    return code;
  }
  if (comm.rank == 0 && d.rank >= 0 && is_hardware(d.verdict))
    std::fprintf(stderr, "culprit: exclude host %s (rank %d, device %s) before requeueing: %s\n", d.host.c_str(), d.rank,
                 d.device.c_str(), name_of(d.verdict));
  // "none": the diagnosis found nothing to blame; the halt's own code stands.
  return d.verdict == Verdict::kNone ? halt_code : verdict_exit_code(d.verdict);
}

cli::Command bisect_command() {
  return {"bisect", "name the faulty step, layer, phase and rank of a run, with a verdict",
          [] { return bisect_options().help(); },
          [](const std::vector<std::string>& args) {
            return cli::run_mpi<Options>(
                args, bisect_options(), "mpirun -np W culprit bisect --run-dir RUN [options]", nullptr,
                [](const Options& o, const Comm& comm, int* code) {
                  records::Diagnosis d;
                  Status st = run(o, comm, &d);
                  *code = verdict_exit_code(d.verdict);
                  return st;
                });
          }};
}

}  // namespace culprit::bisect
