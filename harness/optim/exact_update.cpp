// The update element by element in float32 (exact_update.h). Each line names the libtorch
// operation it stands for (torch::optim::SGD::step; torch.optim.AdamW's step as
// OptimizerState::step runs it).
#include "optim/exact_update.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace culprit::harness {

namespace {

float f32(double v) { return static_cast<float>(v); }

// libtorch's square root of n floats, by its own kernel on a tensor of its own allocation (as
// exp_avg_sq.sqrt() runs): with MKL that is VML's vsSqrt, which is not correctly rounded (one ulp
// off for ~0.6% of inputs, by MKL's branch) and no plain std::sqrt reproduces it.
std::vector<float> library_sqrt(const float* v, std::size_t n) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(n)}, at::kFloat);
  std::memcpy(t.data_ptr<float>(), v, n * sizeof(float));
  const at::Tensor r = t.sqrt().contiguous();
  return std::vector<float>(r.data_ptr<float>(), r.data_ptr<float>() + n);
}

void sgd(const OptimizerOptions& o, double lr, ExactParam* x) {
  const float wd = f32(x->decay ? o.weight_decay : 0.0), m = f32(o.momentum), step = f32(-1 * lr);
  const float keep = f32(1 - 0.0);  // 1 - dampening (libtorch's default, culprit's)
  for (std::size_t i = 0; i < x->n; ++i) {
    float d = x->g[i];
    if (wd != 0) d = std::fma(x->p[i], wd, d);  // d_p = d_p.add(p, weight_decay)
    if (o.momentum != 0) {
      float& buf = x->primary[i];
      buf = x->has_state ? std::fma(d, keep, buf * m) : d;  // buf.mul_(momentum).add_(d_p, 1 - dampening)
      d = o.nesterov ? std::fma(buf, m, d) : buf;           // d_p.add(buf, momentum), or buf
    }
    x->p[i] = std::fma(d, step, x->p[i]);  // p.add_(d_p, -lr)
  }
}

void adamw(const OptimizerOptions& o, double lr, ExactParam* x) {
  const double wd = x->decay ? o.weight_decay : 0.0;
  const double step = static_cast<double>(x->has_state ? x->step : 0) + 1;
  const double bias1 = 1 - std::pow(o.beta1, step), bias2 = 1 - std::pow(o.beta2, step);
  const float shrink = f32(1 - lr * wd), b2 = f32(o.beta2), a1 = f32(1 - o.beta1),
              a2 = f32(1 - o.beta2), root2 = f32(std::pow(bias2, 0.5)), eps = f32(o.eps), size = f32(-(lr / bias1));
  for (std::size_t i = 0; i < x->n; ++i) {
    const float g = x->g[i];
    float& m = x->primary[i];
    float& v = x->second[i];
    if (!x->has_state) m = 0, v = 0;  // the state libtorch creates: zeros
    if (wd != 0) x->p[i] = x->p[i] * shrink;     // p.mul_(1 - lr * weight_decay)
    m = a1 < 0.5f ? std::fma(a1, g - m, m)       // exp_avg.lerp_(grad, 1 - beta1): its kernel's two
                  : std::fma(-(g - m), 1.0f - a1, g);  // forms, by the weight
    v = std::fma(a2 * g, g, v * b2);             // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
  }
  const std::vector<float> roots = library_sqrt(x->second, x->n);  // exp_avg_sq.sqrt()
  for (std::size_t i = 0; i < x->n; ++i) {
    const float denom = roots[i] / root2 + eps;  // (... / sqrt(bias2)).add_(eps)
    x->p[i] = x->p[i] + (size * x->primary[i]) / denom;  // p.addcdiv_(exp_avg, denom, -lr / bias1)
  }
}

}  // namespace

void exact_update(const OptimizerOptions& o, double lr, ExactParam* x) {
  if (o.kind == OptimizerKind::kSgd) sgd(o, lr, x);
  else adamw(o, lr, x);
}

}  // namespace culprit::harness
