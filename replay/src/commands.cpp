// `culprit replay` and `culprit audit`: their options, declared once (culprit/options.h).
#include <cstdio>

#include "culprit/replay.h"
#include "culprit/watchdog.h"

namespace culprit::replay {

namespace {

Status set_ranks(Options* o, const std::string& text) {
  o->ranks.clear();
  for (std::size_t pos = 0; pos < text.size();) {
    const auto end = text.find(',', pos);
    const std::string item = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    std::int64_t r = 0;
    if (!opts::parse_number("ranks", item, &r).ok() || r < 0 || r > (1 << 30))
      return Status::BadInput("option '--ranks': '" + text +
                              "' is not a comma-separated list of ranks, each in [0, 1073741824] (and below the world size)");
    o->ranks.push_back(static_cast<int>(r));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return Status::OK();
}

std::string ranks_text(const Options& o) {
  std::string out;
  for (int r : o.ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out.empty() ? "all" : out;
}

Status set_micro_shard(Options* o, const std::string& text) {
  if (text == "all" || text == "-1") return o->micro_shard = -1, Status::OK();
  std::int64_t k = 0;
  CULPRIT_RETURN_IF_ERROR(opts::parse_number("micro-shard", text, &k));
  if (k < 0 || k > (1 << 20))
    return Status::BadInput("option '--micro-shard' must be a micro-shard's index in [0, 1048576] (below --micro-shards) or all, got " + text);
  o->micro_shard = static_cast<int>(k);
  return Status::OK();
}

const opts::Table<Options>& replay_options() {
  using O = Options;
  static const opts::Table<O> table("culprit replay options", {
      opts::text<O>("run-dir", &O::run_dir, "the run to replay", opts::kRequired),
      opts::number<O>("step", &O::step, "the step to examine, 1-based", opts::Range<std::int64_t>{1, harness::kMaxSteps},
                      opts::kRequired),
      opts::custom<O>("ranks", "comma-separated ranks that recompute the step's micro-shards", set_ranks, ranks_text),
      opts::custom<O>("micro-shard", "only this micro-shard", set_micro_shard,
                      [](const O& o) { return o.micro_shard < 0 ? std::string("all") : std::to_string(o.micro_shard); }),
      opts::choice<O>("trace", &O::trace,
                      "step | layer: layer compares every layer's forward output and backward gradient (when the run's "
                      "trace has them)"),
      opts::flag<O>("json", &O::json, "print the report as JSON (docs/records.md) instead of text"),
      opts::number<O>("collective-timeout", &O::collective_timeout, kCollectiveTimeoutHelp,
                      opts::Range<double>{1, 604800}.or_zero("wait forever")),
  });
  return table;
}

// culprit audit's three forms; exactly one is given.
struct AuditArgs {
  std::string run_dir, share = "0/1", merge;
  std::vector<std::string> compare;
  double collective_timeout = 300;
  AuditOptions audit;
};

const char* kAuditUsage =
    "mpirun -np W culprit audit --run-dir RUN [--share I/N]\n"
    "                                      replay every checkpoint interval (spread over the ranks)\n"
    "                                      against the trace and the next checkpoint; writes RUN/audit.json;\n"
    "                                      exit 0 all reproduce, 5 some do not (the first one named).\n"
    "                                      --share I/N: only intervals i with i mod N == I (a job array's\n"
    "                                      task I), written to RUN/audit/part-IIII-of-NNNN.json\n"
    "       culprit audit --merge RUN      one report from every share's part: RUN/audit.json; exit 0, 5,\n"
    "                                      or 2 when a share is missing or the parts disagree\n"
    "       culprit audit --compare RUN_A RUN_B\n"
    "                                      where two runs meant to be identical part ways: a binary search\n"
    "                                      over their common checkpoints, then their traces; exit 0 equal,\n"
    "                                      5 different (first differing step and tensor printed)";

Status set_share(AuditArgs* a, const std::string& text) {
  int i = -1, n = -1, used = 0;
  // %d of a number past int is undefined: at most 7 digits on each side (N <= 1000000).
  const auto slash = text.find('/');
  const bool short_enough = slash != std::string::npos && slash >= 1 && slash <= 7 && text.size() - slash - 1 >= 1 &&
                            text.size() - slash - 1 <= 7 && text.find_first_not_of("0123456789/") == std::string::npos;
  if (!short_enough || std::sscanf(text.c_str(), "%d/%d%n", &i, &n, &used) != 2 ||
      used != static_cast<int>(text.size()) || n < 1 || n > 1000000 || i < 0 || i >= n)
    return Status::BadInput("option '--share': '" + text + "' is not I/N with 0 <= I < N <= 1000000");
  a->share = text;
  a->audit.share = i;
  a->audit.shares = n;
  return Status::OK();
}

const opts::Table<AuditArgs>& audit_options() {
  using A = AuditArgs;
  static const opts::Table<A> table("culprit audit options", {
      opts::text<A>("run-dir", &A::run_dir, "the run whose checkpoint intervals to replay"),
      opts::number<A>("collective-timeout", &A::collective_timeout, kCollectiveTimeoutHelp,
                      opts::Range<double>{1, 604800}.or_zero("wait forever")),
      opts::custom<A>("share", "I/N: this array task's share of the intervals", set_share, [](const A& a) { return a.share; }),
      opts::text<A>("merge", &A::merge, "RUN: merge every share's part into RUN/audit.json"),
      opts::texts<A>("compare", &A::compare, "RUN_A RUN_B: where two runs meant to be identical differ", opts::kMultitoken),
  }, /*config=*/false);
  return table;
}

Status check_audit(AuditArgs* a) {
  const int forms = !a->run_dir.empty() + !a->merge.empty() + !a->compare.empty();
  if (forms != 1 || (!a->compare.empty() && a->compare.size() != 2) || (a->run_dir.empty() && a->share != "0/1"))
    return Status::BadInput("audit takes --run-dir RUN [--share I/N], --merge RUN or --compare RUN_A RUN_B "
                            "(see culprit audit --help)");
  a->audit.run_dir = a->run_dir;
  a->audit.collective_timeout = a->collective_timeout;
  return Status::OK();
}

bool has_arg(const std::vector<std::string>& args, const std::string& name) {
  for (const auto& a : args)
    if (a == name || a.rfind(name + "=", 0) == 0) return true;
  return false;
}

int run_audit(const std::vector<std::string>& args) {
  // Merging and comparing run in one process; the replay of intervals on every rank of the job.
  if (has_arg(args, "--merge") || has_arg(args, "--compare"))
    return cli::run_local<AuditArgs>(args, audit_options(), kAuditUsage, check_audit, [](const AuditArgs& a, int* code) {
      if (!a.merge.empty()) return merge_audit(a.merge);
      std::string report;
      Status st = compare_runs(a.compare[0], a.compare[1], &report);
      std::fputs(report.c_str(), stdout);
      // Runs that differ are the answer, printed in the report: an exit code, not an error line.
      if (st.code() == StatusCode::kDiffers) return *code = exit_code(st), Status::OK();
      return st;
    });
  return cli::run_mpi<AuditArgs>(args, audit_options(), kAuditUsage, check_audit,
                                 [](const AuditArgs& a, const Comm& comm, int*) { return audit(a.audit, comm); });
}

}  // namespace

cli::Command replay_command() {
  return {"replay", "re-execute a recorded step on chosen ranks and compare every fingerprint with the trace",
          [] { return replay_options().help(); },
          [](const std::vector<std::string>& args) {
            return cli::run_mpi<Options>(
                args, replay_options(), "mpirun -np W culprit replay --run-dir RUN --step S [options]", nullptr,
                [](const Options& o, const Comm& comm, int*) { return run(o, comm); });
          }};
}

cli::Command audit_command() {
  return {"audit",
          "replay every checkpoint interval (--run-dir, --share, --merge); --compare A B: where two runs meant to be "
          "identical differ",
          [] { return std::string(kAuditUsage) + "\n\n" + audit_options().help(); }, run_audit};
}

}  // namespace culprit::replay
