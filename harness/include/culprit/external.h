// A model and data set built outside culprit's C++: `--model python:SCRIPT:FUNCTION` and `--data
// python`, a user's PyTorch module and data given through the Python package (python/,
// docs/python.md). The package registers how to build them once, before a command runs; the
// trainer, replay engine and bisection then use them as any other Model and DataSource. A process
// without a registration (the culprit executable) refuses such a run with one line.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "culprit/harness.h"
#include "culprit/status.h"
#include "culprit/data.h"
#include "culprit/model.h"

namespace culprit::harness {

struct ExternalSource {
  // Opens the data set: its shape, dtypes, size and reader (load_dataset then scans it as any other).
  std::function<Status(const TrainConfig& cfg, Dataset* out)> open_data;
  // Builds the model (make_model then checks its parameters as any other's).
  std::function<Status(const TrainConfig& cfg, const Dataset& data, std::unique_ptr<Model>* out)> make_model;
  // `culprit export`: the model's whole state_dict(), given a checkpoint's tensors (its
  // named_parameters(), a tied tensor once, then its buffers): copied into a fresh model by name,
  // then every name load_state_dict(strict=True) expects (a tied tensor under each of its names,
  // persistent buffers only), host tensors in their dtypes. The checkpoint names a tensor once;
  // only the model knows its other names.
  std::function<Status(const TrainConfig& cfg, const std::vector<NamedTensor>& saved, std::vector<NamedTensor>* out)>
      state_dict;
};

void set_external_source(ExternalSource source);
void clear_external_source();
// Null when nothing registered: `what` (e.g. "model python:...") is then refused by the caller.
const ExternalSource* external_source();

}  // namespace culprit::harness
