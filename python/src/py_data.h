// A data set given in Python (--data python): the script's Setup.data, read through the package's
// culprit._setup._Source adapter (which stacks samples into contiguous tensors of one dtype and
// shape). Used by every read of the run's loader, on whichever thread reads (the GIL is taken).
#pragma once
#include <torch/csrc/utils/pybind.h>

#include "culprit/data.h"

namespace culprit::python {

namespace py = pybind11;

class PyDataSource : public harness::DataSource {
 public:
  explicit PyDataSource(py::object source) : source_(std::move(source)) {}
  ~PyDataSource() override;
  Status read(const std::int64_t* idx, std::size_t count, unsigned char* x, unsigned char* y) override;
  harness::SampleLocation locate(std::int64_t i, harness::SamplePart part) override;
  // A Python data set has no file whose bytes culprit could map to samples (prepare-data's blocks).
  std::vector<std::pair<std::int64_t, std::int64_t>> samples_in(std::uint64_t, std::uint64_t) override { return {}; }

 private:
  py::object source_;  // culprit._setup._Source
};

// Opens Setup.data as the run's data set: its size, shapes and dtypes, a reader, and the checks that
// reading the same samples twice gives the same bytes and leaves torch's default generator as it
// was (a data set that draws random numbers of its own is refused: a replay could not reproduce its
// samples, and reads run on the loader's thread while the step draws dropout masks).
Status open_python_data(const py::object& data, harness::Dataset* out);

}  // namespace culprit::python
