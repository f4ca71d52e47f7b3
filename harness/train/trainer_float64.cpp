// The step recomputed in float64: the bisection's arbiter between two devices that each repeat
// their own float32 result (docs/bisect.md, "Settling a tie"). Its result is an opinion that
// float32 rounding does not reach: a healthy float32 result lies within rounding of it, a fault's
// effect usually far outside.
//  - a micro-shard: the same samples, state and dropout seed as the step's own computation, with
//    every parameter, buffer and floating input widened to float64, no layer hooks and no faults but
//    those of loading the input. The trainer's state comes back exactly: every parameter is again
//    its view of the flat float32 buffer, with the gradient and buffers it had.
//  - the update: the optimizer step from the marked state's parameters and optimizer state, widened,
//    with the step's reduced gradient and learning rate, on copies (the live state is not touched).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <vector>

#include "culprit/rng.h"
#include "train/state_values.h"
#include "train/trainer.h"

namespace culprit::harness {

namespace {

// Widens the model to float64 for one computation and puts back every tensor it swapped. set_data
// keeps each tensor's identity (the optimizer and the flat buffer's views hold it); autograd
// drops a parameter's gradient accumulator when its dtype changes, both ways.
class Widened {
 public:
  Widened(Model& model, std::vector<NamedTensor>& params, LayerObserver* observer)
      : model_(model), params_(params), observer_(observer), buffers_(model.buffers()) {
    torch::NoGradGuard ng;
    // Every float64 copy first (the only step that can throw: memory), then the swaps, which cannot:
    // an exception leaves the model as it was.
    std::vector<at::Tensor> wide, wide_buffers;
    for (auto& p : params_) wide.push_back(p.tensor.data().to(torch::kFloat64));
    for (auto& b : buffers_)
      wide_buffers.push_back(b.tensor.is_floating_point() ? b.tensor.data().to(torch::kFloat64) : at::Tensor());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      data_.push_back(p.tensor.data());
      grads_.push_back(p.tensor.grad());
      p.tensor.mutable_grad().reset();
      p.tensor.set_data(wide[i]);
    }
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      buffer_data_.push_back(buffers_[i].tensor.data());
      if (wide_buffers[i].defined()) buffers_[i].tensor.set_data(wide_buffers[i]);
    }
    model_.set_observer(nullptr);
  }
  ~Widened() {
    torch::NoGradGuard ng;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      params_[i].tensor.set_data(data_[i]);
      params_[i].tensor.mutable_grad() = grads_[i];
    }
    for (std::size_t i = 0; i < buffers_.size(); ++i) buffers_[i].tensor.set_data(buffer_data_[i]);
    model_.set_observer(observer_);
  }
  Widened(const Widened&) = delete;
  Widened& operator=(const Widened&) = delete;

 private:
  Model& model_;
  std::vector<NamedTensor>& params_;
  LayerObserver* observer_;
  std::vector<NamedTensor> buffers_;
  std::vector<at::Tensor> data_, grads_, buffer_data_;
};

at::Tensor widen(const at::Tensor& t, const at::Device& device) {
  auto on = t.to(device);
  return on.is_floating_point() ? on.to(torch::kFloat64) : on;
}

}  // namespace

void Trainer::shard_grad_f64(int k, int round, std::vector<double>* out) {
  // The input as this rank loads it (a fault in loading stays in: the arbiter judges the
  // computation, not the data, and a rank that loads differently gets a float64 result of its own).
  FireContext c = step_.fire;
  c.step = done_ + 1;
  c.rank = self();
  c.attempt = 0;
  c.mode = StepMode::kReplay;
  c.round = round;
  at::Tensor idx = shard_indices(c.step, k);
  std::uint64_t seed = dropout_seed(cfg_.seed, c.step, k);
  faults_.on_inputs(c, k, &idx, &seed);
  auto [loaded, labels] = load_samples(c.step, k, idx);
  faults_.on_batch(c, k, loaded, data_.classes);
  const auto x = widen(loaded, device_);
  const auto y = widen(labels, device_);
  std::vector<double> grad(static_cast<std::size_t>(flat_.size + 1), 0.0);
  {
    BufferGuard keep(model_);  // a forward in training mode moves running statistics: put back
    Widened wide(model_, flat_.params, layers_.get());
    torch::manual_seed(seed);
    auto loss = shard_loss(x, y);
    loss.backward();
    for (std::size_t i = 0; i < flat_.params.size(); ++i) {
      const auto& g = flat_.params[i].tensor.grad();
      if (!g.defined()) continue;
      const auto gc = g.to(at::kCPU).contiguous();
      std::copy(gc.data_ptr<double>(), gc.data_ptr<double>() + flat_.sizes[i], grad.begin() + flat_.offsets[i]);
    }
    grad[static_cast<std::size_t>(flat_.size)] = loss.item<double>();
  }
  *out = std::move(grad);
}

namespace {

// A marked tensor widened to float64 (an integer one as it is): always a copy, since the optimizer
// step writes into it and the marked state must stay as it is.
at::Tensor tensor_of(const ckpt::RawTensor& r) {
  const at::Tensor t = view_of(r);
  return t.is_floating_point() ? t.to(torch::kFloat64, /*non_blocking=*/false, /*copy=*/true) : t.clone();
}

}  // namespace

void Trainer::update_f64(const ckpt::Checkpoint& start, std::vector<float>* now, std::vector<double>* wide) {
  if (!opt_->known())  // its own step() in float64 could differ from it in more than rounding
    throw std::runtime_error("--optimizer script: culprit does not know the update of the script's " +
                             cfg_.optim.script_optimizer + " to recompute it");
  const std::size_t P = static_cast<std::size_t>(flat_.size);
  std::map<std::string, at::Tensor> marked;
  for (const auto& r : start.model) marked[r.name] = tensor_of(r);
  for (const auto& r : start.optimizer) marked[r.name] = tensor_of(r);
  std::vector<at::Tensor> p64;
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    const auto& p = flat_.params[i];
    auto t = marked.at(p.name).reshape(p.tensor.sizes()).clone();
    t.mutable_grad() = torch::from_blob(reduced() + flat_.offsets[i], p.tensor.sizes(), torch::kFloat32)
                           .to(torch::kFloat64);
    p64.push_back(t);
    named.push_back({p.name, t});
  }
  if (cfg_.optim.clip_grad_norm > 0) {  // --clip-grad-norm, in float64 too
    double sq = 0;
    for (const auto& t : p64) sq += t.grad().square().sum().item<double>();
    const double coef = std::min(1.0, cfg_.optim.clip_grad_norm / (std::sqrt(sq) + 1e-6));
    for (auto& t : p64) t.mutable_grad().mul_(coef);
  }
  OptimizerState opt64(cfg_.optim, p64, flat_.decay);
  const Status st = opt64.load(named, [&](const std::string& name, const std::string& suffix) {
    auto it = marked.find(name + "/" + suffix);
    return it == marked.end() ? at::Tensor() : it->second;
  });
  if (!st.ok()) throw std::runtime_error(st.message());
  opt64.set_lr(opt_->lr());  // the step's, as the replay set it
  {
    torch::NoGradGuard ng;
    opt64.step();
  }
  // This rank's state after the step and the float64 one, in the same layout: P parameter values,
  // then each parameter's primary optimizer state (optim_state.h; zeros where there is none).
  now->assign(2 * P, 0.0f);
  wide->assign(2 * P, 0.0);
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    const auto off = static_cast<std::size_t>(flat_.offsets[i]);
    put(flat_.params[i].tensor, now->data() + off);
    put(opt_->primary(flat_.params[i].tensor), now->data() + P + off);
    put(p64[i], wide->data() + off);
    put(opt64.primary(p64[i]), wide->data() + P + off);
  }
}

}  // namespace culprit::harness
