// The update (docs/determinism.md, "4. The update"): the reduced gradient becomes every parameter's
// gradient, clipped with --clip-grad-norm, and the optimizer steps, with the faults of the update's
// phases around it. Part of the Trainer (trainer.h); the step that calls it: trainer.cpp.
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "train/trainer.h"

namespace culprit::harness {

// The reduced gradient becomes every parameter's gradient; the optimizer steps (once the checkpoint
// in flight has its copy of the parameters and optimizer state).
void Trainer::update(double lr) {
  if (pipeline_) pipeline_->fence();
  auto grads = torch::from_blob(reduced(), {flat_.size + 1}, torch::kFloat32);
  if (device_.is_cuda()) grads = grads.to(device_);
  if (cfg_.optim.clip_grad_norm > 0) {
    step_.clip_seconds = 0;
    Stopwatch sw(&step_.clip_seconds);
    grads = clip(grads);
  }
  // The script's step() gets gradients of its own, as eager PyTorch's are: one that changes them in
  // place must not change the reduced gradient the trace and the detectors see.
  if (!opt_->known() && grads.data_ptr() == static_cast<void*>(reduced())) grads = grads.clone();
  // Each slot is a parameter, or with --shard-optimizer this rank's slice of one. Sharded, every
  // parameter's gradient becomes its view of the reduced gradient too, as unsharded: the backward
  // pass's own gradient tensors (P floats) are freed here, not at the next micro-shard.
  for (const auto& s : opt_->slots()) {
    auto t = s.tensor;
    t.mutable_grad() = grads.narrow(0, flat_.offsets[s.param] + s.offset, t.numel()).view(t.sizes());
  }
  if (sharded() && !scatters())  // scattered: the backward pass's hooks freed them
    for (std::size_t i = 0; i < flat_.params.size(); ++i) {
      const auto& t = flat_.params[i].tensor;
      t.mutable_grad() = grads.narrow(0, flat_.offsets[i], t.numel()).view(t.sizes());
    }
  // --shard-params: a lost update keeps this rank's slice of the layer, the only part it holds.
  FaultPlan::PartOf part_of;
  if (gather_)
    part_of = [this](std::size_t i) { return zero_->layout().part(comm_.rank, flat_.offsets[i], flat_.sizes[i]); };
  const auto lost = faults_.before_update(step_.fire, flat_.params, part_of);
  opt_->step();
  if (!sharded()) {
    faults_.after_update(step_.fire, flat_.params, lost, *opt_);
    return;
  }
  // A fault of this rank's slice (its master copy) is in what the gather spreads; one elsewhere
  // hits this rank's copy, which the next gather refreshes. --shard-params: there is no copy (such
  // faults are refused at start), and the layers' gathers spread the slices.
  const auto held = [this](std::size_t i, std::int64_t e) { return zero_->layout().holds(comm_.rank, flat_.offsets[i] + e); };
  faults_.after_update(step_.fire, flat_.params, lost, *opt_, FaultPlan::RestPart::kHeld, held, part_of);
  if (gather_) return;
  zero_->gather_params();
  faults_.after_update(step_.fire, flat_.params, {}, *opt_, FaultPlan::RestPart::kCopy, held);
}

// --clip-grad-norm X: the reduced gradient scaled exactly as torch.nn.utils.clip_grad_norm_(params,
// X) scales it in PyTorch 1.13 (each parameter's L2 norm, the L2 norm of those, the coefficient
// 1/(norm + 1e-6) * X clamped to at most 1, every element multiplied by it), written to a buffer of
// its own: reduced_ stays the gradient as reduced, which the detectors (the norm before clipping),
// the trace and the bisection see.
at::Tensor Trainer::clip(const at::Tensor& grads) {
  auto norm_of = [&](std::size_t i) {
    const auto& t = flat_.params[i].tensor;
    std::vector<std::int64_t> dims(static_cast<std::size_t>(t.dim()));
    std::iota(dims.begin(), dims.end(), 0);
    return at::norm(grads.narrow(0, flat_.offsets[i], t.numel()).view(t.sizes()), 2.0, dims, false);
  };
  std::vector<at::Tensor> norms;
  if (scatters()) {
    norms = sliced_norms(norm_of);
  } else {
    for (std::size_t i = 0; i < flat_.params.size(); ++i) norms.push_back(norm_of(i));
  }
  const at::Tensor total = at::norm(at::stack(norms), 2.0, {0}, false);
  const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * cfg_.optim.clip_grad_norm, c10::nullopt, 1.0);
  if (!clipped_.defined() || clipped_.device() != grads.device()) clipped_ = torch::empty_like(grads);
  if (scatters()) {  // only this rank's slice is read (its slots)
    const std::int64_t lo = zero_->layout().lo(comm_.rank), n = zero_->layout().hi(comm_.rank) - lo;
    auto out = clipped_.narrow(0, lo, n);
    at::mul_out(out, grads.narrow(0, lo, n), coef);
  } else {
    at::mul_out(clipped_, grads, coef);
  }
  step_.clip_factor = coef.item<float>();
  return clipped_;
}

}  // namespace culprit::harness
