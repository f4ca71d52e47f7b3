#include "culprit/mpi_util.h"

#include <unistd.h>

#include <cstdio>
#include <vector>

#include "culprit/exit_codes.h"
#include "culprit/watchdog.h"

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
  MPI_Abort(MPI_COMM_WORLD, exit_code(StatusCode::kMpi));
  std::_Exit(exit_code(StatusCode::kMpi));
}

std::string broadcast_string(const Comm& comm, const std::string& s, int root) {
  unsigned long long n = s.size();
  CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Ibcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm.comm, &_culprit_req));
  std::string out = comm.rank == root ? s : std::string(n, '\0');
  if (n) CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Ibcast(out.data(), static_cast<int>(n), MPI_CHAR, root, comm.comm, &_culprit_req));
  return out;
}

Status broadcast_status(const Comm& comm, const Status& st, int root) {
  int code = static_cast<int>(st.code());
  CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Ibcast(&code, 1, MPI_INT, root, comm.comm, &_culprit_req));
  const std::string msg = broadcast_string(comm, st.message(), root);
  return code == 0 ? Status::OK() : Status::Error(static_cast<StatusCode>(code), msg);
}

std::vector<std::string> gather_lines(const Comm& comm, const std::vector<std::string>& mine) {
  std::string joined;
  for (const auto& l : mine) joined += l + '\n';
  int n = static_cast<int>(joined.size());
  std::vector<int> counts(comm.size), displs(comm.size);
  CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Igather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm.comm, &_culprit_req));
  int total = 0;
  for (int r = 0; r < comm.size; ++r) displs[r] = total, total += counts[r];
  std::string all(comm.rank == 0 ? static_cast<std::size_t>(total) : 0, '\0');
  CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Igatherv(joined.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, 0, comm.comm, &_culprit_req));
  std::vector<std::string> out;
  for (std::size_t pos = 0; pos < all.size();) {
    const auto end = all.find('\n', pos);
    out.push_back(all.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

Status agree(const Comm& comm, const Status& local) {
  if (comm.size == 1) return local;
  int mine = local.ok() ? comm.size : comm.rank;
  int first = comm.size;
  CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm.comm, &_culprit_req));
  if (first == comm.size) return Status::OK();
  // The first failing rank's message travels to everyone.
  unsigned long long n = comm.rank == first ? local.message().size() : 0;
  CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Ibcast(&n, 1, MPI_UNSIGNED_LONG_LONG, first, comm.comm, &_culprit_req));
  std::string msg = comm.rank == first ? local.message() : std::string(n, '\0');
  if (n) CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Ibcast(msg.data(), static_cast<int>(n), MPI_CHAR, first, comm.comm, &_culprit_req));
  int code = comm.rank == first ? static_cast<int>(local.code()) : 0;
  CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Ibcast(&code, 1, MPI_INT, first, comm.comm, &_culprit_req));
  // Same message on every rank: the problem is not rank-specific.
  int same = (!local.ok() && local.message() == msg) ? 1 : 0, nsame = 0;
  CULPRIT_COLLECTIVE(comm, "an agreement", MPI_Iallreduce(&same, &nsame, 1, MPI_INT, MPI_SUM, comm.comm, &_culprit_req));
  const auto category = static_cast<StatusCode>(code);
  if (nsame == comm.size) return Status::Error(category, msg);
  return Status::Error(category, "rank " + std::to_string(first) + ": " + msg);
}

}  // namespace culprit
