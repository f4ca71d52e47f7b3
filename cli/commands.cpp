// Dispatch only: every command, its options and its exit codes live next to its library
// (culprit/command.h).
#include <cstdio>
#include <string>
#include <vector>

#include "culprit/bisect.h"
#include "culprit/checkpoint_tools.h"
#include "culprit/cli.h"
#include "culprit/command.h"
#include "culprit/exit_codes.h"
#include "culprit/data.h"
#include "culprit/export.h"
#include "culprit/harness.h"
#include "culprit/ledger.h"
#include "culprit/train.h"
#include "culprit/replay.h"
#include "culprit/screen.h"

namespace culprit::cli {

namespace {

std::vector<Command> commands() {
  std::vector<Command> all = {
      // --on-detect diagnose: training hands a halted run to the bisection, on the same ranks.
      harness::train_command(bisect::diagnose_after_halt),
      replay::replay_command(),
      bisect::bisect_command(),
      replay::audit_command(),
      harness::screen_command(),
      harness::prepare_data_command(),
      harness::verify_data_command(),
  };
  for (auto& t : ckpt::commands()) all.push_back(std::move(t));
  all.push_back(harness::export_command());
  all.push_back(ledger::ledger_command());
  return all;
}

std::string usage(const std::vector<Command>& all) {
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

std::vector<std::string> command_names() {
  std::vector<std::string> names;
  for (const auto& c : commands()) names.push_back(c.name);
  return names;
}

int run_command_line(std::vector<std::string> args) {
  const auto all = commands();
  if (args.empty()) {
    std::fputs(usage(all).c_str(), stderr);
    return kExitUsage;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::printf("%s\n", usage(all).c_str());
    for (const auto& c : all) std::printf("culprit %s:\n%s\n", c.name.c_str(), c.help().c_str());
    return kExitOk;
  }
  if (cmd == "--version") {
    std::printf("culprit %s\n", CULPRIT_VERSION);
    return kExitOk;
  }
  std::string names;
  for (const auto& c : all) {
    if (c.name == cmd) return c.main(args);
    names += (names.empty() ? "" : ", ") + c.name;
  }
  error_line("unknown command '" + cmd + "' (valid: " + names + "; see culprit --help)");
  return kExitUsage;
}

}  // namespace culprit::cli
