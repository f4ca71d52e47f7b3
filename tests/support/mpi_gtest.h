// GoogleTest under mpirun: every rank runs the tests, only rank 0 prints them, and the program fails
// on every rank when any rank failed. Shared by the MPI test programs' main().
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

namespace culprit::testing {

// After MPI_Init and InitGoogleTest: runs every test, then finalises MPI.
inline int run_on_every_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}

}  // namespace culprit::testing
