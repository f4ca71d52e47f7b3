// culprit: find the step, the layer and the GPU behind a broken training run.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "culprit/exit_codes.h"
#include "culprit/h5.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"

namespace {

const char* kUsage =
    "usage: culprit <command> [options]\n"
    "       mpirun -np W culprit train --run-dir RUN [options]\n"
    "\n"
    "commands:\n"
    "  train    deterministic, world-size-invariant data-parallel training\n"
    "\n"
    "'culprit <command> --help' lists a command's options. Every option can also come from an INI\n"
    "file given with --config FILE (key = value, the option's name without dashes; the command line\n"
    "wins).\n";

void error_line(const std::string& msg) {
  std::fprintf(stderr, "culprit: error: %s\n", msg.c_str());
  std::fflush(stderr);
}

int run_train(const std::vector<std::string>& args) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  culprit::h5::init();
  const culprit::Comm comm = culprit::Comm::world();
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
      code = culprit::kExitUsage;
    }
  }
  MPI_Finalize();
  return code;
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
    std::printf("culprit train:\n%s", culprit::harness::train_options_help().c_str());
    return culprit::kExitOk;
  }
  if (cmd == "--version") {
    std::printf("culprit %s\n", CULPRIT_VERSION);
    return culprit::kExitOk;
  }
  if (cmd == "train") return run_train(args);
  error_line("unknown command '" + cmd + "' (valid: train; see culprit --help)");
  return culprit::kExitUsage;
}
