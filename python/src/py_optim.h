// The script's optimizer: culprit's update alone, for the package's check that an optimizer it maps
// onto its own gives the same bits; and the script's optimizer object itself as culprit's
// ScriptOptimizer (--optimizer script), stepped as the script wrote it (py_optim.cpp).
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>

#include <string>
#include <vector>

#include "culprit/script_optimizer.h"
#include "culprit/status.h"

namespace culprit::python {

// The parameters `start` after one update per entry of `grads` (each a gradient per parameter),
// with the optimizer that the `culprit train` options `args` name; decays[i]: whether weight decay
// applies to parameter i. Bad options: their error.
Status reference_update(std::vector<std::string> args, const std::vector<at::Tensor>& start,
                        const std::vector<bool>& decays, const std::vector<std::vector<at::Tensor>>& grads,
                        std::vector<at::Tensor>* out);

// The optimizer object setup.optimizer(model.parameters()) gives, built now (the model's parameters
// are views of culprit's flat buffer), as culprit's ScriptOptimizer; cls, state: --script-optimizer
// and --optimizer-state as recorded.
// Raises PythonError.
std::unique_ptr<harness::ScriptOptimizer> make_script_optimizer(const pybind11::object& setup, const std::string& cls,
                                                                const std::string& state);

}  // namespace culprit::python
