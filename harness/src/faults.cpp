#include "faults.h"

#include <torch/torch.h>

namespace culprit::harness {

void corrupt_in_place(const FaultSpec& spec, const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || t.scalar_type() != at::kFloat || !t.is_contiguous()) return;
  torch::NoGradGuard ng;
  float* p = t.data_ptr<float>() + spec.index % t.numel();
  *p = corrupt_value(spec, *p);
}

at::Tensor corrupt_output(const FaultSpec& spec, const at::Tensor& out) {
  if (out.numel() == 0 || out.scalar_type() != at::kFloat) return out;
  const std::int64_t i = spec.index % out.numel();
  torch::Tensor flat = out.detach().reshape(-1);
  const float bad = corrupt_value(spec, flat[i].item<float>());
  auto mask = torch::zeros({out.numel()}, torch::kBool);
  mask[i] = true;
  return torch::where(mask.view(out.sizes()), torch::full({}, bad, torch::kFloat), out);
}

void corrupt_tokens(const FaultSpec& spec, const at::Tensor& t, std::int64_t vocab) {
  if (t.numel() == 0 || t.scalar_type() != at::kLong) return;
  std::int64_t* p = t.data_ptr<std::int64_t>() + spec.index % t.numel();
  *p = (*p + 1) % vocab;
}

}  // namespace culprit::harness
