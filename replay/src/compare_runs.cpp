// culprit audit --compare: where two runs meant to be identical part ways (one process; no replay).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "culprit/checkpoint.h"
#include "culprit/exit_codes.h"
#include "culprit/replay.h"
#include "culprit/trace.h"

namespace culprit::replay {

namespace {

// One rank's step rows of a run (every rank records the same update), by step.
Status step_rows(const std::string& run_dir, trace::Header* h, std::map<std::int64_t, trace::StepRow>* rows) {
  const auto files = trace::list(run_dir);
  if (files.empty()) return Status::OK();
  // The lowest rank's files, all of them (a --trace-keep run has several).
  trace::FileName first;
  if (!trace::parse_file_name(std::filesystem::path(files[0]).filename().string(), &first)) return Status::OK();
  for (const auto& path : trace::list_rank(run_dir, first.rank)) {
    trace::TraceFile tf;
    CULPRIT_RETURN_IF_ERROR(trace::read(path, &tf));
    *h = tf.header;
    for (const auto& s : tf.steps) (*rows)[s.step] = s;
  }
  return Status::OK();
}

}  // namespace

Status compare_runs(const std::string& a, const std::string& b, std::string* report) {
  std::string out;
  // Common checkpoints, verified; the state fingerprints bracket the divergence.
  std::map<std::int64_t, std::string> ca, cb;
  for (const auto& [s, p] : ckpt::list(a)) ca[s] = p;
  for (const auto& [s, p] : ckpt::list(b)) cb[s] = p;
  for (const auto& r : {a, b})
    if (ckpt::list(r).empty() && trace::list(r).empty())
      return Status::BadInput("'" + r + "' holds neither checkpoints nor a trace");
  std::vector<std::int64_t> common;
  for (const auto& [s, p] : ca)
    if (cb.count(s)) common.push_back(s);
  auto same_state = [&](std::int64_t s, bool* same) -> Status {
    ckpt::Checkpoint x, y;
    CULPRIT_RETURN_IF_ERROR(ckpt::read(ca[s], &x, /*verify=*/true));
    CULPRIT_RETURN_IF_ERROR(ckpt::read(cb[s], &y, /*verify=*/true));
    *same = x.state_fingerprint == y.state_fingerprint;
    return Status::OK();
  };
  // Binary search for the first common checkpoint whose states differ (once apart, runs stay apart).
  std::int64_t good = -1, bad = -1;
  std::size_t lo = 0, hi = common.size();
  int reads = 0;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    bool same = false;
    CULPRIT_RETURN_IF_ERROR(same_state(common[mid], &same));
    ++reads;
    if (same) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0) good = common[lo - 1];
  if (lo < common.size()) bad = common[lo];
  out += "checkpoints: " + std::to_string(common.size()) + " common, " + std::to_string(reads) + " compared; " +
         (good >= 0 ? "equal through step " + std::to_string(good) : std::string("none equal")) +
         (bad >= 0 ? ", different from step " + std::to_string(bad) : std::string(", none different")) + "\n";
  // Within the bracket, the traces give the first differing step and tensor.
  trace::Header ha, hb;
  std::map<std::int64_t, trace::StepRow> ra, rb;
  CULPRIT_RETURN_IF_ERROR(step_rows(a, &ha, &ra));
  CULPRIT_RETURN_IF_ERROR(step_rows(b, &hb, &rb));
  std::int64_t first = -1;
  std::string tensor;
  if (!ra.empty() && !rb.empty()) {
    if (ha.params != hb.params) return Status::BadInput("the runs train different models (their parameters differ)");
    for (const auto& [s, row] : ra) {
      if (s <= good) continue;
      if (bad >= 0 && s > bad) break;
      auto it = rb.find(s);
      if (it == rb.end()) continue;
      if (row.param_fps == it->second.param_fps && row.grad_fp == it->second.grad_fp) continue;
      first = s;
      for (std::size_t i = 0; i < row.param_fps.size() && i < it->second.param_fps.size(); ++i)
        if (row.param_fps[i] != it->second.param_fps[i]) {
          tensor = ha.params[i];
          break;
        }
      if (tensor.empty()) tensor = "(the reduced gradient)";
      break;
    }
  }
  if (first < 0 && bad >= 0) {
    // No trace to narrow it down: the checkpoint step, and its first differing tensor.
    ckpt::Checkpoint x, y;
    CULPRIT_RETURN_IF_ERROR(ckpt::read(ca[bad], &x, true));
    CULPRIT_RETURN_IF_ERROR(ckpt::read(cb[bad], &y, true));
    for (std::size_t i = 0; i < x.model.size() && i < y.model.size(); ++i)
      if (x.model[i].bytes != y.model[i].bytes) {
        tensor = x.model[i].name;
        break;
      }
    first = bad;
    out += "(no trace between the checkpoints: the divergence is located to the checkpoint interval)\n";
  }
  if (first < 0) {
    out += "the runs agree bitwise everywhere they can be compared\n";
    *report = out;
    return Status::OK();
  }
  out += "first differing step: " + std::to_string(first) + "\nfirst differing tensor: " + tensor + "\n";
  *report = out;
  return Status::Differs("the runs differ from step " + std::to_string(first) + " ('" + tensor + "')");
}

}  // namespace culprit::replay
