#include "py_source.h"

#include <torch/torch.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "culprit/fingerprint.h"
#include "culprit/external.h"
#include "py_call.h"
#include "py_data.h"
#include "py_model.h"
#include "culprit/tensors.h"

namespace culprit::python {

namespace {

// A Python object dropped with the GIL held, whichever way the scope ends.
struct Held {
  py::object o;
  ~Held() {
    py::gil_scoped_acquire gil;
    o = py::object();
  }
};

struct Registered {
  py::object build;
  bool have_fp = false;
  Fingerprint initial_fp = 0;  // the first Setup's initial parameters
};

// The script the run was trained with, unedited: a replay of other code would not reproduce it.
void check_script(const harness::TrainConfig& cfg) {
  if (cfg.script_fingerprint.empty()) return;
  const std::string script = cfg.model.path.substr(0, cfg.model.path.rfind(':'));
  std::string now;
  const Status st = script_fingerprint(script, &now);
  if (!st.ok()) throw PythonError(st.message());
  if (now != cfg.script_fingerprint)
    throw PythonError("script '" + script + "' changed since the run was trained (fingerprint " +
                      cfg.script_fingerprint + ", now " + now +
                      "): replaying edited code would not reproduce the run's steps; restore the script as trained");
}

// A fresh Setup from the setup function, seeded as culprit seeds its own models.
py::object build_setup(const Registered& r, const harness::TrainConfig& cfg) {
  check_script(cfg);
  torch::manual_seed(cfg.seed);
  const py::object m = setup_module();
  return m.attr("_checked_setup")(m.attr("_call_build")(r.build));
}

// The same seed, the same initial parameters: otherwise the script draws random numbers culprit
// does not seed, and ranks (and replays) would start from different models.
void check_same_start(Registered* r, const py::object& setup, const harness::TrainConfig& cfg) {
  const Fingerprint fp = harness::set_fingerprint(named_tensors(setup.attr("model"), "named_parameters"));
  if (!r->have_fp) {
    r->have_fp = true;
    r->initial_fp = fp;
  } else if (fp != r->initial_fp) {
    throw PythonError("model " + cfg.model.text() +
                      ": two calls of the setup function under the same seed gave different initial parameters "
                      "(random numbers culprit does not seed: numpy, random, a generator of its own, the clock; "
                      "docs/python.md)");
  }
}

// A fresh, checked Setup into *setup; a refusal as a Status.
Status fresh_setup(Registered* r, const harness::TrainConfig& cfg, Held* setup) {
  try {
    call_python("the setup function", [&] {
      setup->o = build_setup(*r, cfg);
      check_same_start(r, setup->o, cfg);
    });
  } catch (const std::exception& e) {
    return Status::BadInput(e.what());
  }
  return Status::OK();
}

}  // namespace

Status script_fingerprint(const std::string& path, std::string* hex) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in) return Status::BadInput("cannot read the run's script '" + path + "'");
  const std::string b = bytes.str();
  *hex = fingerprint_hex(fingerprint_bytes(b.data(), b.size()));
  return Status::OK();
}

void register_setup(py::object build) {
  auto r = std::make_shared<Registered>();
  r->build = std::move(build);
  harness::ExternalSource s;
  s.open_data = [r](const harness::TrainConfig& cfg, harness::Dataset* out) {
    Held setup, data;
    CULPRIT_RETURN_IF_ERROR(fresh_setup(r.get(), cfg, &setup));
    call_python("the setup function", [&] { data.o = setup.o.attr("data"); });
    return open_python_data(data.o, out);
  };
  s.make_model = [r](const harness::TrainConfig& cfg, const harness::Dataset& d, std::unique_ptr<harness::Model>* out) {
    Held setup;
    CULPRIT_RETURN_IF_ERROR(fresh_setup(r.get(), cfg, &setup));
    return make_python_model(setup.o, d, cfg.optim.kind == harness::OptimizerKind::kScript, out);
  };
  // culprit export: the checkpoint's tensors copied into a fresh Setup's model, and its state_dict()
  // (culprit/_setup.py's _state_dict): the names the user's load_state_dict(strict=True) expects.
  s.state_dict = [r](const harness::TrainConfig& cfg, const std::vector<harness::NamedTensor>& saved,
                     std::vector<harness::NamedTensor>* out) {
    Held setup;
    CULPRIT_RETURN_IF_ERROR(fresh_setup(r.get(), cfg, &setup));
    try {
      call_python("exporting the model's state_dict()", [&] {
        py::list given;
        for (const auto& t : saved) given.append(py::make_tuple(t.name, t.tensor));
        for (auto item : setup_module().attr("_state_dict")(setup.o, given)) {
          const auto pair = item.cast<py::tuple>();
          out->push_back({pair[0].cast<std::string>(), pair[1].cast<at::Tensor>()});
        }
      });
    } catch (const std::exception& e) {
      return Status::BadInput(e.what());
    }
    return Status::OK();
  };
  harness::set_external_source(std::move(s));
}

void unregister_setup() { harness::clear_external_source(); }

}  // namespace culprit::python
