// A checkpointed tensor as a tensor, and a tensor's values into a flat buffer: shared by the
// bisection's referees (trainer_float64.cpp, trainer_exact.cpp), which lay out a parameter's values
// and optimizer state side by side. Private to train/.
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <type_traits>

#include "culprit/checkpoint.h"
#include "culprit/tensors.h"

namespace culprit::harness {

// The tensor over r's bytes (no copy: r must outlive it, and nothing may write into it).
inline at::Tensor view_of(const ckpt::RawTensor& r) {
  return torch::from_blob(const_cast<void*>(static_cast<const void*>(r.bytes.data())), r.shape,
                          torch::TensorOptions().dtype(to_scalar(r.dtype)));
}

// t's values, as T (float or double), at dst; nothing when t is undefined (no state yet).
template <class T>
void put(const at::Tensor& t, T* dst) {
  if (!t.defined()) return;
  const at::Tensor c =
      t.detach().to(at::kCPU).to(std::is_same_v<T, float> ? torch::kFloat32 : torch::kFloat64).contiguous();
  std::copy(c.data_ptr<T>(), c.data_ptr<T>() + c.numel(), dst);
}

}  // namespace culprit::harness
