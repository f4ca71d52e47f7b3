// tree_allreduce_nccl against the CPU's tree_allreduce, bit for bit (docs/cuda.md, "Deterministic
// reduction over NCCL (design)"). Run under mpirun with one GPU per rank:
//   mpirun -np 1 culprit_nccl_tests   the device's combine for W = 1..8 (simulated ranks) on one GPU
//   mpirun -np W culprit_nccl_tests   also the real NCCL exchange among W ranks, its comm check
//                                     fingerprints, and bucketed calls equal to the whole buffer
// Skips, saying why, without a device, or with fewer devices on a host than ranks there.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "culprit/fingerprint_cuda.h"
#include "culprit/tree_reduce_nccl.h"
#include "mpi_gtest.h"
#include "tree_data.h"
#include "tree_plan_sim.h"

using namespace culprit;
using culprit::testing::tree;

namespace {

#define CUDA_ASSERT(call) ASSERT_EQ((call), cudaSuccess) << #call
#define OK_ASSERT(expr)                    \
  do {                                     \
    const ::culprit::Status _s = (expr);   \
    ASSERT_TRUE(_s.ok()) << _s.message();  \
  } while (0)

Comm world() {
  Comm c;
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.size);
  return c;
}

// A device buffer of floats, freed at scope exit.
struct Dev {
  float* p = nullptr;
  explicit Dev(std::size_t n) {
    if (n) cudaMalloc(&p, n * sizeof(float));
  }
  explicit Dev(const std::vector<float>& v) : Dev(v.size()) {
    if (!v.empty()) cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  Dev(Dev&& o) noexcept : p(o.p) { o.p = nullptr; }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p) cudaFree(p);
  }
  std::vector<float> get(std::size_t n) const {
    std::vector<float> v(n);
    if (n) cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// This rank's device (local rank), or why it has none: the reason is the same on every rank.
int g_device = -1;
std::string g_no_device;
cuda::NcclComm g_nccl;

void choose_device(const Comm& comm) {
  std::string why;
  const int devices = cuda::device_count(&why);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, comm.rank, MPI_INFO_NULL, &local);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  int mine = devices == 0 ? 0 : local_size <= devices ? 2 : 1, worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (devices > 0) g_device = local_rank % devices;
  if (worst == 0) g_no_device = "no CUDA device on some rank (" + why + ")";
  if (worst == 1) g_no_device = "fewer CUDA devices than ranks on a host (NCCL needs one per rank)";
}

}  // namespace

TEST(NcclTree, CombineOnTheDeviceGivesTheTreeRoot) {
  if (g_device < 0) GTEST_SKIP() << "no CUDA device here";
  cudaSetDevice(g_device);
  cuda::NcclTreeWorkspace ws;
  for (int m : {1, 2, 4, 8, 16})
    for (int w = 1; w <= 8 && w <= m; ++w)
      for (std::size_t n : {1u, 5u, 37u, 4097u, 100003u}) {
        std::vector<TreePlan> plans;
        std::vector<std::vector<float>> sent;
        for (int r = 0; r < w; ++r) {
          plans.push_back(plan_tree_allreduce(r, w, m, n));
          sent.push_back(culprit::testing::pack(plans[r], culprit::testing::rank_blocks(r, w, m, n)));
        }
        const auto want = tree(0, m, n);
        for (int c = 0; c < w; ++c) {
          const TreePlan& p = plans[c];
          Dev recv(culprit::testing::receive(plans, sent, c)), out(p.chunk_len);
          OK_ASSERT(cuda::tree_combine_device(p, recv.p, out.p, nullptr, &ws));
          CUDA_ASSERT(cudaDeviceSynchronize());
          const std::vector<float> slice(want.begin() + p.chunk_off, want.begin() + p.chunk_off + p.chunk_len);
          EXPECT_TRUE(same_bits(out.get(p.chunk_len), slice)) << "owner " << c << " W=" << w << " M=" << m << " n=" << n;
        }
      }
}

TEST(NcclTree, SubnormalSumsAreKept) {
  // Leaves of a few times the smallest subnormal: a flush-to-zero add would give 0.
  if (g_device < 0) GTEST_SKIP() << "no CUDA device here";
  cudaSetDevice(g_device);
  const std::size_t n = 1000;
  std::vector<float> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 7 + 1) * 1.4e-45f;
    b[i] = static_cast<float>(i % 5 + 1) * 1.4e-45f;
  }
  std::vector<float> want = a;
  tree_add(want.data(), b.data(), n);
  Dev da(a), db(b);
  OK_ASSERT(cuda::tree_add_device(da.p, db.p, n, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(same_bits(da.get(n), want));
  EXPECT_NE(want[0], 0.0f);
}

TEST(NcclTree, EqualsTreeAllreduceBitwiseWithTheSameCommCheck) {
  if (!g_no_device.empty()) GTEST_SKIP() << g_no_device;
  const Comm comm = world();
  cudaSetDevice(g_device);
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::NcclTreeWorkspace ws;
  for (int m : {1, 2, 4, 8, 16}) {
    if (comm.size > m) continue;
    for (std::size_t n : {1u, 3u, 5u, 64u, 1000u, 4097u, (1u << 20) + 3u}) {
      // The CPU path, with its comm check.
      TreeAccumulator acc(n);
      const auto range = shard_range(comm.rank, comm.size, m);
      for (int k = range.lo; k < range.hi; ++k) {
        const auto v = culprit::testing::leaf(k, n);
        std::memcpy(acc.leaf_buffer(), v.data(), n * sizeof(float));
        acc.push(k);
      }
      std::vector<float> cpu(n);
      CommCheck cpu_check, gpu_check;
      cpu_check.enabled = gpu_check.enabled = true;
      tree_allreduce(comm, m, acc, cpu.data(), nullptr, nullptr, &cpu_check);
      // The same blocks on the device.
      std::vector<Dev> blocks;
      std::vector<const float*> ptrs;
      for (const auto& e : acc.blocks()) blocks.emplace_back(e.data);
      for (const auto& b : blocks) ptrs.push_back(b.p);
      Dev out(n);
      CUDA_ASSERT(cudaDeviceSynchronize());  // the uploads, on the legacy stream, before `stream` reads them
      OK_ASSERT(cuda::tree_allreduce_nccl(g_nccl, m, ptrs, n, out.p, stream, &ws, &gpu_check));
      OK_ASSERT(cuda::nccl_wait(&g_nccl, stream, 60));
      EXPECT_TRUE(same_bits(out.get(n), cpu)) << "rank " << comm.rank << " of " << comm.size << " M=" << m << " n=" << n;
      // The same messages, hence the same fingerprints on both paths.
      EXPECT_EQ(gpu_check.sent, cpu_check.sent) << "M=" << m << " n=" << n;
      EXPECT_EQ(gpu_check.received, cpu_check.received) << "M=" << m << " n=" << n;
      EXPECT_EQ(gpu_check.chunks, cpu_check.chunks) << "M=" << m << " n=" << n;
    }
  }
  cudaStreamDestroy(stream);
}

TEST(NcclTree, BucketsInReverseOrderEqualTheWholeBuffer) {
  // Backward overlap reduces the buffer bucket by bucket, last layers first: each element goes
  // through the same tree, so the bits are the whole buffer's.
  if (!g_no_device.empty()) GTEST_SKIP() << g_no_device;
  const Comm comm = world();
  cudaSetDevice(g_device);
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::NcclTreeWorkspace ws;
  const int m = 8;
  const std::size_t n = 10007;
  const std::size_t cuts[] = {0, 3000, 3001, 7000, n};
  const auto host_blocks = culprit::testing::rank_blocks(comm.rank, comm.size, m, n);
  std::vector<Dev> blocks;
  for (const auto& b : host_blocks) blocks.emplace_back(b);
  Dev whole(n), bucketed(n);
  std::vector<const float*> ptrs;
  for (const auto& b : blocks) ptrs.push_back(b.p);
  CUDA_ASSERT(cudaDeviceSynchronize());  // the uploads, on the legacy stream, before `stream` reads them
  OK_ASSERT(cuda::tree_allreduce_nccl(g_nccl, m, ptrs, n, whole.p, stream, &ws));
  for (int k = 3; k >= 0; --k) {
    std::vector<const float*> part;
    for (const auto& b : blocks) part.push_back(b.p + cuts[k]);
    OK_ASSERT(cuda::tree_allreduce_nccl(g_nccl, m, part, cuts[k + 1] - cuts[k], bucketed.p + cuts[k], stream, &ws));
  }
  OK_ASSERT(cuda::nccl_wait(&g_nccl, stream, 60));
  EXPECT_TRUE(same_bits(bucketed.get(n), whole.get(n)));
  EXPECT_TRUE(same_bits(whole.get(n), tree(0, m, n)));
  cudaStreamDestroy(stream);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const Comm comm = world();
  choose_device(comm);
  if (g_no_device.empty()) {
    const Status st = cuda::nccl_init(comm, g_device, &g_nccl);
    if (!st.ok()) g_no_device = "nccl_init: " + st.message();  // the same on every rank (agreed)
  }
  if (comm.rank == 0 && !g_no_device.empty()) std::printf("NCCL tests skipped: %s\n", g_no_device.c_str());
  const int rc = culprit::testing::run_on_every_rank();  // finalises MPI
  cuda::nccl_destroy(&g_nccl);
  return rc;
}
