#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "culprit/harness.h"

using culprit::harness::parse_train_options;
using culprit::harness::TrainConfig;
using culprit::harness::validate;

TEST(Config, DefaultsAndCommandLine) {
  TrainConfig c;
  bool help = false;
  ASSERT_TRUE(parse_train_options({"--run-dir", "r", "--steps", "7", "--betas", "0.8,0.95"}, &c, &help).ok());
  EXPECT_FALSE(help);
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.micro_shards, 8);
  EXPECT_DOUBLE_EQ(c.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.beta2, 0.95);
  EXPECT_TRUE(validate(c, 4).ok());
}

TEST(Config, IniFileLosesToTheCommandLine) {
  const std::string path = testing::TempDir() + "culprit_config_test.ini";
  {
    std::ofstream f(path);
    f << "steps = 11\nseed = 5\nmodel = gpt\nnesterov = true\n";
  }
  TrainConfig c;
  bool help = false;
  auto st = parse_train_options({"--config", path, "--run-dir", "r", "--seed", "9"}, &c, &help);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(c.steps, 11);
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(c.model, "gpt");
  EXPECT_TRUE(c.nesterov);
  // The resolved configuration reads back to the same values.
  std::ofstream(path) << culprit::harness::to_ini(c);
  TrainConfig d;
  ASSERT_TRUE(parse_train_options({"--config", path}, &d, &help).ok());
  EXPECT_EQ(culprit::harness::to_ini(d), culprit::harness::to_ini(c));
  std::remove(path.c_str());
}

TEST(Config, ValidationNamesTheProblem) {
  TrainConfig c;
  c.run_dir = "r";
  c.micro_shards = 6;
  EXPECT_NE(validate(c, 1).message().find("power of two"), std::string::npos);
  c.micro_shards = 4;
  EXPECT_NE(validate(c, 5).message().find("world size 5 exceeds --micro-shards 4"), std::string::npos);
  c.global_batch = 30;
  EXPECT_NE(validate(c, 1).message().find("not divisible"), std::string::npos);
}

TEST(LearningRate, WarmupThenCosine) {
  TrainConfig c;
  c.lr = 1.0;
  c.steps = 10;
  c.warmup_steps = 2;
  c.lr_schedule = "cosine";
  EXPECT_DOUBLE_EQ(culprit::harness::learning_rate(c, 1), 0.5);
  EXPECT_DOUBLE_EQ(culprit::harness::learning_rate(c, 2), 1.0);
  EXPECT_NEAR(culprit::harness::learning_rate(c, 6), 0.5, 1e-12);
  EXPECT_NEAR(culprit::harness::learning_rate(c, 10), 0.0, 1e-12);
}
