// The model's parameters as views of one flat float32 buffer (state-dict order), so the reduction,
// the fingerprints and checkpoint I/O are one call each. Built by the Trainer's setup
// (train/trainer_setup.cpp); read by the gradient reducer and the sharded optimizer.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/model.h"

namespace culprit::harness {

struct FlatParams {
  std::vector<NamedTensor> params;
  std::vector<std::int64_t> offsets, sizes;  // of each parameter in the flat buffers
  std::vector<std::size_t> byte_offsets, byte_sizes;  // the same in bytes (fingerprint_with_parts)
  std::int64_t size = 0;                     // P; the gradient buffers hold P + 1 (the loss last)
  std::vector<bool> decay;                   // whether weight decay applies (--weight-decay-params)
  at::Tensor flat;
  std::vector<std::string> names() const {
    std::vector<std::string> v;
    for (const auto& p : params) v.push_back(p.name);
    return v;
  }
};

}  // namespace culprit::harness
