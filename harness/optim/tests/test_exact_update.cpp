// The exact referee (optim/exact_update.h) against libtorch's own optimizer step, bit for bit: SGD
// (plain, momentum, Nesterov, weight decay), AdamW (with and without weight decay, one group
// decayed and one not), gradients clipped as Trainer::clip scales them, over several steps from no
// state (each optimizer's first step creates it) on shapes whose sizes are no multiple of a vector
// width (the kernels' scalar tails). A mismatch here means this libtorch rounds otherwise: the
// referee then must not be trusted (docs/bisect.md).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <vector>

#include "culprit/optim_state.h"
#include "optim/exact_update.h"

namespace h = culprit::harness;

namespace {

struct Variant {
  std::string name;
  h::OptimizerOptions o;
  double clip = 0;  // a coefficient the gradient is scaled by first (0: none)
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  h::OptimizerOptions sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0;
  v.push_back({"sgd", sgd});
  sgd.momentum = 0.9;
  v.push_back({"momentum", sgd});
  sgd.nesterov = true;
  sgd.weight_decay = 0.01;
  v.push_back({"nesterov-decay", sgd});
  h::OptimizerOptions adamw;
  adamw.kind = h::OptimizerKind::kAdamW;
  adamw.lr = 3e-3;
  adamw.weight_decay = 0;
  v.push_back({"adamw", adamw});
  adamw.weight_decay = 0.1;
  v.push_back({"adamw-decay", adamw});
  v.push_back({"adamw-decay-clipped", adamw, 0.37});
  sgd.nesterov = false;
  v.push_back({"momentum-clipped", sgd, 0.61});
  return v;
}

bool bitwise(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST(ExactUpdate, EqualsLibtorchBitForBit) {
  torch::manual_seed(7);
  for (const auto& v : variants()) {
    SCOPED_TRACE(v.name);
    const std::vector<std::vector<std::int64_t>> shapes = {{64, 33}, {1003}, {5}};
    std::vector<at::Tensor> params;
    for (const auto& s : shapes) params.push_back(torch::randn(s));
    h::OptimizerState opt(v.o, params, {true, false, true});
    // The referee's copies: parameters and state, carried from step to step as the optimizer's.
    std::vector<std::vector<float>> p, m, s;
    for (const auto& t : params) {
      p.emplace_back(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
      m.emplace_back(t.numel(), 0.0f);
      s.emplace_back(t.numel(), 0.0f);
    }
    for (int step = 0; step < 4; ++step) {
      const double lr = v.o.lr * (1 + 0.25 * step);  // a schedule: the step's learning rate
      opt.set_lr(lr);
      std::vector<std::vector<float>> grads;
      for (auto& t : params) {
        at::Tensor g = torch::randn(t.sizes()) * (step + 1);
        if (v.clip > 0) g = at::mul(g, torch::tensor(static_cast<float>(v.clip)));  // Trainer::clip's mul_out
        t.mutable_grad() = g;
        grads.emplace_back(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
      }
      {
        torch::NoGradGuard ng;
        opt.step();
      }
      for (std::size_t i = 0; i < params.size(); ++i) {
        h::ExactParam x;
        x.p = p[i].data();
        x.g = grads[i].data();
        x.primary = m[i].data();
        x.second = s[i].data();
        x.n = p[i].size();
        x.has_state = step > 0;
        x.step = step;
        x.decay = i != 1;
        h::exact_update(v.o, lr, &x);
        const at::Tensor want = params[i].contiguous();
        EXPECT_TRUE(bitwise(want.data_ptr<float>(), p[i].data(), p[i].size())) << "parameter " << i << " step " << step;
        const at::Tensor prim = opt.primary(params[i]);
        if (prim.defined()) {
          EXPECT_TRUE(bitwise(prim.contiguous().data_ptr<float>(), m[i].data(), m[i].size()))
              << "state of parameter " << i << " step " << step;
        }
      }
    }
  }
}

// Negative control: the referee notices one ulp. A parameter of the libtorch result moved by one
// ulp (what a low-bit flip at rest leaves) no longer equals the referee's.
TEST(ExactUpdate, OneUlpIsADifference) {
  h::OptimizerOptions o;
  std::vector<float> p = {0.5f, -1.25f, 3.0f}, g = {0.1f, 0.2f, -0.3f}, m(3, 0.0f);
  std::vector<float> q = p, n = m;
  h::ExactParam a{p.data(), g.data(), m.data(), nullptr, 3, false, 0, false};
  h::ExactParam b{q.data(), g.data(), n.data(), nullptr, 3, false, 0, false};
  h::exact_update(o, 0.1, &a);
  h::exact_update(o, 0.1, &b);
  ASSERT_TRUE(bitwise(p.data(), q.data(), 3));
  q[1] = std::nextafter(q[1], 0.0f);
  EXPECT_FALSE(bitwise(p.data(), q.data(), 3));
}
