// tree_allreduce under real MPI (run with mpirun -np 1..4): every rank gets the global tree's
// root bitwise, for many lengths including fewer elements than ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_gtest.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "culprit/scatter_reduce.h"
#include "culprit/tree_overlap.h"
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

// The bytes the reduction hands MPI for other ranks, counted where they leave: this program's own
// MPI_Ialltoallv and MPI_Iallgatherv stand in front of Open MPI's (PMPI, the MPI standard's profiling
// interface), add up what each call sends to ranks other than the caller, and call the real one.
namespace {
std::size_t g_sent_bytes = 0;
std::size_t type_bytes(MPI_Datatype t) {
  int size = 0;
  PMPI_Type_size(t, &size);
  return static_cast<std::size_t>(size);
}
int my_rank(MPI_Comm comm) {
  int r = 0;
  PMPI_Comm_rank(comm, &r);
  return r;
}
}  // namespace

extern "C" int MPI_Ialltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                              void* recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype,
                              MPI_Comm comm, MPI_Request* request) {
  int size = 0;
  PMPI_Comm_size(comm, &size);
  const int me = my_rank(comm);
  for (int r = 0; r < size; ++r)
    if (r != me) g_sent_bytes += static_cast<std::size_t>(sendcounts[r]) * type_bytes(sendtype);
  return PMPI_Ialltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm, request);
}

extern "C" int MPI_Iallgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                               const int recvcounts[], const int displs[], MPI_Datatype recvtype, MPI_Comm comm,
                               MPI_Request* request) {
  int size = 0;
  PMPI_Comm_size(comm, &size);
  // In place: the caller's part is recvbuf's, recvcounts[me] elements of recvtype, sent to every other rank.
  const std::size_t mine = sendbuf == MPI_IN_PLACE ? recvcounts[my_rank(comm)] * type_bytes(recvtype)
                                                   : sendcount * type_bytes(sendtype);
  g_sent_bytes += mine * static_cast<std::size_t>(size - 1);
  return PMPI_Iallgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm, request);
}

TEST(TreeAllreduce, TrafficIsAboutTwiceTheBufferTimesWMinusOneOverW) {
  const Comm comm = world();
  if (comm.size == 1) GTEST_SKIP() << "one rank sends nothing";
  const std::size_t n = 1 << 20;
  const int m = 8;
  std::vector<float> out(n);
  TreeAccumulator acc(n);
  const auto r = shard_range(comm.rank, comm.size, m);
  for (int k = r.lo; k < r.hi; ++k) {
    auto v = leaf(k, n);
    std::memcpy(acc.leaf_buffer(), v.data(), n * sizeof(float));
    acc.push(k);
  }
  g_sent_bytes = 0;
  tree_allreduce(comm, m, acc, out.data());
  const std::size_t sent = g_sent_bytes;
  // What the reduction sent is what it says it sends (the figure docs/performance.md quotes).
  EXPECT_EQ(sent, tree_allreduce_bytes_sent(comm.rank, comm.size, m, n)) << "rank " << comm.rank;
  const double ring = 2.0 * (comm.size - 1) / comm.size * n * sizeof(float);
  // W a power of two: exactly a ring allreduce's traffic.
  if ((comm.size & (comm.size - 1)) == 0) EXPECT_NEAR(static_cast<double>(sent), ring, 8.0 * comm.size);
  // Otherwise a few blocks more, never more than twice.
  EXPECT_LE(static_cast<double>(sent), 2 * ring);
  // Negative control: the counter sees a real send (an allgather of one float to the others).
  g_sent_bytes = 0;
  float one = 1.0f;
  std::vector<float> all(comm.size);
  std::vector<int> counts(comm.size, 1), displs(comm.size);
  for (int i = 0; i < comm.size; ++i) displs[i] = i;
  MPI_Request req;
  MPI_Iallgatherv(&one, 1, MPI_FLOAT, all.data(), counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD, &req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  EXPECT_EQ(g_sent_bytes, sizeof(float) * (comm.size - 1));
}

namespace {

// Every rank's leaves but the last pushed into acc; the last one's values in its pending buffer.
void fill_but_last(TreeAccumulator* acc, const Comm& comm, int m, std::size_t n) {
  const auto r = shard_range(comm.rank, comm.size, m);
  for (int k = r.lo; k < r.hi; ++k) {
    auto v = leaf(k, n);
    std::memcpy(acc->leaf_buffer(), v.data(), n * sizeof(float));
    if (k + 1 < r.hi) acc->push(k);
  }
}

// Parameter offsets of a made-up model: sizes 1, 2, 3, ... until n - 1 (the last value: the loss).
std::vector<std::int64_t> offsets_for(std::size_t n) {
  std::vector<std::int64_t> off;
  std::size_t at = 0;
  for (std::size_t size = 1; at + 1 < n; at += size++) off.push_back(static_cast<std::int64_t>(at));
  if (off.empty()) off.push_back(0);
  return off;
}

float flip_high_bit(const void*, float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  u ^= 1u << 30;
  std::memcpy(&v, &u, 4);
  return v;
}

std::vector<CommCheck> gather_checks(const Comm& comm, const CommCheck& mine) {
  std::vector<Fingerprint> flat(mine.sent);
  flat.insert(flat.end(), mine.received.begin(), mine.received.end());
  flat.insert(flat.end(), mine.chunks.begin(), mine.chunks.end());
  std::vector<Fingerprint> all(flat.size() * comm.size);
  MPI_Allgather(flat.data(), static_cast<int>(flat.size()), MPI_UINT64_T, all.data(), static_cast<int>(flat.size()),
                MPI_UINT64_T, MPI_COMM_WORLD);
  std::vector<CommCheck> out(comm.size);
  const std::size_t W = comm.size;
  for (std::size_t r = 0; r < W; ++r) {
    const Fingerprint* p = all.data() + r * 3 * W;
    out[r].sent.assign(p, p + W);
    out[r].received.assign(p + W, p + 2 * W);
    out[r].chunks.assign(p + 2 * W, p + 3 * W);
  }
  return out;
}

}  // namespace

// Bucket by bucket, the final values marked in an order of each rank's own (as a backward pass
// makes them), the overlapped reduction gives tree_allreduce's bits, whatever the bucket size.
TEST(OverlappedReduce, GivesTreeAllreducesBitsForAnyBucketsAndReadyOrder) {
  const Comm comm = world();
  OverlapChannel channel(comm);
  std::mt19937 rng(1234 + comm.rank);
  for (int m : {4, 8, 16}) {
    if (comm.size > m) continue;
    for (std::size_t n : {2u, 5u, 64u, 1000u, 4097u}) {
      const auto offsets = offsets_for(n);
      for (std::size_t cap : {0u, 1u, 7u, 100u, 5000u}) {
        auto buckets = make_buckets(offsets, n, cap);
        TreeAccumulator acc(n);
        fill_but_last(&acc, comm, m, n);
        std::vector<float> out(n, -1.0f);
        OverlappedReduce red(comm, &channel, m, &acc, shard_range(comm.rank, comm.size, m).hi - 1, out.data(), buckets,
                             nullptr, nullptr);
        std::vector<std::size_t> order(buckets.size());
        for (std::size_t b = 0; b < order.size(); ++b) order[b] = b;
        std::shuffle(order.begin(), order.end(), rng);
        for (std::size_t b : order) red.ready(b);
        red.finish();
        const auto want = tree(0, m, n);
        EXPECT_EQ(std::memcmp(out.data(), want.data(), n * sizeof(float)), 0)
            << "rank " << comm.rank << " of " << comm.size << ", M=" << m << ", n=" << n << ", cap=" << cap;
        // Afterwards the accumulator holds the rank's blocks, as after a plain push.
        EXPECT_EQ(acc.blocks().size(), canonical_blocks(shard_range(comm.rank, comm.size, m)).size());
      }
    }
  }
}

// A faulty link corrupts the same element with and without buckets; the comm check names the link
// either way, and with one bucket its fingerprints are tree_allreduce's.
TEST(OverlappedReduce, FaultsAndCommCheckAsTreeAllreduce) {
  const Comm comm = world();
  if (comm.size == 1) GTEST_SKIP() << "one rank sends nothing";
  OverlapChannel channel(comm);
  const int m = 8;
  const std::size_t n = 1000;
  const auto offsets = offsets_for(n);
  for (bool faulty : {false, true}) {
    SendFault fault;
    fault.offset = 997;  // in the last rank's chunk
    fault.apply = flip_high_bit;
    const SendFault* f = faulty && comm.rank == 0 ? &fault : nullptr;
    TreeAccumulator plain_acc(n);
    fill_but_last(&plain_acc, comm, m, n);
    plain_acc.push(shard_range(comm.rank, comm.size, m).hi - 1);
    std::vector<float> plain(n);
    CommCheck plain_check;
    plain_check.enabled = true;
    tree_allreduce(comm, m, plain_acc, plain.data(), nullptr, f, &plain_check);
    for (std::size_t cap : {0u, 50u}) {
      TreeAccumulator acc(n);
      fill_but_last(&acc, comm, m, n);
      std::vector<float> out(n);
      CommCheck check;
      check.enabled = true;
      OverlappedReduce red(comm, &channel, m, &acc, shard_range(comm.rank, comm.size, m).hi - 1, out.data(),
                           make_buckets(offsets, n, cap), f, &check);
      red.finish();
      EXPECT_EQ(std::memcmp(out.data(), plain.data(), n * sizeof(float)), 0) << "cap " << cap << " faulty " << faulty;
      const auto bad = comm_mismatches(gather_checks(comm, check));
      if (faulty) {
        ASSERT_EQ(bad.size(), 1u) << "cap " << cap;
        EXPECT_EQ(bad[0], std::make_pair(0, comm.size - 1));
      } else {
        EXPECT_TRUE(bad.empty()) << "cap " << cap;
      }
      if (cap == 0) {
        EXPECT_EQ(check.sent, plain_check.sent);
        EXPECT_EQ(check.received, plain_check.received);
        EXPECT_EQ(check.chunks, plain_check.chunks);
      }
    }
    // Negative control: the fault did change the result.
    if (faulty) {
      const auto want = tree(0, m, n);
      EXPECT_NE(std::memcmp(plain.data(), want.data(), n * sizeof(float)), 0);
    }
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return culprit::testing::run_on_every_rank();
}

namespace {
// Every rank's phase-1 comm check (ScatterReduce has no phase 2), gathered as the vote gathers them.
std::vector<CommCheck> every_check(const CommCheck& check, int W) {
  std::vector<Fingerprint> s(W * W), r(W * W);
  MPI_Allgather(check.sent.data(), W, MPI_UINT64_T, s.data(), W, MPI_UINT64_T, MPI_COMM_WORLD);
  MPI_Allgather(check.received.data(), W, MPI_UINT64_T, r.data(), W, MPI_UINT64_T, MPI_COMM_WORLD);
  std::vector<CommCheck> all(W);
  for (int q = 0; q < W; ++q) {
    all[q].sent.assign(s.begin() + q * W, s.begin() + (q + 1) * W);
    all[q].received.assign(r.begin() + q * W, r.begin() + (q + 1) * W);
    all[q].chunks.assign(W, 0);
  }
  return all;
}
}  // namespace

// ScatterReduce (--shard-params): micro-shard k computed by rank k mod W, sent piece by piece, in
// any number of pieces; each rank's slice of the result is the global tree's root bit for bit, with
// uneven slices (an empty one included) and rounds where some ranks have no leaf (W does not divide M).
TEST(ScatterReduce, EachSliceIsTheGlobalTreeRootForAnyPiecesAndCuts) {
  const Comm comm = world();
  const int W = comm.size;
  for (int m : {4, 8, 16}) {
    if (W > m) continue;
    for (std::size_t n : {3u, 64u, 1000u, 4097u}) {
      for (int variant = 0; variant < 2; ++variant) {
        std::vector<std::size_t> cuts;
        for (int c = 0; c <= W; ++c) cuts.push_back(chunk_offset(n, W, c));
        if (variant == 1 && W > 1) cuts[1] = 0;  // rank 0 holds nothing
        ScatterReduce sr(comm, m, cuts);
        sr.set_window(variant == 0 ? 1 : 3);
        // Variant 1 also cuts every range into pieces of at most 97 values: they leave from the top
        // down, so each piece's on_sent range lies below the one before (the caller drops the pages
        // of a sent range; the page it shares with the next piece must not be one that is in flight).
        std::vector<std::pair<std::size_t, std::size_t>> sent;
        if (variant == 1) sr.set_piece_limit(97);
        sr.set_on_sent([&](std::size_t a, std::size_t b) { sent.emplace_back(a, b); });
        CommCheck check;
        check.enabled = true;
        sr.begin_step(&check);
        for (int j = 0; j < scatter_rounds(W, m); ++j) {
          sr.begin_round(j);
          const int k = scatter_leaf(comm.rank, W, j);
          std::vector<float> v = k < m ? leaf(k, n) : std::vector<float>();
          // Pieces from the end, as a backward pass makes them final; one piece in variant 0.
          const std::size_t step = variant == 0 ? n : n / 3 + 1;
          sent.clear();
          for (std::size_t hi = n; hi > 0;) {
            const std::size_t lo = hi > step ? hi - step : 0;
            sr.post(lo, hi, k < m ? v.data() : nullptr);
            hi = lo;
          }
          sr.end_round();
          if (k < m) {
            ASSERT_FALSE(sent.empty());
            EXPECT_EQ(sent.front().second, n);
            EXPECT_EQ(sent.back().first, 0u);
            for (std::size_t i = 1; i < sent.size(); ++i) EXPECT_EQ(sent[i].second, sent[i - 1].first);
            for (const auto& [a, b] : sent) EXPECT_LE(b - a, variant == 1 ? 97u : n);
          }
        }
        sr.end_step();
        const auto want = tree(0, m, n);
        const std::size_t lo = cuts[comm.rank], hi = cuts[comm.rank + 1];
        EXPECT_EQ(std::memcmp(sr.slice(), want.data() + lo, (hi - lo) * sizeof(float)), 0)
            << "rank " << comm.rank << " of " << W << ", M=" << m << ", n=" << n << ", variant " << variant;
        // The comm check: every message arrived as sent (gathered, compared pair by pair).
        EXPECT_TRUE(comm_mismatches(every_check(check, W)).empty());
      }
    }
  }
}

namespace {
float twice_plus_one(const void*, float v) { return v * 2.0f + 1.0f; }  // v itself only at -1
}  // namespace

// A faulty link on rank 0: the owner of the element gets a wrong sum, every other value is right,
// and the comm check names (0, owner) — unless the owner is rank 0 itself (its own message).
TEST(ScatterReduce, AFaultyLinkChangesOneValueAndTheCheckNamesIt) {
  const Comm comm = world();
  const int W = comm.size, m = 8;
  const std::size_t n = 1000;
  std::vector<std::size_t> cuts;
  for (int c = 0; c <= W; ++c) cuts.push_back(chunk_offset(n, W, c));
  const std::size_t bad = n - 1;  // owned by the last rank
  SendFault fault;
  fault.offset = bad;
  fault.apply = twice_plus_one;
  ScatterReduce sr(comm, m, cuts);
  CommCheck check;
  check.enabled = true;
  sr.begin_step(&check);
  for (int j = 0; j < scatter_rounds(W, m); ++j) {
    sr.begin_round(j);
    const int k = scatter_leaf(comm.rank, W, j);
    std::vector<float> v = k < m ? leaf(k, n) : std::vector<float>();
    sr.post(n / 2, n, k < m ? v.data() : nullptr, comm.rank == 0 ? &fault : nullptr);
    sr.post(0, n / 2, k < m ? v.data() : nullptr, comm.rank == 0 ? &fault : nullptr);
    sr.end_round();
  }
  sr.end_step();
  const auto want = tree(0, m, n);
  const std::size_t lo = cuts[comm.rank], hi = cuts[comm.rank + 1];
  for (std::size_t e = lo; e < hi; ++e)
    if (e == bad) EXPECT_NE(sr.slice()[e - lo], want[e]);
    else ASSERT_EQ(sr.slice()[e - lo], want[e]) << e;
  const auto odd = comm_mismatches(every_check(check, W));
  if (W == 1) EXPECT_TRUE(odd.empty());
  else EXPECT_EQ(odd, (std::vector<std::pair<int, int>>{{0, W - 1}}));
}
