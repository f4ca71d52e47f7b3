// The detectors' pure parts: the vote record, replica comparison, the spike detector, the spot-check
// schedule, --inject parsing and firing, and StepDetectors' decisions on one rank (no MPI needed:
// a one-rank vote makes no MPI call).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "culprit/fault_spec.h"
#include "culprit/records.h"
#include "detect/replica_check.h"
#include "detect/detectors.h"
#include "detect/vote.h"

namespace h = culprit::harness;
using culprit::Fingerprint;

namespace {

h::VoteRecord full_record(int W, int M, std::size_t replica) {
  h::VoteRecord r;
  r.bad_shard = 3;
  r.bad_params = true;
  r.violated = false;
  r.gather_chunk = 6;
  for (int j = 0; j < W; ++j) {
    r.comm.sent.push_back(100 + j);
    r.comm.received.push_back(200 + j);
    r.comm.chunks.push_back(300 + j);
  }
  r.facts.reset(M);
  for (int k = 0; k < M; ++k) {
    r.facts.leaf[k] = 1000 + k;
    r.facts.recomputed[k] = 2000 + k;
    r.facts.rng[k] = 3000 + k;
    r.facts.samples[k] = 4000 + k;
  }
  for (std::size_t i = 0; i < replica; ++i) r.replica.push_back(5000 + i);
  return r;
}

}  // namespace

TEST(Vote, PackUnpackRoundTrip) {
  const h::VoteLayout layout{3, true, 4, 5};
  EXPECT_EQ(layout.length(), 4u + 9u + 16u + 5u);
  const h::VoteRecord r = full_record(3, 4, 5);
  const auto packed = h::pack(r, layout);
  ASSERT_EQ(packed.size(), layout.length());
  // The positional layout other tools may rely on: [bad shard + 1, bad params, violated, gather
  // chunk + 1, sent...].
  EXPECT_EQ(packed[0], 4u);
  EXPECT_EQ(packed[1], 1u);
  EXPECT_EQ(packed[2], 0u);
  EXPECT_EQ(packed[3], 7u);
  EXPECT_EQ(packed[4], 100u);
  EXPECT_EQ(packed[4 + 3], 200u);
  EXPECT_EQ(packed[4 + 6], 300u);
  EXPECT_EQ(packed[13], 1000u);
  EXPECT_EQ(packed[13 + 4], 2000u);
  EXPECT_EQ(packed.back(), 5004u);
  const h::VoteRecord u = h::unpack(packed.data(), layout);
  EXPECT_EQ(u.bad_shard, 3);
  EXPECT_TRUE(u.bad_params);
  EXPECT_FALSE(u.violated);
  EXPECT_EQ(u.gather_chunk, 6);
  EXPECT_EQ(u.comm.sent, r.comm.sent);
  EXPECT_EQ(u.comm.received, r.comm.received);
  EXPECT_EQ(u.comm.chunks, r.comm.chunks);
  EXPECT_EQ(u.facts.flat(), r.facts.flat());
  EXPECT_EQ(u.replica, r.replica);
}

TEST(Vote, OptionalPartsLeftOut) {
  h::VoteRecord r;  // no bad shard: encoded as 0
  const h::VoteLayout layout{4, false, 0, 0};
  const auto packed = h::pack(r, layout);
  ASSERT_EQ(packed.size(), 4u);
  EXPECT_EQ(packed[0], 0u);
  EXPECT_EQ(packed[3], 0u);  // no gather mismatch: encoded as 0
  EXPECT_EQ(h::unpack(packed.data(), layout).bad_shard, -1);
}

TEST(Vote, RecordThatDoesNotFitIsALogicError) {
  const h::VoteRecord r = full_record(2, 4, 0);
  EXPECT_THROW(h::pack(r, h::VoteLayout{3, true, 4, 0}), std::logic_error);   // comm of another world
  EXPECT_THROW(h::pack(r, h::VoteLayout{2, true, 5, 0}), std::logic_error);   // facts of other M
  EXPECT_THROW(h::pack(r, h::VoteLayout{2, true, 4, 1}), std::logic_error);   // replica count
}

TEST(Vote, OneRankExchangeIsLocal) {
  culprit::Comm one;  // size 1: no MPI call
  const h::VoteLayout layout{1, false, 2, 1};
  h::VoteRecord r;
  r.facts.reset(2);
  r.facts.rng[1] = 7;
  r.replica = {9};
  const auto v = h::exchange_votes(one, r, layout, "test");
  const auto& votes = v.records;
  ASSERT_EQ(votes.size(), 1u);
  EXPECT_EQ(v.facts, r.facts.flat());
  EXPECT_EQ(votes[0].facts.rng[1], 7u);
  EXPECT_EQ(votes[0].replica, std::vector<Fingerprint>{9});
}

TEST(Replicas, OddRankAndFirstParameter) {
  const std::vector<std::string> names{"a", "b", "c"};
  // Three ranks; rank 1 differs in "b".
  const std::vector<Fingerprint> all{1, 2, 3, 1, 9, 3, 1, 2, 3};
  const auto rc = h::compare_replicas(3, all, names.size());
  EXPECT_TRUE(rc.diverged);
  EXPECT_EQ(rc.odd_ranks, std::vector<int>{1});
  ASSERT_EQ(rc.first_index, 1);
  EXPECT_EQ(names[rc.first_index], "b");
  EXPECT_FALSE(h::compare_replicas(3, {1, 2, 3, 1, 2, 3, 1, 2, 3}, names.size()).diverged);
}

TEST(Replicas, ATieBlamesNobody) {
  // Two ranks, 1 vs 1: no majority, so neither is odd by rank order; both are candidates.
  const auto two = h::compare_replicas(2, {1, 2, 1, 9}, 2);
  EXPECT_TRUE(two.diverged);
  EXPECT_TRUE(two.tied);
  EXPECT_EQ(two.odd_ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(two.first_index, 1);
  // Four ranks, 2 vs 2: the same.
  const auto four = h::compare_replicas(4, {5, 1, 5, 1, 7, 1, 7, 1}, 2);
  EXPECT_TRUE(four.tied);
  EXPECT_EQ(four.odd_ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(four.first_index, 0);
  // Four ranks, 2 vs 1 vs 1: the pair wins, the two others are odd.
  const auto split = h::compare_replicas(4, {5, 5, 6, 7}, 1);
  EXPECT_FALSE(split.tied);
  EXPECT_EQ(split.odd_ranks, (std::vector<int>{2, 3}));
  // Three ranks, rank 0 alone: rank 0 is odd (the majority is not rank 0's view).
  const auto zero = h::compare_replicas(3, {9, 1, 1}, 1);
  EXPECT_FALSE(zero.tied);
  EXPECT_EQ(zero.odd_ranks, std::vector<int>{0});
}

TEST(Spikes, NeedHistoryAndBothThresholds) {
  h::SpikeDetector d;
  d.configure(8, 8, 3);
  std::string why;
  {
    h::SpikeDetector fresh;
    fresh.configure(8, 8, 3);
    EXPECT_FALSE(fresh.observe(100.0, &why));  // no history yet: never a spike
  }
  for (double v : {1.0, 1.1, 0.9, 1.05, 0.95}) EXPECT_FALSE(d.observe(v, &why));
  EXPECT_FALSE(d.observe(1.2, &why));     // ordinary variation
  EXPECT_TRUE(d.observe(50.0, &why));     // far above z and 3x the max
  EXPECT_NE(why.find("median"), std::string::npos);
  EXPECT_TRUE(d.observe(50.0, &why));     // a spike does not become the new normal
  EXPECT_FALSE(d.observe(std::nan(""), &why));  // non-finite values are the nonfinite detector's
}

TEST(Spikes, TheLongHorizonKeepsAConvergedRunQuiet) {
  // A converged run: the loss sits near 0.01 for many windows, after an early phase near 2. A hard
  // batch at 1.3 is 100x the recent window but below what the run saw within the horizon: quiet.
  h::SpikeDetector d;
  d.configure(20, 8, 3);
  std::string why;
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(d.observe(2.0 - 0.015 * i, &why));
  for (int i = 0; i < 300; ++i) EXPECT_FALSE(d.observe(0.01 + 0.001 * (i % 3), &why));
  EXPECT_FALSE(d.observe(1.3, &why));
  // Past the horizon (kLongWindows windows of 20) the early phase is forgotten: the same batch
  // against a long quiet stretch, and a fault's spike (1000x) at any time, are spikes.
  for (int i = 0; i < 20 * h::SpikeDetector::kLongWindows; ++i) EXPECT_FALSE(d.observe(0.01 + 0.001 * (i % 3), &why));
  EXPECT_TRUE(d.observe(1.3, &why));
  EXPECT_NE(why.find("values)"), std::string::npos) << why;  // says how far back it looked
  EXPECT_TRUE(d.observe(10.0, &why));
}

TEST(Spikes, RatioGuardsAgainstTinyVariance) {
  h::SpikeDetector d;
  d.configure(8, 8, 3);
  std::string why;
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(d.observe(1.0 + 1e-9 * i, &why));
  EXPECT_FALSE(d.observe(2.0, &why));  // huge z (no spread) but only 2x the maximum
}

TEST(Inject, ParsesEveryKeyAndRefusesUnknownOnes) {
  h::FaultSpec f;
  ASSERT_TRUE(h::parse_fault("step=5,rank=2,layer=fc1,phase=grad,kind=scale,factor=10,mode=persistent,index=7",
                             {"fc1", "fc2"}, &f).ok());
  EXPECT_EQ(f.step, 5);
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.layer, "fc1");
  EXPECT_EQ(f.phase, h::Phase::kGrad);
  EXPECT_EQ(f.kind, h::FaultKind::kScale);
  EXPECT_EQ(f.mode, h::FaultMode::kPersistent);
  EXPECT_EQ(f.index, 7);
  EXPECT_DOUBLE_EQ(f.factor, 10);
  ASSERT_TRUE(h::parse_fault("step=1,rank=all,phase=data,kind=stale", {"fc1"}, &f).ok());
  EXPECT_EQ(f.rank, -1);
  for (const char* bad : {"step=1,phase=warp", "step=1,kind=melt,layer=fc1", "step=1,mode=often,layer=fc1",
                          "step=1,layer=nope,phase=grad", "step=1,colour=red,layer=fc1"}) {
    const auto st = h::parse_fault(bad, {"fc1"}, &f);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("valid"), std::string::npos) << st.message();
  }
}

TEST(Inject, FiringByMode) {
  h::FaultSpec f;
  f.step = 4;
  f.rank = 1;
  f.mode = h::FaultMode::kTransient;
  EXPECT_TRUE(h::fault_fires(f, 1, 4, false, 0, 0));
  EXPECT_FALSE(h::fault_fires(f, 0, 4, false, 0, 0));  // another rank
  EXPECT_FALSE(h::fault_fires(f, 1, 5, false, 0, 0));  // once only
  EXPECT_FALSE(h::fault_fires(f, 1, 4, true, 0, 0));   // never in a replay
  f.mode = h::FaultMode::kPersistent;
  EXPECT_FALSE(h::fault_fires(f, 1, 3, false, 0, 0));
  EXPECT_TRUE(h::fault_fires(f, 1, 9, true, 0, 0));    // again in a replay
  f.rank = -1;
  EXPECT_TRUE(h::fault_fires(f, 3, 4, false, 0, 0));   // every rank
  f.mode = h::FaultMode::kIntermittent;
  f.p = 0.5;
  int fired = 0, changed = 0;
  for (std::uint64_t occ = 0; occ < 400; ++occ) {
    const bool a = h::fault_fires(f, 0, 10, false, 42, occ);
    EXPECT_EQ(a, h::fault_fires(f, 0, 10, false, 42, occ));  // a pure function of its inputs
    fired += a;
    changed += a != h::fault_fires(f, 0, 10, false, 43, occ);
  }
  EXPECT_GT(fired, 150);
  EXPECT_LT(fired, 250);
  EXPECT_GT(changed, 100);  // another seed draws otherwise
  EXPECT_FALSE(h::fault_fires(f, 0, 3, false, 42, 0));  // not before its step
}

TEST(Inject, HostBoundFault) {
  h::FaultSpec f;
  // host= without rank=: every rank on that node, no rank elsewhere.
  ASSERT_TRUE(h::parse_fault("step=2,host=node2,layer=fc1,phase=grad,mode=persistent", {"fc1"}, &f).ok());
  EXPECT_EQ(f.host, "node2");
  EXPECT_EQ(f.rank, -1);
  EXPECT_TRUE(h::fault_fires(f, 5, 3, false, 0, 0, "node2"));
  EXPECT_FALSE(h::fault_fires(f, 5, 3, false, 0, 0, "node3"));
  EXPECT_FALSE(h::fault_fires(f, 5, 3, false, 0, 0, ""));
  ASSERT_TRUE(h::parse_fault("step=2,rank=1,host=node2,layer=fc1,phase=grad", {"fc1"}, &f).ok());
  EXPECT_TRUE(h::fault_fires(f, 1, 2, false, 0, 0, "node2"));
  EXPECT_FALSE(h::fault_fires(f, 0, 2, false, 0, 0, "node2"));  // rank= still narrows it
  for (const char* bad : {"host=node[1-4]", "host=a,b", "host=-x", "host="}) {
    const std::string spec = std::string("step=2,phase=data,") + bad;
    const culprit::Status st = h::parse_fault(spec, {"fc1"}, &f);
    EXPECT_FALSE(st.ok()) << spec;
  }
}

TEST(Inject, CorruptValue) {
  h::FaultSpec f;
  f.kind = h::FaultKind::kBitflip;
  f.bit = 31;
  EXPECT_EQ(h::corrupt_value(f, 2.0f), -2.0f);
  f.kind = h::FaultKind::kNan;
  EXPECT_TRUE(std::isnan(h::corrupt_value(f, 2.0f)));
  f.kind = h::FaultKind::kScale;
  f.factor = 4;
  EXPECT_EQ(h::corrupt_value(f, 2.0f), 8.0f);
  f.kind = h::FaultKind::kNoise;
  const float a = h::corrupt_value(f, 1.0f), b = h::corrupt_value(f, 1.0f);
  EXPECT_NE(a, 1.0f);
  EXPECT_NE(a, b);  // differs every time, like a nondeterministic kernel
}

// ---- StepDetectors on one rank ----

namespace {

struct OneRank : ::testing::Test {
  void SetUp() override {
    dir = std::filesystem::path(testing::TempDir()) / ("culprit_detectors_" + std::to_string(::getpid()) + "_" +
                                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    cfg.run_dir = dir.string();
    cfg.micro_shards = 4;
    cfg.detect.on_detect = h::OnDetect::kHalt;
    comm.host = "testhost";
  }
  void configure() {
    h::StateProbe p;
    p.optimizer_fps = [] { return std::vector<Fingerprint>{0, 0}; };
    p.params_finite = [this] { return params_finite; };
    p.host_params = [this] { return params.data(); };
    p.samples_fp = [](int k) { return Fingerprint(4000 + k); };
    p.recompute = [this](int k, int attempt) { return recomputed; };
    det.configure(cfg, comm, {"w", "b"}, p);
    det.set_placement({"testhost"}, {"cpu"});
  }
  h::StepFacts facts(std::int64_t s) {
    h::StepFacts f;
    f.step = s;
    f.reduced = reduced.data();
    f.params = 2;
    f.shards.reset(det.collects_shard_facts() ? cfg.micro_shards : 0);
    for (int k = 0; k < f.shards.micro_shards(); ++k) {
      f.shards.samples[k] = 4000 + k;
      f.shards.rng[k] = 100 * s + k;
    }
    return f;
  }
  // The records as read back by their one reader (every field structured; the message is for people).
  std::vector<culprit::records::Incident> incidents() const {
    std::vector<culprit::records::Incident> out;
    const auto st = culprit::records::read_incidents(dir.string(), &out);
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  }
  std::filesystem::path dir;
  h::TrainConfig cfg;
  culprit::Comm comm;
  h::StepDetectors det;
  bool params_finite = true;
  Fingerprint recomputed = 0;
  std::vector<float> params{1.0f, 2.0f}, reduced{0.5f, 0.25f, 1.0f};  // P = 2, then the loss
};

}  // namespace

TEST_F(OneRank, CleanStepsRaiseNothing) {
  cfg.detect.invariants = true;
  configure();
  for (int s = 1; s <= 3; ++s) {
    auto f = facts(s);
    det.vote(f);
  }
  EXPECT_TRUE(det.halt().ok());
  EXPECT_TRUE(incidents().empty());
}

TEST_F(OneRank, NonFiniteMicroShardHaltsAsNumerical) {
  configure();
  auto f = facts(2);
  f.bad_shard = 3;
  det.vote(f);
  ASSERT_FALSE(det.halt().ok());
  EXPECT_EQ(det.halt().code(), culprit::status_code_for(culprit::IncidentClass::kNumerical));
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].detector, culprit::Detector::kNonfinite);
  EXPECT_EQ(inc[0].cls, culprit::IncidentClass::kNumerical);
  EXPECT_EQ(inc[0].step, 2);
  EXPECT_EQ(inc[0].rank, 0);
  EXPECT_EQ(inc[0].ranks, std::vector<int>{0});
  EXPECT_EQ(inc[0].micro_shard, 3);
  EXPECT_EQ(inc[0].what, culprit::Subject::kGradient);
  EXPECT_EQ(inc[0].host, "testhost");
  EXPECT_NE(inc[0].message.find("micro-shard 3"), std::string::npos);
}

TEST_F(OneRank, NonFiniteParametersAndReducedGradient) {
  configure();
  params_finite = false;
  auto f = facts(1);
  det.vote(f);
  reduced[1] = std::numeric_limits<float>::infinity();
  auto g = facts(2);
  det.vote(g);
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 2u);
  EXPECT_EQ(inc[0].what, culprit::Subject::kParameter);
  EXPECT_EQ(inc[0].rank, 0);
  EXPECT_NE(inc[0].message.find("parameters of rank 0"), std::string::npos);
  EXPECT_EQ(inc[1].rank, -1);  // the reduced gradient: no rank to blame
  EXPECT_EQ(inc[1].what, culprit::Subject::kGradient);
  EXPECT_EQ(det.halt().code(), culprit::status_code_for(culprit::IncidentClass::kNumerical));
}

TEST_F(OneRank, WarnDoesNotHalt) {
  cfg.detect.on_detect = h::OnDetect::kWarn;
  configure();
  auto f = facts(1);
  f.bad_shard = 0;
  det.vote(f);
  EXPECT_TRUE(det.halt().ok());
  EXPECT_EQ(incidents().size(), 1u);
}

TEST_F(OneRank, InvariantsFromFacts) {
  cfg.detect.invariants = true;
  configure();
  auto f = facts(1);
  f.shards.samples[2] = 12345;  // micro-shard 2 used other samples
  det.vote(f);
  auto g = facts(2);
  g.shards.rng[1] = g.shards.rng[0];  // two micro-shards share a generator state
  det.vote(g);
  auto v = facts(3);
  v.violated("the learning rate is wrong");
  v.violated("a second message is not kept");
  det.vote(v);
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 3u);
  for (const auto& i : inc) EXPECT_EQ(i.detector, culprit::Detector::kInvariant);
  EXPECT_EQ(inc[0].micro_shard, 2);
  EXPECT_EQ(inc[1].micro_shard, 1);
  EXPECT_EQ(inc[2].micro_shard, -1);
  EXPECT_NE(inc[0].message.find("micro-shard 2"), std::string::npos);
  EXPECT_NE(inc[1].message.find("micro-shard 1"), std::string::npos);
  EXPECT_NE(inc[2].message.find("learning rate is wrong"), std::string::npos);
  EXPECT_EQ(det.halt().code(), culprit::status_code_for(culprit::IncidentClass::kInvariant));
}

TEST_F(OneRank, RepeatedRngAcrossStepsIsCaught) {
  cfg.detect.invariants = true;
  configure();
  auto f = facts(1);
  det.vote(f);
  auto g = facts(2);
  g.shards.rng[3] = f.shards.rng[0];  // the previous step's state again
  det.vote(g);
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].micro_shard, 3);
  EXPECT_NE(inc[0].message.find("previous step"), std::string::npos);
}

TEST_F(OneRank, UpdateInvariant) {
  cfg.detect.invariants = true;
  configure();
  det.start({11, 22});
  auto f = facts(1);
  f.param_fps = {11, 23};  // "w" did not change although its gradient asks for it
  det.check_update(f, 0.1, 0.1, {0, 1}, {1, 1});
  EXPECT_NE(f.violation.find("'w' did not change"), std::string::npos) << f.violation;
  auto g = facts(2);
  g.param_fps = {12, 24};
  det.check_update(g, 0.1, 0.2, {0, 1}, {1, 1});
  EXPECT_NE(g.violation.find("learning rate"), std::string::npos) << g.violation;
  auto ok = facts(3);
  ok.param_fps = {13, 25};
  det.check_update(ok, 0.1, 0.1, {0, 1}, {1, 1});
  EXPECT_TRUE(ok.violation.empty()) << ok.violation;
}

TEST_F(OneRank, SpikeHaltsOnlyWithHaltAction) {
  cfg.detect.spike_window = 8;
  cfg.detect.spike_action = h::SpikeAction::kWarn;
  configure();
  for (int s = 1; s <= 8; ++s) {
    reduced[2] = 1.0f + 0.01f * s;
    auto f = facts(s);
    det.vote(f);
  }
  reduced[2] = 100.0f;
  auto f = facts(9);
  det.vote(f);
  const auto inc = incidents();
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].detector, culprit::Detector::kSpike);
  EXPECT_EQ(inc[0].rank, -1);
  EXPECT_TRUE(det.halt().ok());  // --spike-action warn
}

TEST_F(OneRank, SpotScheduleCoversEveryShardAtTheRate) {
  cfg.detect.spot_check = 0.25;
  configure();
  std::vector<int> seen(cfg.micro_shards, 0);
  int total = 0;
  for (int s = 1; s <= 16; ++s)
    for (int k : det.spot_shards(s, 0)) {
      ++seen[k];
      ++total;
      EXPECT_TRUE(det.spot_checked(s, k));
    }
  EXPECT_EQ(total, 16);  // 0.25 * 4 micro-shards * 16 steps
  for (int n : seen) EXPECT_EQ(n, 4);  // rotating evenly
  EXPECT_EQ(det.owner_of(3), 0);
}
