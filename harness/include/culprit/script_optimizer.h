// The optimizer object of a user's script (--optimizer script, set by the Python package), behind
// the one interface culprit's OptimizerState needs of it: culprit sets each parameter's gradient to
// the reduced one and the learning rate of each parameter group, and calls step(); the object
// updates the parameters (views of culprit's flat buffer) as the script wrote it. Its state per
// parameter goes into checkpoints and comes back at a resume or a replay, at any world size.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace culprit::harness {

class ScriptOptimizer {
 public:
  virtual ~ScriptOptimizer() = default;
  // The optimizer's parameter groups (their order is the learning rates').
  virtual std::size_t groups() const = 0;
  // The group of parameter i (state-dict order).
  virtual std::size_t group_of(std::size_t param) const = 0;
  // Each group's learning rate as the script's optimizer was built (the base of culprit's schedule).
  virtual std::vector<double> base_lrs() const = 0;
  virtual void set_lrs(const std::vector<double>& lrs) = 0;
  // One update of every parameter with a gradient.
  virtual void step() = 0;
  // Parameter i's state as (name, tensor), in --optimizer-state's order; a number (an int or float
  // the optimizer keeps) as a 0-dim int64 or float64 tensor; empty before its first update.
  virtual std::vector<std::pair<std::string, at::Tensor>> state(std::size_t param) const = 0;
  // Clears every parameter's state.
  virtual void clear() = 0;
  // Parameter i's state from a checkpoint (state()'s form).
  virtual void load(std::size_t param, const std::vector<std::pair<std::string, at::Tensor>>& state) = 0;
};

}  // namespace culprit::harness
