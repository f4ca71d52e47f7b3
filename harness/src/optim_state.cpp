#include "optim_state.h"

namespace culprit::harness {

namespace optim = torch::optim;

OptimizerState::OptimizerState(const OptimizerOptions& o, std::vector<at::Tensor> params) : o_(o) {
  if (o.kind == OptimizerKind::kSgd)
    opt_ = std::make_unique<optim::SGD>(
        params, optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay));
  else
    opt_ = std::make_unique<optim::AdamW>(
        params,
        optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
}

void OptimizerState::set_lr(double lr) {
  for (auto& group : opt_->param_groups()) group.options().set_lr(lr);
}

double OptimizerState::lr() const { return opt_->param_groups()[0].options().get_lr(); }

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
