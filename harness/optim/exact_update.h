// The update re-executed element by element in float32, in libtorch's own operation order: an
// exact third opinion on an element-wise phase (a parameter at rest, the optimizer's update) when
// two devices each repeat their own result (docs/bisect.md, "Settling a tie"). Every operation of
// SGD and AdamW is element-wise and IEEE float32, so any correct device computing it in the same
// order and with the same roundings gets the same bits; this plain loop is such a device.
// The roundings are libtorch 2.11's CPU kernels' (as 1.13's; measured, harness/optim/tests/test_exact_update.cpp):
//   add_(t, alpha)         fma(t, alpha, self)            one rounding (its vectorised kernel's fmadd)
//   addcmul_(a, b, value)  fma(value * a, b, self)
//   addcdiv_(a, b, value)  self + (value * a) / b         three roundings
//   mul_ / div by a scalar the scalar rounded to float32 first
//   lerp_(end, w)          fma(w, end - self, self) for w < 0.5, else fma(-(end - self), 1 - w, end)
//   sqrt()                 libtorch's own kernel: MKL's vsSqrt, not correctly rounded (taken from it)
// A build whose kernels round otherwise (another CPU capability) fails that test; the bisection
// then finds the referee's two recomputations or the devices unlike it and falls back to the
// float64 arbiter (no opinion is given from a referee that disagrees with both devices).
// Plain floats in and out.
#pragma once
#include <cstddef>
#include <cstdint>

#include "culprit/harness.h"

namespace culprit::harness {

// One parameter's update. p: its values before the step (updated in place); g: its gradient as the
// optimizer saw it (reduced, clipped); primary: SGD's momentum buffer or AdamW's first moment,
// second: AdamW's second moment (both updated in place); has_state: the optimizer held state for it
// before the step (SGD's first step copies the gradient into the buffer; AdamW starts from zeros,
// `step` 0). decay: weight decay applies to it (its parameter group's).
struct ExactParam {
  float* p = nullptr;
  const float* g = nullptr;
  float* primary = nullptr;
  float* second = nullptr;
  std::size_t n = 0;
  bool has_state = false;
  std::int64_t step = 0;  // AdamW: steps taken before this one
  bool decay = false;
};

// The optimizer step `o` takes with learning rate lr.
void exact_update(const OptimizerOptions& o, double lr, ExactParam* param);

}  // namespace culprit::harness
