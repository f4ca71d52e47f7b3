// The script's setup function as culprit's external model and data source (harness/include/culprit/external.h):
// each call builds a fresh Setup under torch.manual_seed(--seed), so every rank, every replay and
// every rebuild gets the same model; a setup function that does not (hidden random numbers of its
// own) is refused.
#pragma once
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "culprit/status.h"

namespace culprit::python {

namespace py = pybind11;

// Registers `build` (a function returning a culprit.Setup) for this process's commands. Call with
// the GIL held; unregister_setup() before the interpreter ends.
void register_setup(py::object build);
void unregister_setup();

// The fingerprint of a script's bytes, as --script-fingerprint records it.
Status script_fingerprint(const std::string& path, std::string* hex);

}  // namespace culprit::python
