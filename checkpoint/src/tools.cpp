#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "culprit/checkpoint.h"
#include "culprit/checkpoint_format.h"
#include "culprit/checkpoint_tools.h"
#include "culprit/h5.h"
#include "culprit/run_files.h"
#include "culprit/trace.h"
#include "verify_run.h"

namespace culprit::ckpt {

namespace fs = std::filesystem;

namespace {

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

bool is_trace(const std::string& path) {
  h5::Handle f;
  if (!h5::open_read(path, &f).ok()) return false;
  const bool t = H5Lexists(f.id(), "shards", H5P_DEFAULT) > 0;
  H5Eclear2(H5E_DEFAULT);
  return t;
}

struct Entry {
  std::string path;
  const RawTensor* t;
};
std::vector<Entry> entries(const Checkpoint& c) {
  std::vector<Entry> v;
  for (const auto& t : c.model) v.push_back({"/model/" + t.name, &t});
  for (const auto& t : c.optimizer) v.push_back({"/optimizer/" + t.name, &t});
  for (const auto& t : c.rng) v.push_back({"/rng/" + t.name, &t});
  return v;
}

Status inspect_trace(const std::string& path, bool json, std::string* out) {
  trace::TraceFile tf;
  CULPRIT_RETURN_IF_ERROR(trace::read(path, &tf));
  if (json) {
    nlohmann::ordered_json j;
    j["file"] = path;
    j["kind"] = "trace";
    j["rank"] = tf.header.rank;
    j["world_size"] = tf.header.world_size;
    j["level"] = name_of(tf.header.level);
    j["forward_detail"] = name_of(tf.header.forward_detail);
    j["params"] = tf.header.params;
    j["layers"] = tf.header.layers;
    j["faults"] = tf.header.faults;
    j["torn_steps"] = tf.torn_steps;
    j["torn_shards"] = tf.torn_shards;
    j["format_version"] = tf.header.format_version;
    j["verified"] = tf.verified;
    for (const auto& s : tf.steps)
      j["steps"].push_back({{"step", s.step}, {"loss", s.loss}, {"lr", s.lr}, {"grad_fp", fingerprint_hex(s.grad_fp)}});
    for (const auto& r : tf.shards) {
      nlohmann::ordered_json row = {{"step", r.step}, {"shard", r.shard}, {"rank", r.rank}, {"host", r.host},
                                    {"device", r.device}, {"loss", r.loss}, {"grad_fp", fingerprint_hex(r.grad_fp)}};
      j["shards"].push_back(row);
    }
    *out = j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    return Status::OK();
  }
  std::ostringstream os;
  os << "trace " << path << ": rank " << tf.header.rank << " of " << tf.header.world_size << ", level "
     << name_of(tf.header.level) << " (" << name_of(tf.header.forward_detail) << "), " << tf.steps.size() << " steps, "
     << tf.shards.size() << " micro-shards\n";
  for (const auto& f : tf.header.faults) os << "  injected fault: " << f << "\n";
  if (tf.torn_steps || tf.torn_shards)
    os << "  torn tail: " << tf.torn_steps << " step row(s) and " << tf.torn_shards
       << " micro-shard row(s) beyond the committed counts ignored\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %8s  %14s  %16s  %s\n", "step", "loss", "grad fingerprint", "micro-shards (shard@rank)");
  os << line;
  std::size_t k = 0;
  for (const auto& s : tf.steps) {
    std::string shards;
    while (k < tf.shards.size() && tf.shards[k].step < s.step) ++k;
    for (std::size_t i = k; i < tf.shards.size() && tf.shards[i].step == s.step; ++i)
      shards += std::to_string(tf.shards[i].shard) + "@" + std::to_string(tf.shards[i].rank) + " ";
    std::snprintf(line, sizeof line, "  %8lld  %14.9g  %16s  %s\n", static_cast<long long>(s.step),
                  static_cast<double>(s.loss), fingerprint_hex(s.grad_fp).c_str(), shards.c_str());
    os << line;
  }
  *out = os.str();
  return Status::OK();
}

}  // namespace

Status inspect(const std::string& path, bool json, std::string* out) {
  if (is_trace(path)) return inspect_trace(path, json, out);
  Checkpoint c;
  CULPRIT_RETURN_IF_ERROR(read(path, &c, /*verify=*/false));
  Checkpoint copy = c;
  compute_fingerprints(&copy);
  const auto mine = entries(c), theirs = entries(copy);
  bool all_ok = copy.state_fingerprint == c.state_fingerprint;
  if (json) {
    nlohmann::ordered_json j;
    j["file"] = path;
    j["kind"] = "checkpoint";
    j["step"] = c.step;
    j["state_fingerprint"] = fingerprint_hex(c.state_fingerprint);
    for (const auto& [k, v] : c.meta) j["meta"][k] = v;
    for (const auto& [k, v] : c.meta_int) j["meta"][k] = v;
    j["data"] = {{"epoch", c.epoch}, {"cursor", c.cursor}};
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const bool ok = mine[i].t->fingerprint == theirs[i].t->fingerprint;
      all_ok = all_ok && ok;
      j["datasets"].push_back({{"name", mine[i].path}, {"dtype", dtype_name(mine[i].t->dtype)},
                               {"shape", mine[i].t->shape}, {"fingerprint", fingerprint_hex(mine[i].t->fingerprint)},
                               {"verified", ok}});
    }
    j["valid"] = all_ok;
    *out = j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    return Status::OK();
  }
  std::ostringstream os;
  os << "checkpoint " << path << ": step " << c.step << ", epoch " << c.epoch << ", cursor " << c.cursor << "\n";
  for (const auto& [k, v] : c.meta_int) os << "  " << k << " = " << v << "\n";
  for (const auto& [k, v] : c.meta)
    if (k != "config") os << "  " << k << " = " << v << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-44s %-8s %-14s %-16s %s\n", "dataset", "dtype", "shape", "fingerprint", "check");
  os << line;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const bool ok = mine[i].t->fingerprint == theirs[i].t->fingerprint;
    all_ok = all_ok && ok;
    std::snprintf(line, sizeof line, "  %-44s %-8s %-14s %-16s %s\n", mine[i].path.c_str(), dtype_name(mine[i].t->dtype),
                  shape_str(mine[i].t->shape).c_str(), fingerprint_hex(mine[i].t->fingerprint).c_str(),
                  ok ? "ok" : ("MISMATCH (computed " + fingerprint_hex(theirs[i].t->fingerprint) + ")").c_str());
    os << line;
  }
  os << "  state fingerprint " << fingerprint_hex(c.state_fingerprint) << ": "
     << (all_ok ? "verified" : "DAMAGED") << "\n";
  *out = os.str();
  return Status::OK();
}

Status verify(const std::string& path, std::string* report, bool* clean, bool* unreadable) {
  std::error_code ec;
  *clean = true;
  bool io = false, damage = false;
  // A file's failure: damage, or (an I/O error: permissions, EIO) a file that could not be checked.
  const auto failed = [&](const Status& st) {
    *clean = false;
    (st.code() == StatusCode::kIo ? io : damage) = true;
  };
  std::ostringstream os;
  std::vector<std::string> ckpts, traces;
  RunFacts facts;
  std::map<std::string, std::string> checkpoint_run_ids;  // and trace files'
  std::map<int, trace::TraceFile> trace_files;
  std::map<std::int64_t, int> checkpoint_worlds;  // step: the world that wrote it
  // What cannot even be looked at (a directory on the way without search permission) is an I/O
  // failure, not a missing run.
  struct stat st_path{};
  if (::stat(path.c_str(), &st_path) != 0 && errno != ENOENT && errno != ENOTDIR)
    return Status::IoError("cannot read '" + path + "': " + std::strerror(errno));
  if (fs::is_directory(path, ec)) {
    // A directory that cannot be listed would look like one holding nothing.
    if (::access(path.c_str(), R_OK | X_OK) != 0)
      return Status::IoError("cannot read the run directory '" + path + "': " + std::strerror(errno));
    CULPRIT_RETURN_IF_ERROR(files::check_not_in_use(path, "culprit verify"));
    CULPRIT_RETURN_IF_ERROR(read_run_facts(path, &facts));
    for (const auto& [step, p] : list(path)) ckpts.push_back(p);
    traces = trace::list(path);
    if (ckpts.empty() && traces.empty())
      return Status::BadInput("'" + path + "' holds no checkpoints and no trace (not a culprit run directory?)");
    // Leftover temporaries are a crash's trace, not damage.
    for (const auto& e : fs::directory_iterator(fs::path(path) / format::kCheckpointDir, ec))
      if (e.path().extension() == format::kTempSuffix)
        os << "note  " << e.path().string() << ": incomplete temporary (a write was interrupted); ignored\n";
  } else if (fs::exists(path, ec)) {
    (is_trace(path) ? traces : ckpts).push_back(path);
  } else {
    return Status::BadInput("'" + path + "' does not exist");
  }
  for (const auto& p : ckpts) {
    Checkpoint c;
    Status st = read(p, &c, true);
    if (st.ok() && facts.has_run_json) st = belongs(p, c, "");  // its name; its run: verify_run_whole
    if (st.ok()) {
      const auto id = c.meta.find(format::kMetaRunId);
      checkpoint_run_ids[p] = id == c.meta.end() ? "" : id->second;
      const auto world = c.meta_int.find("world_size");
      if (world != c.meta_int.end()) checkpoint_worlds[c.step] = static_cast<int>(world->second);
      os << "ok    " << p << " (step " << c.step << ", state " << fingerprint_hex(c.state_fingerprint) << ")\n";
    } else {
      failed(st);
      os << "FAIL  " << st.message() << "\n";
    }
  }
  for (const auto& p : traces) {
    trace::TraceFile tf;
    Status st = trace::read(p, &tf);
    if (st.ok()) {
      os << "ok    " << p << " (" << tf.steps.size() << " steps";
      if (tf.torn_steps || tf.torn_shards) os << ", torn tail of " << tf.torn_steps << " step row(s) ignored";
      os << (tf.verified ? ", every row's checksum verified" : ", format 2: its rows carry no checksums") << ")\n";
      checkpoint_run_ids[p] = tf.header.run_id;
      trace::FileName name;
      const bool named = trace::parse_file_name(fs::path(p).filename().string(), &name);
      const std::int64_t newest = tf.steps.empty() ? 0 : tf.steps.back().step;
      if (named && name.through >= 0 && newest > name.through) {
        *clean = false;
        os << "FAIL  " << p << " holds step " << newest << ", after step " << name.through
           << " its name says it runs through (renamed?)\n";
      } else if (named && name.through >= 0 && !tf.steps.empty() && newest < name.through) {
        // Sealed at a checkpoint after that step's row: one ending earlier was cut back by a resume
        // that did not finish (its rows up to the name's step are lost).
        *clean = false;
        os << "FAIL  " << p << " ends at step " << newest << ", before step " << name.through
           << " its name says it runs through (a resume was interrupted while it rewound the trace: resume from the same checkpoint again)\n";
      }
      // A rank's files in order (sealed oldest first, live last): its rows merged.
      if (named && p == trace::sealed_path_for(path, tf.header.rank, name.through) && name.through >= 0) {
        auto& merged = trace_files[tf.header.rank];
        merged.steps.insert(merged.steps.end(), tf.steps.begin(), tf.steps.end());
      } else if (p == trace::path_for(path, tf.header.rank)) {
        auto& merged = trace_files[tf.header.rank];
        tf.steps.insert(tf.steps.begin(), merged.steps.begin(), merged.steps.end());
        merged = std::move(tf);
      }
    } else {
      failed(st);
      os << "FAIL  " << st.message() << "\n";
    }
  }
  const bool files_clean = *clean;
  if (facts.has_run_json) verify_run_whole(path, facts, checkpoint_run_ids, checkpoint_worlds, trace_files, os, clean);
  if (files_clean && !*clean) damage = true;
  if (unreadable) *unreadable = io && !damage;
  *report = os.str();
  return Status::OK();
}

namespace {
template <class T>
void compare(const RawTensor& a, const RawTensor& b, std::ostringstream& os) {
  const auto* x = reinterpret_cast<const T*>(a.bytes.data());
  const auto* y = reinterpret_cast<const T*>(b.bytes.data());
  const std::int64_t n = a.numel();
  std::int64_t differ = 0, first = -1;
  double max_abs = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&x[i], &y[i], sizeof(T)) == 0) continue;
    if (first < 0) first = i;
    ++differ;
    const double d = std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i]));
    if (!(d <= max_abs)) max_abs = d;  // NaN propagates
  }
  if (!differ) {
    os << "equal\n";
    return;
  }
  // The first differing element as a multi-index.
  std::vector<std::int64_t> idx(a.shape.size());
  std::int64_t rem = first;
  for (std::size_t d = a.shape.size(); d-- > 0;) {
    idx[d] = rem % a.shape[d];
    rem /= a.shape[d];
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%lld of %lld elements differ, max |a-b| %.9g, first at %s: %.9g vs %.9g\n",
                static_cast<long long>(differ), static_cast<long long>(n), max_abs, shape_str(idx).c_str(),
                static_cast<double>(x[first]), static_cast<double>(y[first]));
  os << buf;
}
}  // namespace

Status diff(const std::string& pa, const std::string& pb, std::string* report, bool* identical) {
  Checkpoint a, b;
  CULPRIT_RETURN_IF_ERROR(read(pa, &a, true));
  CULPRIT_RETURN_IF_ERROR(read(pb, &b, true));
  std::map<std::string, const RawTensor*> ma, mb;
  for (const auto& e : entries(a)) ma[e.path] = e.t;
  for (const auto& e : entries(b)) mb[e.path] = e.t;
  std::set<std::string> names;
  for (const auto& [k, v] : ma) names.insert(k);
  for (const auto& [k, v] : mb) names.insert(k);
  std::ostringstream os;
  *identical = true;
  os << "a: " << pa << " (step " << a.step << ")\nb: " << pb << " (step " << b.step << ")\n";
  for (const auto& name : names) {
    os << "  " << name << ": ";
    auto ia = ma.find(name), ib = mb.find(name);
    if (ia == ma.end() || ib == mb.end()) {
      *identical = false;
      os << "only in " << (ia == ma.end() ? "b" : "a") << "\n";
      continue;
    }
    const RawTensor &x = *ia->second, &y = *ib->second;
    if (x.dtype != y.dtype || x.shape != y.shape) {
      *identical = false;
      os << "differs in type: " << dtype_name(x.dtype) << " " << shape_str(x.shape) << " vs " << dtype_name(y.dtype)
         << " " << shape_str(y.shape) << "\n";
      continue;
    }
    if (x.bytes == y.bytes) {
      os << "equal\n";
      continue;
    }
    *identical = false;
    switch (x.dtype) {
      case DType::kFloat32: compare<float>(x, y, os); break;
      case DType::kFloat64: compare<double>(x, y, os); break;
      case DType::kInt64: compare<std::int64_t>(x, y, os); break;
      case DType::kInt32: compare<std::int32_t>(x, y, os); break;
      default: compare<std::uint8_t>(x, y, os); break;
    }
  }
  if (a.epoch != b.epoch || a.cursor != b.cursor) {
    *identical = false;
    os << "  /data: epoch " << a.epoch << " cursor " << a.cursor << " vs epoch " << b.epoch << " cursor " << b.cursor << "\n";
  }
  os << (*identical ? "identical\n" : "different\n");
  *report = os.str();
  return Status::OK();
}

}  // namespace culprit::ckpt
