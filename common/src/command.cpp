#include "culprit/command.h"

#include <malloc.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include "culprit/exit_codes.h"
#include "culprit/h5.h"
#include "culprit/system.h"

namespace culprit::cli {

void error_line(const std::string& msg) {
  std::fprintf(stderr, "culprit: error: %s\n", printable(msg).c_str());
  std::fflush(stderr);
}

void result_line(const Status& st) {
  if (st.code() != StatusCode::kDiffers) return error_line(st.message());
  // A replay or audit that differs from the trace did its job: the difference is the answer.
  std::fprintf(stderr, "culprit: %s\n", printable(st.message()).c_str());
  std::fflush(stderr);
}

void exit_line(int code, const std::string& run_dir) {
  const std::string note = exit_note(code, run_dir);
  if (note.empty()) return;
  // stdout first: what the command printed there comes before its last line.
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", printable(note).c_str());
  std::fflush(stderr);
}

namespace {

// An exception no code caught (an allocation that failed outside any guarded call, on one rank
// while the others wait in a collective): one line naming the rank and the cause, and the job ends
// with the cause's code (2 for memory, as the size checks say it; 1 otherwise), not std::terminate's
// abort and core dump.
[[noreturn]] void on_terminate() {
  int up = 0, down = 0, rank = -1;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (up && !down) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  static char host[256];
  gethostname(host, sizeof host - 1);
  int code = kExitFailure;
  // Formatting may allocate, and memory may be what ran out: a plain line is the fallback.
  try {
    Status st = Status::Internal("std::terminate was called without an exception (an internal error)");
    if (const std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        const std::string w = x.what();
        st = is_out_of_memory(x) ? out_of_memory("an allocation") : Status::Internal(w.substr(0, w.find('\n')));
      } catch (...) {
        st = Status::Internal("an exception that is no std::exception escaped culprit's code");
      }
    }
    code = exit_code(st);
    error_line("host " + std::string(host) + " rank " + std::to_string(rank) + ": " + st.message());
  } catch (...) {
    std::fprintf(stderr, "culprit: error: host %s rank %d: an exception escaped, and describing it failed too "
                 "(out of memory?)\n", host, rank);
    std::fflush(stderr);
  }
  if (up && !down) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace

Comm start_mpi() {
  std::set_terminate(on_terminate);
  // Keep freed memory in the process: libtorch allocates and frees step-sized buffers every step,
  // and glibc would hand each large one back to the kernel and fault it in again. On virtual
  // machines a fresh page is expensive (docs/performance.md), and the page cache of checkpoint
  // writes then competes for fresh pages too.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, -1);
  // A write past the file size limit (ulimit -f, RLIMIT_FSIZE) raises SIGXFSZ, whose default action
  // kills the rank without a word. Ignored, the write fails with EFBIG instead, and the I/O error
  // path says which file (exit 6) on every rank, as for a full disk.
  ::signal(SIGXFSZ, SIG_IGN);
  // Open MPI 4.1's ompio builds the name of sharedfp/lockedfile's lock file (the checkpoint's path
  // and a suffix) in a fixed buffer: a run directory over ~212 characters overflowed it and aborted
  // the first checkpoint. culprit never uses shared file pointers; without lockedfile, ompio takes
  // sm on one node or individual (its files named by malloc'd strings) across nodes. The MCA
  // system reads OMPI_MCA_* from the environment in MPI_Init; a user's own choice (mpirun --mca
  // sharedfp, or the variable set) stands.
  ::setenv("OMPI_MCA_sharedfp", "^lockedfile", /*overwrite=*/0);
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  h5::init();
  return Comm::world();
}

int finish_mpi(int code) {
  // HDF5 1.10 closes every file still open at MPI_Finalize and crashes on one whose flush or close
  // failed (a full or failing disk): then every rank leaves without MPI_Finalize, with the exit code
  // already decided and its message out. Agreed, so that no rank waits in MPI_Finalize for one that
  // left; bounded, so that a rank that never comes (a dead one) does not hold the others.
  int mine = h5::writes_failed() ? 1 : 0, any = mine, size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) {
    MPI_Request req;
    MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
    int done = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done && std::chrono::steady_clock::now() < until) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!done) any = mine;
  }
  if (any) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  MPI_Finalize();
  return code;
}

}  // namespace culprit::cli
