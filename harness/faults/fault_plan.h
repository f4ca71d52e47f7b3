// The faults a run injects (--inject, culprit/fault_spec.h): one FaultPlan owns the parsed specs, their
// validation against the model and the world, and one hook per phase that the step calls at the
// point where that phase's fault lands. Whether a fault fires depends on the firing context, passed
// explicitly. The empty plan changes nothing. Only ATen's Tensor type is visible here.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "culprit/fault_spec.h"
#include "culprit/status.h"
#include "culprit/tree_reduce.h"
#include "culprit/model.h"

namespace culprit::harness {

class OptimizerState;

// How a step runs: as the original run, or re-executed by the replay engine (transient faults
// stay in the original run; intermittent ones draw again).
enum class StepMode { kTrain, kReplay };

// Which execution of a computation this is.
struct FireContext {
  std::int64_t step = 0;
  int rank = 0;         // the device's rank: faults belong to devices
  int first_shard = 0;  // the first micro-shard this rank computes in the step (a transient fault hits it)
  int attempt = 0;      // 0: the step's own computation; 1, 2: spot-check recomputations
  StepMode mode = StepMode::kTrain;
  int round = 0;        // replay: the rerun of a micro-shard
};

// Corrupts element (spec.index mod numel) of a float32 tensor in place, outside autograd.
void corrupt_in_place(const FaultSpec& spec, const at::Tensor& t);
// A layer output with element (spec.index mod numel) replaced by its corrupted value; the result
// stays in the autograd graph (gradient flows to the other elements as before).
at::Tensor corrupt_output(const FaultSpec& spec, const at::Tensor& out);
// For int64 token data: the token at (spec.index mod numel) becomes another valid token.
void corrupt_tokens(const FaultSpec& spec, const at::Tensor& t, std::int64_t vocab);

class FaultPlan {
 public:
  // Parses and validates every --inject SPEC. model_layers: the layers forward calls (forward and
  // backward faults land on their outputs); params: state-dict order, with their flat offsets.
  // A fault on a rank outside the world is refused in training and left out in a replay.
  // A parameter known by more names than its own (a head tied to the embedding: `tied` pairs
  // (other name, parameter name)): a layer holding it by another name holds it. Before parse().
  void set_tied(const std::vector<std::pair<std::string, std::string>>& tied) { tied_names_ = tied; }
  Status parse(const std::vector<std::string>& texts, const std::vector<std::string>& model_layers,
               const std::vector<NamedTensor>& params, const std::vector<std::int64_t>& offsets, int world,
               std::uint64_t seed, StepMode mode);
  bool empty() const { return specs_.empty(); }
  // A layer output in bfloat16 (--precision bf16: the matrix products'), and the gradient flowing
  // back into it, keep bits 16..31 of a float32: a bit flip there must name one of those. dtypes:
  // each layer's output dtype, as the start-up pass saw it.
  Status check_dtypes(const std::map<std::string, at::ScalarType>& dtypes) const;
  // --shard-optimizer: an optimizer fault lands on state its rank holds (held(rank, param, index)),
  // a lost update on a layer the rank updates part of (held(rank, param, -1): any element of it);
  // holds(rank) says what that rank holds, for the message. params (--shard-params): a parameter
  // fault, too, must name an element the rank holds (it has no copy of the others).
  Status check_held(const std::function<bool(int, std::size_t, std::int64_t)>& held,
                    const std::function<std::string(int)>& holds, bool params = false) const;
  // Whether a fault lands on a layer output (the model's layer hooks are needed).
  bool at_layer_outputs() const;

  // ---- the hooks, in the order a step calls them ----
  // lr: the learning rate this rank uses (stale: the previous step's schedule value).
  // *stale (optional): a stale-learning-rate fault fired (the previous step's rates apply).
  double on_lr(const FireContext& c, double lr, double previous_lr, bool* stale = nullptr) const;
  // data (stale) and rng: the samples and dropout seed micro-shard k uses.
  void on_inputs(const FireContext& c, int k, at::Tensor* samples, std::uint64_t* seed);
  // data: the loaded micro-shard batch.
  void on_batch(const FireContext& c, int k, const at::Tensor& x, std::int64_t vocab) const;
  // grad (stale): whether parameter i keeps its gradient from before instead of starting at zero.
  bool keeps_grad(const FireContext& c, int k, std::size_t i) const;
  // forward, backward: a layer's output (and the gradient flowing back into it).
  at::Tensor on_layer_output(const FireContext& c, int k, const std::string& layer, at::Tensor out) const;
  // grad: the micro-shard's gradient leaf (P values); false when a corrupted value is not finite.
  // [lo, hi): only the faults of those elements (a leaf reduced bucket by bucket, tree_overlap.h).
  bool on_leaf(const FireContext& c, int k, float* leaf, std::size_t lo = 0, std::size_t hi = SIZE_MAX) const;
  // comm: the reduction's send buffer; null when no fault fires (storage: the returned fault).
  const SendFault* on_send(const FireContext& c, SendFault* storage) const;
  // param (stale): parameters whose update does not land, with their values before it. part_of(i):
  // the elements of parameter i this rank holds, (first, count) (--shard-params: its slice; null:
  // all of it); only those are kept and put back.
  using PartOf = std::function<std::pair<std::int64_t, std::int64_t>(std::size_t)>;
  std::vector<std::pair<std::size_t, at::Tensor>> before_update(const FireContext& c,
                                                                const std::vector<NamedTensor>& params,
                                                                const PartOf& part_of = nullptr) const;
  // param, optimizer: the update's lost parameters put back, then faults at rest.
  // With --shard-optimizer the update runs in two parts around the parameter gather: `part` kHeld
  // (before it: the lost update, the optimizer faults, and parameter faults on an element the rank
  // holds, its master copy, which the gather spreads) and kCopy (after it: parameter faults on an
  // element it does not hold, its own copy until the next gather). held(param, element): whether
  // the rank holds it.
  // --shard-params, phase gather-link: the faulty link of the sender (the fault's rank, owner of
  // the element) as this receiving rank got parameter `param` in its first gather of the step: the
  // element changes in this rank's copy only (after the gather, before the gather check). c: this
  // rank's context; the fault fires as the sender's device would.
  void on_gather_link(const FireContext& c, std::size_t param, const std::vector<NamedTensor>& params) const;
  // --tensor-parallel: the `n` values tensor-parallel rank `sender` (a world rank) sent in the
  // exchange of `layer` in micro-shard k, as they arrive here: a tp-link fault of the sender's
  // changes them on the way (every receiver sees it; the sender computes with its own).
  void on_tp_link(const FireContext& c, int k, const std::string& layer, int sender, float* part, std::int64_t n) const;
  // gather (--shard-params): the rank's slice of a layer's first parameter (param) corrupted in
  // place just before the step's first gather of it: its memory at rest changed after the update
  // was recorded, and the gather spreads the changed value.
  // held(param, element): whether the rank holds it (another rank's element is never touched).
  void on_gather(const FireContext& c, std::size_t param, const std::vector<NamedTensor>& params,
                 const std::function<bool(std::size_t, std::int64_t)>& held) const;
  bool has_phase(Phase p) const;  // whether a spec lands in phase p
  // Phase tp-link lands in a tensor-parallel exchange: its layer must be one of `exchanges` (the
  // row- and column-parallel layers), the run must exchange (T > 1), and it names the sending rank
  // (no host=, no hang). A forward or backward fault lands on a layer output, never on a
  // column-parallel layer's recorded partial input gradient (layer.dx[c]).
  Status check_tp_link(const std::vector<std::string>& exchanges, int T) const;
  enum class RestPart { kAll, kHeld, kCopy };
  void after_update(const FireContext& c, const std::vector<NamedTensor>& params,
                    const std::vector<std::pair<std::size_t, at::Tensor>>& lost, const OptimizerState& opt,
                    RestPart part = RestPart::kAll,
                    const std::function<bool(std::size_t, std::int64_t)>& held = nullptr,
                    const PartOf& part_of = nullptr) const;

 private:
  // Whether f fires in this phase of this execution (a pure predicate: the same answer every call).
  bool fires(const FaultSpec& f, Phase phase, const FireContext& c, int occurrence, bool per_shard) const;
  // The action of a hang that fired: the rank stalls for f.seconds, then goes on.
  void stall(const FaultSpec& f, const FireContext& c) const;
  // Whether f changes a value here: fires(), except that a firing hang is carried out (stall()) and
  // changes none. What every on_*/before_*/after_* hook asks.
  bool hits(const FaultSpec& f, Phase phase, const FireContext& c, int occurrence, bool per_shard) const;
  int layer_param(const std::string& layer) const;  // first parameter of a layer, or -1
  bool in_layer(std::size_t i, const std::string& layer) const;

  std::vector<FaultSpec> specs_;
  std::vector<std::string> names_;              // parameters, state-dict order
  std::vector<std::vector<std::string>> tied_;  // per parameter: its other names (a tied head's)
  std::vector<std::pair<std::string, std::string>> tied_names_;
  std::vector<std::int64_t> offsets_, sizes_;  // in the flat buffers
  std::uint64_t seed_ = 0;
  // This process's host name: a spec with host= fires only on that node (every rank keeps every
  // spec, so what the ranks agree on about the plan stays the same everywhere).
  std::string host_;  // set by parse()
  // What the last micro-shard used (stale data and rng faults reuse it).
  at::Tensor last_samples_;
  std::uint64_t last_seed_ = 0;
  bool have_last_seed_ = false;
};

}  // namespace culprit::harness
