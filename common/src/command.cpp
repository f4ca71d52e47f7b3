#include "culprit/command.h"

#include <malloc.h>
#include <mpi.h>

#include <cstdio>

#include "culprit/h5.h"

namespace culprit::cli {

void error_line(const std::string& msg) {
  std::fprintf(stderr, "culprit: error: %s\n", printable(msg).c_str());
  std::fflush(stderr);
}

Comm start_mpi() {
  // Keep freed memory in the process: libtorch allocates and frees step-sized buffers every step,
  // and glibc would hand each large one back to the kernel and fault it in again. On virtual
  // machines a fresh page is expensive (docs/performance.md), and the page cache of checkpoint
  // writes then competes for fresh pages too.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, -1);
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  h5::init();
  return Comm::world();
}

int finish_mpi(int code) {
  MPI_Finalize();
  return code;
}

}  // namespace culprit::cli
