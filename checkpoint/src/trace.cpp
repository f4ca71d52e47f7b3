#include "culprit/trace.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "culprit/checkpoint_format.h"

namespace culprit::trace {

namespace fs = std::filesystem;
using namespace culprit::format;

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "\n" : "") + v[i];
  return s;
}
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  if (s.empty()) return v;
  std::size_t pos = 0;
  while (true) {
    auto end = s.find('\n', pos);
    v.push_back(s.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return v;
}

hid_t string_type(int chars) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, chars);
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  return t;
}

// A column: an extendible 1-D or 2-D dataset.
struct Column {
  const char* name;
  hid_t type;  // memory and file type
  std::int64_t width;  // 0: 1-D
};

Status create_column(hid_t group, const Column& c) {
  std::vector<hsize_t> dims{0}, maxd{H5S_UNLIMITED}, chunk{static_cast<hsize_t>(kTraceChunkRows)};
  if (c.width > 0) {
    dims.push_back(c.width);
    maxd.push_back(c.width);
    chunk.push_back(c.width);
  }
  h5::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxd.data()), H5Sclose);
  h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.id(), static_cast<int>(chunk.size()), chunk.data());
  h5::Handle ds(H5Dcreate2(group, c.name, c.type, space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return Status::IoError(std::string("cannot create trace column '") + c.name + "': " + h5::error_stack());
  return Status::OK();
}

// Writes rows [row0, row0 + n) of column `name`, growing the dataset to row0 + n.
Status put(hid_t group, const char* name, hid_t type, std::int64_t row0, std::int64_t n, std::int64_t width,
           const void* data) {
  h5::Handle ds(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return Status::Damaged(std::string("trace column '") + name + "' is missing: " + h5::error_stack());
  std::vector<hsize_t> size{static_cast<hsize_t>(row0 + n)};
  if (width > 0) size.push_back(width);
  if (H5Dset_extent(ds.id(), size.data()) < 0) return Status::IoError("H5Dset_extent: " + h5::error_stack());
  if (n == 0) return Status::OK();
  h5::Handle fspace(H5Dget_space(ds.id()), H5Sclose);
  std::vector<hsize_t> start{static_cast<hsize_t>(row0)}, count{static_cast<hsize_t>(n)};
  if (width > 0) {
    start.push_back(0);
    count.push_back(width);
  }
  H5Sselect_hyperslab(fspace.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  h5::Handle mspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
  if (H5Dwrite(ds.id(), type, mspace.id(), fspace.id(), H5P_DEFAULT, data) < 0)
    return Status::IoError(std::string("writing trace column '") + name + "': " + h5::error_stack());
  return Status::OK();
}

// Reads rows [0, n) of a column after checking its shape; *extent gets its row count.
Status get(hid_t group, const std::string& where, const char* name, hid_t type, std::size_t elem, std::int64_t width,
           std::int64_t n, std::vector<unsigned char>* out, std::int64_t* extent) {
  const std::string what = where + " column '" + name + "'";
  if (H5Lexists(group, name, H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::Damaged(what + " is missing");
  }
  h5::Handle ds(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
  h5::Handle fspace(H5Dget_space(ds.id()), H5Sclose);
  if (!ds.valid() || !fspace.valid()) return Status::Damaged(what + " is unreadable: " + h5::error_stack());
  const int rank = H5Sget_simple_extent_ndims(fspace.id());
  if (rank != (width > 0 ? 2 : 1)) return Status::Damaged(what + " has the wrong rank");
  hsize_t dims[2] = {0, 0};
  H5Sget_simple_extent_dims(fspace.id(), dims, nullptr);
  if (width > 0 && static_cast<std::int64_t>(dims[1]) != width) return Status::Damaged(what + " has the wrong width");
  *extent = static_cast<std::int64_t>(dims[0]);
  if (n > *extent) return Status::Damaged(what + " has " + std::to_string(*extent) + " rows, fewer than the " +
                                        std::to_string(n) + " committed");
  const std::int64_t w = std::max<std::int64_t>(1, width);
  out->assign(static_cast<std::size_t>(n * w) * elem, 0);
  if (n == 0) return Status::OK();
  hsize_t start[2] = {0, 0}, count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(w)};
  H5Sselect_hyperslab(fspace.id(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  h5::Handle mspace(H5Screate_simple(rank, count, nullptr), H5Sclose);
  if (H5Dread(ds.id(), type, mspace.id(), fspace.id(), H5P_DEFAULT, out->data()) < 0)
    return Status::Damaged(what + " is unreadable: " + h5::error_stack());
  return Status::OK();
}

Status write_header(hid_t f, const Header& h) {
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, "format_version", kTraceVersion));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, "rank", static_cast<std::int64_t>(h.rank)));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, "world_size", static_cast<std::int64_t>(h.world_size)));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, "level", std::string(name_of(h.level))));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, "forward_detail", std::string(name_of(h.forward_detail))));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, "params", join(h.params)));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, "layers", join(h.layers)));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, "faults", join(h.faults)));
  return h5::write_attr(f, "fingerprint_format", std::string("fp1"));
}

Status read_header(hid_t f, Header* h) {
  std::int64_t v = 0;
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "format_version", &v));
  if (v != kTraceVersion) return Status::BadInput("format version " + std::to_string(v) + " is not " + std::to_string(kTraceVersion));
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "rank", &v));
  h->rank = static_cast<int>(v);
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "world_size", &v));
  h->world_size = static_cast<int>(v);
  std::string s;
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "level", &s));
  if (!parse_name(s, &h->level)) return Status::Damaged("unknown trace level '" + s + "'");
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "forward_detail", &s));
  if (!parse_name(s, &h->forward_detail)) return Status::Damaged("unknown forward detail '" + s + "'");
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "params", &s));
  h->params = split(s);
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "layers", &s));
  h->layers = split(s);
  h->faults.clear();
  if (h5::has_attr(f, "faults")) {
    CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "faults", &s));
    h->faults = split(s);
  }
  return Status::OK();
}

// Committed rows whose step is <= keep_through_step (rows are in step order).
Status count_through(hid_t group, const std::string& where, std::int64_t committed, std::int64_t keep, std::int64_t* n) {
  std::vector<unsigned char> buf;
  std::int64_t extent = 0;
  CULPRIT_RETURN_IF_ERROR(get(group, where, "step", H5T_NATIVE_INT64, 8, 0, committed, &buf, &extent));
  const auto* steps = reinterpret_cast<const std::int64_t*>(buf.data());
  *n = 0;
  while (*n < committed && steps[*n] <= keep) ++*n;
  return Status::OK();
}

}  // namespace

std::string path_for(const std::string& run_dir, int rank) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%0*d.h5", kTracePrefix, kRankDigits, rank);
  return (fs::path(run_dir) / kTraceDir / name).string();
}

std::vector<std::string> list(const std::string& run_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path dir = fs::path(run_dir) / kTraceDir;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex re("rank-[0-9]{5}\\.h5");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (std::regex_match(e.path().filename().string(), re)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

const StepRow* RunTrace::step(std::int64_t s) const {
  for (int r : ranks) {
    auto it = steps.find({r, s});
    if (it != steps.end()) return &it->second;
  }
  return nullptr;
}

Status read_run(const std::string& run_dir, RunTrace* out) {
  *out = RunTrace();
  const auto files = list(run_dir);
  if (files.empty())
    return Status::BadInput("no trace in '" + run_dir + "/" + kTraceDir + "' (was the run trained with --trace off?)");
  for (std::size_t i = 0; i < files.size(); ++i) {
    TraceFile tf;
    CULPRIT_RETURN_IF_ERROR(read(files[i], &tf));
    if (i == 0) out->header = tf.header;
    out->ranks.push_back(tf.header.rank);
    for (const auto& s : tf.steps) {
      out->steps[{tf.header.rank, s.step}] = s;
      out->first_step = out->first_step ? std::min(out->first_step, s.step) : s.step;
      out->last_step = std::max(out->last_step, s.step);
    }
    for (const auto& r : tf.shards) out->shards[{r.step, r.shard}] = r;
  }
  return Status::OK();
}

Status Writer::open(const std::string& path, const Header& h, std::int64_t keep_through_step, std::string* warning) {
  header_ = h;
  const std::string where = "trace '" + path + "'";
  std::error_code ec;
  if (fs::exists(path, ec)) {
    Header old;
    Status st = h5::open_rw(path, &file_);
    if (st.ok()) st = read_header(file_.id(), &old);
    if (st.ok() && (old.params != h.params || old.level != h.level || old.layers != h.layers))
      return Status::BadInput(where + " was written for another model or trace level (" +
                              name_of(old.level) + ")");
    if (st.ok()) {
      file_.reset();
      st = truncate(path, keep_through_step);
      if (st.ok()) st = h5::open_rw(path, &file_);
      if (st.ok()) st = h5::read_attr(file_.id(), kAttrStepsCommitted, &steps_);
      if (st.ok()) st = h5::read_attr(file_.id(), kAttrShardsCommitted, &shards_);
      // The file's rank and world describe its latest writer; its faults are every writer's.
      Header merged = h;
      for (const auto& f : old.faults)
        if (std::find(merged.faults.begin(), merged.faults.end(), f) == merged.faults.end()) merged.faults.push_back(f);
      if (st.ok()) return write_header(file_.id(), merged);
    }
    file_.reset();
    std::string aside;
    for (int n = 1;; ++n) {
      aside = path + ".damaged-" + std::to_string(n);
      if (!fs::exists(aside, ec)) break;
    }
    fs::rename(path, aside, ec);
    if (ec) return Status::IoError(where + " is damaged (" + st.message() + ") and cannot be moved aside");
    *warning = where + " was damaged (" + st.message() + "); moved to '" + aside + "', a new trace starts";
  }
  fs::create_directories(fs::path(path).parent_path(), ec);
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) return Status::IoError("cannot create " + where + ": " + h5::error_stack());
  file_ = h5::Handle(id, H5Fclose);
  CULPRIT_RETURN_IF_ERROR(write_header(file_.id(), h));
  h5::Handle steps, shards;
  CULPRIT_RETURN_IF_ERROR(h5::create_group(file_.id(), "steps", &steps));
  CULPRIT_RETURN_IF_ERROR(h5::create_group(file_.id(), "shards", &shards));
  h5::Handle host(string_type(kHostChars), H5Tclose), dev(string_type(kDeviceChars), H5Tclose);
  const std::int64_t np = static_cast<std::int64_t>(h.params.size()), nl = static_cast<std::int64_t>(h.layers.size());
  for (const Column& c : {Column{"step", H5T_NATIVE_INT64, 0}, Column{"loss", H5T_NATIVE_FLOAT, 0},
                          Column{"lr", H5T_NATIVE_DOUBLE, 0}, Column{"grad_fp", H5T_NATIVE_UINT64, 0},
                          Column{"param_fp", H5T_NATIVE_UINT64, std::max<std::int64_t>(1, np)}})
    CULPRIT_RETURN_IF_ERROR(create_column(steps.id(), c));
  for (const Column& c : {Column{"step", H5T_NATIVE_INT64, 0}, Column{"shard", H5T_NATIVE_INT32, 0},
                          Column{"rank", H5T_NATIVE_INT32, 0}, Column{"host", host.id(), 0},
                          Column{"device", dev.id(), 0}, Column{"loss", H5T_NATIVE_FLOAT, 0},
                          Column{"grad_fp", H5T_NATIVE_UINT64, 0}, Column{"input_fp", H5T_NATIVE_UINT64, 0}})
    CULPRIT_RETURN_IF_ERROR(create_column(shards.id(), c));
  if (h.level == Level::kLayer) {
    CULPRIT_RETURN_IF_ERROR(
        create_column(shards.id(), {"param_grad_fp", H5T_NATIVE_UINT64, std::max<std::int64_t>(1, np)}));
    CULPRIT_RETURN_IF_ERROR(create_column(shards.id(), {"fwd_fp", H5T_NATIVE_UINT64, std::max<std::int64_t>(1, nl)}));
    CULPRIT_RETURN_IF_ERROR(create_column(shards.id(), {"bwd_fp", H5T_NATIVE_UINT64, std::max<std::int64_t>(1, nl)}));
  }
  steps_ = shards_ = 0;
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(file_.id(), kAttrStepsCommitted, steps_));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(file_.id(), kAttrShardsCommitted, shards_));
  if (H5Fflush(file_.id(), H5F_SCOPE_LOCAL) < 0) return Status::IoError(where + ": flush failed: " + h5::error_stack());
  return Status::OK();
}

Status Writer::append(const StepRow& s, const std::vector<ShardRow>& rows) {
  const std::int64_t np = std::max<std::int64_t>(1, static_cast<std::int64_t>(header_.params.size()));
  const std::int64_t nl = std::max<std::int64_t>(1, static_cast<std::int64_t>(header_.layers.size()));
  h5::Handle steps(H5Gopen2(file_.id(), "steps", H5P_DEFAULT), H5Gclose);
  h5::Handle shards(H5Gopen2(file_.id(), "shards", H5P_DEFAULT), H5Gclose);
  std::vector<Fingerprint> pf = s.param_fps;
  pf.resize(np, 0);
  CULPRIT_RETURN_IF_ERROR(put(steps.id(), "step", H5T_NATIVE_INT64, steps_, 1, 0, &s.step));
  CULPRIT_RETURN_IF_ERROR(put(steps.id(), "loss", H5T_NATIVE_FLOAT, steps_, 1, 0, &s.loss));
  CULPRIT_RETURN_IF_ERROR(put(steps.id(), "lr", H5T_NATIVE_DOUBLE, steps_, 1, 0, &s.lr));
  CULPRIT_RETURN_IF_ERROR(put(steps.id(), "grad_fp", H5T_NATIVE_UINT64, steps_, 1, 0, &s.grad_fp));
  CULPRIT_RETURN_IF_ERROR(put(steps.id(), "param_fp", H5T_NATIVE_UINT64, steps_, 1, np, pf.data()));
  const std::int64_t n = static_cast<std::int64_t>(rows.size());
  std::vector<std::int64_t> step(n);
  std::vector<std::int32_t> shard(n), rank(n);
  std::vector<float> loss(n);
  std::vector<Fingerprint> gfp(n), ifp(n), fwd, bwd, pgf;
  std::vector<char> host(n * kHostChars, 0), dev(n * kDeviceChars, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& r = rows[i];
    step[i] = r.step, shard[i] = r.shard, rank[i] = r.rank, loss[i] = r.loss, gfp[i] = r.grad_fp, ifp[i] = r.input_fp;
    std::strncpy(&host[i * kHostChars], r.host.c_str(), kHostChars);
    std::strncpy(&dev[i * kDeviceChars], r.device.c_str(), kDeviceChars);
    if (header_.level == Level::kLayer) {
      auto f = r.fwd, b = r.bwd;
      f.resize(nl, 0);
      b.resize(nl, 0);
      fwd.insert(fwd.end(), f.begin(), f.end());
      bwd.insert(bwd.end(), b.begin(), b.end());
      auto g = r.param_grad;
      g.resize(np, 0);
      pgf.insert(pgf.end(), g.begin(), g.end());
    }
  }
  h5::Handle ht(string_type(kHostChars), H5Tclose), dt(string_type(kDeviceChars), H5Tclose);
  CULPRIT_RETURN_IF_ERROR(put(shards.id(), "step", H5T_NATIVE_INT64, shards_, n, 0, step.data()));
  CULPRIT_RETURN_IF_ERROR(put(shards.id(), "shard", H5T_NATIVE_INT32, shards_, n, 0, shard.data()));
  CULPRIT_RETURN_IF_ERROR(put(shards.id(), "rank", H5T_NATIVE_INT32, shards_, n, 0, rank.data()));
  CULPRIT_RETURN_IF_ERROR(put(shards.id(), "host", ht.id(), shards_, n, 0, host.data()));
  CULPRIT_RETURN_IF_ERROR(put(shards.id(), "device", dt.id(), shards_, n, 0, dev.data()));
  CULPRIT_RETURN_IF_ERROR(put(shards.id(), "loss", H5T_NATIVE_FLOAT, shards_, n, 0, loss.data()));
  CULPRIT_RETURN_IF_ERROR(put(shards.id(), "grad_fp", H5T_NATIVE_UINT64, shards_, n, 0, gfp.data()));
  CULPRIT_RETURN_IF_ERROR(put(shards.id(), "input_fp", H5T_NATIVE_UINT64, shards_, n, 0, ifp.data()));
  if (header_.level == Level::kLayer) {
    CULPRIT_RETURN_IF_ERROR(put(shards.id(), "param_grad_fp", H5T_NATIVE_UINT64, shards_, n, np, pgf.data()));
    CULPRIT_RETURN_IF_ERROR(put(shards.id(), "fwd_fp", H5T_NATIVE_UINT64, shards_, n, nl, fwd.data()));
    CULPRIT_RETURN_IF_ERROR(put(shards.id(), "bwd_fp", H5T_NATIVE_UINT64, shards_, n, nl, bwd.data()));
  }
  // Rows first, then the counts that make them visible.
  if (H5Fflush(file_.id(), H5F_SCOPE_LOCAL) < 0) return Status::IoError("trace flush failed: " + h5::error_stack());
  steps_ += 1;
  shards_ += n;
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(file_.id(), kAttrStepsCommitted, steps_));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(file_.id(), kAttrShardsCommitted, shards_));
  if (H5Fflush(file_.id(), H5F_SCOPE_LOCAL) < 0) return Status::IoError("trace flush failed: " + h5::error_stack());
  return Status::OK();
}

Status truncate(const std::string& path, std::int64_t keep) {
  const std::string where = "trace '" + path + "'";
  h5::Handle f;
  Status st = h5::open_rw(path, &f);
  if (!st.ok()) return st.prefixed(where);
  std::int64_t steps = 0, shards = 0, ns = 0, nsh = 0;
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f.id(), kAttrStepsCommitted, &steps));
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f.id(), kAttrShardsCommitted, &shards));
  h5::Handle sg(H5Gopen2(f.id(), "steps", H5P_DEFAULT), H5Gclose), hg(H5Gopen2(f.id(), "shards", H5P_DEFAULT), H5Gclose);
  if (!sg.valid() || !hg.valid()) return Status::Damaged(where + " lacks /steps or /shards");
  CULPRIT_RETURN_IF_ERROR(count_through(sg.id(), where, steps, keep, &ns));
  CULPRIT_RETURN_IF_ERROR(count_through(hg.id(), where, shards, keep, &nsh));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f.id(), kAttrStepsCommitted, ns));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f.id(), kAttrShardsCommitted, nsh));
  if (H5Fflush(f.id(), H5F_SCOPE_LOCAL) < 0) return Status::IoError(where + ": flush failed: " + h5::error_stack());
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
  const std::int64_t np = std::max<std::int64_t>(1, static_cast<std::int64_t>(out->header.params.size()));
  const std::int64_t nl = std::max<std::int64_t>(1, static_cast<std::int64_t>(out->header.layers.size()));
  std::vector<unsigned char> a, b, c, d, e;
  std::int64_t ext = 0, ext_steps = 0, ext_shards = 0;
  const std::string sw = where + " /steps", hw = where + " /shards";
  CULPRIT_RETURN_IF_ERROR(get(sg.id(), sw, "step", H5T_NATIVE_INT64, 8, 0, steps, &a, &ext_steps));
  CULPRIT_RETURN_IF_ERROR(get(sg.id(), sw, "loss", H5T_NATIVE_FLOAT, 4, 0, steps, &b, &ext));
  CULPRIT_RETURN_IF_ERROR(get(sg.id(), sw, "lr", H5T_NATIVE_DOUBLE, 8, 0, steps, &c, &ext));
  CULPRIT_RETURN_IF_ERROR(get(sg.id(), sw, "grad_fp", H5T_NATIVE_UINT64, 8, 0, steps, &d, &ext));
  CULPRIT_RETURN_IF_ERROR(get(sg.id(), sw, "param_fp", H5T_NATIVE_UINT64, 8, np, steps, &e, &ext));
  out->torn_steps = ext_steps - steps;
  for (std::int64_t i = 0; i < steps; ++i) {
    StepRow r;
    std::memcpy(&r.step, &a[i * 8], 8);
    std::memcpy(&r.loss, &b[i * 4], 4);
    std::memcpy(&r.lr, &c[i * 8], 8);
    std::memcpy(&r.grad_fp, &d[i * 8], 8);
    r.param_fps.resize(out->header.params.size());
    std::memcpy(r.param_fps.data(), &e[i * np * 8], 8 * r.param_fps.size());
    out->steps.push_back(std::move(r));
  }
  std::vector<unsigned char> st_, sh, rk, ho, de, lo, gf, in, fw, bw, pg;
  h5::Handle ht(string_type(kHostChars), H5Tclose), dt(string_type(kDeviceChars), H5Tclose);
  CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "step", H5T_NATIVE_INT64, 8, 0, shards, &st_, &ext_shards));
  CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "shard", H5T_NATIVE_INT32, 4, 0, shards, &sh, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "rank", H5T_NATIVE_INT32, 4, 0, shards, &rk, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "host", ht.id(), kHostChars, 0, shards, &ho, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "device", dt.id(), kDeviceChars, 0, shards, &de, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "loss", H5T_NATIVE_FLOAT, 4, 0, shards, &lo, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "grad_fp", H5T_NATIVE_UINT64, 8, 0, shards, &gf, &ext));
  CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "input_fp", H5T_NATIVE_UINT64, 8, 0, shards, &in, &ext));
  const bool layer = out->header.level == Level::kLayer;
  if (layer) {
    CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "param_grad_fp", H5T_NATIVE_UINT64, 8, np, shards, &pg, &ext));
    CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "fwd_fp", H5T_NATIVE_UINT64, 8, nl, shards, &fw, &ext));
    CULPRIT_RETURN_IF_ERROR(get(hg.id(), hw, "bwd_fp", H5T_NATIVE_UINT64, 8, nl, shards, &bw, &ext));
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
    out->shards.push_back(std::move(r));
  }
  return Status::OK();
}

}  // namespace culprit::trace
