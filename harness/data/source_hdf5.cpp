// hdf5:PATH — datasets x and y with samples along dimension 0, read a few rows at a time with
// hyperslab selections (HDF5 converts floating types to float32 and integer types to int64). Every
// call here is an HDF5 call: the loader runs them where the process's HDF5 calls run.
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "culprit/h5.h"
#include "culprit/system.h"
#include "culprit/data.h"

namespace culprit::harness {

namespace {

struct Column {
  h5::Handle ds;
  DType dtype = DType::kFloat32;  // in memory
  hid_t mem_type = H5T_NATIVE_FLOAT;
  std::vector<std::int64_t> shape;  // with the sample dimension
  std::size_t file_row_bytes = 0;   // one row as stored
};

// A chunked dataset whose chunks were not all written reads as fill values where they are missing:
// an incomplete file (or one that claims terabytes in a few bytes), refused rather than trained on.
Status check_written(const Column& c, const std::string& where) {
  h5::Handle plist(H5Dget_create_plist(c.ds.id()), H5Pclose);
  if (!plist.valid() || H5Pget_layout(plist.id()) != H5D_CHUNKED) return Status::OK();
  std::vector<hsize_t> chunk(c.shape.size(), 1);
  h5::Handle space(H5Dget_space(c.ds.id()), H5Sclose);
  hsize_t stored = 0;
  if (H5Pget_chunk(plist.id(), static_cast<int>(chunk.size()), chunk.data()) < 0 ||
      H5Dget_num_chunks(c.ds.id(), space.id(), &stored) < 0)
    return Status::Damaged("cannot read the chunks of " + where + ": " + h5::error_stack());
  double needed = 1;
  for (std::size_t i = 0; i < chunk.size(); ++i)
    needed *= std::ceil(static_cast<double>(c.shape[i]) / static_cast<double>(std::max<hsize_t>(1, chunk[i])));
  if (static_cast<double>(stored) < needed)
    return Status::BadInput(where + " stores " + std::to_string(stored) + " of its " +
                            std::to_string(static_cast<long long>(needed)) +
                            " chunks: the others were never written (they would read as fill values)");
  return Status::OK();
}

Status open_column(const h5::Handle& file, const std::string& path, const char* name, Column* c) {
  const std::string where = "'" + path + "' dataset '" + name + "'";
  if (!h5::has_dataset(file, name)) return Status::Damaged("HDF5 file '" + path + "' has no dataset '" + name + "'");
  c->ds = h5::Handle(H5Dopen2(file.id(), name, H5P_DEFAULT), H5Dclose);
  if (!c->ds.valid()) return Status::Damaged("cannot open " + where + ": " + h5::error_stack());
  h5::Handle type(H5Dget_type(c->ds.id()), H5Tclose);
  h5::Handle space(H5Dget_space(c->ds.id()), H5Sclose);
  if (!type.valid() || !space.valid()) return Status::Damaged("cannot read the type of " + where + ": " + h5::error_stack());
  const H5T_class_t cls = H5Tget_class(type.id());
  if (cls == H5T_FLOAT) {
    c->dtype = DType::kFloat32;
    c->mem_type = H5T_NATIVE_FLOAT;
  } else if (cls == H5T_INTEGER) {
    c->dtype = DType::kInt64;
    c->mem_type = H5T_NATIVE_INT64;
  } else {
    return Status::Damaged(where + " must hold floating-point or integer numbers");
  }
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 0 || rank > 16) return Status::Damaged("cannot read the shape of " + where + ": " + h5::error_stack());
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank) H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  c->shape.assign(dims.begin(), dims.end());
  c->file_row_bytes = H5Tget_size(type.id());
  for (std::size_t i = 1; i < dims.size(); ++i) c->file_row_bytes *= dims[i];
  return check_written(*c, where);
}

class Hdf5Source : public DataSource {
 public:
  Hdf5Source(std::string path, h5::Handle file, Column x, Column y)
      : path_(std::move(path)), file_(std::move(file)), x_(std::move(x)), y_(std::move(y)) {}

  // Rows are read in ascending order (one selection of single-row hyperslabs per column) and then
  // put in the caller's order.
  Status read(const std::int64_t* idx, std::size_t count, unsigned char* x, unsigned char* y) override {
    if (count == 0) return Status::OK();
    order_.resize(count);
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    std::sort(order_.begin(), order_.end(), [idx](std::size_t a, std::size_t b) { return idx[a] < idx[b]; });
    rows_.clear();
    for (std::size_t i : order_)
      if (rows_.empty() || rows_.back() != idx[i]) rows_.push_back(idx[i]);
    CULPRIT_RETURN_IF_ERROR(read_rows(x_, "x", &xs_));
    CULPRIT_RETURN_IF_ERROR(read_rows(y_, "y", &ys_));
    scatter(idx, count, xs_, row_bytes(x_), x);
    scatter(idx, count, ys_, row_bytes(y_), y);
    return Status::OK();
  }

  // Contiguous storage: the row's own bytes; chunked: the chunk that holds it (with its filters, a
  // changed byte anywhere in it changes the row). x and y are datasets of their own: the part named
  // is the one whose bytes hold the value in question (a bad label is in y).
  SampleLocation locate(std::int64_t i, SamplePart part) override {
    const Column& c = part == SamplePart::kY ? y_ : x_;
    const std::string row = std::string("dataset ") + (part == SamplePart::kY ? "y" : "x") + " row " + std::to_string(i);
    SampleLocation loc;
    loc.file = path_;
    loc.bytes = c.file_row_bytes;
    const haddr_t base = H5Dget_offset(c.ds.id());
    if (base != HADDR_UNDEF) {
      loc.offset = base + static_cast<std::uint64_t>(i) * c.file_row_bytes;
      loc.detail = row;
      return loc;
    }
    H5Eclear2(H5E_DEFAULT);
    std::vector<hsize_t> coord(c.shape.size(), 0);
    coord[0] = static_cast<hsize_t>(i);
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(c.ds.id(), coord.data(), &mask, &addr, &size) >= 0 && addr != HADDR_UNDEF) {
      loc.offset = addr;
      loc.bytes = size;
      // A set bit of the mask is a filter the chunk skipped: filtered when one of the dataset's
      // filters was applied (it was "(filtered)" for a skipped one and nothing for gzip).
      h5::Handle plist(H5Dget_create_plist(c.ds.id()), H5Pclose);
      const int filters = plist.valid() ? H5Pget_nfilters(plist.id()) : 0;
      const bool filtered = filters > 0 && (mask & ((1u << std::min(filters, 31)) - 1u)) != ((1u << std::min(filters, 31)) - 1u);
      loc.detail = row + ", in the " + std::to_string(size) + "-byte chunk stored there" +
                   (filtered ? " (filtered: any changed byte of the chunk changes the row)" : "");
    } else {
      H5Eclear2(H5E_DEFAULT);
      loc.detail = row + " (storage not located)";
    }
    return loc;
  }

  bool uses_hdf5() const override { return true; }

  std::vector<std::pair<std::int64_t, std::int64_t>> samples_in(std::uint64_t lo, std::uint64_t hi) override {
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (const Column* c : {&x_, &y_}) rows_in(*c, lo, hi, &out);
    return out;
  }

 private:
  static std::size_t row_bytes(const Column& c) {
    std::size_t b = dtype_size(c.dtype);
    for (std::size_t i = 1; i < c.shape.size(); ++i) b *= static_cast<std::size_t>(c.shape[i]);
    return b;
  }

  // The rows of column c stored in the file's bytes [lo, hi): contiguous storage by its offset,
  // chunked storage chunk by chunk.
  static void rows_in(const Column& c, std::uint64_t lo, std::uint64_t hi, std::vector<std::pair<std::int64_t, std::int64_t>>* out) {
    const std::int64_t n = c.shape[0];
    const std::uint64_t rb = std::max<std::uint64_t>(1, c.file_row_bytes);
    const haddr_t base = H5Dget_offset(c.ds.id());
    if (base != HADDR_UNDEF) {
      const std::uint64_t end = base + rb * static_cast<std::uint64_t>(n);
      if (hi <= base || lo >= end) return;
      const auto first = static_cast<std::int64_t>((std::max<std::uint64_t>(lo, base) - base) / rb);
      const auto last = static_cast<std::int64_t>((std::min<std::uint64_t>(hi, end) - 1 - base) / rb);
      out->push_back({first, last});
      return;
    }
    H5Eclear2(H5E_DEFAULT);
    h5::Handle space(H5Dget_space(c.ds.id()), H5Sclose);
    h5::Handle plist(H5Dget_create_plist(c.ds.id()), H5Pclose);
    std::vector<hsize_t> chunk(c.shape.size(), 1);
    hsize_t chunks = 0;
    if (H5Pget_chunk(plist.id(), static_cast<int>(chunk.size()), chunk.data()) < 0 ||
        H5Dget_num_chunks(c.ds.id(), space.id(), &chunks) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return;
    }
    std::vector<hsize_t> at(c.shape.size());
    for (hsize_t i = 0; i < chunks; ++i) {
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info(c.ds.id(), space.id(), i, at.data(), &mask, &addr, &size) < 0) {
        H5Eclear2(H5E_DEFAULT);
        continue;
      }
      if (addr == HADDR_UNDEF || addr + size <= lo || addr >= hi) continue;
      const auto first = static_cast<std::int64_t>(at[0]);
      out->push_back({first, std::min<std::int64_t>(n, first + static_cast<std::int64_t>(chunk[0])) - 1});
    }
  }

  Status read_rows(const Column& c, const char* name, std::vector<unsigned char>* out) {
    h5::Handle fspace(H5Dget_space(c.ds.id()), H5Sclose);
    std::vector<hsize_t> start(c.shape.size(), 0), count(c.shape.begin(), c.shape.end());
    count[0] = 1;
    bool first = true;
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      // Runs of consecutive rows become one hyperslab: a selection of thousands of single rows
      // is slow to build in HDF5 1.10.
      std::size_t e = r;
      while (e + 1 < rows_.size() && rows_[e + 1] == rows_[e] + 1) ++e;
      start[0] = static_cast<hsize_t>(rows_[r]);
      count[0] = static_cast<hsize_t>(e - r + 1);
      if (H5Sselect_hyperslab(fspace.id(), first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr, count.data(),
                              nullptr) < 0)
        return Status::Damaged("cannot select rows of '" + path_ + "' dataset '" + name + "': " + h5::error_stack());
      first = false;
      r = e;
    }
    std::vector<hsize_t> mdims(c.shape.begin(), c.shape.end());
    mdims[0] = static_cast<hsize_t>(rows_.size());
    h5::Handle mspace(H5Screate_simple(static_cast<int>(mdims.size()), mdims.data(), nullptr), H5Sclose);
    out->resize(rows_.size() * row_bytes(c));
    if (!out->empty() && H5Dread(c.ds.id(), c.mem_type, mspace.id(), fspace.id(), H5P_DEFAULT, out->data()) < 0)
      return Status::Damaged("cannot read '" + path_ + "' dataset '" + name + "': " + h5::error_stack());
    return Status::OK();
  }

  // Row j of `sorted` is rows_[j]; the caller's i-th sample is idx[i].
  void scatter(const std::int64_t* idx, std::size_t count, const std::vector<unsigned char>& sorted, std::size_t each,
               unsigned char* out) const {
    for (std::size_t i = 0; i < count; ++i) {
      const auto j = static_cast<std::size_t>(std::lower_bound(rows_.begin(), rows_.end(), idx[i]) - rows_.begin());
      std::memcpy(out + i * each, sorted.data() + j * each, each);
    }
  }

  std::string path_;
  h5::Handle file_;
  Column x_, y_;
  std::vector<std::size_t> order_;
  std::vector<std::int64_t> rows_;
  std::vector<unsigned char> xs_, ys_;
};

}  // namespace

Status open_hdf5(const TrainConfig&, const std::string& path, Dataset* d) {
  d->source = "hdf5:" + path;
  h5::Handle file;
  CULPRIT_RETURN_IF_ERROR(h5::open_read(path, &file));
  Column x, y;
  CULPRIT_RETURN_IF_ERROR(open_column(file, path, "x", &x));
  CULPRIT_RETURN_IF_ERROR(open_column(file, path, "y", &y));
  if (x.shape.empty()) return Status::BadInput("data '" + path + "': dataset 'x' must have a sample dimension, got a scalar");
  if (y.shape.empty()) return Status::BadInput("data '" + path + "': dataset 'y' must have a sample dimension, got a scalar");
  if (x.shape[0] != y.shape[0])
    return Status::BadInput("data '" + path + "': x has " + std::to_string(x.shape[0]) + " samples but y has " +
                            std::to_string(y.shape[0]));
  if (x.shape[0] < 1) return Status::BadInput("data '" + path + "': x and y hold no samples");
  d->n = x.shape[0];
  d->x_dtype = x.dtype;
  d->x_shape.assign(x.shape.begin() + 1, x.shape.end());
  d->y_dtype = y.dtype;
  d->y_shape.assign(y.shape.begin() + 1, y.shape.end());
  // One sample must fit in memory many times over (a damaged header can claim anything).
  double row = 0;
  for (auto* shape : {&d->x_shape, &d->y_shape}) {
    double elements = 8;
    for (auto dim : *shape) elements *= static_cast<double>(dim);
    row += elements;
  }
  CULPRIT_RETURN_IF_ERROR(check_fits_memory("one sample of data '" + path + "'", 64.0 * row));
  d->reader = std::make_shared<Hdf5Source>(path, std::move(file), std::move(x), std::move(y));
  return Status::OK();
}

}  // namespace culprit::harness
