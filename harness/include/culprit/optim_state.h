// The optimizer and its per-parameter state behind one adapter: the only place that knows SGD's
// and AdamW's state layouts (the checkpoint's tensors, the replica check's and the optimizer
// fault's tensor). Included by libtorch translation units only.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "culprit/harness.h"
#include "culprit/script_optimizer.h"
#include "culprit/status.h"

namespace culprit::harness {

// A parameter's key in the optimizer's state map: libtorch 1.13 keys it by its TensorImpl address as
// a string (c10::guts::to_string, which streams the pointer), libtorch 2.x by the address itself.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap&, const at::Tensor& p) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

// The part of a parameter this rank's optimizer holds and updates: the whole parameter, or with
// --shard-optimizer the 1-D view of the slice of it that lies in the rank's part of the flat buffer.
struct OptimizerSlot {
  std::size_t param = 0;    // state-dict index
  std::int64_t offset = 0;  // the slice's first element in the parameter
  at::Tensor tensor;
};

class OptimizerState {
 public:
  // --optimizer sgd (momentum, Nesterov, weight decay) or adamw over `params` (o must outlive it).
  // decays[i]: whether weight decay applies to params[i] (--weight-decay-params); the parameters
  // without it form a second parameter group whose weight decay is 0.
  OptimizerState(const OptimizerOptions& o, const std::vector<at::Tensor>& params, const std::vector<bool>& decays);
  // The same over slots (decays: per parameter): what this rank holds under --shard-optimizer.
  OptimizerState(const OptimizerOptions& o, std::vector<OptimizerSlot> slots, const std::vector<bool>& decays);
  // --optimizer script: the script's optimizer object over `params` (its own groups and decay).
  OptimizerState(const OptimizerOptions& o, const std::vector<at::Tensor>& params, std::unique_ptr<ScriptOptimizer> script);
  // The slot of parameter i on this rank (null: none here).
  const OptimizerSlot* slot(std::size_t i) const;
  const std::vector<OptimizerSlot>& slots() const { return slots_; }
  // Bytes of optimizer state this rank holds.
  std::int64_t state_bytes() const;

  // The number of learning rates set_lrs takes: the script optimizer's parameter groups; culprit's
  // own optimizer schedules one for all.
  std::size_t lr_groups() const;
  // Each group's learning rate before any schedule (culprit's: --lr).
  std::vector<double> base_lrs() const;
  void set_lrs(const std::vector<double>& lrs);
  void set_lr(double lr) { set_lrs(std::vector<double>(lr_groups(), lr)); }
  double lr() const;                   // group 0's
  double lr_of(std::size_t param) const;  // the learning rate parameter i is updated with
  // Whether culprit knows this update (its float64 and exact re-executions): not the script's.
  bool known() const { return !script_; }
  // SGD: libtorch's step. AdamW: torch.optim.AdamW's (torch 2.x's Python, what a user's eager
  // AdamW computes on the CPU) over libtorch's AdamW state; libtorch's own C++ AdamW differs from
  // it in one rounding (optim_state.cpp).
  void step();

  // The state tensor that stands for a parameter's optimizer state (SGD: the momentum buffer, AdamW:
  // the first moment): what the replica check fingerprints and an optimizer fault corrupts.
  // Undefined before the parameter's first update.
  at::Tensor primary(const at::Tensor& p) const;
  // The parameter's state as the checkpoint stores it: (name suffix, tensor) in stored order
  // (SGD: momentum_buffer; AdamW: step, exp_avg, exp_avg_sq); none before the first update.
  std::vector<std::pair<std::string, at::Tensor>> stored(const at::Tensor& p) const;
  // The names of a parameter's stored state, in stored order (stored()'s); `kCounter`: AdamW's step
  // count, a scalar; the others are tensors of the parameter's shape.
  static constexpr const char* kCounter = "step";
  std::vector<std::string> state_names() const;
  // Clears the state, then loads each parameter's from `tensor_of(p, suffix)` (undefined: absent).
  Status load(const std::vector<std::pair<std::string, at::Tensor>>& params,
              const std::function<at::Tensor(const std::string& param, const std::string& suffix)>& tensor_of);

 private:
  void build(const std::vector<at::Tensor>& tensors, const std::vector<bool>& decays);
  int param_of(const at::Tensor& p) const;  // state-dict index of a slot's tensor, -1: none
  const OptimizerOptions& o_;
  std::vector<double> lrs_;
  std::unique_ptr<ScriptOptimizer> script_;
  std::vector<std::string> script_names_;  // --optimizer-state's names
  std::vector<OptimizerSlot> slots_;
  std::vector<int> slot_of_;  // per parameter: its slot's index, -1: none
  std::unique_ptr<torch::optim::Optimizer> opt_;
};

}  // namespace culprit::harness
