// The ledger's file (culprit/ledger.h): real SQLite files, writers in real processes. Many jobs
// writing at once, a writer that dies mid-transaction, and every file that is not a ledger of this
// version refused with one line of the right category, never a crash.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "culprit/ledger.h"
#include "culprit/ledger_schema.h"

namespace l = culprit::ledger;
namespace fs = std::filesystem;
using culprit::StatusCode;

namespace {

struct Ledger : ::testing::Test {
  void SetUp() override {
    dir = fs::path(testing::TempDir()) / ("culprit_ledger_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    db = (dir / "ledger.db").string();
  }
  void TearDown() override {
    if (mounted) ::umount(mounted_at.c_str());
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir);
  }
  fs::path dir;
  std::string db;
  bool mounted = false;
  std::string mounted_at;
};

l::Entry verdict(const std::string& host, std::int64_t step, const std::string& v = "hardware-transient") {
  l::Entry e;
  e.host = host;
  e.verdict = v;
  e.run = "/scratch/runs/a";
  e.step = step;
  e.device = "cuda:1";
  e.rank = 3;
  e.job = "1234";
  e.exit_code = 20;
  e.action = "retried";
  e.evidence = "step " + std::to_string(step) + " layer fc1\nforward";
  return e;
}

std::vector<l::Entry> all(const std::string& db) {
  std::vector<l::Entry> rows;
  const auto st = l::read(db, "", l::Options{}, &rows);
  EXPECT_TRUE(st.ok()) << st.message();
  return rows;
}

// A raw SQLite connection, as someone with the sqlite3 shell would have.
sqlite3* raw(const std::string& path) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &h), SQLITE_OK);
  return h;
}

void write_bytes(const std::string& path, const std::string& bytes, std::size_t offset = 0) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) f.open(path, std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

}  // namespace

TEST_F(Ledger, ARowIsWrittenAndReadBackWhole) {
  ASSERT_TRUE(l::record(db, verdict("node17", 42), l::Options{}).ok());
  const auto rows = all(db);
  ASSERT_EQ(rows.size(), 1u);
  const auto& r = rows[0];
  EXPECT_EQ(r.host, "node17");
  EXPECT_EQ(r.verdict, "hardware-transient");
  EXPECT_EQ(r.run, "/scratch/runs/a");
  EXPECT_EQ(r.step, 42);
  EXPECT_EQ(r.device, "cuda:1");
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.job, "1234");
  EXPECT_EQ(r.exit_code, 20);
  EXPECT_EQ(r.action, "retried");
  EXPECT_EQ(r.evidence, "step 42 layer fc1 forward");  // one line
  EXPECT_EQ(r.time.size(), 20u) << r.time;             // 2026-11-30T14:40:02Z
  EXPECT_EQ(r.time.back(), 'Z');
  // A relative run directory is kept absolute: the same run from two working directories is one.
  auto rel = verdict("node17", 43);
  rel.run = "runs/b/";
  ASSERT_TRUE(l::record(db, rel, l::Options{}).ok());
  EXPECT_EQ(all(db)[1].run, (fs::current_path() / "runs/b").string());
  // The file says what it is, to anyone with the sqlite3 shell; the rollback journal, never WAL.
  sqlite3* h = raw(db);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "SELECT count(*) FROM verdicts WHERE host = 'node17'", -1, &s, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(s, 0), 2);
  sqlite3_finalize(s);
  ASSERT_EQ(sqlite3_prepare_v2(h, "PRAGMA journal_mode", -1, &s, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)), "delete");
  sqlite3_finalize(s);
  sqlite3_close(h);
  EXPECT_FALSE(fs::exists(db + "-wal"));
  EXPECT_FALSE(fs::exists(db + "-journal"));
}

TEST_F(Ledger, EightProcessesWritingAtOnceLoseNothing) {
  // The file does not exist yet: the first writers race to create the schema too.
  constexpr int kProcs = 8, kRows = 50;
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      char c;
      (void)!::read(go[0], &c, 1);  // all start together when the pipe closes
      for (int i = 0; i < kRows; ++i) {
        const auto st = l::record(db, verdict("node" + std::to_string(p), i + 1), l::Options{});
        if (!st.ok()) {
          std::fprintf(stderr, "writer %d row %d: %s\n", p, i, st.message().c_str());
          ::_exit(1);
        }
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  for (const pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer " << pid;
  }
  const auto rows = all(db);
  ASSERT_EQ(rows.size(), std::size_t{kProcs * kRows});
  std::map<std::string, std::set<std::int64_t>> steps;
  for (const auto& r : rows) steps[r.host].insert(r.step);
  ASSERT_EQ(steps.size(), std::size_t{kProcs});
  for (const auto& [host, s] : steps) EXPECT_EQ(s.size(), std::size_t{kRows}) << host;
  // Each writer's rows in its own order: commit order is the id.
  for (std::size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1].id, rows[i].id);
}

TEST_F(Ledger, AWriterThatDiesMidTransactionLeavesTheLedgerAsItWas) {
  ASSERT_TRUE(l::record(db, verdict("node1", 1), l::Options{}).ok());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Enough rows to spill pages into the file before the commit that never comes.
    sqlite3* h = raw(db);
    sqlite3_exec(h, "PRAGMA cache_size = 1; BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    for (int i = 0; i < 2000; ++i)
      sqlite3_exec(h, "INSERT INTO verdicts (time, host, run, verdict) VALUES ('t', 'ghost', '/r', 'hardware')",
                   nullptr, nullptr, nullptr);
    ::_exit(0);  // a crash: no COMMIT, no close, the journal left behind
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const auto rows = all(db);  // the reader rolls the hot journal back
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].host, "node1");
  ASSERT_TRUE(l::record(db, verdict("node2", 2), l::Options{}).ok());
  EXPECT_EQ(all(db).size(), 2u);
}

TEST_F(Ledger, ALockHeldPastTheBusyTimeoutIsAnIoErrorNamingIt) {
  ASSERT_TRUE(l::record(db, verdict("node1", 1), l::Options{}).ok());
  sqlite3* h = raw(db);
  ASSERT_EQ(sqlite3_exec(h, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  const auto st = l::record(db, verdict("node2", 2), l::Options{0});
  EXPECT_EQ(st.code(), StatusCode::kIo) << st.message();
  EXPECT_NE(st.message().find("still locked"), std::string::npos) << st.message();
  std::vector<l::Entry> rows;
  EXPECT_EQ(l::read(db, "", l::Options{0}, &rows).code(), StatusCode::kIo);
  sqlite3_exec(h, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(h);
  EXPECT_EQ(all(db).size(), 1u);
}

TEST_F(Ledger, RandomBytesAreDamageNamingTheFile) {
  write_bytes(db, random_bytes(8192, 1));
  const auto st = l::record(db, verdict("node1", 1), l::Options{});
  EXPECT_EQ(st.code(), StatusCode::kDamaged) << st.message();
  EXPECT_NE(st.message().find(db), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not a culprit ledger"), std::string::npos) << st.message();
  std::vector<l::Entry> rows;
  EXPECT_EQ(l::read(db, "", l::Options{}, &rows).code(), StatusCode::kDamaged);
}

TEST_F(Ledger, ALedgerDamagedInsideIsDamageNotACrash) {
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(l::record(db, verdict("node" + std::to_string(i % 7), i), l::Options{}).ok());
  const auto size = fs::file_size(db);
  ASSERT_GT(size, 3 * 4096u);
  for (unsigned seed = 0; seed < 4; ++seed) {
    write_bytes(db, random_bytes(4096, seed + 10), 4096 * (1 + seed % (size / 4096 - 1)));
    std::vector<l::Entry> rows;
    const auto st = l::read(db, "", l::Options{}, &rows);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), StatusCode::kDamaged) << st.message();
    }
    const auto w = l::record(db, verdict("node1", 1), l::Options{});
    if (!w.ok()) {
      EXPECT_EQ(w.code(), StatusCode::kDamaged) << w.message();
    }
  }
}

TEST_F(Ledger, AnotherProgramsDatabaseIsRefusedByName) {
  sqlite3* h = raw(db);
  ASSERT_EQ(sqlite3_exec(h, "CREATE TABLE verdicts (x); CREATE TABLE jobs (id)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  const auto st = l::record(db, verdict("node1", 1), l::Options{});
  EXPECT_EQ(st.code(), StatusCode::kDamaged) << st.message();
  EXPECT_NE(st.message().find("another program"), std::string::npos) << st.message();
  std::vector<l::Entry> rows;
  EXPECT_EQ(l::read(db, "", l::Options{}, &rows).code(), StatusCode::kDamaged);
}

// The journal mode is read, never changed: another program's WAL database stays as it was (and is
// refused as another program's), a ledger someone switched to WAL is refused by name (I/O, 6).
std::string journal_mode(sqlite3* h) {
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h, "PRAGMA journal_mode", -1, &s, nullptr), SQLITE_OK);
  EXPECT_EQ(sqlite3_step(s), SQLITE_ROW);
  std::string mode = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  return mode;
}

TEST_F(Ledger, AFileInWalModeIsNeverConverted) {
  sqlite3* h = raw(db);
  ASSERT_EQ(sqlite3_exec(h, "PRAGMA journal_mode = WAL; CREATE TABLE other (x)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  auto st = l::record(db, verdict("node1", 1), l::Options{});
  EXPECT_EQ(st.code(), StatusCode::kDamaged) << st.message();
  h = raw(db);
  EXPECT_EQ(journal_mode(h), "wal");
  sqlite3_close(h);
  fs::remove(db);
  ASSERT_TRUE(l::record(db, verdict("node1", 1), l::Options{}).ok());
  h = raw(db);
  ASSERT_EQ(sqlite3_exec(h, "PRAGMA journal_mode = WAL", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  st = l::record(db, verdict("node1", 2), l::Options{});
  EXPECT_EQ(st.code(), StatusCode::kIo) << st.message();
  EXPECT_NE(st.message().find("journal mode 'wal'"), std::string::npos) << st.message();
  h = raw(db);
  EXPECT_EQ(journal_mode(h), "wal");
  sqlite3_close(h);
}

TEST_F(Ledger, AnotherSchemaVersionIsRefusedByName) {
  ASSERT_TRUE(l::record(db, verdict("node1", 1), l::Options{}).ok());
  sqlite3* h = raw(db);
  ASSERT_EQ(sqlite3_exec(h, "PRAGMA user_version = 2", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  std::vector<l::Entry> rows;
  const auto st = l::read(db, "", l::Options{}, &rows);
  EXPECT_EQ(st.code(), StatusCode::kDamaged) << st.message();
  EXPECT_NE(st.message().find("schema version 2; this culprit reads version 1: use a newer culprit"), std::string::npos)
      << st.message();
  EXPECT_EQ(l::record(db, verdict("node1", 2), l::Options{}).code(), StatusCode::kDamaged);
}

TEST_F(Ledger, AnEmptyFileIsAnEmptyLedger) {
  write_bytes(db, "");
  EXPECT_TRUE(all(db).empty());
  ASSERT_TRUE(l::record(db, verdict("node1", 1), l::Options{}).ok());
  EXPECT_EQ(all(db).size(), 1u);
}

TEST_F(Ledger, PathsThatAreNoLedgerAreBadInput) {
  std::vector<l::Entry> rows;
  auto st = l::read(db, "", l::Options{}, &rows);  // readers never create it
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("does not exist"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(db));
  st = l::record((dir / "no-such-dir" / "ledger.db").string(), verdict("n", 1), l::Options{});
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("directory"), std::string::npos) << st.message();
  EXPECT_EQ(l::record(dir.string(), verdict("n", 1), l::Options{}).code(), StatusCode::kBadInput);
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(l::read((dir / "fifo").string(), "", l::Options{}, &rows).code(), StatusCode::kBadInput);
}

TEST_F(Ledger, ABadRowIsBadInputAndNothingIsWritten) {
  auto bad = [&](l::Entry e, const std::string& says) {
    const auto st = l::record(db, e, l::Options{});
    EXPECT_EQ(st.code(), StatusCode::kBadInput) << st.message();
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  };
  auto e = verdict("", 1);
  bad(e, "'--host' is empty");
  bad(verdict("node1,node2", 1), "not a host name");
  bad(verdict("node 1", 1), "not a host name");
  bad(verdict("node1", 1, "Hardware"), "not a verdict");
  bad(verdict("node1", 1, "hardware transient"), "not a verdict");
  bad(verdict("node1", 1, ""), "not a verdict");
  e = verdict("node1", 1);
  e.run = "";
  bad(e, "'--run' is empty");
  e = verdict("node1", 1);
  e.action = "rebooted";
  bad(e, "unknown action 'rebooted'");
  e = verdict("node1", 1);
  e.device = "cuda:0\nnode9 hardware-persistent";
  bad(e, "a newline");
  EXPECT_FALSE(fs::exists(db));
}

TEST_F(Ledger, AnUnwritableDirectoryIsAnIoErrorNamingTheFile) {
  const fs::path ro = dir / "ro";
  fs::create_directories(ro);
  if (::geteuid() == 0) {
    // Root writes through permissions: a read-only filesystem, as a read-only mount of the share.
    if (::mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=64k") != 0)
      GTEST_SKIP() << "root without the right to mount a read-only tmpfs";
    mounted = true;
    mounted_at = ro.string();
  } else {
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  }
  const std::string path = (ro / "ledger.db").string();
  const auto st = l::record(path, verdict("node1", 1), l::Options{});
  EXPECT_EQ(st.code(), StatusCode::kIo) << st.message();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  if (!mounted) fs::permissions(ro, fs::perms::owner_all);
}
