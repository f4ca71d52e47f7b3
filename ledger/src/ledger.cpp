// The ledger's file: its schema checked or created, a verdict appended, the rows read, and the
// policy's summary of them (docs/ledger.md).
#include "culprit/ledger.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "culprit/ledger_schema.h"
#include "sqlite_db.h"

namespace culprit::ledger {

namespace fs = std::filesystem;

namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return when;
}

std::string hex(std::int64_t v) {
  char out[16];
  std::snprintf(out, sizeof out, "0x%08llx", static_cast<unsigned long long>(v) & 0xffffffffULL);
  return out;
}

// The file must be a regular file when it is there: SQLite would open a fifo and block reading it.
Status check_file(const std::string& db, bool must_exist) {
  struct stat st {};
  if (::stat(db.c_str(), &st) != 0) {
    if (errno != ENOENT) return Status::IoError("could not stat '" + db + "': " + std::strerror(errno));
    if (must_exist)
      return Status::BadInput("ledger '" + db + "' does not exist (check the path; 'culprit ledger record' creates it)");
    const fs::path parent = fs::path(db).parent_path();
    std::error_code ec;
    if (!parent.empty() && !fs::is_directory(parent, ec))
      return Status::BadInput("the directory of ledger '" + db + "' does not exist: create it first ('culprit ledger "
                              "record' creates the file, not its directory)");
    // Asked here for the OS's own reason: SQLite, refused, retries read-only and reports that
    // attempt's ENOENT instead of EROFS or EACCES.
    if (::access(parent.empty() ? "." : parent.c_str(), W_OK) != 0)
      return Status::IoError("could not create ledger '" + db + "': " + std::strerror(errno));
    return Status::OK();
  }
  if (S_ISDIR(st.st_mode)) return Status::BadInput("ledger '" + db + "' is a directory: give the ledger's file");
  if (!S_ISREG(st.st_mode)) return Status::BadInput("ledger '" + db + "' is not a regular file");
  return Status::OK();
}

// Inside a transaction: whether the file is a ledger of this schema version. *fresh: it holds no
// schema at all (a new or empty file), which a writer then creates and a reader reads as empty.
Status check_schema(Db& db, bool* fresh) {
  std::int64_t app = 0, version = 0, objects = 0, tables = 0;
  CULPRIT_RETURN_IF_ERROR(db.integer(schema::kApplicationIdPragma, &app));
  CULPRIT_RETURN_IF_ERROR(db.integer(schema::kUserVersionPragma, &version));
  CULPRIT_RETURN_IF_ERROR(db.integer(schema::kObjectCount, &objects));
  *fresh = app == 0 && version == 0 && objects == 0;
  if (*fresh) return Status::OK();
  const std::string file = "'" + db.path() + "'";
  if (app != schema::kApplicationId)
    return Status::Damaged(file + " is a SQLite database of another program (application_id " + hex(app) + ", " +
                           std::to_string(objects) + " schema objects), not a culprit ledger: give the ledger's path");
  if (version != schema::kVersion)
    return Status::Damaged(file + " is a culprit ledger of schema version " + std::to_string(version) +
                           "; this culprit reads version " + std::to_string(schema::kVersion) +
                           (version > schema::kVersion ? ": use a newer culprit" : ": the file is damaged"));
  CULPRIT_RETURN_IF_ERROR(db.integer(schema::kTableCount, &tables));
  if (tables != 1) return Status::Damaged(file + " says it is a culprit ledger but holds no verdicts table");
  return Status::OK();
}

// Inside the writer's transaction, so that two first writers racing create it once: the second
// waits for the first's lock, then finds the schema there (IF NOT EXISTS keeps it a no-op anyway).
Status create_schema(Db& db) {
  CULPRIT_RETURN_IF_ERROR(db.exec(schema::kCreateTable, "create the ledger's table in"));
  CULPRIT_RETURN_IF_ERROR(db.exec(schema::kCreateIndex, "create the ledger's index in"));
  CULPRIT_RETURN_IF_ERROR(
      db.exec("PRAGMA application_id = " + std::to_string(schema::kApplicationId), "write the header of"));
  return db.exec("PRAGMA user_version = " + std::to_string(schema::kVersion), "write the header of");
}

// A value that is one line of `list` or `explain` and one field a job script passes on.
Status one_line(const char* option, const std::string& value) {
  for (const unsigned char c : value)
    if (c < 0x20 || c == 0x7f)
      return Status::BadInput(std::string("option '--") + option + "' holds a control character (" +
                              (c == '\n' ? std::string("a newline") : "byte " + std::to_string(c)) +
                              "): it is one field of one line");
  return Status::OK();
}

Status check_entry(Entry* e) {
  if (e->host.empty()) return Status::BadInput("option '--host' is empty: give the host the verdict blames");
  // Hosts go into Slurm's --exclude lists and `suspects`' one-a-line output: no comma, no space.
  const bool host_ok = e->host.size() <= 253 && std::all_of(e->host.begin(), e->host.end(), [](unsigned char c) {
                         return std::isalnum(c) || c == '.' || c == '-' || c == '_';
                       });
  if (!host_ok)
    return Status::BadInput("option '--host': '" + e->host + "' is not a host name (letters, digits, '.', '-', '_'; "
                            "at most 253)");
  CULPRIT_RETURN_IF_ERROR(check_verdict(e->verdict));
  if (e->run.empty()) return Status::BadInput("option '--run' is empty: give the run directory the verdict is about");
  for (const auto& [name, value] : {std::pair<const char*, const std::string*>{"device", &e->device},
                                    {"run", &e->run}, {"job", &e->job}, {"action", &e->action}})
    CULPRIT_RETURN_IF_ERROR(one_line(name, *value));
  Action a{};
  if (!parse_name(e->action, &a))
    return Status::BadInput("option '--action': unknown action '" + e->action + "' (valid: " + names_list<Action>() + ")");
  if (e->evidence.size() > (std::size_t{64} << 10))
    return Status::BadInput("option '--evidence' is longer than 64 KiB: point to the run's records instead");
  // Evidence is for people and shown on one line: a newline in it becomes a space (as `culprit log`'s message).
  for (char& c : e->evidence)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  // The same run reached from two working directories is one run: the policy counts runs.
  std::error_code ec;
  const fs::path abs = fs::absolute(e->run, ec);
  if (!ec) e->run = abs.lexically_normal().string();
  while (e->run.size() > 1 && e->run.back() == '/') e->run.pop_back();
  if (e->time.empty()) e->time = utc_now();
  return Status::OK();
}

Status insert(Db& db, const Entry& e) {
  Stmt s;
  CULPRIT_RETURN_IF_ERROR(s.prepare(db, schema::kInsert));
  CULPRIT_RETURN_IF_ERROR(s.bind(1, e.time));
  CULPRIT_RETURN_IF_ERROR(s.bind(2, e.host));
  CULPRIT_RETURN_IF_ERROR(s.bind(3, e.device));
  CULPRIT_RETURN_IF_ERROR(s.bind(4, e.rank));
  CULPRIT_RETURN_IF_ERROR(s.bind(5, e.run));
  CULPRIT_RETURN_IF_ERROR(s.bind(6, e.job));
  CULPRIT_RETURN_IF_ERROR(s.bind(7, e.step));
  CULPRIT_RETURN_IF_ERROR(s.bind(8, e.verdict));
  CULPRIT_RETURN_IF_ERROR(s.bind(9, static_cast<std::int64_t>(e.exit_code)));
  CULPRIT_RETURN_IF_ERROR(s.bind(10, e.action));
  CULPRIT_RETURN_IF_ERROR(s.bind(11, e.evidence));
  bool row = false;
  return s.step(&row);
}

Entry entry_of(const Stmt& s) {
  Entry e;
  e.id = s.integer(schema::kId);
  e.time = s.text(schema::kTime);
  e.host = s.text(schema::kHost);
  e.device = s.text(schema::kDevice);
  e.rank = s.integer(schema::kRank);
  e.run = s.text(schema::kRun);
  e.job = s.text(schema::kJob);
  e.step = s.integer(schema::kStep);
  e.verdict = s.text(schema::kVerdict);
  e.exit_code = static_cast<int>(s.integer(schema::kExitCode));
  e.action = s.text(schema::kAction);
  e.evidence = s.text(schema::kEvidence);
  return e;
}

}  // namespace

Status check_verdict(const std::string& verdict) {
  const bool ok = !verdict.empty() && verdict.size() <= 64 &&
                  std::all_of(verdict.begin(), verdict.end(), [](char c) { return (c >= 'a' && c <= 'z') || c == '-'; });
  if (ok) return Status::OK();
  return Status::BadInput("option '--verdict': '" + verdict + "' is not a verdict (lower-case letters and '-', at most "
                          "64: hardware-persistent, hardware-transient, hardware-unconfirmed, hardware, silent-rank, ...)");
}

Status record(const std::string& path, Entry entry, const Options& options) {
  CULPRIT_RETURN_IF_ERROR(check_entry(&entry));
  CULPRIT_RETURN_IF_ERROR(check_file(path, /*must_exist=*/false));
  std::unique_ptr<Db> db;
  CULPRIT_RETURN_IF_ERROR(Db::open(path, Db::Mode::kWrite, options.busy_timeout_s, &db));
  // What the file is, before anything in it changes: another program's database is refused as one.
  CULPRIT_RETURN_IF_ERROR(db->transaction(/*write=*/false, [&] {
    bool fresh = false;
    return check_schema(*db, &fresh);
  }));
  CULPRIT_RETURN_IF_ERROR(db->check_rollback_journal());
  return db->transaction(/*write=*/true, [&] {
    bool fresh = false;
    CULPRIT_RETURN_IF_ERROR(check_schema(*db, &fresh));
    if (fresh) CULPRIT_RETURN_IF_ERROR(create_schema(*db));
    return insert(*db, entry);
  });
}

Status read(const std::string& path, const std::string& host, const Options& options, std::vector<Entry>* out) {
  out->clear();
  CULPRIT_RETURN_IF_ERROR(check_file(path, /*must_exist=*/true));
  std::unique_ptr<Db> db;
  CULPRIT_RETURN_IF_ERROR(Db::open(path, Db::Mode::kRead, options.busy_timeout_s, &db));
  return db->transaction(/*write=*/false, [&] {
    bool fresh = false;
    CULPRIT_RETURN_IF_ERROR(check_schema(*db, &fresh));
    if (fresh) return Status::OK();
    CULPRIT_RETURN_IF_ERROR(db->check_rollback_journal());
    Stmt s;
    CULPRIT_RETURN_IF_ERROR(s.prepare(*db, host.empty() ? schema::kSelectAll : schema::kSelectHost));
    if (!host.empty()) CULPRIT_RETURN_IF_ERROR(s.bind(1, host));
    for (bool row = true;;) {
      CULPRIT_RETURN_IF_ERROR(s.step(&row));
      if (!row) return Status::OK();
      out->push_back(entry_of(s));
    }
  });
}

}  // namespace culprit::ledger
