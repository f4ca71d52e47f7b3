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

namespace culprit::harness {

struct NamedTensor {
  std::string name;  // as in the model's state dict, e.g. "fc1.weight"
  at::Tensor tensor;
};

// Sees every layer output in forward order; may return a modified tensor (fault injection) and
// may register gradient hooks on it (backward fingerprints). Layer names are state-dict prefixes.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  virtual at::Tensor on_forward(const std::string& layer, const at::Tensor& output) = 0;
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
  // False when forward is opaque and layers() is only the model's output (kOutputLayer).
  virtual bool per_layer() const { return true; }
  // The model's own loss: the sum over the samples of `out` of each sample's loss (undefined: none,
  // culprit's cross entropy or MSE). The trainer divides it by the global batch's target elements.
  virtual at::Tensor summed_loss(const at::Tensor& out, const at::Tensor& y) { return {}; }
  void set_observer(LayerObserver* o) { observer_ = o; }

 protected:
  at::Tensor tap(const std::string& layer, const at::Tensor& t) {
    return observer_ ? observer_->on_forward(layer, t) : t;
  }
  LayerObserver* observer_ = nullptr;
};

// Builds cfg.model fitted to the data. Built-in models are initialised from cfg.seed; a
// TorchScript model keeps its stored weights.
// world: the ranks that will train it (the memory estimate of a --shard-optimizer run's state).
Status make_model(const TrainConfig& cfg, const Dataset& data, std::unique_ptr<Model>* out, int world = 1);

}  // namespace culprit::harness
