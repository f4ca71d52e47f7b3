#include "py_data.h"

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstring>

#include "py_call.h"
#include "culprit/tensors.h"

namespace culprit::python {

namespace {

DType dtype_of(const std::string& name) { return name == "int64" ? DType::kInt64 : DType::kFloat32; }

// Copies a tensor the adapter made (contiguous, of the data set's dtype) into a sample buffer.
void copy_out(const at::Tensor& t, unsigned char* to, std::size_t bytes, const char* what) {
  if (!t.is_contiguous() || t.nbytes() != bytes)
    throw PythonError(std::string("data python: the data set's ") + what + " for the samples read has " +
                      std::to_string(t.nbytes()) + " bytes, " + std::to_string(bytes) + " expected");
  std::memcpy(to, t.data_ptr(), bytes);
}

}  // namespace

PyDataSource::~PyDataSource() {
  py::gil_scoped_acquire gil;
  source_ = py::object();
}

Status PyDataSource::read(const std::int64_t* idx, std::size_t count, unsigned char* x, unsigned char* y) {
  try {
    call_python("data python: reading samples", [&] {
      py::list ids;
      for (std::size_t i = 0; i < count; ++i) ids.append(idx[i]);
      auto xy = source_.attr("read")(ids).cast<py::tuple>();
      const auto xt = xy[0].cast<at::Tensor>(), yt = xy[1].cast<at::Tensor>();
      const auto xb = source_.attr("x_bytes").cast<std::size_t>(), yb = source_.attr("y_bytes").cast<std::size_t>();
      copy_out(xt, x, count * xb, "x");
      copy_out(yt, y, count * yb, "y");
    });
  } catch (const std::exception& e) {
    return Status::BadInput(e.what());
  }
  return Status::OK();
}

harness::SampleLocation PyDataSource::locate(std::int64_t i, harness::SamplePart) {
  harness::SampleLocation at;
  at.detail = "sample " + std::to_string(i) + " of the script's data set";
  return at;
}

Status open_python_data(const py::object& data, harness::Dataset* out) {
  try {
    call_python("data python", [&] {
      py::object src = setup_module().attr("_Source")(data);
      out->source = "python";
      out->n = src.attr("n").cast<std::int64_t>();
      out->x_shape = src.attr("x_shape").cast<std::vector<std::int64_t>>();
      out->y_shape = src.attr("y_shape").cast<std::vector<std::int64_t>>();
      out->x_dtype = dtype_of(src.attr("x_dtype").cast<std::string>());
      out->y_dtype = dtype_of(src.attr("y_dtype").cast<std::string>());
      out->reader = std::make_shared<PyDataSource>(src);
    });
  } catch (const std::exception& e) {
    return Status::BadInput(e.what());
  }
  // The same samples twice, the same bytes: a data set with randomness of its own cannot be replayed.
  const std::size_t k = static_cast<std::size_t>(std::min<std::int64_t>(out->n, 4));
  std::vector<std::int64_t> idx(k);
  for (std::size_t i = 0; i < k; ++i) idx[i] = static_cast<std::int64_t>(i);
  std::vector<unsigned char> x[2], y[2];
  const auto rng_state = [] { return harness::tensor_fingerprint(at::detail::getDefaultCPUGenerator().get_state()); };
  const Fingerprint rng_before = rng_state();
  for (int r = 0; r < 2; ++r) {
    x[r].resize(k * out->x_bytes());
    y[r].resize(k * out->y_bytes());
    CULPRIT_RETURN_IF_ERROR(out->reader->read(idx.data(), k, x[r].data(), y[r].data()));
  }
  for (std::size_t i = 0; i < k; ++i) {
    const std::size_t xn = out->x_bytes(), yn = out->y_bytes();
    const bool xs = std::memcmp(x[0].data() + i * xn, x[1].data() + i * xn, xn) == 0;
    const bool ys = std::memcmp(y[0].data() + i * yn, y[1].data() + i * yn, yn) == 0;
    if (!xs || !ys)
      return Status::BadInput("data python: sample " + std::to_string(i) + " read twice gave different " +
                              (xs ? "targets" : "inputs") +
                              ": culprit needs a deterministic data set (a sample a pure function of its index; "
                              "no random augmentation of its own, docs/python.md)");
  }
  if (rng_state() != rng_before)
    return Status::BadInput("data python: reading samples draws from (or seeds) torch's default random generator, "
                            "which culprit's dropout masks use and the loader reads beside: give the data set a "
                            "torch.Generator of its own, seeded from the sample's index (docs/python.md)");
  return Status::OK();
}

}  // namespace culprit::python
