// tree_allreduce under real MPI (run with mpirun -np 1..4): every rank gets the global tree's
// root bitwise, for many lengths including fewer elements than ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_gtest.h"

#include <cstring>
#include <vector>

#include "culprit/tree_reduce.h"
#include "tree_data.h"

using namespace culprit;
using culprit::testing::leaf;
using culprit::testing::tree;

namespace {
Comm world() {
  Comm c;
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.size);
  return c;
}
}  // namespace

TEST(TreeAllreduce, EveryRankGetsTheGlobalTreeRoot) {
  const Comm comm = world();
  for (int m : {4, 8, 16}) {
    if (comm.size > m) continue;
    for (std::size_t n : {1u, 3u, 5u, 64u, 1000u, 4097u}) {
      TreeAccumulator acc(n);
      const auto r = shard_range(comm.rank, comm.size, m);
      for (int k = r.lo; k < r.hi; ++k) {
        auto v = leaf(k, n);
        std::memcpy(acc.leaf_buffer(), v.data(), n * sizeof(float));
        acc.push(k);
      }
      std::vector<float> out(n, -1.0f);
      tree_allreduce(comm, m, acc, out.data());
      const auto want = tree(0, m, n);
      EXPECT_EQ(std::memcmp(out.data(), want.data(), n * sizeof(float)), 0)
          << "rank " << comm.rank << " of " << comm.size << ", M=" << m << ", n=" << n;
    }
  }
}

TEST(TreeAllreduce, TrafficIsAboutTwiceTheBufferTimesWMinusOneOverW) {
  const Comm comm = world();
  if (comm.size == 1) GTEST_SKIP() << "one rank sends nothing";
  const std::size_t n = 1 << 20;
  const double ring = 2.0 * (comm.size - 1) / comm.size * n * sizeof(float);
  // W a power of two: exactly a ring allreduce's traffic.
  if ((comm.size & (comm.size - 1)) == 0) {
    EXPECT_NEAR(tree_allreduce_bytes_sent(comm.rank, comm.size, 8, n), ring, 8.0 * comm.size);
  }
  // Otherwise a few blocks more, never more than twice.
  EXPECT_LE(tree_allreduce_bytes_sent(comm.rank, comm.size, 8, n), 2 * ring);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return culprit::testing::run_on_every_rank();
}
