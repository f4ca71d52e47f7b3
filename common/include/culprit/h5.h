// A small RAII layer over the HDF5 C API. Every call is checked; a failure becomes a Status whose
// message names the operation, the file and object, and HDF5's own error stack. HDF5's automatic
// error printing is switched off (culprit reports errors itself, on one line).
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "culprit/buffer.h"
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
  // Closes now, and says whether that worked: closing a dataset flushes its chunk cache, the one
  // place a full disk shows for writes the cache took (reset() cannot say).
  Status close(const std::string& what);
  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Call once per process before any other HDF5 call: silences HDF5's own error printing.
void init();

// Whether a close (or a flush, noted by its caller) of an HDF5 object failed in this process: a
// full or failing disk. HDF5 1.10 leaves such a file half-closed and crashes closing it again at
// MPI_Finalize; cli::finish_mpi then leaves without it (docs/architecture.md, "I/O failures").
void note_failed_write();
bool writes_failed();

// HDF5's current error stack as one line ("H5Fopen: unable to open file: ...; ...").
std::string error_stack();

// A whole dataset read into memory: element type, full shape, raw bytes (native order).
struct Array {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  ByteBuffer bytes;
  std::int64_t numel() const;
};

// Damaged unless `path` is a regular file (or absent, or a directory: open_read says those): HDF5
// opens by name, and a fifo or device there would block it. open_read and open_rw check it.
Status regular_file(const std::string& path);
Status open_read(const std::string& path, Handle* file);
// Opens for appending (serial, sec2 driver).
Status open_rw(const std::string& path, Handle* file);
// Creates (truncating) a file; with comm != MPI_COMM_NULL collectively through MPI-IO.
Status create(const std::string& path, MPI_Comm comm, Handle* file);
Status create_group(hid_t parent, const std::string& name, Handle* group);
// The HDF5 native type of a DType.
hid_t native_type(DType t);
// Creates a contiguous dataset (rank 0: scalar). Collective when the file was opened via MPI-IO.
Status create_dataset(hid_t parent, const std::string& name, DType t, const std::vector<std::int64_t>& shape,
                      Handle* ds);
// Writes rows [row0, row0 + rows) of a dataset (rows along dimension 0; the whole dataset when it
// is a scalar or rows < 0). Independent I/O.
Status write_rows(const Handle& ds, DType t, const std::vector<std::int64_t>& shape, std::int64_t row0,
                  std::int64_t rows, const void* data);

// Writes elements [first, first + count) of a dataset in row-major order (the union of the few
// boxes that range makes in `shape`). Independent I/O.
Status write_range(const Handle& ds, DType t, const std::vector<std::int64_t>& shape, std::int64_t first,
                   std::int64_t count, const void* data);

// Attributes (collective when the file was opened via MPI-IO). Overwrites an existing one.
Status write_attr(hid_t obj, const std::string& name, const std::string& value);
Status write_attr(hid_t obj, const std::string& name, std::int64_t value);
Status write_attr_u64(hid_t obj, const std::string& name, std::uint64_t value);
Status read_attr(hid_t obj, const std::string& name, std::string* value);
Status read_attr(hid_t obj, const std::string& name, std::int64_t* value);
Status read_attr_u64(hid_t obj, const std::string& name, std::uint64_t* value);
bool has_attr(hid_t obj, const std::string& name);

// Reads a dataset keeping its element type (float32/64, int64/32, uint8). Refuses datasets whose
// size exceeds max_bytes (a corrupt header must not allocate gigabytes).
// `what` names the dataset in messages ("checkpoint 'f.h5' dataset '/model/fc1.weight'").
Status read_exact(hid_t parent, const std::string& name, const std::string& what, std::uint64_t max_bytes,
                  Array* out);

// Names of the links in a group, in name order.
Status list_group(hid_t group, std::vector<std::string>* names);
bool has_dataset(const Handle& file, const std::string& name);
// Reads dataset `name` of `file` (opened from `path`, used in messages). Float32/64 and
// integer datasets are accepted and converted by HDF5 to float32 or int64.
Status read_array(const Handle& file, const std::string& path, const std::string& name,
                  Array* out);

}  // namespace culprit::h5
