// The fleet's suspicion ledger (docs/ledger.md): one SQLite file on the shared filesystem into
// which every training job records its hardware verdict, so that a device that fails again in
// another job, on another run, is seen as the repeat offender it is. Written by many jobs at once
// (rollback journal, BEGIN IMMEDIATE, busy timeout); the format is culprit/ledger_schema.h.
#pragma once
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "culprit/command.h"
#include "culprit/names.h"
#include "culprit/status.h"

namespace culprit::ledger {

// What the job did about the verdict.
enum class Action { kNone, kExcluded, kDrained, kRetried, kStopped };
constexpr NameRow<Action> kActionNames[] = {{Action::kNone, "none"},
                                            {Action::kExcluded, "excluded"},
                                            {Action::kDrained, "drained"},
                                            {Action::kRetried, "retried"},
                                            {Action::kStopped, "stopped"}};
constexpr NameTable<Action> enum_names(Action) { return {kActionNames, std::size(kActionNames), "action"}; }

// One verdict row (the schema's columns).
struct Entry {
  std::int64_t id = 0;   // set by the ledger: commit order
  std::string time;      // UTC ISO-8601; record() sets it
  std::string host;      // required: [A-Za-z0-9._-]
  std::string device;    // as the run recorded it
  std::int64_t rank = -1;
  std::string run;       // required: the run directory (record() makes it absolute)
  std::string job;       // slurm_job_id; "" outside Slurm
  std::int64_t step = -1;
  std::string verdict;   // required: [a-z-]+ (bisect's verdicts, "hardware", "silent-rank", ...)
  int exit_code = -1;
  std::string action = "none";  // a name of Action (a row written by hand may hold another)
  std::string evidence;         // for people
};

// The drain policy: a host is over it when it has at least this many findings of a kind (0: that
// kind never drains). Findings are counted over the whole ledger, every job and run.
struct Policy {
  int persistent = 1;   // hardware-persistent: the fault reproduced on the device; proof enough
  int transient = 2;    // hardware-transient: once may be a cosmic ray; twice on one host is a pattern
  int silent = 2;       // silent-rank: a rank that died or hung (a node's fault, or the job's)
  int unconfirmed = 1;  // hardware-unconfirmed, hardware (exit 10): a device the record blames
};

// Each host's standing: what the ledger holds on it, and the policy's decision.
struct HostSummary {
  std::string host;
  std::map<std::string, int> findings;  // verdict -> findings (one per run and step: docs/ledger.md)
  int rows = 0, runs = 0, jobs = 0;
  std::vector<std::string> devices;     // distinct, sorted; "" left out
  std::string first, last, last_action;
  bool drain = false;                   // over the policy
  std::string why;                      // "2 hardware-transient (--transient 2)", "" when not over
  double score = 0;                     // sum of findings / threshold over the policy's kinds
};

struct Options {
  int busy_timeout_s = 60;  // how long a command waits for another job's transaction
};

// A verdict string: [a-z-]+, at most 64 characters.
Status check_verdict(const std::string& verdict);

// Appends `entry` (checked; time set, run made absolute) to the ledger at `db`, creating the file
// and its schema when absent (its directory must exist).
Status record(const std::string& db, Entry entry, const Options& options);

// Every row of the ledger at `db` (of `host` only, unless ""), oldest first. The file must exist;
// an empty file is an empty ledger.
Status read(const std::string& db, const std::string& host, const Options& options, std::vector<Entry>* out);

// The hosts' standing under `policy`, most suspicious first: over the policy first, then by score,
// findings, latest verdict, name. Pure.
std::vector<HostSummary> summarize(const std::vector<Entry>& rows, const Policy& policy);

// `culprit ledger record|list|explain|suspects|check`.
cli::Command ledger_command();

}  // namespace culprit::ledger
