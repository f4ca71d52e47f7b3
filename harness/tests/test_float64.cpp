// The float64 recomputations the bisection's arbiter uses (harness/train/trainer_float64.cpp), on a real
// trained run under real mpirun: they leave the replay engine's state bitwise as it was, they agree
// with float32 to within rounding, and the measure tells one micro-shard's gradient from another's.
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_gtest.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "culprit/checkpoint.h"
#include "culprit/engine.h"
#include "culprit/harness.h"
#include "culprit/train.h"

using namespace culprit;

namespace {

// ||a - b|| / ||b|| over the first n elements.
template <class A>
double rel(const std::vector<A>& a, const std::vector<double>& b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

bool bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The model under test: the program's argument (one model per process, so that each process trains
// once, as culprit does).
const char* g_model = "mlp";

// One run trained in-process for the whole suite; every test opens its own engine on it.
class Float64 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    comm_ = Comm::world();
    char buf[64] = "/tmp/culprit-float64-XXXXXX";
    int made = comm_.rank != 0 || mkdtemp(buf) != nullptr;
    MPI_Bcast(&made, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!made) return;
    dir_ = buf;
    harness::TrainConfig cfg;
    bool help = false;
    // AdamW: the update's float64 recomputation loads a state with a step counter and two moments.
    trained_ = harness::parse_train_options({"--run-dir", dir_ + "/run", "--model", g_model, "--steps", "3",
                                             "--checkpoint-every", "1", "--samples", "64", "--global-batch", "16",
                                             "--micro-shards", "4", "--optimizer", "adamw", "--quiet"},
                                            &cfg, &help)
                   .ok() &&
               harness::train(cfg, comm_).ok() && harness::load_run_config(dir_ + "/run", &cfg_).ok();
  }
  static void TearDownTestSuite() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (comm_.rank == 0 && !dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }
  void SetUp() override {
    ASSERT_TRUE(trained_) << "training the " << g_model << " run in " << dir_ << " failed";
    ASSERT_TRUE(ckpt::find_valid(comm_, dir_ + "/run", 2, ckpt::Pick::kNewest, &start_, &path_).ok());  // step 1
    ASSERT_TRUE(harness::Engine::open(cfg_, comm_, start_, path_, /*layer_trace=*/true, &engine_).ok());
  }
  static Comm comm_;
  static std::string dir_;
  static bool trained_;
  static harness::TrainConfig cfg_;
  ckpt::Checkpoint start_;
  std::string path_;
  std::unique_ptr<harness::Engine> engine_;
};
Comm Float64::comm_;
std::string Float64::dir_;
bool Float64::trained_ = false;
harness::TrainConfig Float64::cfg_;

TEST_F(Float64, AMicroShardInFloat64LeavesTheStateAndAgreesWithinRounding) {
  harness::ShardResult before, after, other;
  ASSERT_TRUE(engine_->compute_shard(1, 0, &before).ok());
  std::vector<double> wide;
  ASSERT_TRUE(engine_->compute_shard_f64(1, 0, &wide).ok());
  ASSERT_EQ(wide.size(), before.grad.size() + 1);  // the gradient, then the loss
  ASSERT_TRUE(engine_->compute_shard(1, 0, &after).ok());
  // The float32 computation after it is bitwise the one before: parameters, gradients and buffers
  // came back as they were.
  EXPECT_TRUE(bitwise(before.grad, after.grad));
  EXPECT_EQ(before.fwd, after.fwd);
  EXPECT_EQ(before.bwd, after.bwd);
  // Within float32 rounding of float64, and not equal to it (a different computation).
  const double d = rel(before.grad, wide, before.grad.size());
  EXPECT_LT(d, 1e-5);
  EXPECT_GT(d, 0.0);
  EXPECT_NEAR(before.loss, wide.back(), 1e-5 * std::abs(wide.back()));
  // The negative control: another micro-shard's gradient is far from this one's float64 result.
  ASSERT_TRUE(engine_->compute_shard(2, 0, &other).ok());
  EXPECT_GT(rel(other.grad, wide, other.grad.size()), 1e-2);
  // The whole step afterwards is bitwise a fresh engine's: every parameter is still its view of the
  // flat buffer the reduction and the optimizer write (a detached one would keep its old value).
  harness::StepResult stepped, fresh_step;
  ASSERT_TRUE(engine_->run_step(&stepped).ok());
  std::unique_ptr<harness::Engine> fresh;
  ASSERT_TRUE(harness::Engine::open(cfg_, comm_, start_, "fresh", /*layer_trace=*/true, &fresh).ok());
  ASSERT_TRUE(fresh->run_step(&fresh_step).ok());
  EXPECT_EQ(stepped.grad_fp, fresh_step.grad_fp);
  EXPECT_EQ(stepped.param_fps, fresh_step.param_fps);
  EXPECT_EQ(stepped.opt_fps, fresh_step.opt_fps);
}

TEST_F(Float64, TheUpdateInFloat64AgreesWithinRoundingAndTouchesNothing) {
  ASSERT_TRUE(engine_->mark().ok());
  harness::StepResult first, again;
  ASSERT_TRUE(engine_->run_step(&first).ok());
  std::vector<float> now;
  std::vector<double> wide;
  ASSERT_TRUE(engine_->update_f64(&now, &wide).ok());
  ASSERT_EQ(now.size(), wide.size());
  const std::size_t P = now.size() / 2;
  EXPECT_LT(rel(now, wide, P), 1e-5);  // the parameters
  std::vector<float> moment(now.begin() + P, now.end());
  std::vector<double> wide_moment(wide.begin() + P, wide.end());
  EXPECT_LT(rel(moment, wide_moment, P), 1e-5);  // AdamW's first moment
  // Rewound to the mark, the same recomputation gives the same float64 bits, and the float32 state
  // before the step (the negative control) is far from it: the measure tells a step from none.
  ASSERT_TRUE(engine_->rewind().ok());
  std::vector<float> pre;
  std::vector<double> wide_again;
  ASSERT_TRUE(engine_->update_f64(&pre, &wide_again).ok());
  EXPECT_EQ(std::memcmp(wide.data(), wide_again.data(), wide.size() * sizeof(double)), 0);
  EXPECT_GT(rel(pre, wide, P), 100 * rel(now, wide, P));
  // The step replayed again from the mark gives the same state: the live state was not touched.
  ASSERT_TRUE(engine_->run_step(&again).ok());
  EXPECT_EQ(first.param_fps, again.param_fps);
  EXPECT_EQ(first.opt_fps, again.opt_fps);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Every built-in model is one ctest entry: the GPT's token inputs stay integers, its causal mask
  // and positions are made inside forward; the CNN has pooling between its layers.
  if (argc > 1) g_model = argv[1];
  return culprit::testing::run_on_every_rank();
}
