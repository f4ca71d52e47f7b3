// culprit: find the step, the layer and the GPU behind a broken training run. The commands are
// cli/commands.cpp's; a run made from Python is handed to the Python package first.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "culprit/math_libraries.h"
#include "culprit/cli.h"
#include "culprit/command.h"
#include "culprit/exit_codes.h"
#include "culprit/harness.h"

namespace {

// The run directory an existing run's command names (--run-dir RUN or --run-dir=RUN), or "".
std::string run_dir_of(const std::vector<std::string>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--run-dir" && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind("--run-dir=", 0) == 0) return args[i].substr(10);
  }
  return "";
}

// A run made from Python (--model python:SCRIPT:FUNCTION) is replayed, bisected, audited, resumed or
// exported (its state dict is its model's: a tied tensor's every name, its buffers) by re-entering
// its script: this process becomes `python3 -m culprit ARGS...` (the same pid, so under mpirun or
// srun every rank does the same, before any of them starts MPI). Returns only when the run is not a
// Python run, or with the exit code of a failed hand-off.
int hand_python_runs_to_the_package(const std::vector<std::string>& args) {
  if (args.empty()) return -1;
  const auto given = [&](const char* o) { return std::find(args.begin(), args.end(), o) != args.end(); };
  const bool existing_run = args[0] == "replay" || args[0] == "bisect" || args[0] == "audit" || args[0] == "export" ||
                            (args[0] == "train" && (given("--resume") || given("--resume-from")));
  const std::string dir = existing_run ? run_dir_of(args) : "";
  culprit::harness::TrainConfig cfg;
  if (dir.empty() || !culprit::harness::load_run_config(dir, &cfg).ok() ||
      cfg.model.kind != culprit::harness::ModelKind::kPython)
    return -1;
#ifdef CULPRIT_PYTHON_DIR
  // The package and interpreter built with this executable, unless the environment names others:
  // an installed package's `culprit` command (culprit/_cli.py) names its own folder and interpreter.
  const auto env_or = [](const char* name, const char* built) {
    const char* v = std::getenv(name);
    return std::string(v && *v ? v : built);
  };
  const std::string python = env_or("CULPRIT_PYTHON", CULPRIT_PYTHON);
  const char* old = std::getenv("PYTHONPATH");
  const std::string path =
      env_or("CULPRIT_PYTHON_DIR", CULPRIT_PYTHON_DIR) + (old && *old ? std::string(":") + old : "");
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<std::string> argv_s = {python, "-m", "culprit"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(python.c_str(), argv.data());
  culprit::cli::error_line(std::string("run '") + dir + "' was made from Python: cannot start " + python + ": " +
                           std::strerror(errno));
  return culprit::kExitFailure;
#else
  culprit::cli::error_line("run '" + dir + "' was made from Python (model " + cfg.model.text() +
                           ") and this culprit was built without the Python package (pybind11-dev): docs/python.md");
  return culprit::kExitUsage;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  culprit::harness::pin_math_libraries();  // before anything computes (docs/determinism.md)
  std::vector<std::string> args(argv + 1, argv + argc);
  if (const int code = hand_python_runs_to_the_package(args); code >= 0) return code;
  return culprit::cli::run_command_line(std::move(args));
}
