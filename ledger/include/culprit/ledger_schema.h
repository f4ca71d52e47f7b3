// The ledger's file format as one header of constants (as LevelDB keeps its format in a few
// headers): a SQLite database whose header says it is a culprit ledger (application_id) and which
// version of this schema it holds (user_version), with one table of verdict rows. Everything that
// reads or writes the file (ledger/src) takes its SQL from here, so the writer, the readers and
// docs/ledger.md cannot disagree. A changed column bumps kVersion; a reader refuses any other
// version by name (exit 4) rather than guess.
#pragma once
#include <cstdint>

namespace culprit::ledger::schema {

// PRAGMA application_id: "CULP" in ASCII. A SQLite file with another id (0: most programs') is not
// a culprit ledger, however its tables look.
constexpr std::int32_t kApplicationId = 0x43554c50;
// PRAGMA user_version: this schema's version.
constexpr int kVersion = 1;

constexpr const char* kTable = "verdicts";

// The table and its index, created inside the first writer's BEGIN IMMEDIATE transaction; IF NOT
// EXISTS makes a second writer that raced it a no-op. The CHECKs hold rows inserted by hand with
// the sqlite3 shell to the same rules as `culprit ledger record` (a host, a verdict of [a-z-]).
constexpr const char* kCreateTable =
    "CREATE TABLE IF NOT EXISTS verdicts ("
    " id INTEGER PRIMARY KEY,"                        // commit order: oldest first whatever the clocks say
    " time TEXT NOT NULL,"                            // UTC ISO-8601, 2026-11-30T14:40:02Z
    " host TEXT NOT NULL CHECK (host <> ''),"
    " device TEXT NOT NULL DEFAULT '',"               // cuda:1 (H200), as the run recorded it
    " rank INTEGER NOT NULL DEFAULT -1,"              // -1: not known
    " run TEXT NOT NULL CHECK (run <> ''),"           // the run directory, absolute
    " slurm_job_id TEXT NOT NULL DEFAULT '',"         // '' outside Slurm
    " step INTEGER NOT NULL DEFAULT -1,"              // the faulty step, 1-based; -1: not known
    " verdict TEXT NOT NULL CHECK (verdict <> '' AND verdict NOT GLOB '*[^a-z-]*'),"
    " exit_code INTEGER NOT NULL DEFAULT -1,"         // culprit's exit code the verdict came with; -1
    " action TEXT NOT NULL DEFAULT 'none',"           // excluded, drained, retried, stopped, none
    " evidence TEXT NOT NULL DEFAULT '')";            // for people: no reader parses it
constexpr const char* kCreateIndex = "CREATE INDEX IF NOT EXISTS verdicts_host ON verdicts (host)";

constexpr const char* kInsert =
    "INSERT INTO verdicts (time, host, device, rank, run, slurm_job_id, step, verdict, exit_code, action, evidence)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

// Every column, in the order of Column below.
#define CULPRIT_LEDGER_COLUMNS \
  "id, time, host, device, rank, run, slurm_job_id, step, verdict, exit_code, action, evidence"
constexpr const char* kSelectAll = "SELECT " CULPRIT_LEDGER_COLUMNS " FROM verdicts ORDER BY id";
constexpr const char* kSelectHost = "SELECT " CULPRIT_LEDGER_COLUMNS " FROM verdicts WHERE host = ?1 ORDER BY id";
#undef CULPRIT_LEDGER_COLUMNS
enum Column { kId, kTime, kHost, kDevice, kRank, kRun, kJob, kStep, kVerdict, kExitCode, kAction, kEvidence };

// What a reader asks of a file before trusting it: its header's two numbers, and whether it holds
// any schema object at all (a SQLite file without our id but with tables is another program's).
constexpr const char* kApplicationIdPragma = "PRAGMA application_id";
constexpr const char* kUserVersionPragma = "PRAGMA user_version";
constexpr const char* kObjectCount = "SELECT count(*) FROM sqlite_master";
constexpr const char* kTableCount = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'verdicts'";

}  // namespace culprit::ledger::schema
