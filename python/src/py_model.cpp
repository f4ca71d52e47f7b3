#include "py_model.h"

#include <ATen/Functions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "py_call.h"
#include "py_optim.h"

namespace culprit::python {

PyModel::PyModel(py::object setup, py::object schedule, py::object module, py::object call, py::object loss, bool mean,
                 std::vector<std::string> layers, std::vector<std::string> embeddings,
                 std::vector<std::pair<std::string, std::string>> tied)
    : setup_(std::move(setup)),
      schedule_(std::move(schedule)),
      module_(std::move(module)),
      call_(std::move(call)),
      loss_(std::move(loss)),
      mean_(mean),
      layers_(std::move(layers)),
      embeddings_(std::move(embeddings)),
      tied_(std::move(tied)) {
  try {
    hook_layers();
  } catch (...) {
    remove_hooks();  // the hooks capture this
    throw;
  }
}

PyModel::~PyModel() {
  py::gil_scoped_acquire gil;
  remove_hooks();
  setup_ = schedule_ = module_ = call_ = loss_ = py::object();
}

void PyModel::remove_hooks() {
  for (auto& h : handles_) {
    try {
      h.attr("remove")();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("culprit: removing a layer hook");
    }
  }
  handles_.clear();
}

void PyModel::hook_layers() {
  py::dict modules;
  for (auto item : module_.attr("named_modules")()) {
    auto t = item.cast<py::tuple>();
    modules[t[0]] = t[1];
  }
  for (const std::string& name : layers_) {
    // Returning None keeps the output; a tensor replaces it (an injected fault).
    auto hook = py::cpp_function([this, name](py::object, py::object, py::object output) -> py::object {
      if (!observer_ || !THPVariable_Check(output.ptr())) return py::none();
      const at::Tensor t = output.cast<at::Tensor>();
      Watchdog::InScript back_in_culprit("a layer hook", /*in_script=*/false);  // an injected hang is silent
      at::Tensor r = tap(name, t);
      if (r.is_same(t)) return py::none();
      return py::cast(r);
    });
    handles_.push_back(modules[py::str(name)].attr("register_forward_hook")(hook));
    // Before the call: --shard-params gathers the layer's parameters.
    auto pre = py::cpp_function([this, name](py::object, py::object) -> py::object {
      if (!observer_) return py::none();
      Watchdog::InScript back_in_culprit("a layer hook", /*in_script=*/false);
      enter(name);
      return py::none();
    });
    handles_.push_back(modules[py::str(name)].attr("register_forward_pre_hook")(pre));
  }
}

at::Tensor PyModel::forward(const at::Tensor& x) {
  return call_python("the model's forward", [&] {
    py::object out = module_(x);
    if (!THPVariable_Check(out.ptr()))
      throw PythonError("the model's forward returned " + py::str(py::type::of(out)).cast<std::string>() +
                        ", not one tensor");
    return out.cast<at::Tensor>();
  });
}

// The forward pass and the loss of its output, whatever the output is (a tensor, a tuple, a dict, a
// ModelOutput): the loss function takes it whole, so no tensor of it has to be named to culprit.
at::Tensor PyModel::own_loss(const at::Tensor& x, const at::Tensor& y) {
  return call_python("the model's forward", [&] {
    py::object out = call_.is_none() ? module_(x) : call_(module_, x, y);
    py::object l;
    try {
      l = loss_(out, y);
    } catch (py::error_already_set& e) {
      throw PythonError("the loss function raised " + exception_text(e));
    }
    const bool tensor = THPVariable_Check(l.ptr());
    if (!tensor || l.cast<at::Tensor>().dim() != 0)
      throw PythonError(std::string("the loss function must return a 0-dim tensor (the ") +
                        (mean_ ? "mean" : "summed") + " loss of the samples), not " +
                        py::str(py::type::of(l)).cast<std::string>() +
                        (tensor ? " of shape " + py::str(l.attr("shape")).cast<std::string>() : ""));
    return l.cast<at::Tensor>();
  });
}

std::vector<harness::NamedTensor> named_tensors(const py::object& module, const char* which) {
  return call_python(std::string("the model's ") + which, [&] {
    std::vector<harness::NamedTensor> out;
    for (auto item : module.attr(which)()) {
      auto t = item.cast<py::tuple>();
      out.push_back({t[0].cast<std::string>(), t[1].cast<at::Tensor>()});
    }
    return out;
  });
}

std::vector<harness::NamedTensor> PyModel::parameters() { return named_tensors(module_, "named_parameters"); }
std::vector<harness::NamedTensor> PyModel::buffers() { return named_tensors(module_, "named_buffers"); }

void PyModel::set_training(bool on) {
  call_python("the model's train()", [&] { module_.attr("train")(on); });
}

namespace {
// Sample 0 of the data as a batch of one: the forward pass that finds the layers' call order.
Status first_sample(const harness::Dataset& d, at::Tensor* x, at::Tensor* y) {
  std::vector<unsigned char> xb(d.x_bytes()), yb(d.y_bytes());
  const std::int64_t i = 0;
  CULPRIT_RETURN_IF_ERROR(d.reader->read(&i, 1, xb.data(), yb.data()));
  const auto batch_of_one = [](std::vector<unsigned char>& b, const std::vector<std::int64_t>& sample, DType t) {
    std::vector<std::int64_t> shape{1};
    shape.insert(shape.end(), sample.begin(), sample.end());
    const auto dtype = t == DType::kInt64 ? at::kLong : at::kFloat;
    return at::from_blob(b.data(), shape, at::TensorOptions().dtype(dtype)).clone();
  };
  *x = batch_of_one(xb, d.x_shape, d.x_dtype);
  *y = batch_of_one(yb, d.y_shape, d.y_dtype);
  return Status::OK();
}
}  // namespace

std::unique_ptr<harness::ScriptOptimizer> PyModel::make_optimizer(const std::string& cls, const std::string& state) {
  return make_script_optimizer(setup_, cls, state);
}

std::vector<double> PyModel::learning_rates(std::int64_t step) {
  if (schedule_.is_none()) return {};
  return call_python("the learning-rate schedule",
                     [&] { return schedule_.attr("lrs")(step).cast<std::vector<double>>(); });
}

Status make_python_model(const py::object& setup, const harness::Dataset& d, bool script_optimizer,
                         std::unique_ptr<harness::Model>* out) {
  at::Tensor x, y;
  CULPRIT_RETURN_IF_ERROR(first_sample(d, &x, &y));
  try {
    call_python("the model", [&] {
      auto facts = setup_module().attr("_model_facts")(setup, x, y).cast<py::tuple>();
      py::object schedule = setup_module().attr("_schedule")(setup, script_optimizer);
      *out = std::make_unique<PyModel>(setup, schedule, setup.attr("model"), setup.attr("forward"), setup.attr("loss"),
                                       setup.attr("reduction").cast<std::string>() == "mean",
                                       facts[0].cast<std::vector<std::string>>(),
                                       facts[1].cast<std::vector<std::string>>(),
                                       facts[2].cast<std::vector<std::pair<std::string, std::string>>>());
    });
  } catch (const std::exception& e) {
    return Status::BadInput(e.what());
  }
  return Status::OK();
}

}  // namespace culprit::python
