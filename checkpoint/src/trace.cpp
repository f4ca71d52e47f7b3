// The trace's writer: RUN/trace/rank-RRRRR.h5 appended every step (rows first, then the committed
// counts), reopened on resume, truncated to a checkpoint. The reader: trace_read.cpp; the columns
// and the header both share: trace_columns.h. Format: docs/checkpoint-format.md.
#include "culprit/trace.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "culprit/checkpoint_format.h"
#include "culprit/run_files.h"
#include "trace_columns.h"

namespace culprit::trace {

namespace fs = std::filesystem;
using namespace culprit::format;
using namespace detail;

std::string path_for(const std::string& run_dir, int rank) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%0*d.h5", kTracePrefix, kRankDigits, rank);
  return (fs::path(run_dir) / kTraceDir / name).string();
}

std::string sealed_path_for(const std::string& run_dir, int rank, std::int64_t through) {
  char name[96];
  std::snprintf(name, sizeof name, "%s%0*d%s%0*lld.h5", kTracePrefix, kRankDigits, rank, kTraceSealedInfix, kStepDigits,
                static_cast<long long>(through));
  return (fs::path(run_dir) / kTraceDir / name).string();
}

bool parse_file_name(const std::string& filename, FileName* out) {
  static const std::regex re("rank-([0-9]{5})(\\.to-([0-9]{8,12}))?\\.h5");
  std::smatch m;
  if (!std::regex_match(filename, m, re)) return false;
  out->rank = std::stoi(m[1].str());
  out->through = m[3].matched ? std::stoll(m[3].str()) : -1;
  return true;
}

namespace {

// A trace is appended to for the whole run: every append extends its datasets, and HDF5's adaptive
// metadata cache grows with their chunk indexes (up to 32 MiB a file by default: ~420 bytes a step
// a rank, bench/soak.py). Rows are written once and never read back by the writer, so a small cache
// costs nothing (docs/performance.md, "Soak").
Status bound_metadata_cache(hid_t file, const std::string& where) {
  H5AC_cache_config_t c;
  c.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  if (H5Fget_mdc_config(file, &c) < 0) return Status::Internal(where + ": H5Fget_mdc_config: " + h5::error_stack());
  c.set_initial_size = true;
  c.initial_size = 512 * 1024;
  c.min_size = 256 * 1024;
  c.max_size = 1024 * 1024;
  if (H5Fset_mdc_config(file, &c) < 0) return Status::Internal(where + ": H5Fset_mdc_config: " + h5::error_stack());
  return Status::OK();
}

void merge_faults(const std::vector<std::string>& from, std::vector<std::string>* into) {
  for (const auto& f : from)
    if (std::find(into->begin(), into->end(), f) == into->end()) into->push_back(f);
}

Status flush_failed(const std::string& where) {
  h5::note_failed_write();
  return Status::IoError(where + ": flush failed: " + h5::error_stack());
}

// Where the live file's rows begin (its first row's step - 1): where it was last sealed, when every
// sealed file has been retired.
Status first_step_minus_one(hid_t file, const std::string& where, std::int64_t* out) {
  h5::Handle sg(H5Gopen2(file, "steps", H5P_DEFAULT), H5Gclose);
  if (!sg.valid()) return Status::Damaged(where + " lacks /steps");
  std::vector<unsigned char> buf;
  std::int64_t extent = 0, step = 0;
  CULPRIT_RETURN_IF_ERROR(get(sg.id(), where, "step", H5T_NATIVE_INT64, 8, 0, 1, &buf, &extent));
  std::memcpy(&step, buf.data(), 8);
  *out = std::max<std::int64_t>(0, step - 1);
  return Status::OK();
}

// A job may append to a file of this run, this format, this model and trace level only.
Status compatible(const std::string& path, const Header& old, const Header& h) {
  const std::string where = "trace '" + path + "'";
  CULPRIT_RETURN_IF_ERROR(files::same_run(path, old.run_id, h.run_id));  // foreign: never moved aside
  if (old.format_version != kTraceVersion)
    return Status::BadInput(where + " has format " + std::to_string(old.format_version) + ", not " +
                            std::to_string(kTraceVersion) + ": continue the run with the culprit that started it");
  if (old.params != h.params || old.level != h.level || old.layers != h.layers ||
      old.samples_per_shard != h.samples_per_shard)
    return Status::BadInput(where + " was written for another model or trace level (" + name_of(old.level) + ")");
  return Status::OK();
}

const char* kind_of(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a fifo" : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m) || S_ISBLK(m) ? "a device" : "not a file";
}

// Before anything is changed (a refused resume changes nothing): the rank's newest file, when it
// can be read (one that cannot is open()'s to move aside), must be compatible; and every file of
// the rank that HDF5 can open must hold only rows that pass their checksums. A crash leaves at most
// a torn tail beyond the committed counts (readers skip it) or a file HDF5 cannot open at all
// (moved aside by open()); a committed row failing its checksum, or a directory or fifo under a
// trace's name, is something else changing the record. Appending to it and cutting it back would
// hide that, so the resume stops: Damaged, naming the file and the row.
Status check_newest(const std::string& run_dir, const Header& h) {
  const auto all = list_rank(run_dir, h.rank);
  if (all.empty()) return Status::OK();
  const char* stop = ": --resume stops rather than continue the run over a damaged record (restore the file from "
                     "a copy; culprit bisect names it as damaged-record)";
  for (const auto& p : all) {
    struct stat s{};
    if (::lstat(p.c_str(), &s) == 0 && !S_ISREG(s.st_mode) && !S_ISLNK(s.st_mode))
      return Status::Damaged("trace '" + p + "' is " + kind_of(s.st_mode) +
                             ", not a trace file (a crash never leaves one): rank " + std::to_string(h.rank) +
                             "'s record of its steps is not there" + stop);
  }
  {
    h5::Handle f;
    Header old;
    if (h5::open_read(all.back(), &f).ok() && read_header(f.id(), &old).ok())
      CULPRIT_RETURN_IF_ERROR(compatible(all.back(), old, h));
    H5Eclear2(H5E_DEFAULT);
  }
  for (const auto& p : all) {
    h5::Handle f;
    Header old;
    if (!h5::open_read(p, &f).ok() || !read_header(f.id(), &old).ok()) {
      H5Eclear2(H5E_DEFAULT);
      continue;  // what a crash can leave: open()'s to move aside (a sealed one: rewind says it)
    }
    TraceFile tf;
    const Status st = read_open(f, p, &tf);
    if (!st.ok()) return Status::Damaged(st.message() + stop);
  }
  return Status::OK();
}

}  // namespace

Status Writer::check(const std::string& path, const Header& h) {
  CULPRIT_RETURN_IF_ERROR(files::refuse_link(fs::path(path).parent_path().string()));
  CULPRIT_RETURN_IF_ERROR(files::refuse_link(path));  // opened for writing: never through a link
  return check_newest(fs::path(path).parent_path().parent_path().string(), h);
}

Status Writer::open(const std::string& path, const Header& h, std::int64_t keep_through_step, std::string* warning) {
  header_ = h;
  path_ = path;
  failed_ = Status::OK();
  const std::string where = "trace '" + path + "'";
  const std::string run_dir = fs::path(path).parent_path().parent_path().string();
  CULPRIT_RETURN_IF_ERROR(check(path, h));
  CULPRIT_RETURN_IF_ERROR(rewind(run_dir, h.rank, keep_through_step, h.run_id));
  sealed_through_ = 0;
  for (const auto& p : list_rank(run_dir, h.rank)) {
    FileName n;
    if (parse_file_name(fs::path(p).filename().string(), &n)) sealed_through_ = std::max(sealed_through_, n.through);
  }
  std::error_code ec;
  if (fs::exists(path, ec)) {
    Header old;
    Status st = h5::open_rw(path, &file_);
    if (st.ok()) st = read_header(file_.id(), &old);
    if (st.ok()) CULPRIT_RETURN_IF_ERROR(compatible(path, old, h));
    if (st.ok()) {
      file_.reset();
      st = truncate(path, keep_through_step);
      if (st.ok()) st = h5::open_rw(path, &file_);
      if (st.ok()) st = bound_metadata_cache(file_.id(), where);
      if (st.ok()) st = h5::read_attr(file_.id(), kAttrStepsCommitted, &steps_);
      if (st.ok()) st = h5::read_attr(file_.id(), kAttrShardsCommitted, &shards_);
      if (st.ok() && sealed_through_ == 0 && steps_ > 0) st = first_step_minus_one(file_.id(), where, &sealed_through_);
      // The file's rank and world describe its latest writer; its faults are every writer's.
      Header merged = h;
      merge_faults(old.faults, &merged.faults);
      header_ = merged;  // a file sealed from here on carries every writer's faults too
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
  // trace/ is culprit's (never a link) and the file a fresh one (a link there is replaced, not
  // written through).
  CULPRIT_RETURN_IF_ERROR(files::ensure_dir(fs::path(path).parent_path().string()));
  CULPRIT_RETURN_IF_ERROR(files::create_fresh(path));
  // After sealed files (a crash after a seal), the new live file carries their faults too.
  for (const auto& p : list_rank(run_dir, h.rank)) {
    h5::Handle f;
    Header old;
    if (p != path && h5::open_read(p, &f).ok() && read_header(f.id(), &old).ok()) merge_faults(old.faults, &header_.faults);
    H5Eclear2(H5E_DEFAULT);
  }
  const Status created = create(path, header_, where);
  if (!created.ok()) {
    file_.reset();
    files::remove(path);  // no empty or half-made trace is left behind (a full disk at the start)
  }
  return created;
}

Status Writer::create(const std::string& path, const Header& h, const std::string& where) {
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) return Status::IoError("cannot create " + where + ": " + h5::error_stack());
  file_ = h5::Handle(id, H5Fclose);
  CULPRIT_RETURN_IF_ERROR(bound_metadata_cache(file_.id(), where));
  CULPRIT_RETURN_IF_ERROR(write_header(file_.id(), h));
  h5::Handle steps, shards;
  CULPRIT_RETURN_IF_ERROR(h5::create_group(file_.id(), "steps", &steps));
  CULPRIT_RETURN_IF_ERROR(h5::create_group(file_.id(), "shards", &shards));
  CULPRIT_RETURN_IF_ERROR(create_columns<StepRow>(steps.id(), h));
  CULPRIT_RETURN_IF_ERROR(create_columns<ShardRow>(shards.id(), h));
  steps_ = shards_ = 0;
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(file_.id(), kAttrStepsCommitted, steps_));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(file_.id(), kAttrShardsCommitted, shards_));
  if (H5Fflush(file_.id(), H5F_SCOPE_LOCAL) < 0) return flush_failed(where);
  return Status::OK();
}

Status Writer::append(const StepRow& s, const std::vector<ShardRow>& rows) {
  if (!failed_.ok()) return failed_;
  if (!file_.valid()) return failed_ = Status::Internal("trace '" + path_ + "' is not open");
  hsize_t before = 0, after = 0;
  Status st = room_for_rows();
  if (st.ok() && H5Fget_filesize(file_.id(), &before) < 0) H5Eclear2(H5E_DEFAULT);
  if (st.ok()) st = append_rows(s, rows);
  if (st.ok() && H5Fget_filesize(file_.id(), &after) >= 0 && after > before)
    growth_ = std::max<std::uint64_t>(growth_, after - before);
  H5Eclear2(H5E_DEFAULT);
  if (!st.ok()) failed_ = st.prefixed("trace '" + path_ + "'");
  return failed_;
}

// A write past the file size limit is cut short at the limit (then EFBIG): HDF5 would have written
// the superblock's new end of file but not the data up to it, and the file could never be opened
// again ("truncated file"). So the append that may pass the limit is not started: the job ends with
// exit 6 like a full disk, every committed row intact. A step grows the file by at most a new chunk
// of every column (and its index), the most seen so far; twice that and 64 KiB of metadata is kept.
Status Writer::room_for_rows() const {
  struct rlimit limit{};
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return Status::OK();
  hsize_t size = 0;
  if (H5Fget_filesize(file_.id(), &size) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::OK();
  }
  const std::uint64_t need = 2 * growth_ + 65536;
  if (static_cast<std::uint64_t>(size) + need <= limit.rlim_cur) return Status::OK();
  return Status::IoError("cannot append to it: " + std::string(std::strerror(EFBIG)) + " (the file size limit, ulimit -f, is " +
                         std::to_string(limit.rlim_cur) + " bytes; the trace holds " + std::to_string(size) +
                         " and a step may add " + std::to_string(need) + ")");
}

Status Writer::append_rows(const StepRow& s, const std::vector<ShardRow>& rows) {
  h5::Handle steps(H5Gopen2(file_.id(), "steps", H5P_DEFAULT), H5Gclose);
  h5::Handle shards(H5Gopen2(file_.id(), "shards", H5P_DEFAULT), H5Gclose);
  const std::int64_t n = static_cast<std::int64_t>(rows.size());
  CULPRIT_RETURN_IF_ERROR(put_rows(steps.id(), header_, steps_, &s, 1));
  CULPRIT_RETURN_IF_ERROR(put_rows(shards.id(), header_, shards_, rows.data(), n));
  // Rows first, then the counts that make them visible.
  if (H5Fflush(file_.id(), H5F_SCOPE_LOCAL) < 0) return flush_failed("trace '" + path_ + "'");
  steps_ += 1;
  shards_ += n;
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(file_.id(), kAttrStepsCommitted, steps_));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(file_.id(), kAttrShardsCommitted, shards_));
  if (H5Fflush(file_.id(), H5F_SCOPE_LOCAL) < 0) return flush_failed("trace '" + path_ + "'");
  return Status::OK();
}

Status Writer::sync() {
  if (!failed_.ok()) return failed_;
  if (!file_.valid()) return Status::OK();
  const std::string where = "trace '" + path_ + "'";
  if (H5Fflush(file_.id(), H5F_SCOPE_LOCAL) < 0) return failed_ = flush_failed(where);
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file_.id(), H5P_DEFAULT, &handle) < 0 || !handle)
    return Status::Internal(where + ": H5Fget_vfd_handle: " + h5::error_stack());
  if (::fsync(*static_cast<int*>(handle)) != 0)  // the POSIX driver's descriptor
    return failed_ = Status::IoError("cannot sync " + where + ": " + std::strerror(errno));
  return Status::OK();
}

// Rename, then create: a crash between the two leaves no live file, and the next open starts one.
Status Writer::seal(std::int64_t through) {
  if (!failed_.ok()) return failed_;
  const std::string run_dir = fs::path(path_).parent_path().parent_path().string();
  const std::string to = sealed_path_for(run_dir, header_.rank, through);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(to, ec)))
    return Status::Internal("trace '" + to + "' exists already: the live trace cannot be sealed under its name");
  file_.reset();
  CULPRIT_RETURN_IF_ERROR(files::move(path_, to));
  sealed_through_ = through;
  CULPRIT_RETURN_IF_ERROR(files::create_fresh(path_));
  const Status created = create(path_, header_, "trace '" + path_ + "'");
  if (!created.ok()) {
    file_.reset();
    files::remove(path_);
    failed_ = created;  // the next job starts a live file (as after a crash here)
  }
  return created;
}

Status Writer::retire(std::int64_t first_kept) {
  return trace::retire(fs::path(path_).parent_path().parent_path().string(), header_.rank, first_kept, header_.run_id);
}

namespace {

// The run a trace file says it belongs to ("" when it predates identities).
Status run_id_of(const std::string& path, std::string* out) {
  h5::Handle f;
  CULPRIT_RETURN_IF_ERROR(h5::open_read(path, &f).prefixed("trace '" + path + "'"));
  out->clear();
  if (h5::has_attr(f.id(), kAttrRunId)) CULPRIT_RETURN_IF_ERROR(h5::read_attr(f.id(), kAttrRunId, out));
  return Status::OK();
}

// A file about to be deleted or replaced must be this run's (one that cannot be read is).
Status ours(const std::string& path, const std::string& run_id) {
  CULPRIT_RETURN_IF_ERROR(files::refuse_link(path));
  std::string theirs;
  if (!run_id_of(path, &theirs).ok()) {
    H5Eclear2(H5E_DEFAULT);
    return Status::OK();
  }
  return files::same_run(path, theirs, run_id);
}

}  // namespace

Status retire(const std::string& run_dir, int rank, std::int64_t first_kept, const std::string& run_id) {
  for (const auto& p : list_rank(run_dir, rank)) {
    FileName n;
    if (!parse_file_name(fs::path(p).filename().string(), &n) || n.through < 0 || n.through >= first_kept) continue;
    CULPRIT_RETURN_IF_ERROR(ours(p, run_id));
    CULPRIT_RETURN_IF_ERROR(files::remove(p).prefixed("trace retention"));
  }
  return Status::OK();
}

Status rewind(const std::string& run_dir, int rank, std::int64_t keep, const std::string& run_id) {
  std::vector<std::string> after;  // sealed files running past `keep`, oldest first
  for (const auto& p : list_rank(run_dir, rank)) {
    FileName n;
    if (parse_file_name(fs::path(p).filename().string(), &n) && n.through > keep) after.push_back(p);
  }
  if (after.empty()) return Status::OK();
  for (const auto& p : after) {
    CULPRIT_RETURN_IF_ERROR(files::refuse_link(p));
    std::string theirs;
    CULPRIT_RETURN_IF_ERROR(run_id_of(p, &theirs));
    CULPRIT_RETURN_IF_ERROR(files::same_run(p, theirs, run_id));  // another run's: refused, untouched
  }
  const std::string live = path_for(run_dir, rank);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(live, ec))) CULPRIT_RETURN_IF_ERROR(ours(live, run_id));
  // Only the oldest can hold rows through `keep`; the rest hold later steps only. Newest first, so
  // that a crash part-way leaves what a repeat needs.
  std::int64_t kept = 0;
  CULPRIT_RETURN_IF_ERROR(truncate(after[0], keep, run_id, &kept));
  for (std::size_t i = after.size(); i-- > (kept > 0 ? 1 : 0);)
    CULPRIT_RETURN_IF_ERROR(files::remove(after[i]).prefixed("trace rewind"));
  if (kept > 0) CULPRIT_RETURN_IF_ERROR(files::move(after[0], path_for(run_dir, rank)));
  return Status::OK();
}

Status truncate(const std::string& path, std::int64_t keep, const std::string& run_id, std::int64_t* kept) {
  const std::string where = "trace '" + path + "'";
  CULPRIT_RETURN_IF_ERROR(files::refuse_link(path));
  h5::Handle f;
  Status st = h5::open_rw(path, &f);
  if (!st.ok()) return st.prefixed(where);
  std::string theirs;
  if (h5::has_attr(f.id(), kAttrRunId)) CULPRIT_RETURN_IF_ERROR(h5::read_attr(f.id(), kAttrRunId, &theirs));
  CULPRIT_RETURN_IF_ERROR(files::same_run(path, theirs, run_id));
  std::int64_t steps = 0, shards = 0, ns = 0, nsh = 0;
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f.id(), kAttrStepsCommitted, &steps));
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f.id(), kAttrShardsCommitted, &shards));
  h5::Handle sg(H5Gopen2(f.id(), "steps", H5P_DEFAULT), H5Gclose), hg(H5Gopen2(f.id(), "shards", H5P_DEFAULT), H5Gclose);
  if (!sg.valid() || !hg.valid()) return Status::Damaged(where + " lacks /steps or /shards");
  CULPRIT_RETURN_IF_ERROR(count_through(sg.id(), where, steps, keep, &ns));
  CULPRIT_RETURN_IF_ERROR(count_through(hg.id(), where, shards, keep, &nsh));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f.id(), kAttrStepsCommitted, ns));
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f.id(), kAttrShardsCommitted, nsh));
  if (H5Fflush(f.id(), H5F_SCOPE_LOCAL) < 0) return flush_failed(where);
  if (kept) *kept = ns;
  return Status::OK();
}

}  // namespace culprit::trace
