// `culprit ledger ACTION DB ...`: the suspicion ledger's command (docs/ledger.md). One process, no
// MPI: a job script runs it on the batch host. Each action has its own option table, so an option
// that does not apply to an action is refused by name, and its own --help.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>

#include "culprit/ledger.h"

namespace culprit::ledger {

namespace {

// Keys in the order written: "record" and "version" first, as in every culprit record.
using Json = nlohmann::ordered_json;

struct Args {
  std::vector<std::string> paths;  // DB [HOST]
  Entry entry;                     // record
  std::string host;                // list --host
  bool json = false;
  Policy policy;
  int busy_timeout = 60;
};
using Rows = std::vector<opts::Option<Args>>;

Rows common_rows(const char* paths_help) {
  return {opts::texts<Args>("paths", &Args::paths, paths_help, opts::kPositional)};
}

// Every action's last option: readers wait too (a writer's commit briefly locks them out).
opts::Option<Args> busy_row() {
  return opts::number<Args>("busy-timeout", &Args::busy_timeout, "seconds to wait while another job writes the ledger",
                            opts::Range<int>{0, 86400});
}

Rows policy_rows() {
  const opts::Range<int> r = opts::Range<int>{1, 1000000}.or_zero("never");
  return {
      opts::number<Args, int>("persistent", opts::field(&Args::policy, &Policy::persistent),
                              "drain a host with this many hardware-persistent findings (0: never)", r),
      opts::number<Args, int>("transient", opts::field(&Args::policy, &Policy::transient),
                              "... hardware-transient findings", r),
      opts::number<Args, int>("silent", opts::field(&Args::policy, &Policy::silent), "... silent-rank findings", r),
      opts::number<Args, int>("unconfirmed", opts::field(&Args::policy, &Policy::unconfirmed),
                              "... hardware-unconfirmed or hardware (exit 10) findings", r),
  };
}

Rows record_rows() {
  Rows rows = common_rows("the ledger file (created with its schema when absent; its directory must exist)");
  const auto e = [](auto member) { return opts::field(&Args::entry, member); };
  rows.insert(rows.end(), {
      opts::text<Args>("host", e(&Entry::host), "the host the verdict blames", opts::kRequired),
      opts::text<Args>("verdict", e(&Entry::verdict),
                       "hardware-persistent, hardware-transient, hardware-unconfirmed, hardware, silent-rank, ... "
                       "([a-z-]+)", opts::kRequired),
      opts::text<Args>("run", e(&Entry::run), "the run directory the verdict is about", opts::kRequired),
      opts::text<Args>("device", e(&Entry::device), "the device blamed, as the run recorded it"),
      opts::number<Args, std::int64_t>("rank", e(&Entry::rank), "the rank blamed (-1: not known)",
                                       opts::Range<std::int64_t>{-1, 1 << 30}),
      opts::number<Args, std::int64_t>("step", e(&Entry::step), "the faulty step (-1: not known)",
                                       opts::Range<std::int64_t>{-1, 1'000'000'000'000}),
      opts::number<Args, int>("exit-code", e(&Entry::exit_code), "culprit's exit code of the verdict (-1: none)",
                              opts::Range<int>{-1, 255}),
      opts::text<Args>("job", e(&Entry::job), "the Slurm job id (default: $SLURM_JOB_ID)"),
      opts::text<Args>("action", e(&Entry::action), "what the job did: excluded, drained, retried, stopped, none"),
      opts::text<Args>("evidence", e(&Entry::evidence), "for people: why (a newline becomes a space)"),
  });
  return rows;
}

// ---- output ----

// Columns padded to their widest cell, two spaces apart; the last column is not padded.
std::string table(const std::vector<std::vector<std::string>>& cells) {
  std::vector<std::size_t> width;
  for (const auto& row : cells)
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], row[i].size());
    }
  std::string out;
  for (const auto& row : cells) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i)
      line += i + 1 < row.size() ? row[i] + std::string(width[i] - row[i].size() + 2, ' ') : row[i];
    out += line + "\n";
  }
  return out;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string findings_text(const HostSummary& h) {
  std::string out;
  for (const auto& [verdict, n] : h.findings) out += (out.empty() ? "" : " ") + verdict + "=" + std::to_string(n);
  return out;
}

std::string dash(const std::string& s) { return s.empty() ? "-" : s; }
std::string dash(std::int64_t v) { return v < 0 ? "-" : std::to_string(v); }

void print(const std::string& text, bool json) {
  // Rows come from a shared file anyone can write: what is printed stays valid UTF-8.
  std::fputs(json ? text.c_str() : printable(text, true).c_str(), stdout);
}

std::string dump(const Json& j) {
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

Json policy_json(const Policy& p) {
  return {{"persistent", p.persistent}, {"transient", p.transient}, {"silent", p.silent}, {"unconfirmed", p.unconfirmed}};
}

Json summary_json(const HostSummary& h) {
  return {{"host", h.host},   {"drain", h.drain}, {"why", h.why},     {"findings", h.findings},
          {"rows", h.rows},   {"runs", h.runs},   {"jobs", h.jobs},   {"devices", h.devices},
          {"first", h.first}, {"last", h.last},   {"last_action", h.last_action}};
}

Json entry_json(const Entry& e) {
  return {{"id", e.id},       {"time", e.time},         {"host", e.host},           {"device", e.device},
          {"rank", e.rank},   {"run", e.run},           {"slurm_job_id", e.job},    {"step", e.step},
          {"verdict", e.verdict}, {"exit_code", e.exit_code}, {"action", e.action}, {"evidence", e.evidence}};
}

Options options_of(const Args& a) { return Options{a.busy_timeout}; }

// ---- the actions ----

Status do_record(const Args& a, int*) {
  Entry e = a.entry;
  if (e.job.empty())
    if (const char* job = std::getenv("SLURM_JOB_ID")) e.job = job;
  return record(a.paths[0], e, options_of(a));
}

Status do_list(const Args& a, int*) {
  std::vector<Entry> rows;
  CULPRIT_RETURN_IF_ERROR(read(a.paths[0], a.host, options_of(a), &rows));
  const auto hosts = summarize(rows, a.policy);
  if (a.json) {
    Json out = {{"record", "ledger-list"}, {"version", 1}, {"ledger", a.paths[0]},
                          {"policy", policy_json(a.policy)}, {"hosts", Json::array()}};
    for (const auto& h : hosts) out["hosts"].push_back(summary_json(h));
    print(dump(out), true);
    return Status::OK();
  }
  if (hosts.empty()) {
    print("no verdicts" + (a.host.empty() ? std::string() : " for host " + a.host) + " in " + a.paths[0] + "\n", false);
    return Status::OK();
  }
  std::vector<std::vector<std::string>> cells = {
      {"HOST", "DRAIN", "FINDINGS", "RUNS", "JOBS", "DEVICES", "FIRST", "LAST", "LAST-ACTION"}};
  for (const auto& h : hosts)
    cells.push_back({h.host, h.drain ? "yes" : "no", findings_text(h), std::to_string(h.runs), std::to_string(h.jobs),
                     dash(joined(h.devices, ",")), h.first, h.last, dash(h.last_action)});
  print(table(cells), false);
  return Status::OK();
}

// HOST's summary under the policy (an empty one when the ledger holds nothing on it).
HostSummary standing(const std::vector<Entry>& rows, const Args& a) {
  const auto hosts = summarize(rows, a.policy);
  HostSummary none;
  none.host = a.paths[1];
  return hosts.empty() ? none : hosts[0];
}

std::string standing_line(const HostSummary& h) {
  return h.host + ": " + std::to_string(h.rows) + " verdict(s) in " + std::to_string(h.runs) + " run(s), " +
         std::to_string(h.jobs) + " job(s); " +
         (h.drain ? "over the drain policy: " + h.why : std::string("not over the drain policy")) + "\n";
}

Status do_explain(const Args& a, int*) {
  std::vector<Entry> rows;
  CULPRIT_RETURN_IF_ERROR(read(a.paths[0], a.paths[1], options_of(a), &rows));
  const HostSummary h = standing(rows, a);
  if (a.json) {
    Json out = {{"record", "ledger-explain"}, {"version", 1},      {"ledger", a.paths[0]},
                          {"host", a.paths[1]},         {"drain", h.drain},  {"why", h.why},
                          {"policy", policy_json(a.policy)}, {"rows", Json::array()}};
    for (const auto& e : rows) out["rows"].push_back(entry_json(e));
    print(dump(out), true);
    return Status::OK();
  }
  if (rows.empty()) {
    print(a.paths[1] + ": no verdicts in " + a.paths[0] + "\n", false);
    return Status::OK();
  }
  std::vector<std::vector<std::string>> cells = {
      {"TIME", "RUN", "JOB", "STEP", "VERDICT", "DEVICE", "RANK", "EXIT", "ACTION", "EVIDENCE"}};
  for (const auto& e : rows)
    cells.push_back({e.time, e.run, dash(e.job), dash(e.step), e.verdict, dash(e.device), dash(e.rank),
                     dash(e.exit_code), e.action, e.evidence});
  print(standing_line(h) + table(cells), false);
  return Status::OK();
}

Status do_suspects(const Args& a, int*) {
  std::vector<Entry> rows;
  CULPRIT_RETURN_IF_ERROR(read(a.paths[0], "", options_of(a), &rows));
  std::string out;
  for (const auto& h : summarize(rows, a.policy))
    if (h.drain) out += h.host + "\n";
  print(out, false);
  return Status::OK();
}

Status do_check(const Args& a, int* code) {
  std::vector<Entry> rows;
  CULPRIT_RETURN_IF_ERROR(read(a.paths[0], a.paths[1], options_of(a), &rows));
  const HostSummary h = standing(rows, a);
  print(standing_line(h), false);
  // Over the policy is a finding about hardware, the same as a halt's: exit 10, which the job
  // scripts already treat as "exclude this host" (README.md, "Exit codes").
  if (h.drain) *code = kExitHardware;
  return Status::OK();
}

Rows with(Rows a, const Rows& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Sub {
  const char* name;
  const char* summary;
  std::string usage;
  std::size_t paths;  // DB, or DB HOST
  std::function<Rows()> rows;
  std::function<Status(const Args&, int*)> body;
};

const std::vector<Sub>& subs() {
  const auto json = opts::flag<Args>("json", &Args::json, "print JSON (docs/ledger.md)");
  static const std::vector<Sub> all = {
      {"record", "append one verdict row (the job script, after a verdict)",
       "culprit ledger record DB --host H --verdict V --run RUN [--device D] [--rank R] [--step S] [--exit-code C] "
       "[--job J] [--action A] [--evidence TEXT]",
       1, record_rows, do_record},
      {"list", "the suspects, one line per host, most suspicious first",
       "culprit ledger list DB [--host H] [--json] [policy options]", 1,
       [=] {
         return with(with(common_rows("the ledger file"),
                          {opts::text<Args>("host", &Args::host, "this host only"), json}),
                     policy_rows());
       },
       do_list},
      {"explain", "every verdict row of HOST, oldest first: why it is suspected",
       "culprit ledger explain DB HOST [--json] [policy options]", 2,
       [=] { return with(with(common_rows("the ledger file and the host"), {json}), policy_rows()); }, do_explain},
      {"suspects", "the hosts over the drain policy, one a line (nothing when none; exit 0)",
       "culprit ledger suspects DB [--persistent N] [--transient N] [--silent N] [--unconfirmed N]", 1,
       [] { return with(common_rows("the ledger file"), policy_rows()); }, do_suspects},
      {"check", "exit 10 when HOST is over the drain policy, 0 when not",
       "culprit ledger check DB HOST [--persistent N] [--transient N] [--silent N] [--unconfirmed N]   "
       "(exit 0 not over, 10 over the policy)",
       2, [] { return with(common_rows("the ledger file and the host"), policy_rows()); }, do_check},
  };
  return all;
}

opts::Table<Args> table_of(const Sub& s) {
  return opts::Table<Args>(std::string("culprit ledger ") + s.name + " options", with(s.rows(), {busy_row()}),
                           /*config=*/false);
}

std::string sub_help(const Sub& s) { return "usage: " + s.usage + "\n\n" + table_of(s).help(); }

std::string help() {
  std::string out =
      "usage: culprit ledger ACTION DB [...]   (the fleet's suspicion ledger, a SQLite file: docs/ledger.md)\n\n"
      "actions:\n";
  for (const auto& s : subs()) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-9s %s\n", s.name, s.summary);
    out += line;
  }
  out +=
      "\nThe drain policy: a host is over it with at least --persistent (1) hardware-persistent, --transient (2)\n"
      "hardware-transient, --silent (2) silent-rank or --unconfirmed (1) hardware-unconfirmed/hardware findings,\n"
      "counted over every job and run in the ledger (one per run and step). Exit codes: 0; 2 bad input (no such\n"
      "ledger, a bad option); 4 not a culprit ledger or damaged; 6 the file could not be written or read, or\n"
      "stayed locked past --busy-timeout; check: 10 over the policy.\n";
  for (const auto& s : subs()) out += "\n" + sub_help(s);
  return out;
}

int run_sub(const Sub& s, const std::vector<std::string>& args) {
  const auto options = table_of(s);
  const std::string name = s.name;
  const std::size_t paths = s.paths;
  return cli::run_local<Args>(
      args, options, s.usage,
      [=](Args* a) {
        if (a->paths.size() != paths)
          return Status::BadInput("ledger " + name + " takes " +
                                  (paths == 1 ? std::string("one path, the ledger file") : "the ledger file and a host") +
                                  " (see culprit ledger " + name + " --help)");
        if (paths == 2 && a->paths[1].empty()) return Status::BadInput("ledger " + name + ": the host is empty");
        return Status::OK();
      },
      s.body);
}

}  // namespace

cli::Command ledger_command() {
  return {"ledger", "the fleet's suspicion ledger across jobs (SQLite): record, list, explain, suspects, check",
          help, [](const std::vector<std::string>& args) {
            std::string names;
            for (const auto& s : subs()) names += (names.empty() ? "" : ", ") + std::string(s.name);
            if (args.empty()) {
              cli::error_line("ledger needs an action: " + names + " (see culprit ledger --help)");
              return static_cast<int>(kExitUsage);
            }
            if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
              std::printf("%s", help().c_str());
              return static_cast<int>(kExitOk);
            }
            for (const auto& s : subs())
              if (args[0] == s.name) return run_sub(s, {args.begin() + 1, args.end()});
            cli::error_line("unknown ledger action '" + args[0] + "' (valid: " + names + "; see culprit ledger --help)");
            return static_cast<int>(kExitUsage);
          }};
}

}  // namespace culprit::ledger
