// culprit: find the step, the layer and the GPU behind a broken training run.
#include <malloc.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "culprit/bisect.h"
#include "culprit/checkpoint_tools.h"
#include "culprit/exit_codes.h"
#include "culprit/h5.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/replay.h"
#include "culprit/screen.h"

namespace {

const char* kUsage =
    "usage: culprit <command> [options]\n"
    "       mpirun -np W culprit train --run-dir RUN [options]\n"
    "\n"
    "commands:\n"
    "  train    deterministic, world-size-invariant data-parallel training\n"
    "  inspect  show a checkpoint or trace file (--json for machines)\n"
    "  verify   recheck every fingerprint of a checkpoint, or of a run directory's checkpoints and traces\n"
    "  diff     compare two checkpoints tensor by tensor\n"
    "  replay   re-execute a recorded step on chosen ranks and compare every fingerprint with the trace\n"
    "  bisect   name the faulty step, layer, phase and rank of a run, with a verdict\n"
    "  audit    replay every checkpoint interval (--run-dir, --share, --merge); --compare A B: where two\n"
    "           runs meant to be identical differ\n"
    "  screen   known-answer test of every rank's device; prints verdicts and a ready --exclude list\n"
    "\n"
    "'culprit <command> --help' lists a command's options. Every option can also come from an INI\n"
    "file given with --config FILE (key = value, the option's name without dashes; the command line\n"
    "wins).\n";

void error_line(const std::string& msg) {
  std::fprintf(stderr, "culprit: error: %s\n", culprit::printable(msg).c_str());
  std::fflush(stderr);
}

// Start-up of the MPI commands (train, replay, bisect, audit --run-dir): memory settings, MPI with
// thread support for the I/O thread, HDF5's error handling; the world communicator.
culprit::Comm start_mpi() {
  // Keep freed memory in the process: libtorch allocates and frees step-sized buffers every step,
  // and glibc would hand each large one back to the kernel and fault it in again. On virtual
  // machines a fresh page is expensive (docs/performance.md), and the page cache of checkpoint
  // writes then competes for fresh pages too.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, -1);
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  culprit::h5::init();
  return culprit::Comm::world();
}

int run_train(const std::vector<std::string>& args) {
  const culprit::Comm comm = start_mpi();
  culprit::harness::TrainConfig cfg;
  bool help = false;
  culprit::Status st = culprit::agree(comm, culprit::harness::parse_train_options(args, &cfg, &help));
  int code = culprit::kExitOk;
  if (st.ok() && help) {
    if (comm.rank == 0) std::printf("usage: culprit train --run-dir RUN [options]\n\n%s", culprit::harness::train_options_help().c_str());
  } else {
    if (st.ok()) st = culprit::harness::train(cfg, comm);
    if (!st.ok()) {
      if (comm.rank == 0) error_line(st.message());
      code = st.code();
    }
    const bool detected = code == culprit::kExitHardware || code == culprit::kExitNumerical ||
                          code == culprit::kExitInvariant;
    if (detected && cfg.on_detect == "diagnose") {
      // The bisection runs in the job, on the same ranks; its verdict becomes the exit code.
      if (comm.rank == 0) std::fprintf(stderr, "culprit: diagnosing (culprit bisect --run-dir %s)\n", cfg.run_dir.c_str());
      culprit::bisect::Options bo;
      bo.run_dir = cfg.run_dir;
      culprit::bisect::Diagnosis d;
      culprit::Status bs = culprit::bisect::run(bo, comm, &d);
      if (!bs.ok()) {
        if (comm.rank == 0) error_line("diagnosis failed: " + bs.message());
      } else {
        // "none": the diagnosis found nothing to blame; the halt's own code stands.
        if (d.verdict != "none") code = culprit::bisect::exit_code(d.verdict);
        if (comm.rank == 0 && d.rank >= 0 && (d.verdict == "hardware-transient" || d.verdict == "hardware-persistent"))
          std::fprintf(stderr, "culprit: exclude host %s (rank %d, device %s) before requeueing: %s\n", d.host.c_str(),
                       d.rank, d.device.c_str(), d.verdict.c_str());
      }
    }
  }
  MPI_Finalize();
  return code;
}

namespace po = boost::program_options;

po::options_description replay_options(culprit::replay::Options* o, std::string* ranks, std::string* trace) {
  po::options_description d("culprit replay options");
  // clang-format off
  d.add_options()
    ("help,h", "print this help")
    ("run-dir", po::value(&o->run_dir), "the run to replay (required)")
    ("step", po::value(&o->step), "the step to examine, 1-based (required)")
    ("ranks", po::value(ranks)->default_value("", "all"), "comma-separated ranks that recompute the step's micro-shards")
    ("micro-shard", po::value(&o->micro_shard)->default_value(-1, "all"), "only this micro-shard")
    ("trace", po::value(trace)->default_value("step"), "step | layer: layer compares every layer's forward output and backward gradient (when the run's trace has them)");
  // clang-format on
  return d;
}

po::options_description bisect_options(culprit::bisect::Options* o) {
  po::options_description d("culprit bisect options");
  // clang-format off
  d.add_options()
    ("help,h", "print this help")
    ("run-dir", po::value(&o->run_dir), "the run to diagnose (required)")
    ("reruns", po::value(&o->reruns)->default_value(o->reruns), "reruns of the faulty micro-shard on the blamed rank (persistent or transient)");
  // clang-format on
  return d;
}

// The shape every MPI subcommand but train shares: parse the options (`check` adds the command's own
// validation), agree on the outcome on every rank, then print the help on rank 0 or run `body`, which
// returns the exit code when its Status stays OK; one error line on rank 0; MPI_Finalize.
int mpi_command(const std::vector<std::string>& args, const po::options_description& desc, const char* usage,
                const std::function<culprit::Status(const po::variables_map&)>& check,
                const std::function<int(const culprit::Comm&, culprit::Status*)>& body) {
  const culprit::Comm comm = start_mpi();
  culprit::Status st;
  bool help = false;
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    po::notify(vm);
    help = vm.count("help") > 0;
    if (!help) st = check(vm);
  } catch (const po::error& e) {
    st = culprit::Status::Error(e.what());
  }
  st = culprit::agree(comm, st);
  int code = culprit::kExitOk;
  if (st.ok() && help) {
    if (comm.rank == 0) {
      std::ostringstream os;
      os << desc;
      std::printf("usage: %s\n\n%s", usage, os.str().c_str());
    }
  } else {
    if (st.ok()) code = body(comm, &st);
    if (!st.ok()) {
      if (comm.rank == 0) error_line(st.message());
      code = st.code();
    }
  }
  MPI_Finalize();
  return code;
}

int run_bisect(const std::vector<std::string>& args) {
  culprit::bisect::Options opt;
  return mpi_command(
      args, bisect_options(&opt), "mpirun -np W culprit bisect --run-dir RUN [options]",
      [&](const po::variables_map& vm) {
        return vm.count("run-dir") ? culprit::Status::OK() : culprit::Status::Error("option '--run-dir' is required");
      },
      [&](const culprit::Comm& comm, culprit::Status* st) {
        culprit::bisect::Diagnosis d;
        *st = culprit::bisect::run(opt, comm, &d);
        return culprit::bisect::exit_code(d.verdict);
      });
}

const char* kAuditHelp =
    "mpirun -np W culprit audit --run-dir RUN [--share I/N]\n"
    "                                      replay every checkpoint interval (spread over the ranks)\n"
    "                                      against the trace and the next checkpoint; writes RUN/audit.json;\n"
    "                                      exit 0 all reproduce, 5 some do not (the first one named).\n"
    "                                      --share I/N: only intervals i with i mod N == I (a job array's\n"
    "                                      task I), written to RUN/audit/part-IIII-of-NNNN.json\n"
    "culprit audit --merge RUN             one report from every share's part: RUN/audit.json; exit 0, 5,\n"
    "                                      or 2 when a share is missing or the parts disagree\n"
    "culprit audit --compare RUN_A RUN_B   where two runs meant to be identical part ways: a binary search\n"
    "                                      over their common checkpoints, then their traces; exit 0 equal,\n"
    "                                      5 different (first differing step and tensor printed)\n";

int run_audit(const std::vector<std::string>& args) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("%s", kAuditHelp);
    return culprit::kExitOk;
  }
  if (!args.empty() && args[0] == "--run-dir" && (args.size() == 2 || (args.size() == 4 && args[2] == "--share"))) {
    culprit::replay::AuditOptions opt;
    culprit::Status parsed;
    if (args.size() == 4) {
      int i = -1, n = -1, used = 0;
      if (std::sscanf(args[3].c_str(), "%d/%d%n", &i, &n, &used) != 2 || used != static_cast<int>(args[3].size()) ||
          n < 1 || i < 0 || i >= n)
        parsed = culprit::Status::Error("option '--share': '" + args[3] + "' is not I/N with 0 <= I < N");
      opt.share = i;
      opt.shares = n;
    }
    const culprit::Comm comm = start_mpi();
    culprit::Status st = parsed.ok() ? culprit::replay::audit(args[1], comm, opt) : parsed;
    int code = culprit::kExitOk;
    if (!st.ok()) {
      if (comm.rank == 0) error_line(st.message());
      code = st.code();
    }
    MPI_Finalize();
    return code;
  }
  if (args.size() == 2 && args[0] == "--merge") {
    culprit::Status st = culprit::replay::merge_audit(args[1]);
    if (!st.ok()) error_line(st.message());
    return st.code();
  }
  if (args.size() != 3 || args[0] != "--compare") {
    error_line("audit takes --run-dir RUN [--share I/N], --merge RUN or --compare RUN_A RUN_B (see culprit audit --help)");
    return culprit::kExitUsage;
  }
  culprit::h5::init();
  std::string report;
  culprit::Status st = culprit::replay::compare_runs(args[1], args[2], &report);
  std::fputs(report.c_str(), stdout);
  if (!st.ok()) {
    if (st.code() != culprit::kExitDiffers) error_line(st.message());
    return st.code();
  }
  return culprit::kExitOk;
}

int run_replay(const std::vector<std::string>& args) {
  culprit::replay::Options opt;
  std::string ranks, trace;
  return mpi_command(
      args, replay_options(&opt, &ranks, &trace), "mpirun -np W culprit replay --run-dir RUN --step S [options]",
      [&](const po::variables_map& vm) {
        if (!vm.count("run-dir")) return culprit::Status::Error("option '--run-dir' is required");
        if (!vm.count("step")) return culprit::Status::Error("option '--step' is required");
        if (trace != "step" && trace != "layer")
          return culprit::Status::Error("option '--trace': unknown level '" + trace + "' (valid: step, layer)");
        opt.layer = trace == "layer";
        std::size_t pos = 0;
        while (pos < ranks.size()) {
          const auto end = ranks.find(',', pos);
          const std::string item = ranks.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
          try {
            std::size_t used = 0;
            const int r = std::stoi(item, &used);
            if (used != item.size()) throw std::invalid_argument(item);
            opt.ranks.push_back(r);
          } catch (const std::exception&) {
            return culprit::Status::Error("option '--ranks': '" + ranks + "' is not a comma-separated list of ranks");
          }
          if (end == std::string::npos) break;
          pos = end + 1;
        }
        return culprit::Status::OK();
      },
      [&](const culprit::Comm& comm, culprit::Status* st) {
        *st = culprit::replay::run(opt, comm);
        return culprit::kExitOk;
      });
}

// inspect / verify / diff: one process, no MPI needed.
const char* kToolsHelp =
    "culprit inspect FILE [--json]   a checkpoint or trace file as a table (or JSON)\n"
    "culprit verify RUN|FILE         recheck fingerprints; exit 0 clean, 4 damaged\n"
    "culprit diff A B                compare two checkpoints; exit 0 identical, 5 different\n";

int run_tool(const std::string& cmd, const std::vector<std::string>& args) {
  po::options_description d("options");
  d.add_options()("help,h", "print this help")("json", "inspect: print JSON");
  po::options_description hidden;
  hidden.add_options()("files", po::value<std::vector<std::string>>(), "files");
  po::options_description all;
  all.add(d).add(hidden);
  po::positional_options_description pos;
  pos.add("files", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    error_line(e.what());
    return culprit::kExitUsage;
  }
  if (vm.count("help")) {
    std::printf("%s", kToolsHelp);
    return culprit::kExitOk;
  }
  const auto files = vm.count("files") ? vm["files"].as<std::vector<std::string>>() : std::vector<std::string>{};
  const std::size_t want = cmd == "diff" ? 2 : 1;
  if (files.size() != want) {
    error_line(cmd + " takes " + std::to_string(want) + " path" + (want > 1 ? "s" : "") + " (see culprit " + cmd + " --help)");
    return culprit::kExitUsage;
  }
  culprit::h5::init();
  std::string out;
  culprit::Status st;
  int code = culprit::kExitOk;
  if (cmd == "inspect") {
    st = culprit::ckpt::inspect(files[0], vm.count("json") > 0, &out);
  } else if (cmd == "verify") {
    bool clean = false;
    st = culprit::ckpt::verify(files[0], &out, &clean);
    if (!clean) code = culprit::kExitDamaged;
  } else {
    bool same = false;
    st = culprit::ckpt::diff(files[0], files[1], &out, &same);
    if (!same) code = culprit::kExitDiffers;
  }
  if (!st.ok()) {
    error_line(st.message());
    return cmd == "verify" ? culprit::kExitDamaged : culprit::kExitUsage;
  }
  // Names and strings come from files that may be damaged: what is printed stays valid UTF-8.
  std::fputs(vm.count("json") ? out.c_str() : culprit::printable(out, true).c_str(), stdout);
  return code;
}

po::options_description screen_options(culprit::harness::ScreenOptions* o) {
  po::options_description d("culprit screen options");
  d.add_options()
    ("help,h", "print this help")
    ("seconds", po::value(&o->seconds)->default_value(o->seconds), "repeat the tests for about this long (at least once)")
    ("size", po::value(&o->size)->default_value(o->size), "matrix size N (N x N float32)")
    ("device", po::value(&o->device)->default_value(o->device), "cpu | cuda: the CPU path, or the GPU of the rank's local index (builds with nvcc)")
    ("threads", po::value(&o->threads)->default_value(o->threads), "intra-op threads per rank")
    ("report", po::value(&o->report), "write the JSON report here (rank 0)")
    ("inject", po::value(&o->inject)->composing(), "a fault for testing the screen: layer=matmul|reduce|pointwise, "
                                                   "step=repetition, rank, kind, mode (as culprit train --inject)");
  return d;
}

int run_screen(const std::vector<std::string>& args) {
  culprit::harness::ScreenOptions opt;
  return mpi_command(
      args, screen_options(&opt), "mpirun -np W culprit screen [options]   (one rank per device)",
      [](const po::variables_map&) { return culprit::Status::OK(); },
      [&](const culprit::Comm& comm, culprit::Status* st) {
        *st = culprit::harness::screen(opt, comm);
        return culprit::kExitOk;
      });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return culprit::kExitUsage;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::printf("%s\n", kUsage);
    std::printf("culprit train:\n%s\n", culprit::harness::train_options_help().c_str());
    std::printf("culprit inspect / verify / diff:\n%s\n", kToolsHelp);
    culprit::replay::Options o;
    std::string r, t;
    std::ostringstream os;
    os << replay_options(&o, &r, &t);
    std::printf("culprit replay (mpirun -np W culprit replay --run-dir RUN --step S):\n%s\n", os.str().c_str());
    culprit::bisect::Options bo;
    std::ostringstream bs;
    bs << bisect_options(&bo);
    std::printf("culprit bisect (mpirun -np W culprit bisect --run-dir RUN):\n%s\n", bs.str().c_str());
    std::printf("culprit audit:\n%s\n", kAuditHelp);
    culprit::harness::ScreenOptions so;
    std::ostringstream ss;
    ss << screen_options(&so);
    std::printf("culprit screen (mpirun -np W culprit screen, one rank per device):\n%s", ss.str().c_str());
    return culprit::kExitOk;
  }
  if (cmd == "--version") {
    std::printf("culprit %s\n", CULPRIT_VERSION);
    return culprit::kExitOk;
  }
  if (cmd == "train") return run_train(args);
  if (cmd == "replay") return run_replay(args);
  if (cmd == "bisect") return run_bisect(args);
  if (cmd == "audit") return run_audit(args);
  if (cmd == "screen") return run_screen(args);
  if (cmd == "inspect" || cmd == "verify" || cmd == "diff") return run_tool(cmd, args);
  error_line("unknown command '" + cmd + "' (valid: train, replay, bisect, audit, screen, inspect, verify, diff; see culprit --help)");
  return culprit::kExitUsage;
}
