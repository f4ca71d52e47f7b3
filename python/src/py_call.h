// Calling the user's Python from culprit's C++: every call takes the GIL (culprit's own work runs
// without it, python/src/bindings.cpp) and turns a Python exception into a C++ one carrying the
// exception's one-line text, while the GIL is still held (its Python objects are released there).
#pragma once
#include <torch/csrc/utils/pybind.h>

#include <stdexcept>
#include <string>

#include "culprit/tensors.h"
#include "culprit/watchdog.h"

namespace culprit::python {

namespace py = pybind11;

// The failure of a call into the user's code: "WHAT raised ExceptionType: message". A
// UserCodeError: mid-step it ends the job instead of leaving other ranks in a collective.
class PythonError : public harness::UserCodeError {
 public:
  using harness::UserCodeError::UserCodeError;
};

// "ExceptionType: message", without the traceback pybind11 appends to what().
inline std::string exception_text(py::error_already_set& e) {
  return py::str(e.type().attr("__name__")).cast<std::string>() + ": " + py::str(e.value()).cast<std::string>();
}

template <class Fn>
auto call_python(const std::string& what, Fn&& fn) {
  // The main thread in the user's code answers roll calls through the watchdog's thread: a script
  // that hangs is not a stopped rank (culprit/watchdog.h).
  Watchdog::InScript in_script(what.c_str());
  py::gil_scoped_acquire gil;
  try {
    return fn();
  } catch (py::error_already_set& e) {
    throw PythonError(what + " raised " + exception_text(e));
  } catch (const py::cast_error& e) {
    throw PythonError(what + ": " + e.what());
  }
}

// culprit._setup, the package's Python half.
inline py::module_ setup_module() { return py::module_::import("culprit._setup"); }

}  // namespace culprit::python
