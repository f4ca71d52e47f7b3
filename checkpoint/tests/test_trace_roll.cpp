// A rolled trace (--trace-keep) on real HDF5 files: the live file seals under its last step's name,
// retention deletes only whole files older than the kept steps, and a resume at an older step
// rewinds the sealed files so that the rows read back are exactly those through that step, however
// often the rewind is repeated (a crash part-way repeats it).
#include <filesystem>
#include <gtest/gtest.h>

#include "culprit/trace.h"

namespace fs = std::filesystem;
using namespace culprit;

namespace {

class TraceRoll : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/culprit-trace-roll-XXXXXX";
    dir_ = mkdtemp(tmpl);
    header_.rank = 0;
    header_.params = {"w", "b"};
    header_.run_id = "run-a";
    header_.faults = {"step=3,kind=nan"};
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Opens the live file as a job starting after `keep` would; appends steps from..to.
  void write(std::int64_t keep, std::int64_t from, std::int64_t to, std::int64_t seal_every = 0) {
    trace::Writer w;
    std::string warning;
    ASSERT_TRUE(w.open(trace::path_for(dir_, 0), header_, keep, &warning).ok());
    EXPECT_EQ(warning, "");
    for (std::int64_t s = from; s <= to; ++s) {
      trace::StepRow row;
      row.step = s;
      row.loss = static_cast<float>(s);
      row.param_fps = {static_cast<Fingerprint>(s), 7};
      trace::ShardRow shard;
      shard.step = s;
      ASSERT_TRUE(w.append(row, {shard}).ok());
      if (seal_every && s % seal_every == 0) {
        ASSERT_TRUE(w.seal(s).ok());
      }
    }
  }
  // The steps read back from every file of the run, in order.
  std::vector<std::int64_t> steps() {
    trace::RunTrace rt;
    EXPECT_TRUE(trace::read_run(dir_, &rt, "run-a").ok());
    std::vector<std::int64_t> out;
    for (const auto& [key, row] : rt.steps) out.push_back(key.second);
    return out;
  }
  std::vector<std::string> names() {
    std::vector<std::string> out;
    for (const auto& p : trace::list(dir_)) out.push_back(fs::path(p).filename().string());
    return out;
  }
  static std::vector<std::int64_t> range(std::int64_t a, std::int64_t b) {
    std::vector<std::int64_t> out;
    for (std::int64_t s = a; s <= b; ++s) out.push_back(s);
    return out;
  }
  std::string dir_;
  trace::Header header_;
};

TEST_F(TraceRoll, NamesSayTheRankAndTheLastStep) {
  trace::FileName n;
  ASSERT_TRUE(trace::parse_file_name("rank-00003.to-00000120.h5", &n));
  EXPECT_EQ(n.rank, 3);
  EXPECT_EQ(n.through, 120);
  ASSERT_TRUE(trace::parse_file_name("rank-00003.h5", &n));
  EXPECT_EQ(n.through, -1);
  for (const char* bad : {"rank-3.h5", "rank-00003.to-12.h5", "rank-00003.h5.damaged-1", "rank-00003.to-00000120.h5.tmp"})
    EXPECT_FALSE(trace::parse_file_name(bad, &n)) << bad;
  EXPECT_EQ(fs::path(trace::sealed_path_for("/r", 2, 40)).filename(), "rank-00002.to-00000040.h5");
}

TEST_F(TraceRoll, SealedFilesReadBackAsOneTraceInOrder) {
  write(0, 1, 25, /*seal_every=*/10);
  EXPECT_EQ(names(), (std::vector<std::string>{"rank-00000.to-00000010.h5", "rank-00000.to-00000020.h5", "rank-00000.h5"}));
  EXPECT_EQ(steps(), range(1, 25));
  trace::RunTrace rt;
  ASSERT_TRUE(trace::read_run(dir_, &rt).ok());
  EXPECT_EQ(rt.ranks, std::vector<int>{0});
  EXPECT_EQ(rt.header.faults, header_.faults);  // carried into every new live file
}

TEST_F(TraceRoll, RetirementDeletesOnlyWholeFilesBeforeTheKeptSteps) {
  trace::Writer w;
  std::string warning;
  write(0, 1, 30, 10);
  ASSERT_TRUE(w.open(trace::path_for(dir_, 0), header_, 30, &warning).ok());
  EXPECT_EQ(w.sealed_through(), 30);
  ASSERT_TRUE(w.retire(15).ok());  // to-10 only: to-20 holds step 15
  EXPECT_EQ(steps(), range(11, 30));
  ASSERT_TRUE(w.retire(31).ok());
  EXPECT_EQ(steps(), std::vector<std::int64_t>{});
  EXPECT_EQ(names(), std::vector<std::string>{"rank-00000.h5"});  // the live file is never retired
}

TEST_F(TraceRoll, ResumingInsideASealedFileMakesItLiveAgain) {
  write(0, 1, 40, 10);
  trace::Writer w;
  std::string warning;
  ASSERT_TRUE(w.open(trace::path_for(dir_, 0), header_, 25, &warning).ok());  // resumed at step 25
  w.close();
  EXPECT_EQ(names(), (std::vector<std::string>{"rank-00000.to-00000010.h5", "rank-00000.to-00000020.h5", "rank-00000.h5"}));
  EXPECT_EQ(steps(), range(1, 25));
  // The resumed job continues, and seals at 30 again under the same name as before.
  write(25, 26, 35, 10);
  EXPECT_EQ(steps(), range(1, 35));
  EXPECT_EQ(names().size(), 4u);
}

TEST_F(TraceRoll, ARewindIsSafeToRepeatAndRefusesAnotherRunsFiles) {
  write(0, 1, 40, 10);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(trace::rewind(dir_, 0, 20, "run-a").ok());
  trace::Writer w;
  std::string warning;
  ASSERT_TRUE(w.open(trace::path_for(dir_, 0), header_, 20, &warning).ok());
  w.close();
  EXPECT_EQ(steps(), range(1, 20));
  // Another run's sealed file past the resume point is left as it is, and the rewind says so.
  write(20, 21, 30, 10);
  EXPECT_FALSE(trace::rewind(dir_, 0, 5, "run-b").ok());
  EXPECT_EQ(steps(), range(1, 30));
}

TEST_F(TraceRoll, ARefusedResumeChangesNothing) {
  write(0, 1, 40, 10);
  const auto before = names();
  trace::Header other = header_;
  other.params = {"w", "b", "c"};  // another model
  trace::Writer w;
  std::string warning;
  const Status st = w.open(trace::path_for(dir_, 0), other, 15, &warning);
  EXPECT_EQ(st.code(), StatusCode::kBadInput) << st.message();
  EXPECT_NE(st.message().find("another model"), std::string::npos) << st.message();
  EXPECT_EQ(names(), before);
  EXPECT_EQ(steps(), range(1, 40));
}

TEST_F(TraceRoll, ACrashBetweenSealAndTheNewLiveFileLosesNothing) {
  write(0, 1, 20, 10);
  fs::remove(trace::path_for(dir_, 0));  // what a crash after the rename leaves
  EXPECT_EQ(steps(), range(1, 20));
  header_.faults = {"step=21,kind=scale"};  // the next job's own
  write(20, 21, 22);
  EXPECT_EQ(steps(), range(1, 22));
  // The new live file still names the earlier job's faults (its older files may be retired).
  trace::TraceFile live;
  ASSERT_TRUE(trace::read(trace::path_for(dir_, 0), &live).ok());
  EXPECT_EQ(live.header.faults, (std::vector<std::string>{"step=21,kind=scale", "step=3,kind=nan"}));
}

}  // namespace
