// The vote's summary (vote_summary.h) against the decisions the full records give: a clean step's
// summary shows nothing, and a step where any record-based decision would find something — a bad
// micro-shard, bad parameters, a broken invariant, a mismatched reduction message in either phase,
// replicas that differ — always shows something, so it takes the second round. No MPI: the
// reduction's combine is applied here in every order.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "culprit/tree_reduce.h"
#include "detect/replica_check.h"
#include "detect/vote.h"
#include "detect/vote_summary.h"

namespace h = culprit::harness;
using culprit::Fingerprint;

namespace {

constexpr int kW = 4, kM = 8;
constexpr std::size_t kR = 6;

// A clean step's records: every message arrived as it was sent, each micro-shard's facts set by its
// owner only, every replica alike.
std::vector<h::VoteRecord> clean_records(std::mt19937_64& rng, int W = kW, int M = kM, std::size_t R = kR) {
  std::vector<h::VoteRecord> v(W);
  std::vector<Fingerprint> chunk(W), replica(R);
  for (auto& c : chunk) c = rng();
  for (auto& p : replica) p = rng();
  for (int r = 0; r < W; ++r) {
    v[r].comm.sent.assign(W, 0);
    v[r].comm.received.assign(W, 0);
    v[r].comm.chunks = chunk;
    v[r].facts.reset(M);
    v[r].replica = replica;
  }
  for (int i = 0; i < W; ++i)
    for (int j = 0; j < W; ++j)
      if (i != j) v[i].comm.sent[j] = v[j].comm.received[i] = rng();
  for (int k = 0; k < M; ++k) {
    auto& f = v[k * W / M].facts;
    f.leaf[k] = rng(), f.rng[k] = rng(), f.samples[k] = rng();
  }
  return v;
}

h::VoteLayout layout_of(int W = kW, int M = kM, std::size_t R = kR) { return h::VoteLayout{W, true, M, R}; }

// The summaries combined in a given order of ranks, as one reduction tree would.
h::VoteSummary agreed(const std::vector<h::VoteRecord>& v, const h::VoteLayout& layout, std::vector<int> order) {
  h::VoteSummary s = h::summarize(v[order[0]], layout, order[0]);
  for (std::size_t i = 1; i < order.size(); ++i)
    h::combine(h::summarize(v[order[i]], layout, order[i]).words.data(), s.words.data());
  return s;
}

h::VoteSummary agreed(const std::vector<h::VoteRecord>& v, const h::VoteLayout& layout) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  return agreed(v, layout, order);
}

// Whether any decision taken from the records (detectors.cpp) finds something.
bool records_find_something(const std::vector<h::VoteRecord>& v) {
  bool any = !culprit::comm_mismatches(h::comm_checks(v)).empty();
  std::vector<Fingerprint> sets;
  for (const auto& r : v) {
    any = any || r.bad_shard >= 0 || r.bad_params || r.violated || r.gather_chunk >= 0;
    sets.insert(sets.end(), r.replica.begin(), r.replica.end());
  }
  return any || h::compare_replicas(static_cast<int>(v.size()), sets, v[0].replica.size()).diverged;
}

}  // namespace

TEST(VoteSummary, LayoutAndWords) {
  const auto layout = layout_of();
  std::mt19937_64 rng(1);
  const auto v = clean_records(rng);
  const auto s = h::summarize(v[0], layout, 0);
  EXPECT_EQ(s.words.size(), h::summary_words(layout));
  EXPECT_EQ(s.words.size(), 3u + 1u + 4u * kM + 1u + 2u * kR);
  // Flat in W: the world's size changes the record, not the summary.
  EXPECT_EQ(h::summary_words(layout_of(64)), h::summary_words(layout_of(2)));
  EXPECT_EQ(h::summary_words(h::VoteLayout{8, false, 0, 0}), 4u);
}

TEST(VoteSummary, CombineIsTheSameInEveryOrder) {
  std::mt19937_64 rng(2);
  const auto layout = layout_of();
  for (int trial = 0; trial < 50; ++trial) {
    auto v = clean_records(rng);
    // Arbitrary contents: the combine must agree bit for bit whatever they are.
    for (auto& r : v) {
      r.bad_shard = static_cast<int>(rng() % 3) - 1;
      r.comm.sent[rng() % kW] = rng();
      r.replica[rng() % kR] = rng();
      r.facts.leaf[rng() % kM] |= rng();
    }
    std::vector<int> order(kW);
    std::iota(order.begin(), order.end(), 0);
    const auto ref = agreed(v, layout, order).words;
    for (int p = 0; p < 5; ++p) {
      std::shuffle(order.begin(), order.end(), rng);
      EXPECT_EQ(agreed(v, layout, order).words, ref);
    }
    // A tree (two nodes of two, then the leaders) as the hierarchical reduction does.
    auto a = h::summarize(v[0], layout, 0), b = h::summarize(v[2], layout, 2);
    h::combine(h::summarize(v[1], layout, 1).words.data(), a.words.data());
    h::combine(h::summarize(v[3], layout, 3).words.data(), b.words.data());
    h::combine(b.words.data(), a.words.data());
    EXPECT_EQ(a.words, ref);
  }
}

TEST(VoteSummary, CleanStepShowsNothingAndItsFactsAreTheRecordsOr) {
  std::mt19937_64 rng(3);
  for (int W : {2, 3, 4, 8}) {
    const auto layout = layout_of(W);
    const auto v = clean_records(rng, W);
    ASSERT_FALSE(records_find_something(v));
    const auto s = agreed(v, layout);
    EXPECT_FALSE(s.shows_something()) << W;
    EXPECT_EQ(s.comm_digest(), 0u);
    std::vector<Fingerprint> ors(4 * kM, 0);
    for (const auto& r : v) {
      const auto f = r.facts.flat();
      for (std::size_t i = 0; i < ors.size(); ++i) ors[i] |= f[i];
    }
    EXPECT_EQ(std::vector<Fingerprint>(s.facts(), s.facts() + 4 * kM), ors);
  }
}

TEST(VoteSummary, EveryFieldThatDecidesTakesTheSecondRound) {
  using Mutation = std::function<void(std::vector<h::VoteRecord>&, std::mt19937_64&)>;
  const std::vector<std::pair<const char*, Mutation>> cases = {
      {"bad shard", [](auto& v, auto&) { v[2].bad_shard = 0; }},
      {"bad params", [](auto& v, auto&) { v[3].bad_params = true; }},
      {"violated", [](auto& v, auto&) { v[1].violated = true; }},
      {"gather chunk", [](auto& v, auto&) { v[2].gather_chunk = 0; }},
      {"sent", [](auto& v, auto& g) { v[0].comm.sent[3] ^= Fingerprint{1} << (g() % 64); }},
      {"received", [](auto& v, auto& g) { v[3].comm.received[1] = g(); }},
      {"chunk as received", [](auto& v, auto& g) { v[2].comm.chunks[0] = g(); }},
      {"chunk as sent", [](auto& v, auto& g) { v[1].comm.chunks[1] = g(); }},
      {"a link corrupts all it sends",
       [](auto& v, auto& g) {
         for (int j = 0; j < kW; ++j)
           if (j != 2) v[j].comm.received[2] = g();
       }},
      {"two messages swapped", [](auto& v, auto&) { std::swap(v[0].comm.received[1], v[0].comm.received[2]); }},
      {"replica, one rank", [](auto& v, auto& g) { v[1].replica[4] = g(); }},
      {"replica, a tie", [](auto& v, auto& g) { v[0].replica[0] = v[1].replica[0] = g(); }},
  };
  std::mt19937_64 rng(4);
  const auto layout = layout_of();
  for (const auto& [name, mutate] : cases)
    for (int trial = 0; trial < 20; ++trial) {
      auto v = clean_records(rng);
      mutate(v, rng);
      ASSERT_TRUE(records_find_something(v)) << name;
      EXPECT_TRUE(agreed(v, layout).shows_something()) << name;
    }
}

TEST(VoteSummary, FactsNeverTakeTheSecondRound) {
  // The micro-shard invariants read the OR-ed facts, the same bits in the summary as in the records.
  std::mt19937_64 rng(5);
  auto v = clean_records(rng);
  v[0].facts.rng[7] = v[3].facts.rng[7];  // a repeated dropout state: the OR decides it, on every rank
  EXPECT_FALSE(agreed(v, layout_of()).shows_something());
}

TEST(VoteSummary, RandomStepsTakeTheSecondRoundExactlyWhenTheRecordsFindSomething) {
  std::mt19937_64 rng(6);
  const auto layout = layout_of();
  int found = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    auto v = clean_records(rng);
    const int n = static_cast<int>(rng() % 3);  // 0, 1 or 2 faults
    for (int i = 0; i < n; ++i) {
      const int r = static_cast<int>(rng() % kW), j = static_cast<int>(rng() % kW);
      switch (rng() % 6) {
        case 0: v[r].comm.sent[j] ^= rng() | 1; break;
        case 1: v[r].comm.received[j] ^= rng() | 1; break;
        case 2: v[r].comm.chunks[j] ^= rng() | 1; break;
        case 3: v[r].replica[rng() % kR] ^= rng() | 1; break;
        case 4: v[r].bad_shard = j; break;
        default: v[r].violated = true; break;
      }
    }
    const bool want = records_find_something(v);
    found += want;
    EXPECT_EQ(agreed(v, layout).shows_something(), want) << "trial " << trial;
  }
  EXPECT_GT(found, 1000);
}

TEST(VoteSummary, OneMismatchedMessageAlwaysLeavesADigest) {
  // The digest's hash is a bijection of the fingerprint for each message: one mismatch cannot cancel.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 1000; ++trial) {
    auto v = clean_records(rng, 3, 4, 0);
    v[trial % 3].comm.received[(trial + 1) % 3] += 1 + rng() % 1000;  // a nearby value, not a random one
    EXPECT_NE(agreed(v, layout_of(3, 4, 0)).comm_digest(), 0u);
  }
}

TEST(VoteSummary, RecordsOfAnotherLayoutAreALogicError) {
  std::mt19937_64 rng(8);
  const auto v = clean_records(rng);
  EXPECT_THROW(h::summarize(v[0], layout_of(kW + 1), 0), std::logic_error);   // comm of another world
  EXPECT_THROW(h::summarize(v[0], layout_of(kW, kM + 1), 0), std::logic_error);  // facts of other M
  EXPECT_THROW(h::summarize(v[0], layout_of(kW, kM, kR + 1), 0), std::logic_error);  // replica count
  auto a = h::summarize(v[0], layout_of(), 0);
  const auto b = h::summarize(v[0], h::VoteLayout{kW, false, kM, kR}, 0);
  EXPECT_THROW(h::combine(b.words.data(), a.words.data()), std::logic_error);
}

// A tensor-parallel run's comm check (harness/train/tensor_layout.cpp: widen): two data-parallel
// reductions, ranks {0, 2} and {1, 3}, with 0s for the pairs across them, which exchanged nothing.
// A clean step shows nothing (so the vote's records are not gathered every step); a changed message
// in one of them shows.
TEST(VoteSummary, SideBySideReductionsCancelAndAChangedMessageShows) {
  std::mt19937_64 rng(11);
  auto v = clean_records(rng, 4);
  const Fingerprint chunk[2] = {rng(), rng()};  // each reduction's two chunks (the same sums in both)
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 4; ++j) {
      const bool same = r % 2 == j % 2;
      if (!same) v[r].comm.sent[j] = v[r].comm.received[j] = 0;
      v[r].comm.chunks[j] = same ? chunk[j / 2] : 0;
    }
  const auto layout = layout_of(4);
  EXPECT_EQ(agreed(v, layout).comm_digest(), 0u);
  EXPECT_TRUE(culprit::comm_mismatches({v[0].comm, v[1].comm, v[2].comm, v[3].comm}).empty());
  v[0].comm.received[2] ^= 1;  // rank 2's message to rank 0 arrived changed
  EXPECT_NE(agreed(v, layout).comm_digest(), 0u);
  EXPECT_EQ(culprit::comm_mismatches({v[0].comm, v[1].comm, v[2].comm, v[3].comm}),
            (std::vector<std::pair<int, int>>{{2, 0}}));
}
