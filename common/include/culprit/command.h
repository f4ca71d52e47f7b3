// A subcommand of the culprit executable, declared next to its library; cli/culprit.cpp only lists
// and dispatches them. The two shapes every command takes: an MPI command (every rank parses, the
// outcome is agreed, rank 0 prints the help or the one error line, all exit with the same code) and
// a one-process command.
#pragma once
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "culprit/exit_codes.h"
#include "culprit/mpi_util.h"
#include "culprit/options.h"
#include "culprit/status.h"

namespace culprit::cli {

struct Command {
  std::string name;
  std::string summary;                                      // one line for `culprit --help`
  std::function<std::string()> help;                        // the command's own --help
  std::function<int(const std::vector<std::string>&)> main;  // the exit code
};

// "culprit: error: MESSAGE" on stderr, printable (culprit/status.h).
void error_line(const std::string& msg);

// How a command that failed or found something says so, on stderr: a difference (replay, audit:
// exit 5) is a finding, "culprit: MESSAGE"; anything else its error line.
void result_line(const Status& st);
// The last line of a command whose exit code reports a finding (exit_note: a verdict, a halt, a
// difference), on stderr; nothing for other codes. Printed by rank 0 only.
void exit_line(int code, const std::string& run_dir);

// The run directory of a command's options, where they have one (a finding's line points into it).
template <class C, class = void>
struct HasRunDir : std::false_type {};
template <class C>
struct HasRunDir<C, std::void_t<decltype(std::declval<const C&>().run_dir)>> : std::true_type {};
template <class C>
std::string run_dir_of(const C& cfg) {
  if constexpr (HasRunDir<C>::value) return cfg.run_dir;
  return "";
}

// Start-up of the MPI commands: memory settings, MPI with thread support for the I/O thread,
// HDF5's error handling; the world communicator. finish_mpi() ends MPI and returns `code`.
Comm start_mpi();
int finish_mpi(int code);

// Parses args with `table`, applies the command's own checks (`check`, may complete *cfg), agrees
// on every rank, then prints `usage` and the help on rank 0 or runs `body`, which returns its Status
// and may set *code (the exit code of a successful run, e.g. a verdict). One error line on rank 0.
template <class C>
int run_mpi(const std::vector<std::string>& args, const opts::Table<C>& table, const std::string& usage,
            const std::function<Status(C*)>& check, const std::function<Status(const C&, const Comm&, int*)>& body) {
  const Comm comm = start_mpi();
  C cfg;
  opts::Parsed parsed;
  Status st = table.parse(args, &cfg, &parsed);
  if (st.ok() && !parsed.help && check) st = check(&cfg);
  st = agree(comm, st);
  int code = kExitOk;
  if (st.ok() && parsed.help) {
    if (comm.rank == 0) std::printf("usage: %s\n\n%s", usage.c_str(), table.help().c_str());
  } else {
    if (st.ok()) st = body(cfg, comm, &code);
    if (!st.ok()) {
      if (comm.rank == 0) result_line(st);
      code = exit_code(st);
    }
    if (comm.rank == 0) exit_line(code, run_dir_of(cfg));
  }
  return finish_mpi(code);
}

// The same in one process, without MPI.
template <class C>
int run_local(const std::vector<std::string>& args, const opts::Table<C>& table, const std::string& usage,
              const std::function<Status(C*)>& check, const std::function<Status(const C&, int*)>& body) {
  C cfg;
  opts::Parsed parsed;
  Status st = table.parse(args, &cfg, &parsed);
  if (st.ok() && parsed.help) {
    std::printf("usage: %s\n\n%s", usage.c_str(), table.help().c_str());
    return kExitOk;
  }
  if (st.ok() && check) st = check(&cfg);
  int code = kExitOk;
  if (st.ok()) st = body(cfg, &code);
  if (!st.ok()) {
    result_line(st);
    code = exit_code(st);
  }
  exit_line(code, run_dir_of(cfg));
  return code;
}

}  // namespace culprit::cli
