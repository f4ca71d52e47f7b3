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

}  // namespace

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
    CULPRIT_RETURN_IF_ERROR(read(paths[i], &tf));
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
    for (const auto& r : tf.shards) out->shards[{r.step, r.shard}] = r;
  }
  return Status::OK();
}

Status read(const std::string& path, TraceFile* out) {
  h5::Handle f;
  Status st = h5::open_read(path, &f);
  if (!st.ok()) return st.prefixed("trace '" + path + "'");
  return read_open(f, path, out);
}

namespace {

// The committed rows of /steps, each checked against its checksum (format 3).
Status read_steps(hid_t sg, const std::string& sw, std::int64_t steps, TraceFile* out) {
  const std::int64_t np = std::max<std::int64_t>(1, static_cast<std::int64_t>(out->header.params.size()));
  const bool v3 = out->header.format_version >= 3, v4 = out->header.format_version >= 4,
             v5 = out->header.format_version >= 5;
  std::vector<unsigned char> a, b, c, d, e;
  std::int64_t ext = 0, ext_steps = 0;
  CULPRIT_RETURN_IF_ERROR(get(sg, sw, "step", H5T_NATIVE_INT64, 8, 0, steps, &a, &ext_steps));
  CULPRIT_RETURN_IF_ERROR(get(sg, sw, "loss", H5T_NATIVE_FLOAT, 4, 0, steps, &b, &ext));
  CULPRIT_RETURN_IF_ERROR(get(sg, sw, "lr", H5T_NATIVE_DOUBLE, 8, 0, steps, &c, &ext));
  CULPRIT_RETURN_IF_ERROR(get(sg, sw, "grad_fp", H5T_NATIVE_UINT64, 8, 0, steps, &d, &ext));
  CULPRIT_RETURN_IF_ERROR(get(sg, sw, "param_fp", H5T_NATIVE_UINT64, 8, np, steps, &e, &ext));
  std::vector<unsigned char> wo, cf, of, rf, sc;
  if (v3) {
    CULPRIT_RETURN_IF_ERROR(get(sg, sw, "world", H5T_NATIVE_INT32, 4, 0, steps, &wo, &ext));
    CULPRIT_RETURN_IF_ERROR(get(sg, sw, "chunk_fp", H5T_NATIVE_UINT64, 8, 0, steps, &cf, &ext));
    CULPRIT_RETURN_IF_ERROR(get(sg, sw, "opt_fp", H5T_NATIVE_UINT64, 8, np, steps, &of, &ext));
    CULPRIT_RETURN_IF_ERROR(get(sg, sw, "row_check", H5T_NATIVE_UINT64, 8, 0, steps, &sc, &ext));
  }
  if (v4) CULPRIT_RETURN_IF_ERROR(get(sg, sw, "reduced_fp", H5T_NATIVE_UINT64, 8, np, steps, &rf, &ext));
  std::vector<unsigned char> sh;
  if (v5) CULPRIT_RETURN_IF_ERROR(get(sg, sw, "shard", H5T_NATIVE_UINT64, 8, kShardColumns, steps, &sh, &ext));
  out->torn_steps = ext_steps - steps;
  for (std::int64_t i = 0; i < steps; ++i) {
    StepRow r;
    std::memcpy(&r.step, &a[i * 8], 8);
    std::memcpy(&r.loss, &b[i * 4], 4);
    std::memcpy(&r.lr, &c[i * 8], 8);
    std::memcpy(&r.grad_fp, &d[i * 8], 8);
    r.param_fps.resize(out->header.params.size());
    std::memcpy(r.param_fps.data(), &e[i * np * 8], 8 * r.param_fps.size());
    if (v3) {
      std::memcpy(&r.world, &wo[i * 4], 4);
      std::memcpy(&r.chunk_fp, &cf[i * 8], 8);
      r.opt_fps.resize(out->header.params.size());
      std::memcpy(r.opt_fps.data(), &of[i * np * 8], 8 * r.opt_fps.size());
      if (v4) {
        r.reduced_fps.resize(out->header.params.size());
        std::memcpy(r.reduced_fps.data(), &rf[i * np * 8], 8 * r.reduced_fps.size());
      }
      if (v5) {
        std::uint64_t w[kShardColumns];
        std::memcpy(w, &sh[i * kShardColumns * 8], 8 * kShardColumns);
        if (std::any_of(w, w + kShardColumns, [](std::uint64_t v) { return v != 0; })) r.shard = trace::SliceRecord::of(w);
      }
      Fingerprint want;
      std::memcpy(&want, &sc[i * 8], 8);
      if (row_check(r, out->header.rank, i) != want)
        return Status::Damaged(sw + " row " + std::to_string(i) + " (step " + std::to_string(r.step) +
                               ") fails its checksum: the file changed after it was written");
    }
    out->steps.push_back(std::move(r));
  }
  return Status::OK();
}

// The committed rows of /shards, each checked against its checksum (format 3).
Status read_shards(hid_t hg, const std::string& hw, std::int64_t shards, TraceFile* out) {
  const std::int64_t np = std::max<std::int64_t>(1, static_cast<std::int64_t>(out->header.params.size()));
  const std::int64_t nl = std::max<std::int64_t>(1, static_cast<std::int64_t>(out->header.layers.size()));
  const bool v3 = out->header.format_version >= 3;
  std::int64_t ext = 0, ext_shards = 0;
  std::vector<unsigned char> st_, sh, rk, ho, de, lo, gf, in, fw, bw, pg;
  h5::Handle ht(string_type(kHostChars), H5Tclose), dt(string_type(kDeviceChars), H5Tclose);
  CULPRIT_RETURN_IF_ERROR(get(hg, hw, "step", H5T_NATIVE_INT64, 8, 0, shards, &st_, &ext_shards));
  CULPRIT_RETURN_IF_ERROR(get(hg, hw, "shard", H5T_NATIVE_INT32, 4, 0, shards, &sh, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg, hw, "rank", H5T_NATIVE_INT32, 4, 0, shards, &rk, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg, hw, "host", ht.id(), kHostChars, 0, shards, &ho, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg, hw, "device", dt.id(), kDeviceChars, 0, shards, &de, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg, hw, "loss", H5T_NATIVE_FLOAT, 4, 0, shards, &lo, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg, hw, "grad_fp", H5T_NATIVE_UINT64, 8, 0, shards, &gf, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg, hw, "input_fp", H5T_NATIVE_UINT64, 8, 0, shards, &in, &ext));
  const bool layer = out->header.level == Level::kLayer;
  if (layer) {
    CULPRIT_RETURN_IF_ERROR(get(hg, hw, "param_grad_fp", H5T_NATIVE_UINT64, 8, np, shards, &pg, &ext));
    CULPRIT_RETURN_IF_ERROR(get(hg, hw, "fwd_fp", H5T_NATIVE_UINT64, 8, nl, shards, &fw, &ext));
    CULPRIT_RETURN_IF_ERROR(get(hg, hw, "bwd_fp", H5T_NATIVE_UINT64, 8, nl, shards, &bw, &ext));
  }
  const std::int64_t nsam = std::max(1, out->header.samples_per_shard);
  std::vector<unsigned char> sf, hc;
  if (v3) {
    CULPRIT_RETURN_IF_ERROR(get(hg, hw, "sample_fp", H5T_NATIVE_UINT64, 8, nsam, shards, &sf, &ext));
    CULPRIT_RETURN_IF_ERROR(get(hg, hw, "row_check", H5T_NATIVE_UINT64, 8, 0, shards, &hc, &ext));
  }
  out->torn_shards = ext_shards - shards;
  for (std::int64_t i = 0; i < shards; ++i) {
    ShardRow r;
    std::memcpy(&r.step, &st_[i * 8], 8);
    std::memcpy(&r.shard, &sh[i * 4], 4);
    std::memcpy(&r.rank, &rk[i * 4], 4);
    r.host.assign(reinterpret_cast<const char*>(&ho[i * kHostChars]),
                  strnlen(reinterpret_cast<const char*>(&ho[i * kHostChars]), kHostChars));
    r.device.assign(reinterpret_cast<const char*>(&de[i * kDeviceChars]),
                    strnlen(reinterpret_cast<const char*>(&de[i * kDeviceChars]), kDeviceChars));
    std::memcpy(&r.loss, &lo[i * 4], 4);
    std::memcpy(&r.grad_fp, &gf[i * 8], 8);
    std::memcpy(&r.input_fp, &in[i * 8], 8);
    if (layer) {
      r.param_grad.resize(out->header.params.size());
      std::memcpy(r.param_grad.data(), &pg[i * np * 8], 8 * r.param_grad.size());
      r.fwd.resize(out->header.layers.size());
      r.bwd.resize(out->header.layers.size());
      std::memcpy(r.fwd.data(), &fw[i * nl * 8], 8 * r.fwd.size());
      std::memcpy(r.bwd.data(), &bw[i * nl * 8], 8 * r.bwd.size());
    }
    if (v3) {
      r.sample_fps.resize(out->header.samples_per_shard);
      std::memcpy(r.sample_fps.data(), &sf[i * nsam * 8], 8 * r.sample_fps.size());
      Fingerprint want;
      std::memcpy(&want, &hc[i * 8], 8);
      if (row_check(r, out->header.rank, i) != want)
        return Status::Damaged(hw + " row " + std::to_string(i) + " (step " + std::to_string(r.step) + ", micro-shard " +
                               std::to_string(r.shard) + ") fails its checksum: the file changed after it was written");
    }
    out->shards.push_back(std::move(r));
  }
  return Status::OK();
}

}  // namespace

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
  CULPRIT_RETURN_IF_ERROR(read_steps(sg.id(), sw, steps, out));
  CULPRIT_RETURN_IF_ERROR(read_shards(hg.id(), hw, shards, out));
  out->verified = out->header.format_version >= 3;
  return Status::OK();
}

}  // namespace culprit::trace
