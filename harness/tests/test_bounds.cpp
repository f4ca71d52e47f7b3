// Bounds on every number a command takes (culprit/options.h's Range), --config's file checks, and
// the memory estimates that refuse a configuration too large for the machine before it allocates
// (sizes.h) — checked against the models' real parameter counts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "culprit/fault_spec.h"
#include "culprit/harness.h"
#include "culprit/options.h"
#include "culprit/screen.h"
#include "culprit/system.h"
#include "culprit/data.h"
#include "culprit/model.h"
#include "config/sizes.h"

namespace h = culprit::harness;
namespace opts = culprit::opts;
namespace fs = std::filesystem;
using culprit::Status;

namespace {

struct Toy {
  int n = 1;
  double t = 5;
};

const opts::Table<Toy>& toy() {
  static const opts::Table<Toy> table("toy", {
      opts::number<Toy>("n", &Toy::n, "", opts::Range<int>{1, 8}.because("the system reports 8 cores", "[1, cores]")),
      opts::number<Toy>("t", &Toy::t, "", opts::Range<double>{1, 60}.or_zero("wait forever")),
  });
  return table;
}

std::string train_error(std::vector<std::string> args) {
  h::TrainConfig c;
  bool help = false;
  args.insert(args.begin(), {"--run-dir", "r"});
  Status st = h::parse_train_options(args, &c, &help);
  if (st.ok()) st = h::validate(c, 1);
  return st.ok() ? "" : st.message();
}

}  // namespace

TEST(Range, SaysTheRangeWhyAndTheValue) {
  Toy t;
  auto msg = [&](std::vector<std::string> a) { return toy().parse(a, &t).message(); };
  EXPECT_EQ(msg({"--n", "9"}), "option '--n' must be in [1, 8], got 9: the system reports 8 cores");
  EXPECT_EQ(msg({"--n", "x"}), "option '--n': 'x' is not an integer; it must be in [1, 8]: the system reports 8 cores");
  EXPECT_EQ(msg({"--t", "1e-9"}), "option '--t' must be 0 (wait forever) or a finite number in [1, 60], got 1e-09");
  EXPECT_EQ(msg({"--t", "nan"}), "option '--t' must be 0 (wait forever) or a finite number in [1, 60], got nan");
  EXPECT_TRUE(toy().parse({"--t", "0"}, &t).ok());
  EXPECT_TRUE(toy().parse({"--t", "60", "--n", "8"}, &t).ok());
  const auto open = opts::Range<double>::above(0, 1);
  EXPECT_FALSE(open.contains(0));
  EXPECT_TRUE(open.contains(1));
  EXPECT_EQ(open.check("eps", 0).message(), "option '--eps' must be a finite number in (0, 1], got 0");
  // The help says every range, the machine's bound by name (docs/cli.md is the same everywhere).
  const std::string help = toy().help();
  EXPECT_NE(help.find("(range [1, cores])"), std::string::npos) << help;
  EXPECT_NE(help.find("(range 0 or [1, 60])"), std::string::npos) << help;
  EXPECT_EQ(opts::Range<std::uint64_t>{}.help_note(), "");
  EXPECT_EQ(opts::Range<int>::at_least(1).help_note(), " (range >= 1)");
}

TEST(ConfigFile, RegularFilesOnlyAndAtMostOneMebibyte) {
  const fs::path dir = fs::path(testing::TempDir()) / "culprit_bounds_config";
  fs::remove_all(dir);
  fs::create_directories(dir);
  Toy t;
  auto msg = [&](const fs::path& p) { return toy().parse({"--config", p.string()}, &t).message(); };
  std::ofstream(dir / "ok.ini") << "n = 2\n";
  EXPECT_TRUE(toy().parse({"--config", (dir / "ok.ini").string()}, &t).ok());
  EXPECT_EQ(t.n, 2);
  fs::create_symlink(dir / "ok.ini", dir / "link.ini");  // the user's link is followed to the file
  EXPECT_TRUE(toy().parse({"--config", (dir / "link.ini").string()}, &t).ok());
  EXPECT_NE(msg(dir).find("is a directory: --config takes a regular file"), std::string::npos) << msg(dir);
  fs::create_directory_symlink(dir, dir / "dirlink");
  EXPECT_NE(msg(dir / "dirlink").find("is a directory"), std::string::npos);
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_NE(msg(dir / "fifo").find("is a fifo"), std::string::npos);  // refused, not waited on
  EXPECT_NE(msg("/dev/zero").find("is a character device"), std::string::npos);
  EXPECT_NE(msg("/dev/null").find("is a character device"), std::string::npos);
  EXPECT_NE(msg(dir / "missing.ini").find("does not exist"), std::string::npos);
  std::ofstream(dir / "big.ini") << std::string((1 << 20) + 1, '#');
  EXPECT_NE(msg(dir / "big.ini").find("is 1048577 bytes, more than the 1048576"), std::string::npos) << msg(dir / "big.ini");
  fs::remove_all(dir);
}

TEST(TrainBounds, TheReportedFailuresAreOneLine) {
  EXPECT_EQ(train_error({"--threads", "0"}).find("option '--threads' must be in [1, "), 0u);
  const std::string threads = train_error({"--threads", "100000"});
  EXPECT_NE(threads.find("], got 100000: " + culprit::cores_reason()), std::string::npos) << threads;
  EXPECT_EQ(train_error({"--collective-timeout", "1e-9"}),
            "option '--collective-timeout' must be 0 (wait forever) or a finite number in [1, 604800], got 1e-09");
  EXPECT_EQ(train_error({"--collective-timeout", "0"}), "");
  EXPECT_EQ(train_error({"--spike-z", "nan"}), "option '--spike-z' must be a finite number in [0, 1000000], got nan");
  EXPECT_EQ(train_error({"--samples", "999999999999999"}),
            "option '--samples' must be in [1, 1099511627776], got 999999999999999");
  // Within their ranges, but not within the machine: the estimate and the memory in one line.
  for (auto args : std::vector<std::vector<std::string>>{{"--samples", "999999999999"},
                                                         {"--sample-shape", "100000,100000"},
                                                         {"--hidden", "1000000"},
                                                         {"--model", "gpt", "--seq-len", "1000000"},
                                                         {"--model", "gpt", "--layers", "96", "--width", "12288", "--heads", "96"}}) {
    const std::string m = train_error(args);
    EXPECT_NE(m.find(" per rank, more than the "), std::string::npos) << args[1] << ": " << m;
    EXPECT_NE(m.find("of memory the system reports"), std::string::npos) << m;
    EXPECT_NE(m.find(args[args.size() - 2] == "--heads" ? "96 x 12288" : args[args.size() - 2]), std::string::npos) << m;  // names the option
  }
  EXPECT_EQ(train_error({"--hidden", "100000000"}), "option '--hidden' must be in [1, 1048576], got 100000000");
}

TEST(TrainBounds, EveryNumberHasAnUpperBoundAndRefusesNonFinite) {
  for (const char* name : {"checkpoint-every", "keep-last", "keep-every", "checkpoint-writers-per-host", "spike-window",
                           "spike-z", "spike-ratio", "replica-check-every", "spot-check", "collective-timeout", "steps",
                           "global-batch", "micro-shards", "hidden", "samples", "classes", "lr", "momentum",
                           "weight-decay", "eps", "warmup-steps", "threads"}) {
    for (const char* v : {"1e300", "-1e300", "nan", "inf", "99999999999999999999"}) {
      const std::string m = train_error({std::string("--") + name, v});
      EXPECT_NE(m.find("option '--" + std::string(name) + "'"), std::string::npos) << name << " " << v << ": " << m;
      EXPECT_TRUE(m.find(" in [") != std::string::npos || m.find(" in (") != std::string::npos)
          << name << " " << v << ": " << m;  // a closed top: no "at least"
    }
  }
  // The defaults are within every range.
  EXPECT_EQ(train_error({}), "");
  EXPECT_NE(train_error({"--sample-shape", "1,nan"}).find("every dimension must be an integer in [1, 16777216]"),
            std::string::npos);
  EXPECT_NE(train_error({"--sample-shape", "1,1,1,1,1,1,1,1,1"}).find("at most 8 dimensions"), std::string::npos);
}

TEST(ScreenBounds, SecondsSizeAndThreads) {
  h::ScreenOptions s;
  auto msg = [&](std::vector<std::string> a) { return h::screen_options().parse(a, &s).message(); };
  EXPECT_EQ(msg({"--threads", "0"}).find("option '--threads' must be in [1, "), 0u);
  EXPECT_NE(msg({"--threads", "100000"}).find(culprit::cores_reason()), std::string::npos);
  EXPECT_EQ(msg({"--seconds", "nan"}), "option '--seconds' must be a finite number in [0, 604800], got nan");
  EXPECT_EQ(msg({"--size", "0"}), "option '--size' must be in [1, 8192], got 0");
}

TEST(InjectBounds, EveryKeyHasARange) {
  h::FaultSpec f;
  auto msg = [&](const std::string& spec) { return h::parse_fault(spec, {"fc1"}, &f).message(); };
  EXPECT_EQ(msg("step=1e30,phase=data"), "--inject: step must be an integer in [1, 1000000000], got 1e30");
  EXPECT_EQ(msg("step=1,rank=1e30,phase=data"), "--inject: rank must be an integer in [0, 1073741824], got 1e30");
  EXPECT_EQ(msg("step=1,bit=32,phase=grad,layer=fc1"), "--inject: bit must be an integer in [0, 31], got 32");
  EXPECT_EQ(msg("step=1,p=2,phase=data"), "--inject: p must be a number in [0, 1], got 2");
  EXPECT_EQ(msg("step=1,seconds=1e9,phase=data"), "--inject: seconds must be a number in [0, 86400], got 1e9");
  // Decimal numbers only (std::stod would take nan, inf and hex): nan is refused as such.
  EXPECT_EQ(msg("step=1,factor=nan,phase=data"), "--inject: factor=nan is not a decimal number");
  EXPECT_EQ(msg("step=1,factor=1e999,phase=data"), "--inject: factor=1e999 is not a finite number");
  EXPECT_EQ(msg("step=0x3,phase=data"), "--inject: step=0x3 is not a decimal number");
  EXPECT_EQ(msg("step=3,phase=data,"), "--inject: 'step=3,phase=data,' has an empty item (a leading, trailing or doubled comma)");
  EXPECT_EQ(msg("step=3,step=4,phase=data"), "--inject: key 'step' is given twice in 'step=3,step=4,phase=data' (each key once)");
  EXPECT_FALSE(h::check_fault_texts(std::vector<std::string>(3000, "step=3,phase=data")).ok());
  EXPECT_TRUE(h::parse_fault("step=3,rank=1,phase=grad,layer=fc1,index=7,bit=31", {"fc1"}, &f).ok());
}

TEST(Sizes, TheEstimateCountsTheModelsParameters) {
  const std::vector<std::vector<std::string>> cases = {
      {"--model", "mlp", "--classes", "7"},
      {"--model", "cnn", "--classes", "7"},
      {"--model", "gpt", "--vocab", "7"},
      {"--model", "gpt", "--vocab", "50", "--layers", "3", "--width", "24", "--heads", "3", "--seq-len", "9"},
      {"--model", "gpt", "--vocab", "50", "--width", "16", "--tie-head"}};
  for (const auto& given : cases) {
    const std::string model = given[1] + (given.size() > 4 ? " (" + given[4] + ")" : "");
    std::vector<std::string> args = {"--run-dir", "r", "--samples", "64"};
    args.insert(args.end(), given.begin(), given.end());
    h::TrainConfig c;
    bool help = false;
    ASSERT_TRUE(h::parse_train_options(args, &c, &help).ok()) << model;
    h::Dataset d;
    ASSERT_TRUE(h::load_dataset(c, &d).ok());
    std::unique_ptr<h::Model> m;
    ASSERT_TRUE(h::make_model(c, d, &m).ok());
    double n = 0;
    for (const auto& p : m->parameters()) n += static_cast<double>(p.tensor.numel());
    EXPECT_EQ(h::builtin_parameters(c, d.x_shape, static_cast<double>(d.classes)), n) << model;
  }
}

TEST(Sizes, MemoryIsWhatTheSystemReports) {
  const std::uint64_t mem = culprit::system_memory_bytes();
  ASSERT_GT(mem, 0u);
  EXPECT_TRUE(culprit::check_fits_memory("x", static_cast<double>(mem) / 2).ok());
  const Status st = culprit::check_fits_memory("the thing", static_cast<double>(mem) * 4);
  EXPECT_EQ(st.code(), culprit::StatusCode::kBadInput);
  EXPECT_EQ(st.message().find("the thing needs about "), 0u) << st.message();
  EXPECT_EQ(culprit::human_bytes(1536), "1.5 KiB");
  EXPECT_GE(culprit::system_cores(), 1);
}
