// The extension module culprit._culprit: culprit's command line, run in this Python process on the
// model, loss, data and optimizer of a user's script (python/culprit/_setup.py is its other half).
// Thin on purpose: the binding unit is the slow one to compile.
#include <mpi.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdio>
#include <string>
#include <vector>

#include "culprit/math_libraries.h"
#include "culprit/cli.h"
#include "culprit/command.h"
#include "culprit/exit_codes.h"
#include "culprit/harness.h"
#include "py_optim.h"
#include "py_source.h"

namespace py = pybind11;

namespace {

// A failure that escapes a command (an exception from the user's code in the middle of a step)
// would leave the other ranks waiting in a collective: this rank says what and ends the job.
int run_or_abort(const std::vector<std::string>& argv) {
  try {
    return culprit::cli::run_command_line(argv);
  } catch (const std::exception& e) {
    int up = 0, down = 0, rank = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    culprit::cli::error_line("rank " + std::to_string(rank) + ": " + e.what());
    std::fflush(stderr);
    if (up && !down) MPI_Abort(MPI_COMM_WORLD, culprit::kExitFailure);
    return culprit::kExitFailure;
  }
}

int main_entry(const std::vector<std::string>& argv, py::object build) {
  if (!build.is_none()) culprit::python::register_setup(build);
  int code;
  {
    py::gil_scoped_release nogil;  // culprit's work runs without the GIL; each call into Python takes it
    code = run_or_abort(argv);
  }
  culprit::python::unregister_setup();
  std::fflush(stdout);
  return code;
}

std::string run_model(const std::string& run_dir) {
  culprit::harness::TrainConfig cfg;
  const culprit::Status st = culprit::harness::load_run_config(run_dir, &cfg);
  if (!st.ok()) throw py::value_error(st.message());
  return cfg.model.text();
}

std::string script_fingerprint(const std::string& path) {
  std::string hex;
  const culprit::Status st = culprit::python::script_fingerprint(path, &hex);
  if (!st.ok()) throw py::value_error(st.message());
  return hex;
}

std::vector<at::Tensor> reference_update(const std::vector<std::string>& args, const std::vector<at::Tensor>& start,
                                         const std::vector<bool>& decays,
                                         const std::vector<std::vector<at::Tensor>>& grads) {
  std::vector<at::Tensor> out;
  culprit::Status st;
  {
    py::gil_scoped_release nogil;
    st = culprit::python::reference_update(args, start, decays, grads, &out);
  }
  if (!st.ok()) throw py::value_error(st.message());
  return out;
}

}  // namespace

PYBIND11_MODULE(_culprit, m) {
  py::module_::import("torch");  // torch's Python bindings (tensor conversion) before anything else
  // MKL's reproducible mode, unless the script has computed with MKL already (what MKL then runs
  // is recorded: docs/determinism.md, "The math libraries").
  culprit::harness::pin_math_libraries();
  m.doc() = "culprit's C++ core (docs/python.md); use the culprit package, not this module";
  m.def("main", &main_entry, py::arg("argv"), py::arg("build"),
        "Runs `culprit ARGV...` with `build` (or None) as the setup function of --model python runs; the exit code.");
  m.def("command_names", &culprit::cli::command_names, "culprit's commands");
  m.def("script_fingerprint", &script_fingerprint, py::arg("path"), "a script's fingerprint (--script-fingerprint)");
  m.def("reference_update", &reference_update, py::arg("args"), py::arg("start"), py::arg("decays"), py::arg("grads"),
        "culprit's update of `start` by each step's gradients, with the optimizer the options name");
  m.def("run_model", &run_model, py::arg("run_dir"), "the --model a run recorded (RUN/run.json)");
}
