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
  if (script_) {
    script_->step();
    return;
  }
  if (o_.kind == OptimizerKind::kSgd) {
    opt_->step();
    return;
  }
  torch::NoGradGuard no_grad;
  adamw_step(static_cast<optim::AdamW&>(*opt_));
}

OptimizerState::OptimizerState(const OptimizerOptions& o, const std::vector<at::Tensor>& params,
                               const std::vector<bool>& decays)
    : o_(o), lrs_{o.lr} {
  for (std::size_t i = 0; i < params.size(); ++i) slots_.push_back({i, 0, params[i]});
  build(params, decays);
}

OptimizerState::OptimizerState(const OptimizerOptions& o, std::vector<OptimizerSlot> slots, const std::vector<bool>& decays)
    : o_(o), lrs_{o.lr}, slots_(std::move(slots)) {
  std::vector<at::Tensor> tensors;
  std::vector<bool> slot_decays;
  for (const auto& s : slots_) {
    tensors.push_back(s.tensor);
    slot_decays.push_back(decays.at(s.param));
  }
  build(tensors, slot_decays);
}

OptimizerState::OptimizerState(const OptimizerOptions& o, const std::vector<at::Tensor>& params,
                               std::unique_ptr<ScriptOptimizer> script)
    : o_(o), script_(std::move(script)) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    slots_.push_back({i, 0, params[i]});
    slot_of_.push_back(static_cast<int>(i));
  }
  lrs_ = script_->base_lrs();
  std::stringstream names(o.script_state);
  for (std::string item; std::getline(names, item, ',');)
    if (!item.empty()) script_names_.push_back(item.substr(0, item.find(':')));
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

std::size_t OptimizerState::lr_groups() const { return script_ ? script_->groups() : 1; }

std::vector<double> OptimizerState::base_lrs() const { return script_ ? script_->base_lrs() : std::vector<double>{o_.lr}; }

void OptimizerState::set_lrs(const std::vector<double>& lrs) {
  lrs_ = lrs;
  if (script_) {
    script_->set_lrs(lrs);
    return;
  }
  for (auto& group : opt_->param_groups()) group.options().set_lr(lrs.at(0));
}

// Kept beside the groups: a sharded rank may hold no slice, and so no group.
double OptimizerState::lr() const { return lrs_.at(0); }

double OptimizerState::lr_of(std::size_t param) const { return script_ ? lrs_.at(script_->group_of(param)) : lrs_.at(0); }

int OptimizerState::param_of(const at::Tensor& p) const {
  for (const auto& s : slots_)
    if (s.tensor.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return static_cast<int>(s.param);
  return -1;
}

std::vector<std::string> OptimizerState::state_names() const {
  if (script_) return script_names_;
  if (o_.kind == OptimizerKind::kSgd) return {"momentum_buffer"};
  return {kCounter, "exp_avg", "exp_avg_sq"};
}

at::Tensor OptimizerState::primary(const at::Tensor& p) const {
  if (script_) {  // the first floating state tensor of the parameter's shape (a momentum, a first moment)
    const int i = param_of(p);
    if (i < 0) return {};
    for (const auto& [name, t] : script_->state(static_cast<std::size_t>(i)))
      if (t.is_floating_point() && t.sizes().equals(p.sizes())) return t;
    return {};
  }
  auto& state = opt_->state();
  auto it = state.find(optimizer_state_key(state, p));
  if (it == state.end()) return {};
  if (o_.kind == OptimizerKind::kSgd) return static_cast<optim::SGDParamState&>(*it->second).momentum_buffer();
  return static_cast<optim::AdamWParamState&>(*it->second).exp_avg();
}

std::vector<std::pair<std::string, at::Tensor>> OptimizerState::stored(const at::Tensor& p) const {
  if (script_) {
    const int i = param_of(p);
    return i < 0 ? std::vector<std::pair<std::string, at::Tensor>>{} : script_->state(static_cast<std::size_t>(i));
  }
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
  if (script_) {
    script_->clear();
    for (const auto& [name, p] : params) {
      std::vector<std::pair<std::string, at::Tensor>> st;
      for (const auto& suffix : script_names_)
        if (at::Tensor t = tensor_of(name, suffix); t.defined()) st.push_back({suffix, t});
      const int i = param_of(p);
      if (!st.empty() && i >= 0) script_->load(static_cast<std::size_t>(i), st);
    }
    return Status::OK();
  }
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
