// A small RAII layer over the HDF5 C API. Every call is checked; a failure becomes a Status whose
// message names the operation, the file and object, and HDF5's own error stack. HDF5's automatic
// error printing is switched off (culprit reports errors itself, on one line).
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/status.h"

namespace culprit::h5 {

// Owns one HDF5 identifier and closes it with the matching H5xclose.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  void reset();
  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Call once per process before any other HDF5 call: silences HDF5's own error printing.
void init();

// HDF5's current error stack as one line ("H5Fopen: unable to open file: ...; ...").
std::string error_stack();

// A whole dataset read into memory: element type, full shape, raw bytes (native order).
struct Array {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;
  std::int64_t numel() const;
};

Status open_read(const std::string& path, Handle* file);
bool has_dataset(const Handle& file, const std::string& name);
// Reads dataset `name` of `file` (opened from `path`, used in messages). Float32/64 and
// integer datasets are accepted and converted by HDF5 to float32 or int64.
Status read_array(const Handle& file, const std::string& path, const std::string& name,
                  Array* out);

}  // namespace culprit::h5
