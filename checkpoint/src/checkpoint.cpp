#include "culprit/checkpoint.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>

#include "culprit/checkpoint_format.h"
#include "culprit/h5.h"
#include "culprit/run_files.h"

namespace culprit::ckpt {

namespace fs = std::filesystem;
using namespace culprit::format;

std::int64_t RawTensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::uint64_t RawTensor::full_bytes() const {
  return sliced() ? static_cast<std::uint64_t>(numel()) * dtype_size(dtype) : bytes.size();
}

namespace {

std::string hex(Fingerprint f) { return fingerprint_hex(f); }

RawTensor scalar_i64(const std::string& name, std::int64_t v) {
  RawTensor t;
  t.name = name;
  t.dtype = DType::kInt64;
  t.bytes.resize(8);
  std::memcpy(t.bytes.data(), &v, 8);
  return t;
}

// Every dataset of the file with its full path (no leading slash), for the state fingerprint.
std::vector<std::pair<std::string, const RawTensor*>> all_datasets(const Checkpoint& c, RawTensor* epoch,
                                                                   RawTensor* cursor) {
  std::vector<std::pair<std::string, const RawTensor*>> v;
  for (const auto& t : c.model) v.push_back({std::string(kModel) + "/" + t.name, &t});
  for (const auto& t : c.optimizer) v.push_back({std::string(kOptimizer) + "/" + t.name, &t});
  for (const auto& t : c.rng) v.push_back({std::string(kRng) + "/" + t.name, &t});
  v.push_back({std::string(kData) + "/epoch", epoch});
  v.push_back({std::string(kData) + "/cursor", cursor});
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return v;
}

Fingerprint state_fp(const Checkpoint& c) {
  RawTensor e = scalar_i64("epoch", c.epoch), k = scalar_i64("cursor", c.cursor);
  e.fingerprint = fingerprint_bytes(e.bytes.data(), e.bytes.size());
  k.fingerprint = fingerprint_bytes(k.bytes.data(), k.bytes.size());
  FingerprintSet set;
  for (const auto& [path, t] : all_datasets(c, &e, &k)) set.add(path, t->dtype, t->shape, t->fingerprint);
  return set.finish();
}

Status fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return Status::IoError("cannot open '" + path + "' to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::IoError("fsync of '" + path + "' failed");
  return Status::OK();
}

// Parent groups of "a/b/c" are created on demand.
Status ensure_parent(hid_t root, const std::string& path, std::map<std::string, h5::Handle>* groups,
                     hid_t* parent, std::string* leaf) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) {
    *parent = root;
    *leaf = path;
    return Status::OK();
  }
  const std::string dir = path.substr(0, slash);
  *leaf = path.substr(slash + 1);
  auto it = groups->find(dir);
  if (it == groups->end()) {
    hid_t up;
    std::string name;
    CULPRIT_RETURN_IF_ERROR(ensure_parent(root, dir, groups, &up, &name));
    h5::Handle g;
    CULPRIT_RETURN_IF_ERROR(h5::create_group(up, name, &g));
    it = groups->emplace(dir, std::move(g)).first;
  }
  *parent = it->second.id();
  return Status::OK();
}

// writer: this rank's place among the W writers (-1: not one).
Status write_tensor(int writer, int W, hid_t group, std::map<std::string, h5::Handle>* groups,
                    const RawTensor& t, std::size_t index) {
  hid_t parent;
  std::string leaf;
  CULPRIT_RETURN_IF_ERROR(ensure_parent(group, t.name, groups, &parent, &leaf));
  h5::Handle ds;
  CULPRIT_RETURN_IF_ERROR(h5::create_dataset(parent, leaf, t.dtype, t.shape, &ds));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr_u64(ds.id(), kAttrFingerprint, t.fingerprint));
  if (t.sliced()) {  // its holder writes its slice, writer or not
    const std::int64_t n = static_cast<std::int64_t>(t.bytes.size() / dtype_size(t.dtype));
    return n ? h5::write_range(ds, t.dtype, t.shape, t.slice_lo, n, t.bytes.data()) : Status::OK();
  }
  if (writer < 0) return Status::OK();
  if (!t.shape.empty() && t.bytes.size() >= kSliceBytes && t.shape[0] >= W) {
    // Large: every writer writes its rows.
    const std::int64_t rows = t.shape[0];
    const std::int64_t r0 = rows * writer / W, r1 = rows * (writer + 1) / W;
    const std::size_t row_bytes = t.bytes.size() / static_cast<std::size_t>(rows);
    return h5::write_rows(ds, t.dtype, t.shape, r0, r1 - r0, t.bytes.data() + r0 * row_bytes);
  }
  if (static_cast<int>(index % W) == writer && !t.bytes.empty())
    return h5::write_rows(ds, t.dtype, t.shape, 0, t.shape.empty() ? -1 : t.shape[0], t.bytes.data());
  return Status::OK();
}

}  // namespace

void compute_fingerprints(Checkpoint* c) {
  for (auto* group : {&c->model, &c->optimizer, &c->rng})
    for (auto& t : *group)
      if (!t.sliced()) t.fingerprint = fingerprint_bytes(t.bytes.data(), t.bytes.size());
  c->state_fingerprint = state_fp(*c);
}

std::string path_for(const std::string& run_dir, std::int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%0*lld%s", kCheckpointPrefix, kStepDigits, static_cast<long long>(step),
                kCheckpointSuffix);
  return (fs::path(run_dir) / kCheckpointDir / name).string();
}

// The step a checkpoint's file name says (step-XXXXXXXX.h5), -1 for any other name.
static std::int64_t step_in_name(const std::string& name) {
  static const std::regex re("step-([0-9]{8})\\.h5");
  std::smatch m;
  return std::regex_match(name, m, re) ? std::stoll(m[1]) : -1;
}

std::vector<std::pair<std::int64_t, std::string>> list(const std::string& run_dir) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  const fs::path dir = fs::path(run_dir) / kCheckpointDir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::int64_t step = step_in_name(e.path().filename().string());
    if (step >= 0) out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status first_valid(const Comm& comm, const std::vector<std::string>& candidates, Checkpoint* out, std::string* path) {
  for (const auto& p : candidates) {
    Status st = agree(comm, read(p, out, /*verify=*/true));
    if (st.ok()) {
      *path = p;
      return Status::OK();
    }
    if (comm.rank == 0) {
      std::fprintf(stderr, "culprit: warning: skipping damaged checkpoint: %s\n", st.message().c_str());
      std::fflush(stderr);
    }
  }
  return Status::Damaged("every one of the " + std::to_string(candidates.size()) + " checkpoint(s) tried is damaged");
}

Status find_valid(const Comm& comm, const std::string& run_dir, std::int64_t before, Pick pick, Checkpoint* out,
                  std::string* path, std::int64_t at_least) {
  std::vector<std::string> candidates;
  for (const auto& [step, p] : list(run_dir))
    if (step < before && step >= at_least) candidates.push_back(p);
  if (pick == Pick::kNewest) std::reverse(candidates.begin(), candidates.end());
  const std::string where = "no valid checkpoint of '" + run_dir + "'" +
                            (before == kAnyStep ? std::string() : " precedes step " + std::to_string(before)) +
                            (at_least > 0 ? " from step " + std::to_string(at_least) + " on" : std::string());
  if (candidates.empty()) return Status::BadInput(where + " (none is there)");
  Status st = first_valid(comm, candidates, out, path);
  return st.ok() ? st : Status::Damaged(where + " (" + st.message() + ")");
}

namespace {

// Bytes the file of `c` needs, with room for HDF5's metadata (object headers, attributes).
std::uint64_t size_estimate(const Checkpoint& c) {
  std::uint64_t bytes = 0;
  std::size_t n = 0;
  for (const auto* group : {&c.model, &c.optimizer, &c.rng})
    for (const auto& t : *group) bytes += t.full_bytes(), ++n;
  return bytes + bytes / 32 + n * 512 + 32768;
}

Status prepare_file(const std::string& tmp, const Checkpoint& c) {
  CULPRIT_RETURN_IF_ERROR(files::create_fresh(tmp));
  std::uint64_t free = 0;
  Status st = files::free_bytes(tmp, &free);
  const std::uint64_t need = size_estimate(c);
  if (st.ok() && free < need)
    st = Status::IoError("cannot write checkpoint '" + tmp + "': " + std::strerror(ENOSPC) + " (" +
                         std::to_string(free) + " bytes free, the checkpoint needs about " + std::to_string(need) + ")");
  // The file size limit (ulimit -f) likewise: a write past it fails with EFBIG (SIGXFSZ is ignored,
  // cli::start_mpi) on one writer, and the collective close could hang the way it does for space.
  struct rlimit fsize{};
  if (st.ok() && ::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY && fsize.rlim_cur < need)
    st = Status::IoError("cannot write checkpoint '" + tmp + "': " + std::strerror(EFBIG) + " (the file size limit, " +
                         "ulimit -f, is " + std::to_string(fsize.rlim_cur) + " bytes; the checkpoint needs about " +
                         std::to_string(need) + ")");
  if (!st.ok()) files::remove(tmp);
  return st;
}

}  // namespace

Status write(const Comm& comm, const std::string& final_path, const Checkpoint& c, WriteStats* stats,
             const std::vector<int>& writers, const Status& local) {
  const auto t0 = std::chrono::steady_clock::now();
  const int W = writers.empty() ? comm.size : static_cast<int>(writers.size());
  int writer = writers.empty() ? comm.rank : -1;
  for (int i = 0; i < static_cast<int>(writers.size()); ++i)
    if (writers[i] == comm.rank) writer = i;
  const std::string tmp = final_path + kTempSuffix;
  // Rank 0 makes the file a fresh one (a leftover or a link there is replaced, never written
  // through) and checks the space: MPI-IO's collective close can hang once a rank's write failed
  // for lack of it, so a full disk must be found before the first byte (docs/checkpoint-format.md).
  Status st = local;
  if (st.ok() && comm.rank == 0) st = prepare_file(tmp, c);
  st = agree(comm, st);
  if (!st.ok()) {
    if (comm.rank == 0) files::remove(tmp);
    return st;
  }
  Status failed;
  {
    h5::Handle file;
    // One rank needs no MPI-IO: the POSIX driver is faster for it.
    st = agree(comm, h5::create(tmp, comm.size > 1 ? comm.comm : MPI_COMM_NULL, &file));
    if (!st.ok()) return st;
    // Metadata calls are collective: every rank makes them in the same order with the same values.
    h5::Handle meta;
    st = h5::create_group(file.id(), kMeta, &meta);
    if (st.ok()) st = h5::write_attr(meta.id(), kAttrFormatVersion, kCheckpointVersion);
    if (st.ok()) st = h5::write_attr(meta.id(), "step", c.step);
    if (st.ok()) st = h5::write_attr(meta.id(), kAttrFingerprintFormat, std::string("fp1"));
    if (st.ok()) st = h5::write_attr_u64(meta.id(), kAttrStateFingerprint, c.state_fingerprint);
    if (st.ok()) st = h5::write_attr(meta.id(), "state_fingerprint_hex", hex(c.state_fingerprint));
    for (const auto& [k, v] : c.meta)
      if (st.ok()) st = h5::write_attr(meta.id(), k, v);
    for (const auto& [k, v] : c.meta_int)
      if (st.ok()) st = h5::write_attr(meta.id(), k, v);
    std::map<std::string, h5::Handle> groups;
    std::size_t index = 0;
    std::uint64_t bytes = 0;
    for (const auto& [gname, tensors] : {std::pair<const char*, const std::vector<RawTensor>*>{kModel, &c.model},
                                         {kOptimizer, &c.optimizer},
                                         {kRng, &c.rng}}) {
      h5::Handle g;
      if (st.ok()) st = h5::create_group(file.id(), gname, &g);
      for (const auto& t : *tensors) {
        if (st.ok()) st = write_tensor(writer, W, g.id(), &groups, t, index++);
        bytes += t.full_bytes();
      }
      groups.clear();
    }
    h5::Handle data;
    if (st.ok()) st = h5::create_group(file.id(), kData, &data);
    for (const auto& t : {scalar_i64("epoch", c.epoch), scalar_i64("cursor", c.cursor)}) {
      RawTensor u = t;
      u.fingerprint = fingerprint_bytes(u.bytes.data(), u.bytes.size());
      if (st.ok()) st = write_tensor(writer, W, data.id(), &groups, u, index++);
    }
    if (stats) stats->bytes = bytes;
    // Collective close: its groups and datasets first, then the file (also after a failure), whose
    // close writes what HDF5 still holds: its failure is the write's.
    data.reset();
    groups.clear();
    meta.reset();
    const Status closed = file.close("checkpoint '" + tmp + "'");
    failed = agree(comm, st.ok() ? closed : st);
  }
  if (!failed.ok()) {
    if (comm.rank == 0) files::remove(tmp);  // the partial file goes
    return failed.prefixed("writing checkpoint '" + tmp + "'");
  }
  CULPRIT_MPI_CHECK(MPI_Barrier(comm.comm));
  if (comm.rank == 0) {
    st = fsync_path(tmp, false);
    if (st.ok() && std::rename(tmp.c_str(), final_path.c_str()) != 0)
      st = Status::IoError("cannot rename '" + tmp + "' to '" + final_path + "'");
    if (st.ok()) st = fsync_path(fs::path(final_path).parent_path().string(), true);
  }
  st = agree(comm, st);
  if (stats) stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

namespace {

// Reads the datasets of group `gname` of `file` (shown as `display`, e.g. "/optimizer/fc1.bias").
Status read_group(hid_t file, const std::string& path, const std::string& gname, const std::string& display,
                  bool nested, std::uint64_t max_bytes, std::vector<RawTensor>* out) {
  const std::string where = "checkpoint '" + path + "'";
  if (H5Lexists(file, gname.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::Damaged(where + " has no group '" + display + "'");
  }
  h5::Handle g(H5Gopen2(file, gname.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.valid()) return Status::Damaged(where + ": cannot open group '" + display + "': " + h5::error_stack());
  std::vector<std::string> names;
  CULPRIT_RETURN_IF_ERROR(h5::list_group(g.id(), &names));
  for (const auto& name : names) {
    H5O_info_t info;
    if (H5Oget_info_by_name(g.id(), name.c_str(), &info, H5P_DEFAULT) < 0)
      return Status::Damaged(where + ": cannot inspect '" + display + "/" + name + "': " + h5::error_stack());
    if (info.type == H5O_TYPE_GROUP && nested) {
      std::vector<RawTensor> inner;
      CULPRIT_RETURN_IF_ERROR(read_group(g.id(), path, name, display + "/" + name, false, max_bytes, &inner));
      for (auto& t : inner) {
        t.name = name + "/" + t.name;
        out->push_back(std::move(t));
      }
      continue;
    }
    const std::string what = where + " dataset '" + display + "/" + name + "'";
    if (info.type != H5O_TYPE_DATASET) return Status::Damaged(where + ": '" + display + "/" + name + "' is not a dataset");
    h5::Array a;
    CULPRIT_RETURN_IF_ERROR(h5::read_exact(g.id(), name, what, max_bytes, &a));
    RawTensor t;
    t.name = name;
    t.dtype = a.dtype;
    t.shape = a.shape;
    t.bytes = std::move(a.bytes);
    h5::Handle ds(H5Dopen2(g.id(), name.c_str(), H5P_DEFAULT), H5Dclose);
    Status st = h5::read_attr_u64(ds.id(), kAttrFingerprint, &t.fingerprint);
    if (!st.ok()) return st.prefixed(what);
    out->push_back(std::move(t));
  }
  return Status::OK();
}

Status verify_tensor(const std::string& path, const std::string& group, const RawTensor& t) {
  const Fingerprint actual = fingerprint_bytes(t.bytes.data(), t.bytes.size());
  if (actual != t.fingerprint)
    return Status::Damaged("checkpoint '" + path + "' dataset '/" + group + "/" + t.name +
                         "': fingerprint mismatch: stored " + hex(t.fingerprint) + ", computed " + hex(actual));
  return Status::OK();
}

}  // namespace

Status read(const std::string& path, Checkpoint* out, bool verify) {
  std::error_code ec;
  const auto fsize = fs::file_size(path, ec);
  h5::Handle file;
  Status st = h5::open_read(path, &file);
  if (!st.ok()) return st.prefixed("checkpoint '" + path + "'");
  return read_open(file, path, ec ? 0 : fsize, out, verify);
}

Status read_open(const h5::Handle& file, const std::string& path, std::uint64_t fsize, Checkpoint* out, bool verify) {
  *out = Checkpoint();
  const std::string where = "checkpoint '" + path + "'";
  Status st;
  if (H5Lexists(file.id(), kMeta, H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::Damaged(where + " has no group '/meta' (not a culprit checkpoint?)");
  }
  h5::Handle meta(H5Gopen2(file.id(), kMeta, H5P_DEFAULT), H5Gclose);
  if (!meta.valid()) return Status::Damaged(where + ": cannot open '/meta': " + h5::error_stack());
  std::int64_t version = 0;
  st = h5::read_attr(meta.id(), kAttrFormatVersion, &version);
  if (!st.ok()) return st.prefixed(where + " /meta");
  if (version != kCheckpointVersion)
    return Status::BadInput(where + " has format version " + std::to_string(version) + "; this culprit reads " +
                         std::to_string(kCheckpointVersion));
  // Only the attributes culprit writes are read, by name (no H5Aiterate: HDF5 1.10's attribute
  // table walk crashes on some damaged files, found by tests/fuzz).
  Fingerprint stored_state = 0;
  st = h5::read_attr_u64(meta.id(), kAttrStateFingerprint, &stored_state);
  if (!st.ok()) return st.prefixed(where + " /meta");
  for (const char* a : kMetaInts) {
    std::int64_t v = 0;
    if (!h5::has_attr(meta.id(), a)) continue;
    st = h5::read_attr(meta.id(), a, &v);
    if (!st.ok()) return st.prefixed(where + " /meta");
    out->meta_int[a] = v;
  }
  for (const char* a : kMetaStrings) {
    std::string v;
    if (!h5::has_attr(meta.id(), a)) continue;
    st = h5::read_attr(meta.id(), a, &v);
    if (!st.ok()) return st.prefixed(where + " /meta");
    out->meta[a] = v;
  }
  if (!out->meta_int.count("step")) return Status::Damaged(where + " /meta has no 'step'");
  out->step = out->meta_int["step"];
  const std::uint64_t max_bytes = fsize + (1u << 20);
  CULPRIT_RETURN_IF_ERROR(read_group(file.id(), path, kModel, std::string("/") + kModel, false, max_bytes, &out->model));
  CULPRIT_RETURN_IF_ERROR(read_group(file.id(), path, kOptimizer, std::string("/") + kOptimizer, true, max_bytes, &out->optimizer));
  CULPRIT_RETURN_IF_ERROR(read_group(file.id(), path, kRng, std::string("/") + kRng, false, max_bytes, &out->rng));
  std::vector<RawTensor> data;
  CULPRIT_RETURN_IF_ERROR(read_group(file.id(), path, kData, std::string("/") + kData, false, max_bytes, &data));
  RawTensor epoch, cursor;
  for (auto& t : data) {
    if (t.dtype != DType::kInt64 || !t.shape.empty())
      return Status::Damaged(where + " dataset '/data/" + t.name + "' must be an int64 scalar");
    if (t.name == "epoch") epoch = t;
    if (t.name == "cursor") cursor = t;
  }
  if (epoch.bytes.size() != 8 || cursor.bytes.size() != 8)
    return Status::Damaged(where + " lacks /data/epoch or /data/cursor");
  std::memcpy(&out->epoch, epoch.bytes.data(), 8);
  std::memcpy(&out->cursor, cursor.bytes.data(), 8);
  out->state_fingerprint = stored_state;
  if (!verify) return Status::OK();
  for (const auto& t : out->model) CULPRIT_RETURN_IF_ERROR(verify_tensor(path, kModel, t));
  for (const auto& t : out->optimizer) CULPRIT_RETURN_IF_ERROR(verify_tensor(path, kOptimizer, t));
  for (const auto& t : out->rng) CULPRIT_RETURN_IF_ERROR(verify_tensor(path, kRng, t));
  for (const auto* t : {&epoch, &cursor}) CULPRIT_RETURN_IF_ERROR(verify_tensor(path, kData, *t));
  const Fingerprint actual = state_fp(*out);
  if (actual != stored_state)
    return Status::Damaged(where + ": state fingerprint mismatch: stored " + hex(stored_state) + ", computed " +
                         hex(actual) + " (a dataset was added, removed or renamed)");
  return Status::OK();
}

Status belongs(const std::string& path, const Checkpoint& c, const std::string& run_id) {
  const std::int64_t named_step = step_in_name(fs::path(path).filename().string());
  const auto id = c.meta.find(kMetaRunId);
  CULPRIT_RETURN_IF_ERROR(files::same_run(path, id == c.meta.end() ? "" : id->second, run_id));
  if (named_step >= 0 && c.step != named_step)
    return Status::Damaged("'" + path + "' holds step " + std::to_string(c.step) + ", not the step its name says (" +
                            std::to_string(named_step) + "): a renamed checkpoint is never used");
  return Status::OK();
}

Status apply_retention(const std::string& run_dir, std::int64_t keep_step, int keep_last, std::int64_t keep_every) {
  // Deletes only entries of RUN/checkpoints itself: never through a linked directory.
  CULPRIT_RETURN_IF_ERROR(files::refuse_link((fs::path(run_dir) / kCheckpointDir).string()));
  auto all = list(run_dir);
  std::vector<std::pair<std::int64_t, std::string>> older;
  for (const auto& e : all)
    if (e.first < keep_step) older.push_back(e);
  // keep_step itself counts as one of the newest keep_last. The oldest checkpoint is the run's
  // start (step 0, or the one it was resumed from first): it is always kept, so that any step of
  // the run can be reached by replaying forward and a silent fault anywhere can be localised.
  const int keep_older = std::max(0, keep_last - 1);
  for (std::size_t i = 1; i + keep_older < older.size(); ++i) {
    const auto& [step, path] = older[i];
    if (keep_every > 0 && step > 0 && step % keep_every == 0) continue;
    CULPRIT_RETURN_IF_ERROR(files::remove(path).prefixed("retention"));
  }
  return Status::OK();
}

}  // namespace culprit::ckpt
