#include "culprit/mpi_util.h"

#include <unistd.h>

#include <cstdio>
#include <vector>

#include "culprit/exit_codes.h"

namespace culprit {

Comm Comm::world() {
  Comm c;
  c.comm = MPI_COMM_WORLD;
  MPI_Comm_rank(c.comm, &c.rank);
  MPI_Comm_size(c.comm, &c.size);
  MPI_Comm_set_errhandler(c.comm, MPI_ERRORS_RETURN);
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  c.host = name;
  return c;
}

void mpi_fail(int err, const char* call, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(err, msg, &len);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  std::fprintf(stderr, "culprit: error: host %s rank %d %s:%d: %s failed: %s\n", host, rank, base,
               line, call, msg);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, kExitMpi);
  std::_Exit(kExitMpi);
}

std::string broadcast_string(const Comm& comm, const std::string& s, int root) {
  unsigned long long n = s.size();
  CULPRIT_MPI_CHECK(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm.comm));
  std::string out = comm.rank == root ? s : std::string(n, '\0');
  if (n) CULPRIT_MPI_CHECK(MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, root, comm.comm));
  return out;
}

Status agree(const Comm& comm, const Status& local) {
  if (comm.size == 1) return local;
  int mine = local.ok() ? comm.size : comm.rank;
  int first = comm.size;
  CULPRIT_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm.comm));
  if (first == comm.size) return Status::OK();
  // The first failing rank's message travels to everyone.
  unsigned long long n = comm.rank == first ? local.message().size() : 0;
  CULPRIT_MPI_CHECK(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, first, comm.comm));
  std::string msg = comm.rank == first ? local.message() : std::string(n, '\0');
  if (n) CULPRIT_MPI_CHECK(MPI_Bcast(msg.data(), static_cast<int>(n), MPI_CHAR, first, comm.comm));
  int code = comm.rank == first ? local.code() : 0;
  CULPRIT_MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, first, comm.comm));
  // Same message on every rank: the problem is not rank-specific.
  int same = (!local.ok() && local.message() == msg) ? 1 : 0, nsame = 0;
  CULPRIT_MPI_CHECK(MPI_Allreduce(&same, &nsame, 1, MPI_INT, MPI_SUM, comm.comm));
  if (nsame == comm.size) return Status::Error(msg, code);
  return Status::Error("rank " + std::to_string(first) + ": " + msg, code);
}

}  // namespace culprit
