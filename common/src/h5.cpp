#include "culprit/h5.h"

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

void Handle::reset() {
  if (id_ >= 0 && closer_) closer_(id_);
  id_ = H5I_INVALID_HID;
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

Status open_read(const std::string& path, Handle* file) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return Status::Error("file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path, ec))
    return Status::Error("'" + path + "' is a directory, not an HDF5 file");
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::Error("'" + path + "' is not an HDF5 file");
  }
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) return Status::Error("cannot open HDF5 file '" + path + "': " + error_stack());
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
  if (!has_dataset(file, name)) return Status::Error("HDF5 file '" + path + "' has no dataset '" + name + "'");
  Handle ds(H5Dopen2(file.id(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return Status::Error("cannot open " + where + ": " + error_stack());
  Handle type(H5Dget_type(ds.id()), H5Tclose);
  Handle space(H5Dget_space(ds.id()), H5Sclose);
  if (!type.valid() || !space.valid())
    return Status::Error("cannot read the type of " + where + ": " + error_stack());
  const H5T_class_t cls = H5Tget_class(type.id());
  hid_t mem_type;
  if (cls == H5T_FLOAT) {
    out->dtype = DType::kFloat32;
    mem_type = H5T_NATIVE_FLOAT;
  } else if (cls == H5T_INTEGER) {
    out->dtype = DType::kInt64;
    mem_type = H5T_NATIVE_INT64;
  } else {
    return Status::Error(where + " must hold floating-point or integer numbers");
  }
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 0) return Status::Error("cannot read the shape of " + where + ": " + error_stack());
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  out->shape.assign(dims.begin(), dims.end());
  out->bytes.assign(static_cast<std::size_t>(out->numel()) * dtype_size(out->dtype), 0);
  if (!out->bytes.empty() &&
      H5Dread(ds.id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->bytes.data()) < 0)
    return Status::Error("cannot read " + where + ": " + error_stack());
  return Status::OK();
}

}  // namespace culprit::h5
