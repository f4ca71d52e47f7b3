// culprit's update of given parameters and gradients, outside any run: the Python package compares
// it bitwise with the script's own optimizer object stepping the same (culprit/_setup.py), so that
// the options it mapped the optimizer onto are known to give the optimizer's own step.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "culprit/optim_state.h"
#include "py_call.h"
#include "py_optim.h"

namespace culprit::python {

namespace {

// culprit._setup._ScriptOptimizer: the object and its state as tensors; every call takes the GIL.
class PyScriptOptimizer : public harness::ScriptOptimizer {
 public:
  explicit PyScriptOptimizer(py::object adapter) : adapter_(std::move(adapter)) {
    groups_ = adapter_.attr("groups")().cast<std::size_t>();
    group_of_ = adapter_.attr("group_of")().cast<std::vector<std::size_t>>();
    base_ = adapter_.attr("base_lrs")().cast<std::vector<double>>();
  }
  ~PyScriptOptimizer() override {
    py::gil_scoped_acquire gil;
    adapter_ = py::object();
  }
  std::size_t groups() const override { return groups_; }
  std::size_t group_of(std::size_t param) const override { return group_of_.at(param); }
  std::vector<double> base_lrs() const override { return base_; }
  void set_lrs(const std::vector<double>& lrs) override {
    call_python("the script's optimizer", [&] { adapter_.attr("set_lrs")(lrs); });
  }
  void step() override {
    call_python("the optimizer's step()", [&] { adapter_.attr("step")(); });
  }
  std::vector<std::pair<std::string, at::Tensor>> state(std::size_t param) const override {
    return call_python("the optimizer's state", [&] {
      return adapter_.attr("state")(param).cast<std::vector<std::pair<std::string, at::Tensor>>>();
    });
  }
  void clear() override {
    call_python("the optimizer's state", [&] { adapter_.attr("clear")(); });
  }
  void load(std::size_t param, const std::vector<std::pair<std::string, at::Tensor>>& state) override {
    call_python("loading the optimizer's state", [&] { adapter_.attr("load")(param, state); });
  }

 private:
  py::object adapter_;
  std::size_t groups_ = 0;
  std::vector<std::size_t> group_of_;
  std::vector<double> base_;
};

}  // namespace

std::unique_ptr<harness::ScriptOptimizer> make_script_optimizer(const py::object& setup, const std::string& cls,
                                                                const std::string& state) {
  return call_python("the setup's optimizer", [&] {
    return std::make_unique<PyScriptOptimizer>(setup_module().attr("_ScriptOptimizer")(setup, state, cls));
  });
}

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
