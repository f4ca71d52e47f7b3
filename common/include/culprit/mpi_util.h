// MPI helpers: the communicator a command runs on, a check macro that names host, rank and
// file:line, and agreement on a Status across ranks before anyone acts on it.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "culprit/status.h"

namespace culprit {

class Watchdog;

struct Comm {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0;
  int size = 1;
  std::string host;
  Watchdog* watchdog = nullptr;  // bounds the training loop's collectives (culprit/watchdog.h)
  static Comm world();  // MPI must be initialised
};

// Prints "culprit: error: host H rank R FILE:LINE: CALL failed: MPI's message" and aborts the
// job with kExitMpi: a failed collective leaves the other ranks nowhere to go.
[[noreturn]] void mpi_fail(int err, const char* call, const char* file, int line);

#define CULPRIT_MPI_CHECK(call)                                          \
  do {                                                                   \
    int _culprit_err = (call);                                           \
    if (_culprit_err != MPI_SUCCESS)                                     \
      ::culprit::mpi_fail(_culprit_err, #call, __FILE__, __LINE__);      \
  } while (0)

// Collective. Every rank passes its own Status; every rank gets back the same result: OK when
// all were OK, otherwise the error of the lowest failing rank (prefixed with "rank R: " when
// the world has more than one rank and not every rank failed with the same message).
Status agree(const Comm& comm, const Status& local);

// Collective: every rank gets `root`'s Status (a decision only the root could take).
Status broadcast_status(const Comm& comm, const Status& st, int root = 0);

// Collective: all ranks get `root`'s string.
std::string broadcast_string(const Comm& comm, const std::string& s, int root = 0);

// Collective: every rank's lines (none may hold '\n'), on rank 0 in rank order; empty elsewhere.
std::vector<std::string> gather_lines(const Comm& comm, const std::vector<std::string>& mine);

}  // namespace culprit
