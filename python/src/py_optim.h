// culprit's optimizer update alone (py_optim.cpp), for the package's check of the script's optimizer.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "culprit/status.h"

namespace culprit::python {

// The parameters `start` after one update per entry of `grads` (each a gradient per parameter),
// with the optimizer that the `culprit train` options `args` name; decays[i]: whether weight decay
// applies to parameter i. Bad options: their error.
Status reference_update(std::vector<std::string> args, const std::vector<at::Tensor>& start,
                        const std::vector<bool>& decays, const std::vector<std::vector<at::Tensor>>& grads,
                        std::vector<at::Tensor>* out);

}  // namespace culprit::python
