// culprit audit --run-dir (optionally one share of a job array) and audit --merge: every interval
// between consecutive valid checkpoints replayed alone on one rank, against the trace and the next
// checkpoint. The report is records::AuditReport (RUN/audit.json, docs/records.md); intervals
// travel between ranks as that record's interval entries.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "culprit/watchdog.h"
#include "culprit/replay.h"
#include "culprit/run_files.h"

namespace culprit::replay {

namespace fs = std::filesystem;
using records::AuditReport;
using records::IntervalResult;

namespace {

using Ckpts = std::vector<std::pair<std::int64_t, std::string>>;

// Collective: the run's checkpoints that verify, in step order (each rank verifies every W-th; the
// ranks agree), and on rank 0 the messages of the damaged ones.
// Damaged checkpoints are reported and left out; a foreign or renamed one ends the audit (agreed).
Status verify_checkpoints(const RunRecord& run, const Comm& comm, Ckpts* valid, std::vector<std::string>* damaged) {
  const auto all = ckpt::list(run.cfg.run_dir);
  std::vector<int> ok(all.size(), 1);
  std::vector<std::string> mine;
  Status foreign;
  for (std::size_t j = 0; j < all.size(); ++j) {
    if (static_cast<int>(j % comm.size) != comm.rank) continue;
    ckpt::Checkpoint c;
    Status st = ckpt::read(all[j].second, &c, /*verify=*/true);
    if (!st.ok()) ok[j] = 0, mine.push_back(st.message());
    if (st.ok() && foreign.ok()) foreign = ckpt::belongs(all[j].second, c, run.cfg.run_id);
  }
  CULPRIT_COLLECTIVE(comm, "the audit", MPI_Iallreduce(MPI_IN_PLACE, ok.data(), static_cast<int>(ok.size()), MPI_INT, MPI_MIN, comm.comm, &_culprit_req));
  *damaged = gather_lines(comm, mine);
  for (std::size_t j = 0; j < all.size(); ++j)
    if (ok[j]) valid->push_back(all[j]);
  return agree(comm, foreign);
}

// The replay of one interval must end in the next checkpoint's parameters ("" when it does).
std::string end_state_difference(const StepResult& last, const std::vector<std::string>& params, const std::string& next,
                                 Status* st) {
  ckpt::Checkpoint c;
  *st = ckpt::read(next, &c, /*verify=*/false);  // verified by verify_checkpoints
  if (!st->ok()) return "";
  for (std::size_t p = 0; p < params.size() && p < last.param_fps.size(); ++p)
    for (const auto& t : c.model)
      if (t.name == params[p] && fingerprint_bytes(t.bytes.data(), t.bytes.size()) != last.param_fps[p])
        return "the replay does not end in " + next + " ('" + params[p] + "' differs)";
  return "";
}

// One interval replayed alone (`solo`): *out says whether it reproduced; an error when the replay
// itself could not run.
Status audit_interval(const RunRecord& run, const Comm& solo, const Ckpts& ckpts, std::size_t i, IntervalResult* out) {
  ckpt::Checkpoint start;
  // verify_checkpoints has verified it (on whichever rank): read here, not verified again.
  CULPRIT_RETURN_IF_ERROR(ckpt::read(ckpts[i].second, &start, /*verify=*/false));
  std::unique_ptr<harness::Engine> engine;
  CULPRIT_RETURN_IF_ERROR(harness::Engine::open(run.cfg, solo, start, ckpts[i].second,
                                                run.trace.header.level == trace::Level::kLayer, &engine));
  const Schema schema = schema_of(*engine, run.trace);
  const std::int64_t to = ckpts[i + 1].first;
  std::string verdict;
  StepResult sr;
  while (engine->step() < to && verdict.empty()) {
    CULPRIT_RETURN_IF_ERROR(engine->run_step(&sr));
    const StepComparison cmp = compare_step(sr, run.trace, schema, engine.get());
    const std::string T = std::to_string(sr.step);
    if (!cmp.shards.empty()) {
      const auto& m = cmp.shards[0];
      verdict = "step " + T + " micro-shard " + std::to_string(m.shard) + " (recorded by rank " +
                std::to_string(m.recorded_by) + " on " + m.host + ") differs " + m.diff.describe();
    } else if (cmp.update) {
      verdict = "step " + T + ": " + cmp.update.describe();
    }
  }
  Status st;
  if (verdict.empty()) verdict = end_state_difference(sr, schema.params, ckpts[i + 1].second, &st);
  CULPRIT_RETURN_IF_ERROR(st);
  out->from = ckpts[i].first;
  out->to = to;
  out->reproduced = verdict.empty();
  out->detail = verdict;
  return Status::OK();
}

// Prints the report; its verdict: OK, or kDiffers naming the first interval that does not reproduce.
Status print_report(const AuditReport& a, const std::string& how, const std::string& written) {
  std::printf("culprit audit: %s, %zu interval(s) %s\n", a.run_dir.c_str(), a.intervals.size(), how.c_str());
  for (const auto& d : a.damaged) std::printf("damaged checkpoint skipped: %s\n", d.c_str());
  for (const auto& r : a.intervals) std::printf("%s\n", records::interval_line(r).c_str());
  if (!written.empty()) std::printf("report: %s\n", written.c_str());
  std::fflush(stdout);
  if (const IntervalResult* bad = a.first_bad())
    return Status::Differs(std::to_string(a.mismatches()) + " interval(s) do not reproduce; first: " +
                           records::interval_line(*bad));
  return Status::OK();
}

// Collective: this rank's share of the intervals (interval i belongs to share i mod N; the share's
// n-th to rank n mod W), each replayed alone. Rank 0 gets every rank's results, by `from`.
Status audit_share(const AuditOptions& opt, const RunRecord& run, const Ckpts& ckpts, const Comm& comm,
                   std::vector<IntervalResult>* results) {
  std::vector<std::size_t> share_intervals;
  for (std::size_t i = 0; i + 1 < ckpts.size(); ++i)
    if (static_cast<int>(i % opt.shares) == opt.share) share_intervals.push_back(i);
  // Each rank alone: MPI_COMM_SELF, no collective (a rank stopped here would hang a split).
  const Comm solo{MPI_COMM_SELF, 0, 1, comm.host};
  std::vector<std::string> mine;
  Status failure;
  for (std::size_t n = 0; n < share_intervals.size() && failure.ok(); ++n) {
    if (static_cast<int>(n % comm.size) != comm.rank) continue;
    IntervalResult r;
    failure = audit_interval(run, solo, ckpts, share_intervals[n], &r);
    r.rank = comm.rank;
    r.share = opt.share;
    if (failure.ok()) mine.push_back(records::to_json_line(r));
  }
  CULPRIT_RETURN_IF_ERROR(agree(comm, failure));
  Status parsed;  // on rank 0, which alone holds the lines: every rank learns how it went
  for (const auto& line : gather_lines(comm, mine)) {
    IntervalResult r;
    if (parsed.ok()) parsed = records::from_json_line(line, &r);
    results->push_back(r);
  }
  std::sort(results->begin(), results->end(), [](const auto& a, const auto& b) { return a.from < b.from; });
  return broadcast_status(comm, parsed);
}

}  // namespace

Status audit(const AuditOptions& opt, const Comm& given) {
  const Watched watched(given, opt.collective_timeout);
  const Comm& comm = watched.comm();
  if (opt.shares < 1 || opt.share < 0 || opt.share >= opt.shares)
    return agree(comm, Status::BadInput("option '--share': " + std::to_string(opt.share) + "/" +
                                        std::to_string(opt.shares) + " is not I/N with 0 <= I < N"));
  Status locked;
  // Shared: the shares of an array audit read the run side by side; no writer of it meanwhile.
  std::error_code ec;
  if (comm.rank == 0 && fs::exists(fs::path(opt.run_dir) / "run.json", ec))
    locked = files::lock_run_dir(opt.run_dir, "audit", files::Lock::kShared);
  CULPRIT_RETURN_IF_ERROR(agree(comm, locked));
  RunRecord run;
  CULPRIT_RETURN_IF_ERROR(load_run(opt.run_dir, comm, &run));
  const auto t0 = MPI_Wtime();
  AuditReport report;
  report.run_dir = opt.run_dir;
  report.share = opt.share;
  report.shares = opt.shares;
  report.world_size = comm.size;
  Ckpts ckpts;
  CULPRIT_RETURN_IF_ERROR(verify_checkpoints(run, comm, &ckpts, &report.damaged));
  if (ckpts.size() < 2)
    return agree(comm, Status::BadInput("'" + opt.run_dir + "' holds " + std::to_string(ckpts.size()) +
                                        " valid checkpoint(s): an audit needs two (an interval)"));
  for (std::size_t i = 0; i + 1 < ckpts.size(); ++i) report.all_intervals.push_back({ckpts[i].first, ckpts[i + 1].first});
  if (comm.rank == 0) {  // what the wait is for, as bisect says it (stderr: stdout is the report)
    std::fprintf(stderr, "culprit audit: replaying %zu interval(s) on %d rank(s)\n", report.all_intervals.size(), comm.size);
    std::fflush(stderr);
  }
  CULPRIT_RETURN_IF_ERROR(audit_share(opt, run, ckpts, comm, &report.intervals));
  Status verdict;
  if (comm.rank == 0) {
    // A share writes its part for --merge; a whole audit writes RUN/audit.json.
    const std::string path = opt.shares > 1 ? records::audit_part_path(opt.run_dir, opt.share, opt.shares)
                                            : records::audit_path(opt.run_dir);
    report.seconds = MPI_Wtime() - t0;
    const Status written = records::write_audit(path, report);
    const std::string how = "on " + std::to_string(comm.size) + " rank(s)" +
                            (opt.shares > 1 ? ", share " + std::to_string(opt.share) + " of " +
                                                  std::to_string(opt.shares) + " (" +
                                                  std::to_string(report.all_intervals.size()) + " in the run)"
                                            : "");
    verdict = print_report(report, how, written.ok() ? path : "");
    std::printf("audited in %.2f s\n", MPI_Wtime() - t0);
    std::fflush(stdout);
    if (!written.ok()) verdict = written;
  }
  return broadcast_status(comm, verdict);  // rank 0 decided
}

Status merge_audit(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "audit";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::BadInput("'" + dir.string() + "' does not exist: no audit share has written its part");
  // Like a share: no writer of the run while the parts become RUN/audit.json.
  if (fs::exists(fs::path(run_dir) / "run.json", ec))
    CULPRIT_RETURN_IF_ERROR(files::lock_run_dir(run_dir, "audit --merge", files::Lock::kShared));
  // The parts, by their N; exactly one N may be present.
  std::map<int, std::map<int, std::string>> parts;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int i = -1, n = -1;
    const std::string name = e.path().filename().string();
    if (std::sscanf(name.c_str(), "part-%d-of-%d.json", &i, &n) == 2 && name.size() == 22 && i >= 0 && i < n &&
        name == fs::path(records::audit_part_path(run_dir, i, n)).filename().string())
      parts[n][i] = e.path().string();
  }
  if (parts.empty()) return Status::BadInput("'" + dir.string() + "' holds no part-I-of-N.json");
  if (parts.size() > 1)
    return Status::BadInput("'" + dir.string() + "' holds parts of audits with different share counts (" +
                            std::to_string(parts.begin()->first) + " and " + std::to_string(parts.rbegin()->first) + ")");
  const int shares = parts.begin()->first;
  const auto& files = parts.begin()->second;
  std::string missing;
  for (int i = 0; i < shares; ++i)
    if (!files.count(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
  if (!missing.empty())
    return Status::BadInput("the audit of '" + run_dir + "' in " + std::to_string(shares) + " shares lacks share(s) " +
                            missing + " (did every array task finish?)");
  AuditReport merged;
  merged.run_dir = run_dir;
  merged.shares = shares;
  merged.merged = true;
  std::set<std::string> damaged;
  for (const auto& [i, path] : files) {
    AuditReport part;
    CULPRIT_RETURN_IF_ERROR(records::read_audit(path, &part));
    if (i == files.begin()->first) merged.all_intervals = part.all_intervals;
    if (part.all_intervals != merged.all_intervals)
      return Status::BadInput("'" + path + "' audited other intervals than share 0 (checkpoints changed between the "
                              "array's tasks?)");
    damaged.insert(part.damaged.begin(), part.damaged.end());
    merged.intervals.insert(merged.intervals.end(), part.intervals.begin(), part.intervals.end());
    merged.seconds = std::max(merged.seconds, part.seconds);
  }
  std::sort(merged.intervals.begin(), merged.intervals.end(), [](const auto& a, const auto& b) { return a.from < b.from; });
  std::vector<std::pair<std::int64_t, std::int64_t>> got;
  for (const auto& r : merged.intervals) got.push_back({r.from, r.to});
  if (got != merged.all_intervals)
    return Status::BadInput("the parts of the audit of '" + run_dir + "' cover " + std::to_string(got.size()) + " of " +
                            std::to_string(merged.all_intervals.size()) + " intervals");
  merged.damaged.assign(damaged.begin(), damaged.end());
  const std::string path = records::audit_path(run_dir);
  CULPRIT_RETURN_IF_ERROR(records::write_audit(path, merged));
  return print_report(merged, "merged from " + std::to_string(shares) + " share(s)", path);
}

}  // namespace culprit::replay
