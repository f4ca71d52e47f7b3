// The option table (culprit/options.h) and `culprit train`'s options declared in it: parsing,
// --config INI files, help, INI text, validation, the determinism-critical list, --resume.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "culprit/harness.h"
#include "culprit/options.h"

using culprit::Status;
using culprit::harness::parse_train_options;
using culprit::harness::TrainConfig;
using culprit::harness::validate;
namespace opts = culprit::opts;
namespace fs = std::filesystem;

namespace {

enum class Colour { kRed, kBlue };
constexpr culprit::NameRow<Colour> kColourNames[] = {{Colour::kRed, "red"}, {Colour::kBlue, "blue"}};
constexpr culprit::NameTable<Colour> enum_names(Colour) { return {kColourNames, 2, "colour"}; }

struct Toy {
  int count = 3;
  double rate = 0.5;
  bool loud = false;
  Colour colour = Colour::kRed;
  std::vector<std::string> tags;
  std::string name;
  std::pair<int, int> pair{1, 2};
};

const opts::Table<Toy>& toy() {
  static const opts::Table<Toy> t("toy options", {
      opts::number<Toy>("count", &Toy::count, "how many", opts::Range<int>{1, 10}, opts::kCritical),
      opts::number<Toy>("rate", &Toy::rate, "how fast", opts::Range<double>::at_least(0)),
      opts::flag<Toy>("loud", &Toy::loud, "shout"),
      opts::choice<Toy>("colour", &Toy::colour, "red | blue", opts::kCritical),
      opts::texts<Toy>("tag", &Toy::tags, "repeatable"),
      opts::text<Toy>("name", &Toy::name, "not recorded", opts::kNotRecorded),
      opts::custom<Toy>("pair", "a,b",
                        [](Toy* t, const std::string& s) {
                          int a = 0, b = 0;
                          if (std::sscanf(s.c_str(), "%d,%d", &a, &b) != 2) return Status::BadInput("option '--pair': not a,b");
                          t->pair = {a, b};
                          return Status::OK();
                        },
                        [](const Toy& t) { return std::to_string(t.pair.first) + "," + std::to_string(t.pair.second); }),
  });
  return t;
}

std::string temp(const std::string& name) { return testing::TempDir() + "culprit_options_" + name; }

}  // namespace

TEST(OptionTable, ParsesEveryShapeAndKeepsDefaults) {
  Toy t;
  opts::Parsed p;
  ASSERT_TRUE(toy().parse({"--count", "7", "--loud", "--colour", "blue", "--tag", "a", "--tag=b", "--pair", "4,5"}, &t, &p).ok());
  EXPECT_FALSE(p.help);
  EXPECT_EQ(t.count, 7);
  EXPECT_DOUBLE_EQ(t.rate, 0.5);  // not given: the default
  EXPECT_TRUE(t.loud);
  EXPECT_EQ(t.colour, Colour::kBlue);
  EXPECT_EQ(t.tags, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(t.pair, (std::pair<int, int>{4, 5}));
  EXPECT_EQ(p.given, (std::vector<std::string>{"count", "loud", "colour", "tag", "pair"}));
  ASSERT_TRUE(toy().parse({"--loud", "false"}, &t).ok());
  EXPECT_FALSE(t.loud);
  ASSERT_TRUE(toy().parse({"--help"}, &t, &p).ok());
  EXPECT_TRUE(p.help);
}

TEST(OptionTable, BadValuesNameTheOptionAndWhatIsValid) {
  Toy t;
  auto msg = [&](std::vector<std::string> args) { return toy().parse(args, &t).message(); };
  EXPECT_EQ(msg({"--count", "0"}), "option '--count' must be in [1, 10], got 0");
  EXPECT_EQ(msg({"--count", "x"}), "option '--count': 'x' is not an integer; it must be in [1, 10]");
  EXPECT_EQ(msg({"--count", "99999999999"}), "option '--count' must be in [1, 10], got 99999999999");
  EXPECT_EQ(msg({"--count", "99999999999999999999"}),
            "option '--count': 99999999999999999999 is out of range; it must be in [1, 10]");
  EXPECT_EQ(msg({"--rate", "-1"}), "option '--rate' must be a finite number at least 0, got -1");
  EXPECT_EQ(msg({"--rate", "nan"}), "option '--rate' must be a finite number at least 0, got nan");
  EXPECT_EQ(msg({"--rate", "inf"}), "option '--rate' must be a finite number at least 0, got inf");
  EXPECT_EQ(msg({"--colour", "green"}), "option '--colour': unknown colour 'green' (valid: red, blue)");
  EXPECT_EQ(msg({"--loud", "maybe"}), "option '--loud': 'maybe' is not true or false");
  EXPECT_NE(msg({"--bogus"}).find("unrecognised option '--bogus'"), std::string::npos);
  EXPECT_EQ(toy().parse({"--count", "0"}, &t).code(), culprit::StatusCode::kBadInput);
}

TEST(OptionTable, ConfigFileLosesToTheCommandLineAndIsChecked) {
  const std::string path = temp("toy.ini");
  std::ofstream(path) << "count = 9\nrate = 2\ntag = x\n";
  Toy t;
  ASSERT_TRUE(toy().parse({"--config", path, "--count", "4"}, &t).ok());
  EXPECT_EQ(t.count, 4);
  EXPECT_DOUBLE_EQ(t.rate, 2);
  EXPECT_EQ(t.tags, std::vector<std::string>{"x"});
  std::ofstream(path) << "count = 11\n";
  EXPECT_EQ(toy().parse({"--config", path}, &t).message(), "option '--count' must be in [1, 10], got 11");
  std::ofstream(path) << "nope = 1\n";
  EXPECT_NE(toy().parse({"--config", path}, &t).message().find("nope"), std::string::npos);
  EXPECT_NE(toy().parse({"--config", testing::TempDir()}, &t).message().find("is a directory"), std::string::npos);
  // Regular files only (test_bounds.cpp: devices, fifos, links), and at most 1 MiB.
  EXPECT_NE(toy().parse({"--config", temp("missing.ini")}, &t).message().find("does not exist"), std::string::npos);
  {
    std::ofstream big(path);
    big << std::string((1 << 20) + 10, '#');
  }
  EXPECT_NE(toy().parse({"--config", path}, &t).message().find("more than the 1048576 bytes"), std::string::npos);
  std::remove(path.c_str());
}

TEST(OptionTable, HelpIniValidationAndTheCriticalList) {
  Toy t;
  t.count = 5;
  t.colour = Colour::kBlue;
  t.tags = {"p", "q"};
  t.name = "secret";
  const std::string ini = toy().to_ini(t);
  EXPECT_EQ(ini, "count = 5\nrate = 0.5\nloud = false\ncolour = blue\ntag = p\ntag = q\npair = 1,2\n");  // no name
  Toy back;
  ASSERT_TRUE(toy().parse_ini(ini, &back, false).ok());
  EXPECT_EQ(toy().to_ini(back), ini);
  EXPECT_EQ(toy().critical(), (std::vector<std::string>{"count", "colour"}));
  const std::string help = toy().help();
  for (const char* s : {"--count", "(=3)", "--rate", "(=0.5)", "--colour", "(=red)", "--tag", "--config", "--help"})
    EXPECT_NE(help.find(s), std::string::npos) << s << "\n" << help;
  t.count = 42;  // set in code, not parsed: validate() applies the same checks
  EXPECT_EQ(toy().validate(t).message(), "option '--count' must be in [1, 10], got 42");
  EXPECT_EQ(toy().value_text(t, "tag"), "p,q");
}

TEST(OptionTable, PositionalArgumentsBesideSwitches) {
  struct Files {
    std::vector<std::string> paths;
    bool json = false;
  };
  const opts::Table<Files> t("files", {opts::texts<Files>("paths", &Files::paths, "files", opts::kPositional),
                                       opts::flag<Files>("json", &Files::json, "print JSON")},
                             /*config=*/false);
  Files f;
  ASSERT_TRUE(t.parse({"--json", "a.h5", "b.h5"}, &f).ok());
  EXPECT_TRUE(f.json);  // the switch does not swallow the file after it
  EXPECT_EQ(f.paths, (std::vector<std::string>{"a.h5", "b.h5"}));
  ASSERT_TRUE(t.parse({"a.h5"}, &f).ok());
  EXPECT_FALSE(f.json);
  EXPECT_EQ(t.help().find("--paths"), std::string::npos);  // shown by the usage line, not as an option
}

TEST(Config, DefaultsAndCommandLine) {
  TrainConfig c;
  bool help = false;
  ASSERT_TRUE(parse_train_options({"--run-dir", "r", "--steps", "7", "--betas", "0.8,0.95"}, &c, &help).ok());
  EXPECT_FALSE(help);
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.micro_shards, 8);
  EXPECT_DOUBLE_EQ(c.optim.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
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
  EXPECT_EQ(c.model.kind, culprit::harness::ModelKind::kGpt);
  EXPECT_TRUE(c.optim.nesterov);
  // The resolved configuration reads back to the same values.
  std::ofstream(path) << culprit::harness::to_ini(c);
  TrainConfig d;
  ASSERT_TRUE(parse_train_options({"--config", path}, &d, &help).ok());
  EXPECT_EQ(culprit::harness::to_ini(d), culprit::harness::to_ini(c));
  std::remove(path.c_str());
}

TEST(Config, EveryRecordedOptionRoundTripsThroughIni) {
  TrainConfig c;
  bool help = false;
  ASSERT_TRUE(parse_train_options({"--run-dir", "r", "--model", "torchscript:/m.pt", "--data", "hdf5:/d.h5", "--trace",
                                   "layer", "--optimizer", "adamw", "--lr", "0.003", "--betas", "0.8,0.95",
                                   "--sample-shape", "1,16,16", "--on-detect", "diagnose", "--inject", "step=1,rank=0,phase=data",
                                   "--inject", "step=2,rank=1,phase=lr,kind=stale", "--lr-schedule", "cosine", "--quiet"},
                                  &c, &help)
                  .ok());
  const auto& table = culprit::harness::train_options();
  TrainConfig d;
  ASSERT_TRUE(table.parse_ini(table.to_ini(c), &d, false).ok());
  EXPECT_EQ(table.to_ini(d), table.to_ini(c));
  EXPECT_EQ(d.model.path, "/m.pt");
  EXPECT_EQ(d.data.path, "/d.h5");
  EXPECT_EQ(d.inject.size(), 2u);
  EXPECT_DOUBLE_EQ(d.optim.lr, 0.003);
  EXPECT_FALSE(d.quiet);  // not recorded: an invocation's, not the run's
  // Every option is in the help; the critical ones are those that fix a run's results.
  const std::string help_text = table.help();
  for (const auto& o : table.options()) EXPECT_NE(help_text.find("--" + o.name), std::string::npos) << o.name;
  EXPECT_EQ(table.critical(), (std::vector<std::string>{"trace", "global-batch", "micro-shards", "seed", "model", "script-fingerprint", "data",
                                                        "token-dtype", "shuffle", "tp-chunks", "hidden", "samples", "sample-shape", "classes", "layers", "width",
                                                        "heads", "seq-len", "vocab", "tie-head", "init", "precision", "optimizer",
                                                        "script-optimizer", "optimizer-state",
                                                        "lr", "momentum", "nesterov", "weight-decay", "weight-decay-params",
                                                        "clip-grad-norm", "betas", "eps", "lr-schedule", "min-lr", "warmup-steps",
                                                        "threads"}));
}

TEST(Config, ResumeTakesTheRunsConfigurationAndKeepsTheCriticalOptions) {
  const fs::path dir = fs::path(testing::TempDir()) / "culprit_resume_config";
  fs::remove_all(dir);
  fs::create_directories(dir);
  TrainConfig orig;
  bool help = false;
  ASSERT_TRUE(parse_train_options({"--run-dir", dir.string(), "--seed", "77", "--steps", "10", "--inject",
                                   "step=3,rank=0,phase=data"},
                                  &orig, &help)
                  .ok());
  std::ofstream(dir / "run.json") << nlohmann::json{{"config", culprit::harness::to_ini(orig)}}.dump();
  TrainConfig c;
  ASSERT_TRUE(parse_train_options({"--run-dir", dir.string(), "--resume", "--steps", "20"}, &c, &help).ok());
  EXPECT_EQ(c.seed, 77u);      // the run's
  EXPECT_EQ(c.steps, 20);      // given now
  EXPECT_TRUE(c.inject.empty());  // faults belong to the invocation that named them
  EXPECT_TRUE(c.resume);
  const Status st = parse_train_options({"--run-dir", dir.string(), "--resume", "--seed", "78"}, &c, &help);
  EXPECT_EQ(st.message(), "option '--seed' is 78 but the run in '" + dir.string() + "' was trained with 77; a resumed "
                          "run must keep it");
  EXPECT_TRUE(parse_train_options({"--run-dir", dir.string(), "--resume", "--seed", "77"}, &c, &help).ok());
  EXPECT_NE(parse_train_options({"--run-dir", (dir / "none").string(), "--resume"}, &c, &help).message().find(
                "cannot resume: '" + (dir / "none").string() + "' holds no run (no run.json)"),
            std::string::npos);
  fs::remove_all(dir);
}

// A run recorded before the recipe options: weight decay on every parameter, and a gpt's --classes
// and --sample-shape as its vocabulary and sequence length (what they meant then).
TEST(Config, RunsFromBeforeTheRecipeOptionsKeepTheirMeaning) {
  const fs::path dir = fs::path(testing::TempDir()) / "culprit_old_config";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string old_ini = "model = gpt\noptimizer = adamw\nweight-decay = 0.1\nclasses = 40\nsample-shape = 12\n";
  std::ofstream(dir / "run.json") << nlohmann::json{{"config", old_ini}}.dump();
  TrainConfig c;
  bool help = false;
  ASSERT_TRUE(parse_train_options({"--run-dir", dir.string(), "--resume"}, &c, &help).ok());
  EXPECT_EQ(c.optim.decay_params, culprit::harness::DecayParams::kAll);
  EXPECT_FALSE(c.optim.decay_matrices_only());
  EXPECT_EQ(c.gpt.vocab, 40);
  EXPECT_EQ(c.gpt.seq_len, 12);
  EXPECT_EQ(c.classes, 0);
  EXPECT_TRUE(c.sample_shape.empty());
  EXPECT_TRUE(validate(c, 1).ok()) << validate(c, 1).message();
  // A job script resubmitting the run repeats the options it started with.
  TrainConfig given;
  ASSERT_TRUE(parse_train_options({"--run-dir", dir.string(), "--resume", "--classes", "40", "--sample-shape", "12"},
                                  &given, &help)
                  .ok());
  EXPECT_EQ(culprit::harness::to_ini(given), culprit::harness::to_ini(c));
  TrainConfig r;
  ASSERT_TRUE(culprit::harness::load_run_config(dir.string(), &r).ok());  // replays read it the same way
  EXPECT_EQ(culprit::harness::to_ini(r), culprit::harness::to_ini(c));
  // A run recorded with the options keeps what it recorded.
  std::ofstream(dir / "run.json") << nlohmann::json{{"config", culprit::harness::to_ini(c)}}.dump();
  TrainConfig again;
  ASSERT_TRUE(parse_train_options({"--run-dir", dir.string(), "--resume"}, &again, &help).ok());
  EXPECT_EQ(culprit::harness::to_ini(again), culprit::harness::to_ini(c));
  fs::remove_all(dir);
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
  c.global_batch = 32;
  c.detect.spot_check = 2;  // the option's own range, for a configuration built in code
  EXPECT_EQ(validate(c, 1).message(), "option '--spot-check' must be a finite number in [0, 1], got 2");
  c.detect.spot_check = 0;
  c.trace = culprit::harness::TraceLevel::kOff;
  c.detect.on_detect = culprit::harness::OnDetect::kDiagnose;
  EXPECT_NE(validate(c, 1).message().find("needs the trace"), std::string::npos);
}

// The options of the training recipe (gpt's shape, precision, clipping, weight decay): one line each.
TEST(Config, RecipeOptionsNameTheProblem) {
  auto msg = [](std::vector<std::string> a) {
    TrainConfig c;
    bool help = false;
    a.insert(a.begin(), {"--run-dir", "r"});
    Status st = parse_train_options(a, &c, &help);
    return st.ok() ? validate(c, 1).message() : st.message();
  };
  EXPECT_EQ(msg({"--model", "gpt", "--width", "48", "--heads", "5"}),
            "option '--heads' 5 does not divide --width 48: every head gets width / heads dimensions");
  EXPECT_EQ(msg({"--model", "mlp", "--layers", "4"}), "option '--layers' applies to --model gpt, not mlp");
  EXPECT_EQ(msg({"--model", "cnn", "--tie-head"}), "option '--tie-head' applies to --model gpt, not cnn");
  EXPECT_EQ(msg({"--model", "mlp", "--init", "gpt2"}), "option '--init' applies to --model gpt, not mlp");
  EXPECT_EQ(msg({"--model", "gpt", "--classes", "40"}),
            "option '--classes' is the output width of a classifier; gpt's is its vocabulary: --vocab 40");
  EXPECT_EQ(msg({"--model", "gpt", "--sample-shape", "8"}),
            "option '--sample-shape' does not apply to --model gpt: its samples are --seq-len tokens");
  EXPECT_EQ(msg({"--clip-grad-norm", "-1"}), "option '--clip-grad-norm' must be a finite number in [0, 1000000000000], got -1");
  EXPECT_EQ(msg({"--precision", "fp8"}), "option '--precision': unknown precision 'fp8' (valid: fp32, bf16)");
  EXPECT_EQ(msg({"--weight-decay-params", "some"}),
            "option '--weight-decay-params': unknown parameter set 'some' (valid: auto, matrices, all, ndim2)");
  EXPECT_EQ(msg({"--min-lr", "0.01"}), "option '--min-lr' is the floor of --lr-schedule cosine: give that schedule too");
  EXPECT_EQ(msg({"--lr-schedule", "cosine", "--lr", "0.01", "--min-lr", "0.1"}),
            "option '--min-lr' exceeds --lr (a Python run's: its optimizer's first group's rate): the cosine decays from --lr down to --min-lr");
  EXPECT_EQ(msg({"--optimizer", "script"}),
            "option '--optimizer script' is the optimizer object of a Python script: it comes with "
            "--model python:SCRIPT:FUNCTION (the Python package sets both, docs/python.md)");
  EXPECT_EQ(msg({"--model", "gpt", "--layers", "12", "--width", "96", "--heads", "12", "--seq-len", "64", "--vocab",
                 "500", "--tie-head", "--precision", "bf16", "--clip-grad-norm", "1", "--samples", "64"}),
            "");
  EXPECT_EQ(msg({"--model", "cnn", "--hidden", "128"}), "option '--hidden' applies to --model mlp, not cnn");
  TrainConfig c;
  EXPECT_FALSE(c.optim.decay_matrices_only());  // sgd: every parameter
  c.optim.kind = culprit::harness::OptimizerKind::kAdamW;
  EXPECT_TRUE(c.optim.decay_matrices_only());
  c.optim.decay_params = culprit::harness::DecayParams::kAll;
  EXPECT_FALSE(c.optim.decay_matrices_only());
}

TEST(Config, ModelAndDataSources) {
  TrainConfig c;
  bool help = false;
  auto msg = [&](std::vector<std::string> a) { return parse_train_options(a, &c, &help).message(); };
  EXPECT_EQ(msg({"--model", "resnet"}), "option '--model': unknown model 'resnet' (valid: mlp, cnn, gpt, torchscript:PATH, python:SCRIPT:FUNCTION)");
  EXPECT_EQ(msg({"--model", "torchscript"}), "option '--model': unknown model 'torchscript' (valid: mlp, cnn, gpt, torchscript:PATH, python:SCRIPT:FUNCTION)");
  EXPECT_EQ(msg({"--model", "torchscript:"}), "option '--model': torchscript: needs a path");
  EXPECT_EQ(msg({"--data", "csv:x"}), "option '--data': unknown data source 'csv:x' (valid: synthetic, hdf5:PATH, tokens:PATH, python)");
  EXPECT_EQ(msg({"--data", "hdf5:"}), "option '--data': hdf5: needs a path");
  // A Python model (set by the package): SCRIPT:FUNCTION, split at the last colon.
  EXPECT_EQ(msg({"--model", "python:train.py"}), "option '--model': 'python:train.py' is not python:SCRIPT:FUNCTION");
  EXPECT_EQ(msg({"--model", "python:train.py:"}), "option '--model': 'python:train.py:' is not python:SCRIPT:FUNCTION");
  EXPECT_EQ(msg({"--model", "python"}), "option '--model': unknown model 'python' (valid: mlp, cnn, gpt, torchscript:PATH, python:SCRIPT:FUNCTION)");
  ASSERT_TRUE(parse_train_options({"--run-dir", "r", "--model", "python:/a:b/t.py:build", "--data", "python"}, &c, &help).ok());
  EXPECT_EQ(c.model.path, "/a:b/t.py:build");
  EXPECT_EQ(c.model.text(), "python:/a:b/t.py:build");
  EXPECT_EQ(c.data.text(), "python");
  EXPECT_EQ(validate(c, 1).message(), "");
  c.model = culprit::harness::ModelSpec();
  c.script_fingerprint = "0123456789abcdef";
  EXPECT_EQ(validate(c, 1).message(), "option '--script-fingerprint' applies to --model python:SCRIPT:FUNCTION, not mlp");
  EXPECT_EQ(msg({"--sample-shape", "1,0"}),
            "option '--sample-shape': every dimension must be an integer in [1, 16777216], got '1,0'");
  EXPECT_EQ(msg({"--trace", "deep"}), "option '--trace': unknown level 'deep' (valid: off, step, layer)");
}

TEST(LearningRate, WarmupThenCosine) {
  TrainConfig c;
  c.optim.lr = 1.0;
  c.steps = 10;
  c.optim.warmup_steps = 2;
  c.optim.schedule = culprit::harness::LrSchedule::kCosine;
  EXPECT_DOUBLE_EQ(culprit::harness::learning_rate(c, 1), 0.5);
  EXPECT_DOUBLE_EQ(culprit::harness::learning_rate(c, 2), 1.0);
  EXPECT_NEAR(culprit::harness::learning_rate(c, 6), 0.5, 1e-12);
  EXPECT_NEAR(culprit::harness::learning_rate(c, 10), 0.0, 1e-12);
  // --min-lr: the cosine's floor (nanoGPT's min_lr), reached at the last step; halfway it is the mean.
  c.optim.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(culprit::harness::learning_rate(c, 2), 1.0);
  EXPECT_NEAR(culprit::harness::learning_rate(c, 6), 0.55, 1e-12);
  EXPECT_NEAR(culprit::harness::learning_rate(c, 10), 0.1, 1e-12);
}
