// Calling the user's Python from culprit's C++: every call takes the GIL (culprit's own work runs
// without it, python/src/bindings.cpp) and turns a Python exception into a C++ one carrying the
// exception's one-line text, while the GIL is still held (its Python objects are released there).
#pragma once
#include <torch/csrc/utils/pybind.h>

#include <stdexcept>
#include <string>

namespace culprit::python {

namespace py = pybind11;

// The failure of a call into the user's code: "WHAT raised ExceptionType: message".
class PythonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class Fn>
auto call_python(const std::string& what, Fn&& fn) {
  py::gil_scoped_acquire gil;
  try {
    return fn();
  } catch (py::error_already_set& e) {
    throw PythonError(what + " raised " + e.what());
  } catch (const py::cast_error& e) {
    throw PythonError(what + ": " + e.what());
  }
}

// culprit._setup, the package's Python half.
inline py::module_ setup_module() { return py::module_::import("culprit._setup"); }

}  // namespace culprit::python
