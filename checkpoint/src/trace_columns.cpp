#include "trace_columns.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>

#include "culprit/checkpoint_format.h"
#include "trace_table.h"

namespace culprit::trace {

using namespace culprit::format;

namespace {

// The fields' places in the row checksum (index k: the table column hashed k-th).
template <class R>
struct CheckOrder {
  static constexpr auto& t = detail::TableOf<R>::columns;
  static constexpr auto order = [] {
    std::array<std::size_t, std::size(t) - 1> o{};
    for (std::size_t i = 0; i < std::size(t); ++i)
      if (t[i].check != detail::kRowCheck) o[t[i].check] = i;
    return o;
  }();
};

// The fingerprint (culprit/fingerprint.h) of the seed, the file's rank and the row's index, then
// the fields in checksum order.
template <class R>
Fingerprint check_of(const R& r, int rank, std::int64_t index) {
  detail::RowBytes b;
  const std::uint64_t head[] = {kRowCheckSeed, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(index)};
  b.add(head, sizeof head);
  for (std::size_t i : CheckOrder<R>::order) {
    const auto& c = CheckOrder<R>::t[i];
    c.codec.hash(r, detail::elem_size(c.elem), &b);
  }
  return fingerprint_bytes(b.b.data(), b.b.size());
}

}  // namespace

Fingerprint row_check(const StepRow& r, int rank, std::int64_t index) { return check_of(r, rank, index); }
Fingerprint row_check(const ShardRow& r, int rank, std::int64_t index) { return check_of(r, rank, index); }

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

namespace {

hid_t string_type(int chars) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, chars);
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  return t;
}
// An extendible 1-D (width 0) or 2-D column.
Status create_column(hid_t group, const char* name, hid_t type, std::int64_t width) {
  std::vector<hsize_t> dims{0}, maxd{H5S_UNLIMITED}, chunk{static_cast<hsize_t>(kTraceChunkRows)};
  if (width > 0) {
    dims.push_back(width);
    maxd.push_back(width);
    chunk.push_back(width);
  }
  h5::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxd.data()), H5Sclose);
  h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.id(), static_cast<int>(chunk.size()), chunk.data());
  h5::Handle ds(H5Dcreate2(group, name, type, space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return Status::IoError(std::string("cannot create trace column '") + name + "': " + h5::error_stack());
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
  // The write may sit in the chunk cache until the close writes it: a full disk shows there.
  return ds.close(std::string("trace column '") + name + "'");
}

// A column's HDF5 type (memory and file), a copy to close.
h5::Handle type_of(Elem e) {
  switch (e) {
    case Elem::kInt32: return h5::Handle(H5Tcopy(H5T_NATIVE_INT32), H5Tclose);
    case Elem::kInt64: return h5::Handle(H5Tcopy(H5T_NATIVE_INT64), H5Tclose);
    case Elem::kUint64: return h5::Handle(H5Tcopy(H5T_NATIVE_UINT64), H5Tclose);
    case Elem::kFloat: return h5::Handle(H5Tcopy(H5T_NATIVE_FLOAT), H5Tclose);
    case Elem::kDouble: return h5::Handle(H5Tcopy(H5T_NATIVE_DOUBLE), H5Tclose);
    case Elem::kHost: return h5::Handle(string_type(kHostChars), H5Tclose);
    case Elem::kDevice: return h5::Handle(string_type(kDeviceChars), H5Tclose);
  }
  return h5::Handle();
}

// A column's row in a file of header `h`.
struct Shape {
  std::int64_t width;  // stored elements (a 1-D column: 1)
  std::int64_t len;    // the field's elements: the header's count, which may be 0
  std::size_t elem;    // bytes an element
  bool two_d;
  std::size_t bytes() const { return static_cast<std::size_t>(width) * elem; }
  std::int64_t dims() const { return two_d ? width : 0; }  // put's and get's width (0: 1-D)
};

template <class R>
Shape shape_of(const ColumnSpec<R>& c, const Header& h) {
  std::int64_t len = 1;
  switch (c.width) {
    case Width::kOne: break;
    case Width::kParams: len = static_cast<std::int64_t>(h.params.size()); break;
    case Width::kLayers: len = static_cast<std::int64_t>(h.layers.size()); break;
    case Width::kSamples: len = h.samples_per_shard; break;
    case Width::kSlice: len = kShardColumns; break;
  }
  return {std::max<std::int64_t>(1, len), len, elem_size(c.elem), c.width != Width::kOne};
}

// Whether a file of this format and level has the column.
template <class R>
bool has(const ColumnSpec<R>& c, std::int64_t version, Level level) {
  return version >= c.since && (!c.layer_only || level == Level::kLayer);
}

std::string label(const StepRow& r) { return "step " + std::to_string(r.step); }
std::string label(const ShardRow& r) {
  return "step " + std::to_string(r.step) + ", micro-shard " + std::to_string(r.shard);
}

}  // namespace

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

template <class R>
Status create_columns(hid_t group, const Header& h) {
  for (const auto& c : TableOf<R>::columns) {
    if (!has(c, kTraceVersion, h.level)) continue;
    const h5::Handle type = type_of(c.elem);
    CULPRIT_RETURN_IF_ERROR(create_column(group, c.name, type.id(), shape_of(c, h).dims()));
  }
  return Status::OK();
}

// Every column's rows are gathered, then read back as the reader will (a vector padded or cut to
// the header's count, a string cut at its NUL): the checksum covers what a reader sees, so the two
// cannot disagree.
template <class R>
Status put_rows(hid_t group, const Header& h, std::int64_t row0, const R* rows, std::int64_t n) {
  constexpr auto& t = TableOf<R>::columns;
  std::vector<std::vector<unsigned char>> cols(std::size(t));
  std::vector<R> back(n);
  std::size_t check = 0;
  for (std::size_t k = 0; k < std::size(t); ++k) {
    const auto& c = t[k];
    if (c.check == kRowCheck) check = k;
    if (!has(c, kTraceVersion, h.level) || c.check == kRowCheck) continue;
    const Shape s = shape_of(c, h);
    cols[k].assign(n * s.bytes(), 0);
    for (std::int64_t i = 0; i < n; ++i) {
      c.codec.save(rows[i], s.width, s.elem, &cols[k][i * s.bytes()]);
      c.codec.load(&back[i], s.len, s.elem, &cols[k][i * s.bytes()]);
    }
  }
  std::vector<Fingerprint> checks(n);
  for (std::int64_t i = 0; i < n; ++i) checks[i] = row_check(back[i], h.rank, row0 + i);
  cols[check].resize(n * sizeof(Fingerprint));
  std::memcpy(cols[check].data(), checks.data(), cols[check].size());
  for (std::size_t k = 0; k < std::size(t); ++k) {
    if (!has(t[k], kTraceVersion, h.level)) continue;
    const h5::Handle type = type_of(t[k].elem);
    CULPRIT_RETURN_IF_ERROR(put(group, t[k].name, type.id(), row0, n, shape_of(t[k], h).dims(), cols[k].data()));
  }
  return Status::OK();
}

template <class R>
Status get_rows(hid_t group, const std::string& where, const Header& h, std::int64_t n, std::vector<R>* out,
                std::int64_t* torn) {
  constexpr auto& t = TableOf<R>::columns;
  std::vector<std::vector<unsigned char>> cols(std::size(t));
  std::vector<Shape> shapes;
  const unsigned char* checks = nullptr;  // none before format 3
  for (std::size_t k = 0; k < std::size(t); ++k) {
    shapes.push_back(shape_of(t[k], h));
    if (!has(t[k], h.format_version, h.level)) continue;
    const h5::Handle type = type_of(t[k].elem);
    const Shape& s = shapes[k];
    std::int64_t extent = 0;
    CULPRIT_RETURN_IF_ERROR(get(group, where, t[k].name, type.id(), s.elem, s.dims(), n, &cols[k], &extent));
    if (k == 0) *torn = extent - n;  // "step"
    if (t[k].check == kRowCheck) checks = cols[k].data();
  }
  for (std::int64_t i = 0; i < n; ++i) {
    R r;
    for (std::size_t k = 0; k < std::size(t); ++k)
      if (t[k].check != kRowCheck && has(t[k], h.format_version, h.level))
        t[k].codec.load(&r, shapes[k].len, shapes[k].elem, &cols[k][i * shapes[k].bytes()]);
    Fingerprint want = 0;
    if (checks) std::memcpy(&want, checks + i * sizeof want, sizeof want);
    if (checks && row_check(r, h.rank, i) != want)
      return Status::Damaged(where + " row " + std::to_string(i) + " (" + label(r) +
                             ") fails its checksum: the file changed after it was written");
    out->push_back(std::move(r));
  }
  return Status::OK();
}

template Status create_columns<StepRow>(hid_t, const Header&);
template Status create_columns<ShardRow>(hid_t, const Header&);
template Status put_rows(hid_t, const Header&, std::int64_t, const StepRow*, std::int64_t);
template Status put_rows(hid_t, const Header&, std::int64_t, const ShardRow*, std::int64_t);
template Status get_rows(hid_t, const std::string&, const Header&, std::int64_t, std::vector<StepRow>*, std::int64_t*);
template Status get_rows(hid_t, const std::string&, const Header&, std::int64_t, std::vector<ShardRow>*, std::int64_t*);

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
