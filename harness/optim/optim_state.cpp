#include "culprit/optim_state.h"

#include <cmath>

namespace culprit::harness {

namespace optim = torch::optim;

namespace {

std::unique_ptr<optim::OptimizerOptions> options_of(const OptimizerOptions& o, double weight_decay) {
  if (o.kind == OptimizerKind::kSgd)
    return std::make_unique<optim::SGDOptions>(
        optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(weight_decay));
  return std::make_unique<optim::AdamWOptions>(
      optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(weight_decay));
}

// torch.optim.AdamW's single-tensor step (torch/optim/adam.py, decoupled weight decay, no amsgrad)
// in libtorch's operations. libtorch's C++ AdamW::step updates the first moment as
// exp_avg.mul_(beta1).add_(grad, 1 - beta1) where Python's lerps (exp_avg.lerp_(grad, 1 - beta1)),
// and the two round differently: culprit's AdamW is Python's, the optimizer its users run (and its
// state stays libtorch's AdamWParamState, the checkpoints' layout). Python's step counter is a
// float; its bias corrections, step size and square root are doubles as here (`** 0.5` is pow).
void adamw_step(optim::AdamW& opt) {
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const optim::AdamWOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      auto& slot = opt.state()[p.unsafeGetTensorImpl()];
      if (!slot) {  // the state Python creates on a parameter's first step: zeros
        auto fresh = std::make_unique<optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& st = static_cast<optim::AdamWParamState&>(*slot);
      st.step(st.step() + 1);
      if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
      st.exp_avg().lerp_(grad, 1 - beta1);
      st.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      const double step = static_cast<double>(st.step());
      const double bias1 = 1 - std::pow(beta1, step), bias2 = 1 - std::pow(beta2, step);
      const at::Tensor denom = (st.exp_avg_sq().sqrt() / std::pow(bias2, 0.5)).add_(o.eps());
      p.addcdiv_(st.exp_avg(), denom, -(o.lr() / bias1));
    }
  }
}

}  // namespace

void OptimizerState::step() {
  if (o_.kind == OptimizerKind::kSgd) {
    opt_->step();
    return;
  }
  torch::NoGradGuard no_grad;
  adamw_step(static_cast<optim::AdamW&>(*opt_));
}

OptimizerState::OptimizerState(const OptimizerOptions& o, const std::vector<at::Tensor>& params,
                               const std::vector<bool>& decays)
    : o_(o), lr_(o.lr) {
  for (std::size_t i = 0; i < params.size(); ++i) slots_.push_back({i, 0, params[i]});
  build(params, decays);
}

OptimizerState::OptimizerState(const OptimizerOptions& o, std::vector<OptimizerSlot> slots, const std::vector<bool>& decays)
    : o_(o), lr_(o.lr), slots_(std::move(slots)) {
  std::vector<at::Tensor> tensors;
  std::vector<bool> slot_decays;
  for (const auto& s : slots_) {
    tensors.push_back(s.tensor);
    slot_decays.push_back(decays.at(s.param));
  }
  build(tensors, slot_decays);
}

void OptimizerState::build(const std::vector<at::Tensor>& params, const std::vector<bool>& decays) {
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    if (slot_of_.size() <= slots_[k].param) slot_of_.resize(slots_[k].param + 1, -1);
    slot_of_[slots_[k].param] = static_cast<int>(k);
  }
  // Group 0: the parameters weight decay applies to; group 1: the others (weight decay 0). An
  // empty group is left out (libtorch refuses none, but it would be a group of nothing).
  std::vector<at::Tensor> decayed, plain;
  for (std::size_t i = 0; i < params.size(); ++i) (decays.at(i) ? decayed : plain).push_back(params[i]);
  std::vector<optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) groups.emplace_back(decayed, options_of(o_, o_.weight_decay));
  if (!plain.empty()) groups.emplace_back(plain, options_of(o_, 0.0));
  if (o_.kind == OptimizerKind::kSgd)
    opt_ = std::make_unique<optim::SGD>(std::move(groups), static_cast<optim::SGDOptions&>(*options_of(o_, o_.weight_decay)));
  else
    opt_ = std::make_unique<optim::AdamW>(std::move(groups), static_cast<optim::AdamWOptions&>(*options_of(o_, o_.weight_decay)));
}

const OptimizerSlot* OptimizerState::slot(std::size_t i) const {
  return i < slot_of_.size() && slot_of_[i] >= 0 ? &slots_[static_cast<std::size_t>(slot_of_[i])] : nullptr;
}

std::int64_t OptimizerState::state_bytes() const {
  std::int64_t n = 0;
  for (const auto& s : slots_)
    for (const auto& [suffix, t] : stored(s.tensor)) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

void OptimizerState::set_lr(double lr) {
  lr_ = lr;
  for (auto& group : opt_->param_groups()) group.options().set_lr(lr);
}

// Kept beside the groups: a sharded rank may hold no slice, and so no group.
double OptimizerState::lr() const { return lr_; }

std::vector<std::string> OptimizerState::state_names() const {
  if (o_.kind == OptimizerKind::kSgd) return {"momentum_buffer"};
  return {kCounter, "exp_avg", "exp_avg_sq"};
}

at::Tensor OptimizerState::primary(const at::Tensor& p) const {
  auto& state = opt_->state();
  auto it = state.find(optimizer_state_key(state, p));
  if (it == state.end()) return {};
  if (o_.kind == OptimizerKind::kSgd) return static_cast<optim::SGDParamState&>(*it->second).momentum_buffer();
  return static_cast<optim::AdamWParamState&>(*it->second).exp_avg();
}

std::vector<std::pair<std::string, at::Tensor>> OptimizerState::stored(const at::Tensor& p) const {
  auto& state = opt_->state();
  auto it = state.find(optimizer_state_key(state, p));
  if (it == state.end()) return {};
  if (o_.kind == OptimizerKind::kSgd) {
    auto& st = static_cast<optim::SGDParamState&>(*it->second);
    if (!st.momentum_buffer().defined()) return {};
    return {{"momentum_buffer", st.momentum_buffer()}};
  }
  auto& st = static_cast<optim::AdamWParamState&>(*it->second);
  return {{"step", torch::tensor(st.step(), torch::kLong).reshape({})},
          {"exp_avg", st.exp_avg()},
          {"exp_avg_sq", st.exp_avg_sq()}};
}

Status OptimizerState::load(
    const std::vector<std::pair<std::string, at::Tensor>>& params,
    const std::function<at::Tensor(const std::string& param, const std::string& suffix)>& tensor_of) {
  auto& state = opt_->state();
  state.clear();
  for (const auto& [name, p] : params) {
    const auto key = optimizer_state_key(state, p);
    if (o_.kind == OptimizerKind::kSgd) {
      auto buf = tensor_of(name, "momentum_buffer");
      if (!buf.defined()) continue;
      if (!buf.sizes().equals(p.sizes())) return Status::BadInput("checkpoint momentum of '" + name + "' has the wrong shape");
      auto st = std::make_unique<optim::SGDParamState>();
      st->momentum_buffer(buf);
      state[key] = std::move(st);
    } else {
      auto step = tensor_of(name, "step"), m = tensor_of(name, "exp_avg"), v = tensor_of(name, "exp_avg_sq");
      if (!step.defined() && !m.defined()) continue;
      if (!step.defined() || !m.defined() || !v.defined() || step.scalar_type() != torch::kLong ||
          !m.sizes().equals(p.sizes()) || !v.sizes().equals(p.sizes()))
        return Status::BadInput("checkpoint AdamW state of '" + name + "' is incomplete or misshapen");
      auto st = std::make_unique<optim::AdamWParamState>();
      st->step(step.item<std::int64_t>());
      st->exp_avg(m);
      st->exp_avg_sq(v);
      state[key] = std::move(st);
    }
  }
  return Status::OK();
}

}  // namespace culprit::harness
