// FaultPlan: validation against the model and the world, and each phase's hook under its firing
// context (transient faults hit the first micro-shard once, never in recomputations or replays;
// intermittent ones draw per round).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "faults/fault_plan.h"
#include "culprit/optim_state.h"

namespace h = culprit::harness;

namespace {

struct Plan : ::testing::Test {
  void SetUp() override {
    params = {{"fc1.weight", torch::zeros({3})}, {"fc1.bias", torch::zeros({2})}, {"fc2.weight", torch::zeros({4})}};
    offsets = {0, 3, 5};
  }
  culprit::Status parse(std::vector<std::string> specs, int world = 2, h::StepMode mode = h::StepMode::kTrain) {
    plan = h::FaultPlan();
    return plan.parse(specs, {"fc1", "act", "fc2"}, params, offsets, world, /*seed=*/7, mode);
  }
  h::FireContext at(std::int64_t step, int rank, int first_shard = 0) {
    h::FireContext c;
    c.step = step;
    c.rank = rank;
    c.first_shard = first_shard;
    return c;
  }
  std::vector<h::NamedTensor> params;
  std::vector<std::int64_t> offsets;
  h::FaultPlan plan;
};

}  // namespace

TEST_F(Plan, ValidationNamesWhatIsWrong) {
  auto st = parse({"step=1,rank=0,layer=act,phase=grad"});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("has no parameters"), std::string::npos) << st.message();
  st = parse({"step=1,rank=5,layer=fc1,phase=grad"});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("does not exist"), std::string::npos) << st.message();
  st = parse({"step=1,rank=0,layer=nope,phase=forward"});
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(parse({"step=1,rank=0,layer=act,phase=forward"}).ok());
  EXPECT_TRUE(plan.at_layer_outputs());
  EXPECT_TRUE(parse({"step=1,rank=1,phase=data,kind=stale"}).ok());
  EXPECT_FALSE(plan.at_layer_outputs());
}

TEST_F(Plan, AReplayLeavesOutTheFaultsOfRanksItLacks) {
  // Trained on 4 ranks, replayed on 2: rank 3's device is not replaying; rank 1's is.
  const std::vector<std::string> specs{"step=1,rank=3,layer=fc1,phase=grad,kind=nan,mode=persistent",
                                       "step=1,rank=1,layer=fc1,phase=grad,kind=nan,mode=persistent"};
  EXPECT_FALSE(parse(specs, 2, h::StepMode::kTrain).ok());
  ASSERT_TRUE(parse(specs, 2, h::StepMode::kReplay).ok());
  std::vector<float> leaf(10, 1.0f);
  auto c = at(1, 1);
  c.mode = h::StepMode::kReplay;
  EXPECT_FALSE(plan.on_leaf(c, 0, leaf.data()));  // rank 1's NaN fires in the replay
  std::fill(leaf.begin(), leaf.end(), 1.0f);
  c.rank = 0;
  EXPECT_TRUE(plan.on_leaf(c, 0, leaf.data()));  // no fault of rank 3 lands anywhere else
  EXPECT_EQ(leaf, std::vector<float>(10, 1.0f));
}

TEST_F(Plan, EmptyPlanChangesNothing) {
  ASSERT_TRUE(parse({}).ok());
  EXPECT_TRUE(plan.empty());
  auto c = at(1, 0);
  EXPECT_EQ(plan.on_lr(c, 0.5, 0.25), 0.5);
  std::vector<float> leaf(10, 1.0f);
  EXPECT_TRUE(plan.on_leaf(c, 0, leaf.data()));
  EXPECT_EQ(leaf, std::vector<float>(10, 1.0f));
  culprit::SendFault sf;
  EXPECT_EQ(plan.on_send(c, &sf), nullptr);
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_FALSE(plan.keeps_grad(c, 0, i));
}

TEST_F(Plan, GradFaultLandsOnItsElementOnce) {
  ASSERT_TRUE(parse({"step=3,rank=1,layer=fc1,index=4,phase=grad,kind=nan"}).ok());
  std::vector<float> leaf(10, 1.0f);
  // fc1's first parameter is fc1.weight (3 elements): index 4 wraps to element 1.
  EXPECT_FALSE(plan.on_leaf(at(3, 1, /*first_shard=*/2), 2, leaf.data()));
  EXPECT_TRUE(std::isnan(leaf[1]));
  leaf.assign(10, 1.0f);
  EXPECT_TRUE(plan.on_leaf(at(3, 1, 2), 3, leaf.data()));  // not the first micro-shard: transient hits once
  EXPECT_TRUE(plan.on_leaf(at(3, 0, 0), 0, leaf.data()));  // another rank
  EXPECT_TRUE(plan.on_leaf(at(4, 1, 2), 2, leaf.data()));  // another step
  auto recompute = at(3, 1, 2);
  recompute.attempt = 1;
  EXPECT_TRUE(plan.on_leaf(recompute, 2, leaf.data()));  // a spot check's recomputation
  auto replay = at(3, 1, 2);
  replay.mode = h::StepMode::kReplay;
  EXPECT_TRUE(plan.on_leaf(replay, 2, leaf.data()));  // a replay
  EXPECT_EQ(leaf, std::vector<float>(10, 1.0f));
}

TEST_F(Plan, PersistentFaultFiresInReplays) {
  ASSERT_TRUE(parse({"step=2,rank=0,layer=fc2,phase=comm,kind=scale,factor=3,mode=persistent,index=1"}).ok());
  auto replay = at(5, 0);
  replay.mode = h::StepMode::kReplay;
  culprit::SendFault sf;
  const culprit::SendFault* f = plan.on_send(replay, &sf);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->offset, 6u);  // fc2.weight at offset 5, element 1
  EXPECT_EQ(f->apply(f->ctx, 2.0f), 6.0f);
  EXPECT_EQ(plan.on_send(at(1, 0), &sf), nullptr);  // before its step
}

TEST_F(Plan, LearningRateFaults) {
  ASSERT_TRUE(parse({"step=4,rank=all,phase=lr,kind=stale"}).ok());
  EXPECT_EQ(plan.on_lr(at(4, 1), 0.5, 0.25), 0.25);
  EXPECT_EQ(plan.on_lr(at(5, 1), 0.5, 0.25), 0.5);
  ASSERT_TRUE(parse({"step=4,rank=0,phase=lr,kind=scale,factor=10"}).ok());
  EXPECT_FLOAT_EQ(static_cast<float>(plan.on_lr(at(4, 0), 0.5, 0.25)), 5.0f);
}

TEST_F(Plan, IntermittentDrawsAnewEachRound) {
  ASSERT_TRUE(parse({"step=1,rank=0,layer=fc1,phase=grad,kind=nan,mode=intermittent,p=0.5"}).ok());
  int fired = 0, rounds = 64;
  for (int r = 0; r < rounds; ++r) {
    auto c = at(3, 0);
    c.mode = h::StepMode::kReplay;
    c.round = r;
    std::vector<float> leaf(10, 1.0f);
    const bool finite = plan.on_leaf(c, 0, leaf.data());
    auto again = c;
    std::vector<float> leaf2(10, 1.0f);
    EXPECT_EQ(finite, plan.on_leaf(again, 0, leaf2.data()));  // the same round draws the same
    fired += !finite;
  }
  EXPECT_GT(fired, 10);
  EXPECT_LT(fired, rounds - 10);
}

TEST_F(Plan, StaleGradientAndStaleSamples) {
  ASSERT_TRUE(parse({"step=2,rank=1,layer=fc1,phase=grad,kind=stale", "step=3,rank=1,phase=data,kind=stale"}).ok());
  EXPECT_TRUE(plan.keeps_grad(at(2, 1), 0, 0));   // fc1.weight
  EXPECT_TRUE(plan.keeps_grad(at(2, 1), 0, 1));   // fc1.bias
  EXPECT_FALSE(plan.keeps_grad(at(2, 1), 0, 2));  // fc2.weight
  at::Tensor s2 = torch::arange(4), s3 = torch::arange(4, 8);
  std::uint64_t seed = 1;
  plan.on_inputs(at(2, 1), 0, &s2, &seed);  // remembered
  plan.on_inputs(at(3, 1), 0, &s3, &seed);  // replaced by the previous samples
  EXPECT_TRUE(s3.equal(torch::arange(4)));
}

TEST_F(Plan, FaultsAtRestAndLostUpdates) {
  ASSERT_TRUE(parse({"step=1,rank=0,layer=fc2,phase=param,kind=scale,factor=2,index=2",
                     "step=1,rank=0,layer=fc1,phase=param,kind=stale"}).ok());
  for (auto& p : params) p.tensor.fill_(1.0f);
  const auto lost = plan.before_update(at(1, 0), params);
  ASSERT_EQ(lost.size(), 2u);  // both of fc1's parameters
  for (auto& p : params) p.tensor.fill_(3.0f);  // "the update"
  h::TrainConfig cfg;
  cfg.optim.kind = h::OptimizerKind::kSgd;
  std::vector<at::Tensor> tensors;
  for (auto& p : params) tensors.push_back(p.tensor);
  h::OptimizerState opt(cfg.optim, tensors, std::vector<bool>(tensors.size(), true));
  plan.after_update(at(1, 0), params, lost, opt);
  EXPECT_TRUE(params[0].tensor.equal(torch::full({3}, 1.0f)));  // the update of fc1 did not land
  EXPECT_TRUE(params[1].tensor.equal(torch::full({2}, 1.0f)));
  EXPECT_EQ(params[2].tensor[2].item<float>(), 6.0f);           // fc2.weight[2] corrupted at rest
  EXPECT_EQ(params[2].tensor[1].item<float>(), 3.0f);
}

// --precision bf16: a layer output in bfloat16 is corrupted in its own dtype, and always changes.
TEST_F(Plan, Bfloat16OutputsAreCorruptedInTheirOwnDtype) {
  const auto out = torch::tensor({1.5f, -2.0f, 3.0f}).to(torch::kBFloat16);
  auto spec_of = [](const std::string& text) {
    h::FaultSpec f;
    EXPECT_TRUE(h::parse_fault(text, {"fc1"}, &f).ok()) << text;
    return f;
  };
  // bit 22 of a float32 is bfloat16 bit 6, the top mantissa bit: 3.0 (1.1b x 2) becomes 2.0.
  auto bad = h::corrupt_output(spec_of("step=1,rank=0,phase=forward,layer=fc1,index=2,kind=bitflip,bit=22"), out);
  EXPECT_EQ(bad.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(bad[2].item<float>(), 2.0f);
  EXPECT_EQ(bad[0].item<float>(), 1.5f);  // only the element named
  // A scale too small for bfloat16's resolution moves the value one unit (1.5 -> 1.5078125).
  bad = h::corrupt_output(spec_of("step=1,rank=0,phase=forward,layer=fc1,index=0,kind=scale,factor=1.0001"), out);
  EXPECT_EQ(bad[0].item<float>(), 1.5078125f);
  bad = h::corrupt_output(spec_of("step=1,rank=0,phase=forward,layer=fc1,index=1,kind=scale,factor=0.9999"), out);
  EXPECT_EQ(bad[1].item<float>(), -1.9921875f);  // toward zero when the change shrinks it
  // Noise changes it too.
  bad = h::corrupt_output(spec_of("step=1,rank=0,phase=forward,layer=fc1,index=0,kind=noise"), out);
  EXPECT_NE(bad[0].item<float>(), 1.5f);
  // The plan refuses a bit a bfloat16 value does not keep, for bfloat16 layer outputs only.
  EXPECT_TRUE(parse({"step=1,rank=0,layer=fc1,phase=forward,kind=bitflip,bit=3"}).ok());
  EXPECT_TRUE(plan.check_dtypes({{"fc1", torch::kFloat}, {"fc2", torch::kBFloat16}}).ok());
  EXPECT_EQ(plan.check_dtypes({{"fc1", torch::kBFloat16}}).message(),
            "--inject 'step=1,rank=0,layer=fc1,phase=forward,kind=bitflip,bit=3': layer fc1's output (and the "
            "gradient into it) is bfloat16 under --precision bf16, which keeps bits 16..31 of a float32 value: bit "
            "must be in [16, 31], got 3");
  EXPECT_TRUE(parse({"step=1,rank=0,layer=fc1,phase=grad,kind=bitflip,bit=3"}).ok());
  EXPECT_TRUE(plan.check_dtypes({{"fc1", torch::kBFloat16}}).ok());  // the leaf is float32
}
