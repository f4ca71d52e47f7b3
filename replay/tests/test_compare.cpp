// The compare module shared by replay, audit and bisect (culprit/compare.h): where a recomputation
// first differs, in execution order, and what --inject phase and layer that is.
#include <gtest/gtest.h>

#include <limits>

#include "culprit/compare.h"

namespace rp = culprit::replay;
using culprit::Phase;
using culprit::harness::ShardResult;
using culprit::harness::StepResult;

namespace {

const std::vector<std::string> kLayers{"fc1", "act", "fc2"};
const std::vector<std::string> kParams{"fc1.weight", "fc1.bias", "fc2.weight"};

ShardResult result() {
  ShardResult r;
  r.loss = 0.5f;
  r.grad_fp = 10;
  r.input_fp = 20;
  r.fwd = {1, 2, 3};
  r.bwd = {4, 5, 6};
  r.param_grad = {7, 8, 9};
  return r;
}

}  // namespace

TEST(Compare, TheFirstDifferenceInExecutionOrder) {
  const ShardResult want = result();
  EXPECT_FALSE(rp::first_difference(want, want, kLayers, kParams, true));
  ShardResult got = want;
  got.fwd[2] = 99;
  got.bwd[0] = 99;  // later in execution than fc2's forward output
  got.grad_fp = 99;
  auto d = rp::first_difference(got, want, kLayers, kParams, true);
  EXPECT_EQ(d.where, rp::ShardWhere::kForward);
  EXPECT_EQ(d.layer(), "fc2");
  EXPECT_EQ(d.phase(), Phase::kForward);
  EXPECT_EQ(d.describe(), "first in the forward output of layer fc2");
  got = want;
  got.bwd[0] = 99;
  got.bwd[2] = 99;  // backward runs from the last layer: fc2 first
  d = rp::first_difference(got, want, kLayers, kParams, true);
  EXPECT_EQ(d.where, rp::ShardWhere::kBackward);
  EXPECT_EQ(d.layer(), "fc2");
  got = want;
  got.param_grad[1] = 99;
  d = rp::first_difference(got, want, kLayers, kParams, true);
  EXPECT_EQ(d.phase(), Phase::kGrad);
  EXPECT_EQ(d.layer(), "fc1");  // the parameter's module
  EXPECT_EQ(d.describe(), "first in the gradient of parameter 'fc1.bias'");
  got.input_fp = 21;  // the input comes before everything
  d = rp::first_difference(got, want, kLayers, kParams, true);
  EXPECT_EQ(d.phase(), Phase::kData);
  EXPECT_EQ(d.layer(), "");
}

TEST(Compare, WithoutLayersOnlyTheLeafAndTheLossCount) {
  const ShardResult want = result();
  ShardResult got = want;
  got.fwd[0] = 99;
  EXPECT_FALSE(rp::first_difference(got, want, kLayers, kParams, /*compare_layers=*/false));
  EXPECT_FALSE(rp::same_result(got, want));  // but the results are not the same
  got = want;
  got.grad_fp = 11;
  auto d = rp::first_difference(got, want, kLayers, kParams, false);
  EXPECT_EQ(d.where, rp::ShardWhere::kLeaf);
  EXPECT_EQ(d.phase(), Phase::kGrad);
  got = want;
  got.loss = std::numeric_limits<float>::quiet_NaN();
  d = rp::first_difference(got, want, kLayers, kParams, false);
  EXPECT_EQ(d.where, rp::ShardWhere::kLoss);
  EXPECT_NE(d.describe().find("recorded 0.5 (0x3f000000)"), std::string::npos) << d.describe();
  // -0 and +0 compare equal as floats, not as bits.
  EXPECT_FALSE(rp::same_bits(0.0f, -0.0f));
  EXPECT_TRUE(rp::same_bits(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::quiet_NaN()));
}

TEST(Compare, AnUpdateAgainstItsRecord) {
  StepResult got;
  got.loss = 1.0f;
  got.grad_fp = 5;
  got.param_fps = {1, 2, 3};
  culprit::trace::StepRow want;
  want.loss = 1.0f;
  want.grad_fp = 5;
  want.param_fps = {1, 2, 3};
  EXPECT_FALSE(rp::update_difference(got, want, kParams));
  got.param_fps[2] = 9;
  auto d = rp::update_difference(got, want, kParams);
  EXPECT_EQ(d.where, rp::UpdateWhere::kParameter);
  EXPECT_EQ(d.param, "fc2.weight");
  EXPECT_EQ(d.describe(), "parameter 'fc2.weight' differs after the update");
  got.grad_fp = 6;  // the reduced gradient comes first
  EXPECT_EQ(rp::update_difference(got, want, kParams).where, rp::UpdateWhere::kReducedGradient);
}
