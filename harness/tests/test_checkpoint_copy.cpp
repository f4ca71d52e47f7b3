// The checkpoint pipeline's copy of the state (harness/train/checkpoint_pipeline.cpp), on real runs
// under real mpirun: the copy runs on the I/O thread while the next step's forward and backward
// passes run, and the next optimizer step waits for it (the fence). Made slow through the Env seam
// (culprit/env.h), the copy is still of the checkpointed step: the files equal a run's with
// synchronous checkpoints, and the cost log shows that training did wait.
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_gtest.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "culprit/checkpoint.h"
#include "culprit/checkpoint_tools.h"
#include "culprit/env.h"
#include "culprit/harness.h"
#include "culprit/train.h"

using namespace culprit;

namespace {

// Every copy of the state starts 300 ms late: the step after a checkpoint reaches its optimizer
// step long before the copy is done.
class SlowCopy : public EnvWrapper {
 public:
  SlowCopy() : EnvWrapper(Env::Default()) {}
  void copy_state(const std::function<void()>& copy) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ++copies;
    target()->copy_state(copy);
  }
  std::atomic<int> copies{0};
};

class CheckpointCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = Comm::world();
    char buf[64] = "/tmp/culprit-copy-XXXXXX";
    int made = comm_.rank != 0 || mkdtemp(buf) != nullptr;
    MPI_Bcast(&made, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    ASSERT_TRUE(made);
    dir_ = buf;
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (comm_.rank == 0 && !dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }
  // cnn, 10 steps on this world, a checkpoint every 5.
  Status train(const std::string& name, std::vector<std::string> extra, Env* env = Env::Default()) {
    std::vector<std::string> args = {"--run-dir", dir_ + "/" + name, "--model", "cnn", "--steps", "10",
                                     "--global-batch", "32", "--micro-shards", "4", "--samples", "160",
                                     "--checkpoint-every", "5", "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    harness::TrainConfig cfg;
    bool help = false;
    CULPRIT_RETURN_IF_ERROR(harness::parse_train_options(args, &cfg, &help));
    return harness::train(cfg, comm_, env);
  }
  // Whether two runs' checkpoints of these steps hold the same state bitwise (`culprit diff`).
  bool identical(const std::string& a, std::int64_t sa, const std::string& b, std::int64_t sb) {
    std::string report;
    bool same = false;
    const Status st = ckpt::diff(ckpt::path_for(dir_ + "/" + a, sa), ckpt::path_for(dir_ + "/" + b, sb), &report, &same);
    EXPECT_TRUE(st.ok()) << st.message();
    return same;
  }
  // The run's checkpoints.jsonl, one object a checkpoint.
  std::vector<nlohmann::json> cost_log(const std::string& name) {
    std::vector<nlohmann::json> out;
    std::ifstream f(dir_ + "/" + name + "/checkpoints.jsonl");
    for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  Comm comm_;
  std::string dir_;
};

TEST_F(CheckpointCopy, SlowCopyIsOfTheCheckpointedStep) {
  ASSERT_TRUE(train("sync", {"--async-checkpoint", "false"}).ok());
  SlowCopy slow;
  const Status st = train("slow", {}, &slow);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(slow.copies.load(), 3);  // steps 0, 5 and 10: the seam was the one the pipeline used
  for (std::int64_t step : {0, 5, 10})
    EXPECT_TRUE(identical("sync", step, "slow", step)) << "checkpoint of step " << step;
  if (comm_.rank == 0) {
    const auto log = cost_log("slow");
    ASSERT_EQ(log.size(), 3u);
    EXPECT_EQ(log[1]["step"], 5);
    EXPECT_TRUE(log[1]["async"].get<bool>());
    // Step 6's optimizer step waited for the copy of step 5's state.
    EXPECT_GT(log[1]["fence_seconds"].get<double>(), 0.1) << log[1].dump();
    EXPECT_GE(log[1]["stall_seconds"].get<double>(), log[1]["fence_seconds"].get<double>());
    EXPECT_LT(cost_log("sync")[1]["fence_seconds"].get<double>(), 0.1);  // nothing to wait for
  }
  // Negative control: the checkpoints of consecutive intervals differ, so equality above says something.
  EXPECT_FALSE(identical("sync", 5, "slow", 10));
}

}  // namespace

int main(int argc, char** argv) {
  // As culprit's own main: the I/O thread calls MPI while training does (with less, every
  // checkpoint would be synchronous and there would be no copy to wait for).
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "test_checkpoint_copy: MPI provides no MPI_THREAD_MULTIPLE\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return culprit::testing::run_on_every_rank();
}
