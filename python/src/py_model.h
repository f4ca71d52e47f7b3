// A user's torch.nn.Module as culprit's Model (--model python:SCRIPT:FUNCTION). Its layers are its
// leaf modules, named as named_modules() names them, in the order a forward pass calls them; a
// forward hook on each hands its output to culprit's layer observer (fingerprints, fault
// injection), and the user's loss function gives the summed loss. Every call takes the GIL.
#pragma once
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "culprit/data.h"
#include "culprit/model.h"

namespace culprit::python {

namespace py = pybind11;

class PyModel : public harness::Model {
 public:
  // module: a torch.nn.Module; call: call(module, x, y) -> its output (None: module(x)); loss:
  // loss(output, target) -> the samples' summed loss, or their mean (mean). layers, embeddings:
  // culprit._setup._model_facts's (leaf modules in call order; embedding weights).
  // setup: the culprit.Setup (its optimizer factory); schedule: culprit._setup._Schedule or None.
  PyModel(py::object setup, py::object schedule, py::object module, py::object call, py::object loss, bool mean,
          std::vector<std::string> layers, std::vector<std::string> embeddings,
          std::vector<std::pair<std::string, std::string>> tied);
  ~PyModel() override;
  at::Tensor forward(const at::Tensor& x) override;
  std::vector<harness::NamedTensor> parameters() override;
  std::vector<harness::NamedTensor> buffers() override;
  void set_training(bool on) override;
  std::vector<std::string> layers() const override { return layers_; }
  std::vector<std::string> embeddings() const override { return embeddings_; }
  std::vector<std::pair<std::string, std::string>> tied() const override { return tied_; }
  bool owns_loss() const override { return true; }
  at::Tensor own_loss(const at::Tensor& x, const at::Tensor& y) override;
  bool own_loss_is_mean() const override { return mean_; }
  std::unique_ptr<harness::ScriptOptimizer> make_optimizer(const std::string& cls, const std::string& state) override;
  std::vector<double> learning_rates(std::int64_t step) override;

 private:
  void hook_layers();   // a forward hook on each layer
  void remove_hooks();  // with the GIL held
  py::object setup_, schedule_, module_, call_, loss_;
  bool mean_;
  std::vector<std::string> layers_, embeddings_;
  std::vector<std::pair<std::string, std::string>> tied_;
  std::vector<py::object> handles_;  // the hooks' RemovableHandles
};

// Builds the model of a Setup (a culprit._setup.Setup) for data `d`; script_optimizer: the run
// steps the script's optimizer object (--optimizer script), whose groups the schedule gives.
Status make_python_model(const py::object& setup, const harness::Dataset& d, bool script_optimizer,
                         std::unique_ptr<harness::Model>* out);

// A module's named_parameters() or named_buffers() (which) as culprit's named tensors.
std::vector<harness::NamedTensor> named_tensors(const py::object& module, const char* which);

}  // namespace culprit::python
