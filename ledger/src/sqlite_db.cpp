#include "sqlite_db.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

namespace culprit::ledger {

namespace {

std::string quoted(const std::string& path) { return "'" + path + "'"; }

// Whether this user could write the file and the directory its journal goes into.
bool writable(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return ::access(path.c_str(), W_OK) == 0 && ::access(dir.empty() ? "." : dir.c_str(), W_OK) == 0;
}

}  // namespace

Status Db::error(int rc, const std::string& doing) const {
  const std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  const int err = db_ ? sqlite3_system_errno(db_) : 0;
  const std::string os = err ? std::string(": ") + std::strerror(err) : "";
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
    case SQLITE_FORMAT:
      return Status::Damaged(quoted(path_) + " is not a culprit ledger or is damaged (SQLite: " + msg +
                             "): give the ledger's path, or move the file aside (a new one is started by the next "
                             "'culprit ledger record'; 'sqlite3 FILE .recover' may save its rows)");
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Status::IoError(quoted(path_) + " is still locked by another job after " + std::to_string(busy_s_) +
                             " s (" + doing + "; --busy-timeout waits longer); a lock that never goes away is a "
                             "filesystem without working POSIX locks (docs/ledger.md)");
    case SQLITE_ERROR:
      // Our statements are fixed (culprit/ledger_schema.h): one that fails on a file whose header
      // says it is a ledger of this version means the tables are not what the header promises.
      return Status::Damaged(quoted(path_) + " does not hold the ledger's tables as its schema version says (" +
                             doing + ": " + msg + ")");
    case SQLITE_CONSTRAINT:
      return Status::BadInput(quoted(path_) + ": the row breaks the ledger's rules (" + msg + ")");
    case SQLITE_NOMEM:
    case SQLITE_MISUSE:
    case SQLITE_INTERNAL:
      return Status::Internal(quoted(path_) + ": " + doing + ": SQLite: " + msg);
    default:  // CANTOPEN, READONLY, IOERR, FULL, PERM, PROTOCOL, NOLFS, AUTH: the file or its disk
      return Status::IoError("could not " + doing + " " + quoted(path_) + ": " + msg + os);
  }
}

Status Db::open(const std::string& path, Mode mode, int busy_timeout_s, std::unique_ptr<Db>* out) {
  int flags = SQLITE_OPEN_NOMUTEX;  // one thread per connection
  if (mode == Mode::kWrite) flags |= SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  else flags |= writable(path) ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY;
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  std::unique_ptr<Db> db(new Db(raw, path, busy_timeout_s));  // closes raw on every path out
  if (rc != SQLITE_OK) return db->error(rc, "open");
  sqlite3_extended_result_codes(raw, 1);
  // Many jobs write one ledger: a writer waits this long for another's transaction to end.
  sqlite3_busy_timeout(raw, busy_timeout_s * 1000);
  // The file is data, not code (docs/architecture.md, "security model"): a file crafted to look
  // like a ledger must not run functions from triggers or views, nor let SQL damage the file format.
  sqlite3_db_config(raw, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  CULPRIT_RETURN_IF_ERROR(db->exec("PRAGMA trusted_schema = OFF", "open"));
  // Every commit reaches the disk before COMMIT returns: a verdict recorded is a verdict kept.
  CULPRIT_RETURN_IF_ERROR(db->exec("PRAGMA synchronous = FULL", "open"));
  *out = std::move(db);
  return Status::OK();
}

Db::~Db() { sqlite3_close_v2(db_); }

Status Db::check_rollback_journal() {
  // The rollback journal, never WAL: WAL keeps its index in shared memory (the -shm file, mmap-ed),
  // which hosts cannot share over NFS or Lustre, and writers on two hosts would corrupt the file.
  // A rollback journal needs only POSIX advisory locks, which those filesystems provide. A new file
  // has one (SQLite's default); the mode is only read here, never changed: a file in another mode
  // was put there by someone, and is left as it is.
  Stmt mode_stmt;
  CULPRIT_RETURN_IF_ERROR(mode_stmt.prepare(*this, "PRAGMA journal_mode"));
  bool row = false;
  CULPRIT_RETURN_IF_ERROR(mode_stmt.step(&row));
  const std::string journal = row ? mode_stmt.text(0) : "";
  if (journal == "delete" || journal == "truncate" || journal == "persist") return Status::OK();
  return Status::IoError(quoted(path()) + " is in journal mode '" + journal +
                         "', not the rollback journal the ledger needs (WAL does not work on network filesystems; "
                         "docs/ledger.md): run sqlite3 FILE 'PRAGMA journal_mode=DELETE' where no job uses it");
}

Status Db::exec(const std::string& sql, const std::string& doing) {
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? Status::OK() : error(rc, doing);
}

Status Db::integer(const std::string& sql, std::int64_t* out) {
  Stmt s;
  CULPRIT_RETURN_IF_ERROR(s.prepare(*this, sql));
  bool row = false;
  CULPRIT_RETURN_IF_ERROR(s.step(&row));
  *out = row ? s.integer(0) : 0;
  return Status::OK();
}

Status Db::transaction(bool write, const std::function<Status()>& fn) {
  const std::string doing = write ? "write" : "read";
  CULPRIT_RETURN_IF_ERROR(exec(write ? "BEGIN IMMEDIATE" : "BEGIN", doing));
  Status st = fn();
  if (st.ok()) st = exec("COMMIT", doing);
  // After a failed COMMIT SQLite may have rolled back already: then ROLLBACK fails, harmlessly.
  if (!st.ok() && !sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  return st;
}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }

Status Stmt::prepare(const Db& db, const std::string& sql) {
  db_ = &db;
  const int rc = sqlite3_prepare_v2(db.handle(), sql.c_str(), -1, &stmt_, nullptr);
  return rc == SQLITE_OK ? Status::OK() : db.error(rc, "read");
}

Status Stmt::bind(int index, const std::string& value) {
  const int rc = sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  return rc == SQLITE_OK ? Status::OK() : db_->error(rc, "write");
}

Status Stmt::bind(int index, std::int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, value);
  return rc == SQLITE_OK ? Status::OK() : db_->error(rc, "write");
}

Status Stmt::step(bool* row) {
  const int rc = sqlite3_step(stmt_);
  *row = rc == SQLITE_ROW;
  if (rc == SQLITE_ROW || rc == SQLITE_DONE) return Status::OK();
  return db_->error(rc, sqlite3_stmt_readonly(stmt_) ? "read" : "write");
}

std::string Stmt::text(int column) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
  return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column))) : std::string();
}

std::int64_t Stmt::integer(int column) const { return sqlite3_column_int64(stmt_, column); }

}  // namespace culprit::ledger
