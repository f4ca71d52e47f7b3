// Applying injected faults to tensors (the decisions are in culprit/inject.h).
#pragma once
#include <ATen/core/Tensor.h>

#include "culprit/inject.h"

namespace culprit::harness {

// Corrupts element (spec.index mod numel) of a float32 tensor in place, outside autograd.
void corrupt_in_place(const FaultSpec& spec, const at::Tensor& t);
// A layer output with element (spec.index mod numel) replaced by its corrupted value; the result
// stays in the autograd graph (gradient flows to the other elements as before).
at::Tensor corrupt_output(const FaultSpec& spec, const at::Tensor& out);
// For int64 token data: the token at (spec.index mod numel) becomes another valid token.
void corrupt_tokens(const FaultSpec& spec, const at::Tensor& t, std::int64_t vocab);

}  // namespace culprit::harness
