// The world-size-invariant tree reduction against MPI_Allreduce(MPI_SUM) on the same buffers.
// mpirun -np 4 build/bench/tree_reduce_bench [--micro-shards M] [--reps R]
// Prints one row per size: median seconds of each and their ratio (tree / MPI_Allreduce).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "culprit/tree_reduce.h"

using namespace culprit;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Comm comm;
  MPI_Comm_rank(MPI_COMM_WORLD, &comm.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &comm.size);
  int m = comm.size, reps = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--micro-shards")) m = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[i + 1]);
  }
  if (comm.rank == 0) {
    std::printf("tree_allreduce vs MPI_Allreduce: %d ranks, %d micro-shards, median of %d\n", comm.size, m, reps);
    std::printf("%8s  %14s  %14s  %7s  %14s\n", "MiB", "allreduce ms", "tree ms", "ratio", "tree MB sent");
  }
  for (int mib = 1; mib <= 64; mib *= 2) {
    const std::size_t n = static_cast<std::size_t>(mib) * (1 << 20) / sizeof(float);
    TreeAccumulator acc(n);
    const auto r = shard_range(comm.rank, comm.size, m);
    for (int k = r.lo; k < r.hi; ++k) {
      float* leaf = acc.leaf_buffer();
      for (std::size_t i = 0; i < n; ++i) leaf[i] = static_cast<float>((i * 31 + k) % 97) * 0.01f;
      acc.push(k);
    }
    std::vector<float> out(n), in(acc.blocks()[0].data), red(n);
    TreeWorkspace ws;
    std::vector<double> t_ar, t_tree;
    for (int rep = 0; rep < reps + 2; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(in.data(), red.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t1 = MPI_Wtime();
      MPI_Barrier(MPI_COMM_WORLD);
      double t2 = MPI_Wtime();
      tree_allreduce(comm, m, acc, out.data(), &ws);
      double t3 = MPI_Wtime();
      double a = t1 - t0, b = t3 - t2, amax = 0, bmax = 0;
      MPI_Allreduce(&a, &amax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(&b, &bmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep >= 2) {  // two warm-up rounds
        t_ar.push_back(amax);
        t_tree.push_back(bmax);
      }
    }
    if (comm.rank == 0) {
      const double a = median(t_ar), b = median(t_tree);
      std::printf("%8d  %14.3f  %14.3f  %7.2f  %14.2f\n", mib, a * 1e3, b * 1e3, b / a,
                  tree_allreduce_bytes_sent(0, comm.size, m, n) / 1e6);
    }
  }
  MPI_Finalize();
  return 0;
}
