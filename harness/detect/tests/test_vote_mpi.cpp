// The vote under real mpirun (ctest runs it at 4 ranks as one node, as 2 nodes of 2 and as nodes of
// 3 + 1 through the CULPRIT_NODE_SPLIT seam, and with CULPRIT_VOTE_GATHER's full all-gather): every
// rank gets the same records and facts in every arrangement — none when the step is clean, all of
// them, bit for bit, when any record would decide something.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <random>

#include "mpi_gtest.h"
#include "detect/node_topology.h"
#include "detect/vote.h"

namespace h = culprit::harness;
using culprit::Fingerprint;

namespace {

culprit::Comm world() {
  culprit::Comm c;
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.size);
  return c;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}

constexpr int kM = 8;
constexpr std::size_t kR = 5;

// Every rank builds the whole step's records from one seed and votes with its own.
std::vector<h::VoteRecord> step_records(int W, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<h::VoteRecord> v(W);
  std::vector<Fingerprint> chunk(W), replica(kR);
  for (auto& c : chunk) c = rng();
  for (auto& p : replica) p = rng();
  for (int r = 0; r < W; ++r) {
    v[r].comm.sent.assign(W, 0);
    v[r].comm.received.assign(W, 0);
    v[r].comm.chunks = chunk;
    v[r].facts.reset(kM);
    v[r].replica = replica;
  }
  for (int i = 0; i < W; ++i)
    for (int j = 0; j < W; ++j)
      if (i != j) v[i].comm.sent[j] = v[j].comm.received[i] = rng();
  for (int k = 0; k < kM; ++k) v[k * W / kM].facts.samples[k] = rng();
  return v;
}

void expect_same(const h::VoteRecord& a, const h::VoteRecord& b) {
  EXPECT_EQ(a.bad_shard, b.bad_shard);
  EXPECT_EQ(a.bad_params, b.bad_params);
  EXPECT_EQ(a.violated, b.violated);
  EXPECT_EQ(a.comm.sent, b.comm.sent);
  EXPECT_EQ(a.comm.received, b.comm.received);
  EXPECT_EQ(a.comm.chunks, b.comm.chunks);
  EXPECT_EQ(a.facts.flat(), b.facts.flat());
  EXPECT_EQ(a.replica, b.replica);
}

}  // namespace

TEST(VoteMpi, NodesAsTheSeamOrTheMachineGroupsThem) {
  const auto comm = world();
  const auto& t = h::node_topology(comm);
  EXPECT_EQ(&t, &h::node_topology(comm));  // built once per communicator
  const int K = env_int("CULPRIT_NODE_SPLIT");
  if (K > 0) {
    EXPECT_EQ(t.node_rank, comm.rank % K);
    EXPECT_EQ(t.node_size, std::min(K, comm.size - comm.rank / K * K));
    EXPECT_EQ(t.leaders_size, t.leader() ? (comm.size + K - 1) / K : 0);
  } else {
    EXPECT_EQ(t.node_size, comm.size);  // one machine: MPI_COMM_TYPE_SHARED makes one node
  }
  EXPECT_EQ(t.leader(), t.leaders != MPI_COMM_NULL);
}

TEST(VoteMpi, RecordsOnlyWhenAStepShowsSomethingAndThenExactly) {
  const auto comm = world();
  const int W = comm.size;
  const bool gather = env_int("CULPRIT_VOTE_GATHER") != 0;
  const h::VoteLayout layout{W, true, kM, kR};
  for (int scenario = 0; scenario < 8; ++scenario) {
    auto v = step_records(W, 100 + scenario);
    const int r = W - 1;
    switch (scenario) {
      case 1: v[r].bad_shard = 1; break;
      case 2: v[r].bad_params = true; break;
      case 3: v[r].violated = true; break;
      case 4: if (W > 1) v[0].comm.received[r] ^= 4; break;
      case 5: if (W > 1) v[r].comm.chunks[0] ^= 1; break;
      case 6: v[r].replica[2] ^= 1; break;
      case 7: v[0].facts.rng[kM - 1] = 9; break;  // facts are OR-ed, never a second round
      default: break;
    }
    const bool shows = (scenario >= 1 && scenario <= 6 && (W > 1 || scenario < 4 || scenario == 6)) || gather ||
                       W == 1;
    const auto got = h::exchange_votes(comm, v[comm.rank], layout, "test");
    std::vector<Fingerprint> ors(4 * kM, 0);
    for (const auto& rec : v) {
      const auto f = rec.facts.flat();
      for (std::size_t i = 0; i < ors.size(); ++i) ors[i] |= f[i];
    }
    EXPECT_EQ(got.facts, ors) << "scenario " << scenario;
    ASSERT_EQ(got.records.size(), shows ? static_cast<std::size_t>(W) : 0u) << "scenario " << scenario;
    for (std::size_t i = 0; i < got.records.size(); ++i) expect_same(got.records[i], v[i]);
  }
}

TEST(VoteMpi, ATopologyGoesWithItsCommunicator) {
  // A replay's rotated layout is split and freed: each communicator gets its own, freed with it.
  const auto comm = world();
  for (int i = 0; i < 3; ++i) {
    culprit::Comm c = comm;
    MPI_Comm_split(MPI_COMM_WORLD, 0, (comm.rank + i) % comm.size, &c.comm);
    MPI_Comm_rank(c.comm, &c.rank);
    h::VoteRecord mine;
    const auto got = h::exchange_votes(c, mine, h::VoteLayout{c.size, false, 0, 0}, "test");
    EXPECT_EQ(got.records.size(), std::getenv("CULPRIT_VOTE_GATHER") || c.size == 1 ? std::size_t(c.size) : 0u);
    MPI_Comm_free(&c.comm);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return culprit::testing::run_on_every_rank();
}
