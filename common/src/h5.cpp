#include "culprit/h5.h"

#include <atomic>
#include "culprit/system.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace culprit::h5 {

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

namespace {
std::atomic<bool> g_failed_write{false};
}  // namespace

void note_failed_write() { g_failed_write = true; }
bool writes_failed() { return g_failed_write; }

void Handle::reset() {
  if (id_ >= 0 && closer_ && closer_(id_) < 0) note_failed_write();
  id_ = H5I_INVALID_HID;
}

Status Handle::close(const std::string& what) {
  const herr_t rc = id_ >= 0 && closer_ ? closer_(id_) : 0;
  id_ = H5I_INVALID_HID;
  if (rc < 0) note_failed_write();
  if (rc < 0) return Status::IoError("closing " + what + ": " + error_stack());
  return Status::OK();
}

void init() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {
herr_t walk_cb(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (!out->empty()) *out += "; ";
  *out += e->func_name ? e->func_name : "?";
  *out += ": ";
  *out += e->desc ? e->desc : "";
  return 0;
}
}  // namespace

std::string error_stack() {
  std::string out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? "no HDF5 error stack" : out;
}

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// HDF5 opens a file by name, blocking: a fifo or device in place of a checkpoint or trace would
// hang it (or read forever). Only a regular file is handed to HDF5 (a link is followed to one).
Status regular_file(const std::string& path) {
  struct stat s{};
  if (::stat(path.c_str(), &s) != 0 || S_ISREG(s.st_mode) || S_ISDIR(s.st_mode)) return Status::OK();
  const char* kind = S_ISFIFO(s.st_mode) ? "a fifo" : S_ISSOCK(s.st_mode) ? "a socket"
                     : S_ISCHR(s.st_mode) || S_ISBLK(s.st_mode) ? "a device" : "not a file";
  return Status::Damaged("'" + path + "' is " + kind + ", not a regular file: not an HDF5 checkpoint or trace "
                         "(remove it, or put the run's own file back)");
}

Status open_read(const std::string& path, Handle* file) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return Status::BadInput("file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path, ec))
    return Status::BadInput("'" + path + "' is a directory, not an HDF5 file");
  CULPRIT_RETURN_IF_ERROR(regular_file(path));
  if (access(path.c_str(), R_OK) != 0)
    return Status::IoError("cannot read '" + path + "': " + std::strerror(errno));
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::Damaged("'" + path + "' is not an HDF5 file");
  }
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) return Status::Damaged("cannot open HDF5 file '" + path + "': " + error_stack());
  *file = Handle(id, H5Fclose);
  return Status::OK();
}

bool has_dataset(const Handle& file, const std::string& name) {
  htri_t e = H5Lexists(file.id(), name.c_str(), H5P_DEFAULT);
  if (e <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  H5O_info_t info;
  if (H5Oget_info_by_name(file.id(), name.c_str(), &info, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return info.type == H5O_TYPE_DATASET;
}

Status read_array(const Handle& file, const std::string& path, const std::string& name,
                  Array* out) {
  const std::string where = "'" + path + "' dataset '" + name + "'";
  if (!has_dataset(file, name)) return Status::Damaged("HDF5 file '" + path + "' has no dataset '" + name + "'");
  Handle ds(H5Dopen2(file.id(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return Status::Damaged("cannot open " + where + ": " + error_stack());
  Handle type(H5Dget_type(ds.id()), H5Tclose);
  Handle space(H5Dget_space(ds.id()), H5Sclose);
  if (!type.valid() || !space.valid())
    return Status::Damaged("cannot read the type of " + where + ": " + error_stack());
  const H5T_class_t cls = H5Tget_class(type.id());
  hid_t mem_type;
  if (cls == H5T_FLOAT) {
    out->dtype = DType::kFloat32;
    mem_type = H5T_NATIVE_FLOAT;
  } else if (cls == H5T_INTEGER) {
    out->dtype = DType::kInt64;
    mem_type = H5T_NATIVE_INT64;
  } else {
    return Status::Damaged(where + " must hold floating-point or integer numbers");
  }
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 0 || rank > 16) return Status::Damaged("cannot read the shape of " + where + ": " + error_stack());
  std::vector<hsize_t> dims(rank);
  if (rank) H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  out->shape.assign(dims.begin(), dims.end());
  // The whole array is read at once: its size (a compressed dataset can claim far more than the
  // file holds) is checked against the machine's memory before anything is allocated.
  double bytes = static_cast<double>(dtype_size(out->dtype));
  for (hsize_t d : dims) bytes *= static_cast<double>(d);
  CULPRIT_RETURN_IF_ERROR(check_fits_memory("data " + where, bytes));
  out->bytes.assign(static_cast<std::size_t>(out->numel()) * dtype_size(out->dtype), 0);
  if (!out->bytes.empty() &&
      H5Dread(ds.id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->bytes.data()) < 0)
    return Status::Damaged("cannot read " + where + ": " + error_stack());
  return Status::OK();
}

}  // namespace culprit::h5

namespace culprit::h5 {

Status open_rw(const std::string& path, Handle* file) {
  CULPRIT_RETURN_IF_ERROR(regular_file(path));
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (id < 0) return Status::IoError("cannot open HDF5 file '" + path + "' for writing: " + error_stack());
  *file = Handle(id, H5Fclose);
  return Status::OK();
}

Status create(const std::string& path, MPI_Comm comm, Handle* file) {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (comm != MPI_COMM_NULL && H5Pset_fapl_mpio(fapl.id(), comm, MPI_INFO_NULL) < 0)
    return Status::Internal("H5Pset_fapl_mpio: " + error_stack());
  // The 1.8 file format at least: version 2 superblock and object headers carry checksums, so a
  // damaged header is refused when it is loaded instead of being decoded (HDF5 1.10 reads past its
  // buffers decoding some damaged version 1 headers: tests/integration/test_corruption.py under
  // AddressSanitizer found one in H5Aexists).
  if (H5Pset_libver_bounds(fapl.id(), H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
    return Status::Internal("H5Pset_libver_bounds: " + error_stack());
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id());
  if (id < 0) return Status::IoError("cannot create HDF5 file '" + path + "': " + error_stack());
  *file = Handle(id, H5Fclose);
  return Status::OK();
}

Status create_group(hid_t parent, const std::string& name, Handle* group) {
  hid_t id = H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) return Status::IoError("cannot create group '" + name + "': " + error_stack());
  *group = Handle(id, H5Gclose);
  return Status::OK();
}

hid_t native_type(DType t) {
  switch (t) {
    case DType::kFloat32: return H5T_NATIVE_FLOAT;
    case DType::kFloat64: return H5T_NATIVE_DOUBLE;
    case DType::kInt64: return H5T_NATIVE_INT64;
    case DType::kInt32: return H5T_NATIVE_INT32;
    case DType::kUInt8: case DType::kBool: return H5T_NATIVE_UINT8;
    case DType::kBFloat16: case DType::kFloat16: return H5T_NATIVE_UINT16;
  }
  return H5T_NATIVE_UINT8;
}

namespace {
Handle make_space(const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return Handle(H5Screate(H5S_SCALAR), H5Sclose);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return Handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
}
}  // namespace

Status create_dataset(hid_t parent, const std::string& name, DType t, const std::vector<std::int64_t>& shape,
                      Handle* ds) {
  Handle space = make_space(shape);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  // Allocate at creation so ranks can write disjoint slices independently.
  H5Pset_alloc_time(dcpl.id(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl.id(), H5D_FILL_TIME_NEVER);
  hid_t id = H5Dcreate2(parent, name.c_str(), native_type(t), space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT);
  if (id < 0) return Status::IoError("cannot create dataset '" + name + "': " + error_stack());
  *ds = Handle(id, H5Dclose);
  return Status::OK();
}

Status write_rows(const Handle& ds, DType t, const std::vector<std::int64_t>& shape, std::int64_t row0,
                  std::int64_t rows, const void* data) {
  herr_t rc;
  if (shape.empty() || rows < 0) {
    rc = H5Dwrite(ds.id(), native_type(t), H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  } else {
    if (rows == 0) return Status::OK();
    Handle fspace(H5Dget_space(ds.id()), H5Sclose);
    std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
    start[0] = static_cast<hsize_t>(row0);
    count[0] = static_cast<hsize_t>(rows);
    H5Sselect_hyperslab(fspace.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    Handle mspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
    rc = H5Dwrite(ds.id(), native_type(t), mspace.id(), fspace.id(), H5P_DEFAULT, data);
  }
  if (rc < 0) return Status::IoError("H5Dwrite: " + error_stack());
  return Status::OK();
}

namespace {
void range_boxes(const std::vector<std::int64_t>& shape, std::size_t d, std::vector<hsize_t> prefix, std::int64_t lo,
                 std::int64_t hi, std::vector<std::pair<std::vector<hsize_t>, std::vector<hsize_t>>>* out);
}  // namespace

Status write_range(const Handle& ds, DType t, const std::vector<std::int64_t>& shape, std::int64_t first,
                   std::int64_t count, const void* data) {
  if (count <= 0) return Status::OK();
  if (shape.empty()) return write_rows(ds, t, shape, 0, -1, data);
  std::vector<std::pair<std::vector<hsize_t>, std::vector<hsize_t>>> boxes;
  range_boxes(shape, 0, {}, first, first + count, &boxes);
  Handle fspace(H5Dget_space(ds.id()), H5Sclose);
  for (std::size_t i = 0; i < boxes.size(); ++i)
    if (H5Sselect_hyperslab(fspace.id(), i ? H5S_SELECT_OR : H5S_SELECT_SET, boxes[i].first.data(), nullptr,
                            boxes[i].second.data(), nullptr) < 0)
      return Status::IoError("H5Sselect_hyperslab: " + error_stack());
  const hsize_t n = static_cast<hsize_t>(count);
  Handle mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (H5Dwrite(ds.id(), native_type(t), mspace.id(), fspace.id(), H5P_DEFAULT, data) < 0)
    return Status::IoError("H5Dwrite: " + error_stack());
  return Status::OK();
}

namespace {
// The boxes (start, count per dimension) whose union is elements [lo, hi) of `shape` from
// dimension d on, within the box `prefix` fixes for the dimensions before d.
void range_boxes(const std::vector<std::int64_t>& shape, std::size_t d, std::vector<hsize_t> prefix, std::int64_t lo,
                 std::int64_t hi, std::vector<std::pair<std::vector<hsize_t>, std::vector<hsize_t>>>* out) {
  if (lo >= hi) return;
  std::int64_t inner = 1;
  for (std::size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  auto box = [&](std::int64_t a, std::int64_t b) {  // rows [a, b) of dimension d, whole below
    std::vector<hsize_t> start = prefix, count(prefix.size(), 1);
    start.push_back(static_cast<hsize_t>(a));
    count.push_back(static_cast<hsize_t>(b - a));
    for (std::size_t i = d + 1; i < shape.size(); ++i) start.push_back(0), count.push_back(static_cast<hsize_t>(shape[i]));
    out->push_back({start, count});
  };
  if (d + 1 == shape.size()) return box(lo, hi);
  const std::int64_t r0 = lo / inner, r1 = hi / inner;
  auto within = [&](std::int64_t row, std::int64_t a, std::int64_t b) {
    std::vector<hsize_t> p = prefix;
    p.push_back(static_cast<hsize_t>(row));
    range_boxes(shape, d + 1, p, a, b, out);
  };
  if (r0 == r1) return within(r0, lo % inner, hi % inner);
  std::int64_t full0 = r0;
  if (lo % inner) within(r0, lo % inner, inner), full0 = r0 + 1;
  if (full0 < r1) box(full0, r1);
  if (hi % inner) within(r1, 0, hi % inner);
}

Status write_attr_raw(hid_t obj, const std::string& name, hid_t type, const void* value) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle a(H5Acreate2(obj, name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid() || H5Awrite(a.id(), type, value) < 0)
    return Status::IoError("cannot write attribute '" + name + "': " + error_stack());
  return Status::OK();
}
}  // namespace

Status write_attr(hid_t obj, const std::string& name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.id(), value.empty() ? 1 : value.size());
  H5Tset_strpad(type.id(), H5T_STR_NULLPAD);
  std::string v = value.empty() ? std::string(1, '\0') : value;
  return write_attr_raw(obj, name, type.id(), v.data());
}
Status write_attr(hid_t obj, const std::string& name, std::int64_t value) {
  return write_attr_raw(obj, name, H5T_NATIVE_INT64, &value);
}
Status write_attr_u64(hid_t obj, const std::string& name, std::uint64_t value) {
  return write_attr_raw(obj, name, H5T_NATIVE_UINT64, &value);
}

bool has_attr(hid_t obj, const std::string& name) {
  htri_t e = H5Aexists(obj, name.c_str());
  if (e < 0) H5Eclear2(H5E_DEFAULT);
  return e > 0;
}

Status read_attr(hid_t obj, const std::string& name, std::string* value) {
  if (!has_attr(obj, name)) return Status::Damaged("attribute '" + name + "' is missing");
  Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(a.id()), H5Tclose);
  if (!a.valid() || !type.valid() || H5Tget_class(type.id()) != H5T_STRING)
    return Status::Damaged("attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(type.id()) > 0) return Status::Damaged("attribute '" + name + "' is a variable-length string");
  const std::size_t n = H5Tget_size(type.id());
  if (n == 0 || n > (64u << 20)) return Status::Damaged("attribute '" + name + "' has an implausible size");
  Handle space(H5Aget_space(a.id()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.id()) != 1) return Status::Damaged("attribute '" + name + "' is not a scalar");
  std::string buf(n, '\0');
  Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem.id(), n);
  H5Tset_strpad(mem.id(), H5T_STR_NULLPAD);
  if (H5Aread(a.id(), mem.id(), buf.data()) < 0)
    return Status::Damaged("cannot read attribute '" + name + "': " + error_stack());
  buf.resize(std::strlen(buf.c_str()));
  *value = buf;
  return Status::OK();
}

namespace {
Status read_attr_num(hid_t obj, const std::string& name, hid_t mem, void* value) {
  if (!has_attr(obj, name)) return Status::Damaged("attribute '" + name + "' is missing");
  Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(a.id()), H5Tclose);
  Handle space(H5Aget_space(a.id()), H5Sclose);
  if (!a.valid() || !type.valid() || H5Tget_class(type.id()) != H5T_INTEGER ||
      H5Sget_simple_extent_npoints(space.id()) != 1)
    return Status::Damaged("attribute '" + name + "' is not an integer scalar");
  if (H5Aread(a.id(), mem, value) < 0) return Status::Damaged("cannot read attribute '" + name + "': " + error_stack());
  return Status::OK();
}
}  // namespace

Status read_attr(hid_t obj, const std::string& name, std::int64_t* value) {
  return read_attr_num(obj, name, H5T_NATIVE_INT64, value);
}
Status read_attr_u64(hid_t obj, const std::string& name, std::uint64_t* value) {
  return read_attr_num(obj, name, H5T_NATIVE_UINT64, value);
}

Status read_exact(hid_t parent, const std::string& name, const std::string& what, std::uint64_t max_bytes,
                  Array* out) {
  Handle ds(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return Status::Damaged("cannot open " + what + ": " + error_stack());
  Handle type(H5Dget_type(ds.id()), H5Tclose);
  Handle space(H5Dget_space(ds.id()), H5Sclose);
  if (!type.valid() || !space.valid()) return Status::Damaged("cannot read the type of " + what + ": " + error_stack());
  const H5T_class_t cls = H5Tget_class(type.id());
  const std::size_t size = H5Tget_size(type.id());
  if (cls == H5T_FLOAT && size == 4) out->dtype = DType::kFloat32;
  else if (cls == H5T_FLOAT && size == 8) out->dtype = DType::kFloat64;
  else if (cls == H5T_INTEGER && size == 8) out->dtype = DType::kInt64;
  else if (cls == H5T_INTEGER && size == 4) out->dtype = DType::kInt32;
  else if (cls == H5T_INTEGER && size == 1) out->dtype = DType::kUInt8;
  else return Status::Damaged(what + " has an unsupported element type");
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 0 || rank > 16) return Status::Damaged(what + " has an unreadable shape");
  std::vector<hsize_t> dims(rank);
  if (rank) H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  out->shape.assign(dims.begin(), dims.end());
  std::uint64_t n = 1;
  for (hsize_t d : dims) {
    if (d != 0 && n > max_bytes / d) return Status::Damaged(what + " claims more bytes than the file holds");
    n *= d;
  }
  const std::uint64_t bytes = n * dtype_size(out->dtype);
  if (bytes > max_bytes) return Status::Damaged(what + " claims more bytes than the file holds");
  out->bytes.assign(bytes, 0);
  if (bytes && H5Dread(ds.id(), native_type(out->dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, out->bytes.data()) < 0)
    return Status::Damaged("cannot read " + what + ": " + error_stack());
  return Status::OK();
}

namespace {
herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}
}  // namespace

Status list_group(hid_t group, std::vector<std::string>* names) {
  names->clear();
  hsize_t idx = 0;
  if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_name, names) < 0)
    return Status::Damaged("cannot list group: " + error_stack());
  return Status::OK();
}

}  // namespace culprit::h5
