// Settling a disagreement (bisect/src/opinions.cpp): every case the bisection meets, by devices,
// never by rank order.
#include <limits>

#include <gtest/gtest.h>

#include "opinions.h"

namespace b = culprit::bisect;

namespace {

// One record by `recorder` with value `record`; replays per rank.
b::Settlement shard(int recorder, int record, std::vector<int> replay) {
  b::Opinions o;
  o.records = {{recorder, record}};
  o.replay = std::move(replay);
  return b::settle(o);
}

}  // namespace

TEST(Opinions, TheRecordAloneIsWrong) {
  // Rank 0 recorded 9; every replay, rank 0's too, computes 1: a transient fault in the run.
  const auto s = shard(0, 9, {1, 1, 1});
  EXPECT_EQ(s.healthy, 1);
  EXPECT_EQ(s.wrong_records, std::vector<int>{0});
  EXPECT_TRUE(s.wrong_now.empty());
}

TEST(Opinions, APersistentFaultOutvotedByDevicesNotCounts) {
  // Rank 0 recorded 9 and computes 9 again: one device's two opinions, against two devices.
  const auto s = shard(0, 9, {9, 1, 1});
  EXPECT_EQ(s.healthy, 1);
  EXPECT_EQ(s.wrong_records, std::vector<int>{0});
  EXPECT_EQ(s.wrong_now, std::vector<int>{0});
}

TEST(Opinions, TwoRanksAPersistentFaultIsAnAmbiguousPair) {
  // Each rank reproduces its own result: one of them is faulty, nobody is blamed.
  for (int recorder : {0, 1}) {
    std::vector<int> replay{2, 2};
    replay[recorder] = 9;
    const auto s = shard(recorder, 9, replay);
    EXPECT_EQ(s.healthy, -1);
    EXPECT_TRUE(s.ambiguous);
    EXPECT_EQ(s.candidates, (std::vector<int>{0, 1}));
  }
}

TEST(Opinions, TwoRanksATransientFaultIsFound) {
  // Rank 1 recorded 9, both recompute 1: two devices agree.
  const auto s = shard(1, 9, {1, 1});
  EXPECT_EQ(s.healthy, 1);
  EXPECT_EQ(s.wrong_records, std::vector<int>{1});
  // A device that contradicts itself is the faulty one (a persistent fault with a new wrong value
  // each time), even with two ranks.
  const auto n = shard(0, 9, {7, 1});
  EXPECT_EQ(n.healthy, 1);
  EXPECT_EQ(n.wrong_records, std::vector<int>{0});
  EXPECT_EQ(n.wrong_now, std::vector<int>{0});
}

TEST(Opinions, AFaultDuringTheReplayLeavesTheRecordHealthy) {
  // The record agrees with another device; rank 2 computed wrongly now.
  const auto s = shard(0, 1, {1, 1, 5});
  EXPECT_EQ(s.healthy, 1);
  EXPECT_TRUE(s.wrong_records.empty());
  EXPECT_EQ(s.wrong_now, std::vector<int>{2});
  // With two ranks, rank 1 wrong now looks like a persistent fault on either until reruns show
  // rank 1 contradicting itself (an intermittent fault draws anew).
  b::Opinions o;
  o.records = {{0, 1}};
  o.replay = {1, 5};
  EXPECT_TRUE(b::settle(o).ambiguous);
  o.more = {{0, 1}, {1, 1}, {1, 5}};
  const auto rr = b::settle(o);
  EXPECT_EQ(rr.healthy, 1);
  EXPECT_TRUE(rr.wrong_records.empty());
  EXPECT_EQ(rr.wrong_now, std::vector<int>{1});
  // ... and the recorder itself, intermittently wrong now.
  const auto r = shard(0, 1, {5, 1});
  EXPECT_TRUE(r.wrong_records.empty());
  EXPECT_EQ(r.wrong_now, std::vector<int>{0});
}

TEST(Opinions, ARecorderOutsideThisWorld) {
  // Rank 3 recorded 9; this world has two ranks, both computing 1.
  const auto s = shard(3, 9, {1, 1});
  EXPECT_EQ(s.wrong_records, std::vector<int>{3});
  // Rank 3's record agrees with rank 0: rank 1 is wrong now.
  const auto t = shard(3, 1, {1, 2});
  EXPECT_TRUE(t.wrong_records.empty());
  EXPECT_EQ(t.wrong_now, std::vector<int>{1});
}

TEST(Opinions, HealthyDevicesDisagreeing) {
  // Two pairs of devices with two results: software nondeterminism, nobody blamed.
  const auto s = shard(0, 1, {1, 1, 2, 2});
  EXPECT_EQ(s.healthy, -1);
  EXPECT_TRUE(s.disagree);
  EXPECT_FALSE(s.ambiguous);
  // Three self-consistent devices, three results.
  const auto t = shard(0, 1, {1, 2, 3});
  EXPECT_TRUE(t.disagree);
}

TEST(Opinions, AnUpdateWithARecordPerRank) {
  // Parameters after a step: rank 0's record differs; both replays agree with rank 1's record.
  b::Opinions o;
  o.records = {{0, 9}, {1, 1}};
  o.replay = {1, 1};
  const auto s = b::settle(o);
  EXPECT_EQ(s.healthy, 1);
  EXPECT_EQ(s.wrong_records, std::vector<int>{0});
  // The fault at rest comes back on rank 0: rank 0 holds 9 twice, rank 1 holds 1 twice: a tie.
  o.replay = {9, 1};
  const auto t = b::settle(o);
  EXPECT_TRUE(t.ambiguous);
  // With four ranks it does not.
  o.records = {{0, 9}, {1, 1}, {2, 1}, {3, 1}};
  o.replay = {9, 1, 1, 1};
  const auto u = b::settle(o);
  EXPECT_EQ(u.wrong_records, std::vector<int>{0});
  EXPECT_EQ(u.wrong_now, std::vector<int>{0});
}

TEST(Opinions, TheFloat64ArbiterSettlesATie) {
  // Rank 0 holds 9 (record and replay), rank 1 holds 1: a tie, until the float64 recomputation
  // sides with rank 1 as one more device.
  b::Opinions o;
  o.records = {{0, 9}};
  o.replay = {9, 1};
  EXPECT_TRUE(b::settle(o).ambiguous);
  o.more.push_back({b::kArbiterDevice, 1});
  const auto s = b::settle(o);
  EXPECT_EQ(s.healthy, 1);
  EXPECT_EQ(s.wrong_records, std::vector<int>{0});
  EXPECT_EQ(s.wrong_now, std::vector<int>{0});
}

TEST(Opinions, TheArbiterSidesOnlyWithAClearMargin) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  // Rounding against a fault's effect, either way round.
  EXPECT_EQ(b::arbitrate(1e-7, 0.5), 0);
  EXPECT_EQ(b::arbitrate(0.02, 4e-8), 1);
  EXPECT_EQ(b::arbitrate(1e-7, inf), 0);  // a NaN or Inf in one result
  EXPECT_EQ(b::arbitrate(0.0, inf), 0);   // exact zeros against a flipped zero
  // A few ulps apart: a low bit's flip can land either side of the float64 value.
  EXPECT_EQ(b::arbitrate(1e-9, 3e-6), -1);
  // As close as each other, both far, both non-finite, or nothing to measure.
  EXPECT_EQ(b::arbitrate(1e-7, 1.4e-7), -1);
  EXPECT_EQ(b::arbitrate(0.3, 0.5), -1);
  EXPECT_EQ(b::arbitrate(inf, inf), -1);
  EXPECT_EQ(b::arbitrate(nan, 0.5), -1);
  // The gap is a ratio: just under it decides nothing, at it decides.
  EXPECT_EQ(b::arbitrate(1e-4, 1e-4 * b::kArbiterGap * 0.99), -1);
  EXPECT_EQ(b::arbitrate(1e-4, 1e-4 * b::kArbiterGap), 0);
  // The nearer one far from float64 (not rounding: the float64 computation took another path, as a
  // kernel may): no side, whatever the ratio.
  EXPECT_EQ(b::arbitrate(0.5, 40), -1);
  EXPECT_EQ(b::arbitrate(b::kRoundingBound * 2, inf), -1);
}
