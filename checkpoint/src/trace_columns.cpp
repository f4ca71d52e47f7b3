#include "trace_columns.h"

#include <algorithm>
#include <cstring>

#include "culprit/checkpoint_format.h"

namespace culprit::trace {

using namespace culprit::format;

namespace {

// The row's fields in column order, as bytes.
struct RowBytes {
  std::vector<unsigned char> b;
  template <class T>
  void add(const T& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  }
  void add(const std::vector<Fingerprint>& v) {
    for (auto x : v) add(x);
  }
  void add_fixed(const std::string& s, int chars) {
    std::vector<unsigned char> f(chars, 0);
    std::memcpy(f.data(), s.data(), std::min<std::size_t>(s.size(), chars));
    b.insert(b.end(), f.begin(), f.end());
  }
  // The fingerprint (culprit/fingerprint.h) of the file's rank and the row's index, then the fields.
  Fingerprint check(int rank, std::int64_t index) const {
    RowBytes all;
    all.add(kRowCheckSeed), all.add(static_cast<std::int64_t>(rank)), all.add(index);
    all.b.insert(all.b.end(), b.begin(), b.end());
    return fingerprint_bytes(all.b.data(), all.b.size());
  }
};

}  // namespace

Fingerprint row_check(const StepRow& r, int rank, std::int64_t index) {
  RowBytes b;
  b.add(r.step), b.add(r.loss), b.add(r.lr), b.add(r.grad_fp), b.add(r.param_fps);
  b.add(r.world), b.add(r.chunk_fp), b.add(r.opt_fps);
  b.add(r.reduced_fps);  // format 4; empty (no bytes) before
  if (r.shard) {  // format 5, sharded runs only: an unsharded row's bytes are format 4's
    const auto w = r.shard->words();
    b.add(std::vector<Fingerprint>(w.begin(), w.end()));
  }
  return b.check(rank, index);
}

Fingerprint row_check(const ShardRow& r, int rank, std::int64_t index) {
  RowBytes b;
  b.add(r.step), b.add(r.shard), b.add(r.rank);
  b.add_fixed(r.host, kHostChars), b.add_fixed(r.device, kDeviceChars);
  b.add(r.loss), b.add(r.grad_fp), b.add(r.input_fp), b.add(r.param_grad), b.add(r.fwd), b.add(r.bwd);
  b.add(r.sample_fps);
  return b.check(rank, index);
}

namespace detail {

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
  // The write may sit in the chunk cache until the close writes it: a full disk shows there.
  return ds.close(std::string("trace column '") + name + "'");
}

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
  CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, kAttrSamplesPerShard, static_cast<std::int64_t>(h.samples_per_shard)));
  if (!h.run_id.empty()) CULPRIT_RETURN_IF_ERROR(h5::write_attr(f, kAttrRunId, h.run_id));
  return h5::write_attr(f, "fingerprint_format", std::string("fp1"));
}

Status read_header(hid_t f, Header* h) {
  std::int64_t v = 0;
  CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, "format_version", &v));
  if (v < kTraceOldestReadable || v > kTraceVersion)
    return Status::BadInput("format version " + std::to_string(v) + " is not one this culprit reads (" +
                            std::to_string(kTraceOldestReadable) + ".." + std::to_string(kTraceVersion) + ")");
  h->format_version = v;
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
  h->samples_per_shard = 0;
  if (h->format_version >= 3) {
    CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, kAttrSamplesPerShard, &v));
    if (v < 0 || v > (1 << 24)) return Status::Damaged("implausible samples_per_shard " + std::to_string(v));
    h->samples_per_shard = static_cast<int>(v);
  }
  h->run_id.clear();
  if (h5::has_attr(f, kAttrRunId)) CULPRIT_RETURN_IF_ERROR(h5::read_attr(f, kAttrRunId, &h->run_id));
  return Status::OK();
}

Status count_through(hid_t group, const std::string& where, std::int64_t committed, std::int64_t keep, std::int64_t* n) {
  std::vector<unsigned char> buf;
  std::int64_t extent = 0;
  CULPRIT_RETURN_IF_ERROR(get(group, where, "step", H5T_NATIVE_INT64, 8, 0, committed, &buf, &extent));
  const auto* steps = reinterpret_cast<const std::int64_t*>(buf.data());
  *n = 0;
  while (*n < committed && steps[*n] <= keep) ++*n;
  return Status::OK();
}

}  // namespace detail
}  // namespace culprit::trace
