// The trace's reader: one rank's file (every committed row, its checksum verified in format 3) and
// a run's files merged. Writer: trace.cpp.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>

#include "culprit/checkpoint_format.h"
#include "culprit/run_files.h"
#include "culprit/trace.h"
#include "trace_columns.h"

namespace culprit::trace {

namespace fs = std::filesystem;
using namespace culprit::format;
using namespace detail;

namespace {

// Every trace file of `run_dir` (rank < 0: of every rank) in reading order.
std::vector<std::string> list_files(const std::string& run_dir, int rank) {
  std::vector<std::pair<std::pair<int, std::int64_t>, std::string>> found;
  std::error_code ec;
  const fs::path dir = fs::path(run_dir) / kTraceDir;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    FileName n;
    if (!parse_file_name(e.path().filename().string(), &n) || (rank >= 0 && n.rank != rank)) continue;
    found.push_back({{n.rank, n.through < 0 ? INT64_MAX : n.through}, e.path().string()});  // live last
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

bool has_gap(const std::vector<Fingerprint>& v) { return std::find(v.begin(), v.end(), Fingerprint{0}) != v.end(); }

// A micro-shard's row: the newest of its rank, or (two ranks' rows that each left some layer
// unrecorded: a tensor-parallel group's) one more member of its group, shown merged.
void add_shard_row(const ShardRow& r, std::map<std::pair<std::int64_t, int>, ShardRow>* shards) {
  const std::pair<std::int64_t, int> key{r.step, r.shard};
  auto it = shards->find(key);
  if (it == shards->end() || !has_gap(r.fwd) || !has_gap(it->second.fwd)) {
    (*shards)[key] = r;
    return;
  }
  std::vector<ShardRow> group = it->second.group;
  if (group.empty()) group.push_back(it->second);
  bool replaced = false;
  for (auto& m : group)
    if (m.rank == r.rank) m = r, replaced = true;
  if (!replaced) group.push_back(r);
  std::sort(group.begin(), group.end(), [](const ShardRow& a, const ShardRow& b) { return a.rank < b.rank; });
  it->second = merged_view(group, 0);
}

}  // namespace

ShardRow merged_view(const std::vector<ShardRow>& group, std::size_t who) {
  ShardRow v = group[who];
  v.group.clear();
  for (const auto& m : group)
    for (std::size_t i = 0; i < v.fwd.size() && i < m.fwd.size(); ++i) {
      if (v.fwd[i] == 0) v.fwd[i] = m.fwd[i];
      if (i < v.bwd.size() && i < m.bwd.size() && v.bwd[i] == 0) v.bwd[i] = m.bwd[i];
    }
  v.group = group;
  return v;
}

std::vector<std::string> list(const std::string& run_dir) { return list_files(run_dir, -1); }
std::vector<std::string> list_rank(const std::string& run_dir, int rank) { return list_files(run_dir, rank); }

const StepRow* RunTrace::step(std::int64_t s) const {
  for (int r : ranks) {
    auto it = steps.find({r, s});
    if (it != steps.end()) return &it->second;
  }
  return nullptr;
}

Status read_run(const std::string& run_dir, RunTrace* out, const std::string& run_id) {
  *out = RunTrace();
  const auto paths = list(run_dir);
  if (paths.empty())
    return Status::BadInput("no trace in '" + run_dir + "/" + kTraceDir + "' (was the run trained with --trace off?)");
  for (std::size_t i = 0; i < paths.size(); ++i) {
    TraceFile tf;
    const Status st = read(paths[i], &tf);
    // A file of the run under a trace's name that is no trace (a directory there) is damage to the
    // run, as verify says, not a bad input of the user's.
    if (st.code() == StatusCode::kBadInput) return Status::Damaged(st.message());
    CULPRIT_RETURN_IF_ERROR(st);
    CULPRIT_RETURN_IF_ERROR(files::same_run(paths[i], tf.header.run_id, run_id));
    // The lowest rank's header, from its newest file; the faults of every file of that rank.
    const bool lowest = out->ranks.empty() || out->ranks.front() == tf.header.rank;
    if (lowest) {
      std::vector<std::string> faults = out->header.faults;
      for (const auto& f : tf.header.faults)
        if (std::find(faults.begin(), faults.end(), f) == faults.end()) faults.push_back(f);
      out->header = tf.header;
      out->header.faults = faults;
    }
    out->verified = out->verified && tf.verified;
    if (out->ranks.empty() || out->ranks.back() != tf.header.rank) out->ranks.push_back(tf.header.rank);
    for (const auto& s : tf.steps) {
      out->steps[{tf.header.rank, s.step}] = s;
      out->first_step = out->first_step ? std::min(out->first_step, s.step) : s.step;
      out->last_step = std::max(out->last_step, s.step);
    }
    for (const auto& r : tf.shards) add_shard_row(r, &out->shards);
  }
  return Status::OK();
}

Status read(const std::string& path, TraceFile* out) {
  h5::Handle f;
  Status st = h5::open_read(path, &f);
  if (!st.ok()) return st.prefixed("trace '" + path + "'");
  return read_open(f, path, out);
}

Status read_open(const h5::Handle& f, const std::string& path, TraceFile* out) {
  *out = TraceFile();
  const std::string where = "trace '" + path + "'";
  Status st = read_header(f.id(), &out->header);
  if (!st.ok()) return st.prefixed(where);
  std::int64_t steps = 0, shards = 0;
  st = h5::read_attr(f.id(), kAttrStepsCommitted, &steps);
  if (st.ok()) st = h5::read_attr(f.id(), kAttrShardsCommitted, &shards);
  if (!st.ok()) return st.prefixed(where);
  if (steps < 0 || shards < 0 || steps > (1LL << 40) || shards > (1LL << 40))
    return Status::Damaged(where + ": implausible committed counts");
  for (const char* g : {"steps", "shards"}) {
    if (H5Lexists(f.id(), g, H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return Status::Damaged(where + " has no group '/" + g + "'");
    }
  }
  h5::Handle sg(H5Gopen2(f.id(), "steps", H5P_DEFAULT), H5Gclose), hg(H5Gopen2(f.id(), "shards", H5P_DEFAULT), H5Gclose);
  const std::string sw = where + " /steps", hw = where + " /shards";
  CULPRIT_RETURN_IF_ERROR(get_rows(sg.id(), sw, out->header, steps, &out->steps, &out->torn_steps));
  CULPRIT_RETURN_IF_ERROR(get_rows(hg.id(), hw, out->header, shards, &out->shards, &out->torn_shards));
  out->verified = out->header.format_version >= 3;
  return Status::OK();
}

}  // namespace culprit::trace
