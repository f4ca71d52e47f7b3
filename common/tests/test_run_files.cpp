// Writing inside a run directory (culprit/run_files.h) on the real filesystem: links are never
// followed, replacements are whole or absent, the lock is taken once per process.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <iterator>

#include "culprit/run_files.h"

namespace fs = std::filesystem;
using namespace culprit;

namespace {

class RunFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/culprit-run-files-XXXXXX";
    dir_ = mkdtemp(tmpl);
    victim_ = dir_ / "outside.txt";
    std::ofstream(victim_) << "precious\n";
    fs::create_directory(dir_ / "run");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string read(const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  std::string in_run(const char* name) { return (dir_ / "run" / name).string(); }
  fs::path dir_, victim_;
};

TEST_F(RunFiles, AppendRefusesALinkAndWritesAFile) {
  fs::create_symlink(victim_, in_run("log"));
  const Status st = files::append(in_run("log"), "x\n");
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("is a symbolic link"), std::string::npos) << st.message();
  EXPECT_EQ(read(victim_), "precious\n");
  ASSERT_TRUE(files::append(in_run("real"), "a\n").ok());
  ASSERT_TRUE(files::append(in_run("real"), "b\n").ok());
  EXPECT_EQ(read(in_run("real")), "a\nb\n");
}

TEST_F(RunFiles, WriteAtomicReplacesALinkNotItsTarget) {
  fs::create_symlink(victim_, in_run("run.json"));
  fs::create_symlink(victim_, in_run("run.json.tmp"));  // a planted temporary, too
  ASSERT_TRUE(files::write_atomic(in_run("run.json"), "{}\n").ok());
  EXPECT_EQ(read(victim_), "precious\n");
  EXPECT_FALSE(fs::is_symlink(in_run("run.json")));
  EXPECT_EQ(read(in_run("run.json")), "{}\n");
  EXPECT_FALSE(fs::exists(fs::symlink_status(in_run("run.json.tmp"))));
}

TEST_F(RunFiles, AFailedReplacementLeavesTheOldFileAndNoTemporary) {
  ASSERT_TRUE(files::write_atomic(in_run("run.json"), "old\n").ok());
  fs::create_directory(in_run("run.json.tmp"));  // the temporary cannot be made: the write fails
  const Status st = files::write_atomic(in_run("run.json"), "new\n");
  EXPECT_EQ(st.code(), StatusCode::kIo) << st.message();
  EXPECT_NE(st.message().find("run.json.tmp"), std::string::npos) << st.message();
  EXPECT_EQ(read(in_run("run.json")), "old\n");
}

TEST_F(RunFiles, CreateFreshUnlinksWhatIsThere) {
  fs::create_symlink(victim_, in_run("step.h5.tmp"));
  ASSERT_TRUE(files::create_fresh(in_run("step.h5.tmp")).ok());
  EXPECT_FALSE(fs::is_symlink(in_run("step.h5.tmp")));
  EXPECT_EQ(fs::file_size(in_run("step.h5.tmp")), 0u);
  EXPECT_EQ(read(victim_), "precious\n");
}

TEST_F(RunFiles, EnsureDirRefusesALinkedDirectory) {
  fs::create_directory(dir_ / "elsewhere");
  fs::create_directory_symlink(dir_ / "elsewhere", in_run("checkpoints"));
  EXPECT_EQ(files::ensure_dir(in_run("checkpoints")).code(), StatusCode::kBadInput);
  EXPECT_TRUE(files::ensure_dir(in_run("trace")).ok());
  EXPECT_TRUE(fs::is_directory(in_run("trace")));
  EXPECT_TRUE(files::ensure_dir(in_run("trace")).ok());  // again: already there
  std::ofstream(in_run("audit")) << "";
  EXPECT_EQ(files::ensure_dir(in_run("audit")).code(), StatusCode::kBadInput);
}

TEST_F(RunFiles, ATornLastLineIsCutAndWholeFilesStay) {
  std::ofstream(in_run("incidents.jsonl")) << "{\"a\": 1}\n{\"b\": ";
  ASSERT_TRUE(files::cut_torn_tail(in_run("incidents.jsonl")).ok());
  EXPECT_EQ(read(in_run("incidents.jsonl")), "{\"a\": 1}\n");
  ASSERT_TRUE(files::cut_torn_tail(in_run("incidents.jsonl")).ok());  // whole: unchanged
  EXPECT_EQ(read(in_run("incidents.jsonl")), "{\"a\": 1}\n");
  std::ofstream(in_run("one.jsonl")) << "{\"torn";
  ASSERT_TRUE(files::cut_torn_tail(in_run("one.jsonl")).ok());
  EXPECT_EQ(read(in_run("one.jsonl")), "");
  EXPECT_TRUE(files::cut_torn_tail(in_run("absent.jsonl")).ok());
}

TEST_F(RunFiles, AnAppendAfterATornLineCutsItFirst) {
  std::ofstream(in_run("incidents.jsonl")) << "{\"a\": 1}\n{\"torn";
  ASSERT_TRUE(files::append(in_run("incidents.jsonl"), "{\"b\": 2}\n").ok());
  EXPECT_EQ(read(in_run("incidents.jsonl")), "{\"a\": 1}\n{\"b\": 2}\n");
}

TEST_F(RunFiles, ASharedLockBecomesExclusiveWhenNobodyElseHoldsIt) {
  fs::create_directory(dir_ / "shared");
  const std::string run = (dir_ / "shared").string();
  ASSERT_TRUE(files::lock_run_dir(run, "audit", files::Lock::kShared).ok());
  // Another holder (a second open file description, shared): the upgrade is refused...
  const int fd = ::open((dir_ / "shared" / ".lock").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH | LOCK_NB), 0);
  EXPECT_EQ(files::lock_run_dir(run, "train").code(), StatusCode::kBadInput);
  ::close(fd);
  // ...and granted once it is gone.
  EXPECT_TRUE(files::lock_run_dir(run, "train").ok());
}

TEST_F(RunFiles, RemoveDeletesALinkNotItsTarget) {
  fs::create_symlink(victim_, in_run("step-1.h5"));
  ASSERT_TRUE(files::remove(in_run("step-1.h5")).ok());
  EXPECT_TRUE(files::remove(in_run("step-1.h5")).ok());  // absent is fine
  EXPECT_EQ(read(victim_), "precious\n");
  // The durable removal too: the link goes, its target stays; absent is fine; a directory is not a
  // file to remove and says so (an I/O error naming it).
  fs::create_symlink(victim_, in_run("diagnosis.json"));
  ASSERT_TRUE(files::remove_durably(in_run("diagnosis.json")).ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(in_run("diagnosis.json"))));
  EXPECT_TRUE(files::remove_durably(in_run("diagnosis.json")).ok());
  EXPECT_EQ(read(victim_), "precious\n");
  fs::create_directory(in_run("diagnosis.html"));
  const Status dir = files::remove_durably(in_run("diagnosis.html"));
  EXPECT_EQ(dir.code(), StatusCode::kIo);
  EXPECT_NE(dir.message().find("diagnosis.html"), std::string::npos) << dir.message();
}

TEST_F(RunFiles, TheLockIsTakenOncePerProcessAndRefusesAnotherHolder) {
  const std::string run = (dir_ / "run").string();
  ASSERT_TRUE(files::lock_run_dir(run, "train").ok());
  EXPECT_TRUE(files::lock_run_dir(run, "bisect").ok());  // the same process again (--on-detect diagnose)
  EXPECT_NE(read(in_run(".lock")).find("culprit train (host "), std::string::npos);
  // Another holder: a second open file description of another directory's lock, held here.
  fs::create_directory(dir_ / "other");
  const int fd = ::open((dir_ / "other" / ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "someone else\n", 13), 13);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const Status st = files::lock_run_dir((dir_ / "other").string(), "train");
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("is in use by someone else"), std::string::npos) << st.message();
  ::close(fd);  // released: free again (a crashed holder's lock is dropped the same way)
  EXPECT_TRUE(files::lock_run_dir((dir_ / "other").string(), "train").ok());
}

}  // namespace
