// The cost of agreeing one rank's status, as the training loop does every step (issue 15: a lost
// metrics line or trace row ends the job within a step). Prints the median of `rounds` rounds of
// `n` agree() calls, in microseconds per call, next to an MPI_Barrier round for scale.
//   mpirun -np 2 build/bench/agree_bench [n] [rounds]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "culprit/mpi_util.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int n = argc > 1 ? std::atoi(argv[1]) : 20000, rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const culprit::Comm comm = culprit::Comm::world();
  std::vector<double> agree_us, barrier_us;
  using Clock = std::chrono::steady_clock;
  for (int r = 0; r < rounds; ++r) {  // interleaved: the VM drifts between runs
    MPI_Barrier(comm.comm);
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) (void)culprit::agree(comm, culprit::Status::OK());
    agree_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
    MPI_Barrier(comm.comm);
    t0 = Clock::now();
    for (int i = 0; i < n; ++i) MPI_Barrier(comm.comm);
    barrier_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
  }
  std::sort(agree_us.begin(), agree_us.end());
  std::sort(barrier_us.begin(), barrier_us.end());
  if (comm.rank == 0)
    std::printf("W=%d: agree %.2f us/call, MPI_Barrier %.2f us/call (median of %d rounds of %d)\n", comm.size,
                agree_us[rounds / 2], barrier_us[rounds / 2], rounds, n);
  MPI_Finalize();
  return 0;
}
