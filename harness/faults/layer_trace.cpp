#include "faults/layer_trace.h"

#include <torch/torch.h>

#include <algorithm>

#include "culprit/tensors.h"

namespace culprit::harness {

LayerTrace::LayerTrace(const FaultPlan* plan, const std::vector<std::string>& layers, bool record) : plan_(plan) {
  for (std::size_t i = 0; i < layers.size(); ++i) index_[layers[i]] = i;
  if (record) {
    fwd_.assign(layers.size(), 0);
    bwd_.assign(layers.size(), 0);
  }
}

void LayerTrace::begin_shard(const FireContext& c, int k) {
  fire_ = c;
  shard_ = k;
  std::fill(fwd_.begin(), fwd_.end(), 0);
  std::fill(bwd_.begin(), bwd_.end(), 0);
}

at::Tensor LayerTrace::on_forward(const std::string& layer, const at::Tensor& output) {
  at::Tensor out = plan_->on_layer_output(fire_, shard_, layer, output);
  if (fire_.step == 0) dtypes_[layer] = output.scalar_type();  // the start-up pass (no step yet)
  const auto it = index_.find(layer);
  if (it == index_.end() || fwd_.empty()) return out;
  const std::size_t i = it->second;
  fwd_[i] = tensor_fingerprint(out.detach());
  if (out.requires_grad()) out.register_hook([this, i](const at::Tensor& g) { bwd_[i] = tensor_fingerprint(g); });
  return out;
}

void LayerTrace::on_exchange(const std::string& layer, int chunk, int sender, bool backward, bool own, at::Tensor part) {
  if (!own && group_size_ > 1)
    plan_->on_tp_link(fire_, shard_, layer, fire_.rank - tp_ + sender, part.data_ptr<float>(), part.numel());
  if (fwd_.empty() || (own && !backward)) return;
  const std::string slot = layer + (backward ? ".dx[" : "[") + std::to_string(chunk) + "]";
  const auto it = index_.find(slot);
  if (it == index_.end()) return;
  (backward ? bwd_ : fwd_)[it->second] = tensor_fingerprint(part);
}

}  // namespace culprit::harness
