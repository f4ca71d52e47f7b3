// culprit's update of given parameters and gradients, outside any run: the Python package compares
// it bitwise with the script's own optimizer object stepping the same (culprit/_setup.py), so that
// the options it mapped the optimizer onto are known to give the optimizer's own step.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "culprit/optim_state.h"
#include "py_optim.h"

namespace culprit::python {

Status reference_update(std::vector<std::string> args, const std::vector<at::Tensor>& start,
                        const std::vector<bool>& decays, const std::vector<std::vector<at::Tensor>>& grads,
                        std::vector<at::Tensor>* out) {
  harness::TrainConfig cfg;
  bool help = false;
  args.insert(args.begin(), {"--run-dir", "."});
  CULPRIT_RETURN_IF_ERROR(harness::parse_train_options(args, &cfg, &help));
  bool shapes = decays.size() == start.size();
  for (const auto& step : grads) shapes = shapes && step.size() == start.size();
  if (!shapes) return Status::BadInput("reference_update: one decay flag and one gradient per parameter and step");
  std::vector<at::Tensor> params;
  for (const auto& t : start) params.push_back(t.detach().clone().set_requires_grad(true));
  harness::OptimizerState opt(cfg.optim, params, decays);
  opt.set_lr(cfg.optim.lr);
  for (const auto& step : grads) {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = step[i].clone();
    opt.step();
  }
  out->clear();
  for (const auto& p : params) out->push_back(p.detach());
  return Status::OK();
}

}  // namespace culprit::python
