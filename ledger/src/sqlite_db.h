// A thin RAII layer over SQLite's C API for the ledger: one connection per command, statements
// that finalize themselves, transactions that roll back unless committed, and every SQLite result
// code turned into a Status of the right category (damaged file: 4, lock or disk: 6) whose one line
// names the file and what to do.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "culprit/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace culprit::ledger {

class Db {
 public:
  // kWrite creates the file when absent; kRead never does (the caller checked it exists) and opens
  // read-only only where this user cannot write the file or its directory (someone else's ledger):
  // a reader that can write rolls back the journal of a writer that crashed mid-transaction, as
  // SQLite requires before anyone reads.
  enum class Mode { kWrite, kRead };
  static Status open(const std::string& path, Mode mode, int busy_timeout_s, std::unique_ptr<Db>* out);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // One statement without results (or whose results are ignored).
  Status exec(const std::string& sql, const std::string& doing);
  // Whether the file keeps a rollback journal (delete, truncate, persist): never WAL (NFS, Lustre).
  // Asked after the file has shown it is a ledger: another program's file is refused as such.
  Status check_rollback_journal();
  // The one integer a statement returns (PRAGMA user_version, count(*)).
  Status integer(const std::string& sql, std::int64_t* out);
  // fn inside BEGIN IMMEDIATE (write: the write lock is taken first, so two writers never deadlock
  // upgrading their locks; busy_timeout waits for it) or BEGIN (read: one snapshot), then COMMIT;
  // ROLLBACK when fn or the commit fails, so a failed write leaves the ledger as it was.
  Status transaction(bool write, const std::function<Status()>& fn);
  // The Status of SQLite result code rc while `doing` something to the file.
  Status error(int rc, const std::string& doing) const;

  sqlite3* handle() const { return db_; }
  const std::string& path() const { return path_; }

 private:
  Db(sqlite3* db, std::string path, int busy_timeout_s) : db_(db), path_(std::move(path)), busy_s_(busy_timeout_s) {}
  sqlite3* db_;
  std::string path_;
  int busy_s_;
};

// A prepared statement, finalized when it goes out of scope.
class Stmt {
 public:
  Stmt() = default;
  ~Stmt();
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Status prepare(const Db& db, const std::string& sql);
  Status bind(int index, const std::string& value);
  Status bind(int index, std::int64_t value);
  // One step: *row true when a row is there to read, false when the statement is done.
  Status step(bool* row);
  std::string text(int column) const;
  std::int64_t integer(int column) const;

 private:
  const Db* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
};

}  // namespace culprit::ledger
