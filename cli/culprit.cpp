// culprit: find the step, the layer and the GPU behind a broken training run. Dispatch only: every
// command, its options and its exit codes live next to its library (culprit/command.h).
#include <cstdio>
#include <string>
#include <vector>

#include "culprit/bisect.h"
#include "culprit/checkpoint_tools.h"
#include "culprit/command.h"
#include "culprit/exit_codes.h"
#include "culprit/harness.h"
#include "culprit/replay.h"
#include "culprit/screen.h"

namespace {

std::vector<culprit::cli::Command> commands() {
  namespace c = culprit;
  std::vector<c::cli::Command> all = {
      // --on-detect diagnose: training hands a halted run to the bisection, on the same ranks.
      c::harness::train_command(c::bisect::diagnose_after_halt),
      c::replay::replay_command(),
      c::bisect::bisect_command(),
      c::replay::audit_command(),
      c::harness::screen_command(),
      c::harness::prepare_data_command(),
      c::harness::verify_data_command(),
  };
  for (auto& t : c::ckpt::commands()) all.push_back(std::move(t));
  return all;
}

std::string usage(const std::vector<culprit::cli::Command>& all) {
  std::string out =
      "usage: culprit <command> [options]\n"
      "       mpirun -np W culprit train --run-dir RUN [options]\n"
      "\n"
      "commands:\n";
  for (const auto& c : all) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-8s %s\n", c.name.c_str(), c.summary.c_str());
    out += line;
  }
  return out +
         "\n"
         "'culprit <command> --help' lists a command's options. The options of train, replay, bisect and\n"
         "screen can also come from an INI file given with --config FILE (key = value, the option's name\n"
         "without dashes; the command line wins). Exit codes: README.md.\n";
}

}  // namespace

int main(int argc, char** argv) {
  const auto all = commands();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(usage(all).c_str(), stderr);
    return culprit::kExitUsage;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::printf("%s\n", usage(all).c_str());
    for (const auto& c : all) std::printf("culprit %s:\n%s\n", c.name.c_str(), c.help().c_str());
    return culprit::kExitOk;
  }
  if (cmd == "--version") {
    std::printf("culprit %s\n", CULPRIT_VERSION);
    return culprit::kExitOk;
  }
  std::string names;
  for (const auto& c : all) {
    if (c.name == cmd) return c.main(args);
    names += (names.empty() ? "" : ", ") + c.name;
  }
  culprit::cli::error_line("unknown command '" + cmd + "' (valid: " + names + "; see culprit --help)");
  return culprit::kExitUsage;
}
