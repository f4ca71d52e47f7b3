// The models culprit trains, behind one small interface. Only ATen's Tensor type is visible
// here; <torch/torch.h> stays in models.cpp and trainer.cpp.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "culprit/harness.h"
#include "culprit/status.h"
#include "culprit/data.h"
#include "culprit/script_optimizer.h"

namespace culprit::harness {

struct NamedTensor {
  std::string name;  // as in the model's state dict, e.g. "fc1.weight"
  at::Tensor tensor;
};

// Sees every layer call in forward order: on_enter before it (--shard-params gathers the layer's
// parameters there), on_forward with its output, which it may replace (fault injection) and hook
// (backward fingerprints, the gather before the layer's backward). Layer names are state-dict
// prefixes.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  virtual void on_enter(const std::string& layer) {}
  virtual at::Tensor on_forward(const std::string& layer, const at::Tensor& output) = 0;
  // A tensor-parallel model's exchange of `layer` (a row-parallel layer's partial products in the
  // forward pass, a column-parallel layer's partial input gradients in the backward pass): `part`
  // is chunk `chunk`'s, computed by tensor-parallel rank `sender` of the group (own: this rank; else
  // as it arrived here, which the observer may change in place: a faulty link).
  virtual void on_exchange(const std::string& layer, int chunk, int sender, bool backward, bool own, at::Tensor part) {}
};

// A parameter cut into a tensor-parallel model's chunks (--tp-chunks): along `dim` (0: rows, the
// outputs of a column-parallel layer; 1: columns, the inputs of a row-parallel one), each of its
// `groups` equal parts (qkv: q, k and v) cut into the model's C chunks; chunk c is part c of every
// group.
struct TensorSplit {
  std::string name;
  int dim = 0;
  int groups = 1;
};

// The pseudo-layer of an opaque (TorchScript) forward: the model's output.
constexpr const char* kOutputLayer = "(output)";

class Model {
 public:
  virtual ~Model() = default;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  virtual std::vector<NamedTensor> parameters() = 0;  // state-dict order
  virtual std::vector<NamedTensor> buffers() = 0;
  virtual void set_training(bool on) = 0;
  // The layers forward calls, in execution order.
  virtual std::vector<std::string> layers() const = 0;
  // The parameters that are embedding tables (weight decay skips them with --weight-decay-params
  // matrices).
  virtual std::vector<std::string> embeddings() const { return {}; }
  // Parameters known by more names than named_parameters() gives (a head tied to the embedding):
  // (other name, the parameter's name). The state dict has both.
  virtual std::vector<std::pair<std::string, std::string>> tied() const { return {}; }
  // Parameters a layer reads that its name does not prefix: (layer, parameter name), such as a
  // head that multiplies by the embedding's table (--shard-params gathers them for that layer).
  virtual std::vector<std::pair<std::string, std::string>> borrowed() const { return {}; }
  // False when forward is opaque and layers() is only the model's output (kOutputLayer).
  virtual bool per_layer() const { return true; }
  // A model that computes its own loss (a Python model: its forward, whatever it returns, and the
  // user's loss function of that; forward() is then not called): own_loss is the loss of samples x
  // with targets y, a 0-dim tensor. Otherwise culprit's cross entropy or MSE of forward(x). The
  // trainer divides a summed loss by the global batch's target elements, a mean
  // (own_loss_is_mean()) by the global batch over x's samples.
  virtual bool owns_loss() const { return false; }
  virtual at::Tensor own_loss(const at::Tensor& x, const at::Tensor& y) { return {}; }
  // Whether own_loss is the mean over the samples' target elements, not their sum.
  virtual bool own_loss_is_mean() const { return false; }
  // The script's optimizer object over the model's parameters as they are now (--optimizer script:
  // a Python model's); null: none. cls, state: --script-optimizer and --optimizer-state, as recorded
  // (an object of another class is refused).
  virtual std::unique_ptr<ScriptOptimizer> make_optimizer(const std::string& cls, const std::string& state) {
    return nullptr;
  }
  // The script's learning-rate schedule: each parameter group's learning rate at step s >= 1 (empty:
  // culprit's --lr-schedule).
  virtual std::vector<double> learning_rates(std::int64_t step) { return {}; }
  void set_observer(LayerObserver* o) { observer_ = o; }
  // A tensor-parallel model (--tp-chunks): the ranks that share each micro-shard (group.size = T,
  // this rank group.rank); it computes chunks [rank * C / T, (rank + 1) * C / T). Collective
  // within the group from then on: every forward and backward exchanges partial sums.
  virtual void set_tensor_group(const Comm& group) {}
  // Its parameters cut into chunks (a rank's gradient of them holds only its chunks); empty: none.
  virtual std::vector<TensorSplit> tensor_splits() const { return {}; }
  virtual int chunks() const { return 0; }

 protected:
  // Every layer call is enter(layer) before it and tap(layer, output) after it.
  void enter(const std::string& layer) {
    if (observer_) observer_->on_enter(layer);
  }
  at::Tensor tap(const std::string& layer, const at::Tensor& t) {
    return observer_ ? observer_->on_forward(layer, t) : t;
  }
  // The layer's call f() between the two.
  template <class F>
  at::Tensor call(const std::string& layer, F&& f) {
    enter(layer);
    return tap(layer, f());
  }
  LayerObserver* observer_ = nullptr;
};

// Builds cfg.model fitted to the data. Built-in models are initialised from cfg.seed; a
// TorchScript model keeps its stored weights.
// world: the ranks that will train it (the memory estimate of a --shard-optimizer run's state).
Status make_model(const TrainConfig& cfg, const Dataset& data, std::unique_ptr<Model>* out, int world = 1);

}  // namespace culprit::harness
