// The bytes of an exported state dict, one function per format (docs/checkpoint-format.md,
// "Exporting a checkpoint"). Pure: no files, no run directory.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "culprit/model.h"
#include "culprit/status.h"

namespace culprit::harness {

// torch.save's zip format, written by libtorch's own Pickler and archive writer (as its
// torch::pickle_save does, without TorchScript's type tag): torch.load(FILE), with its default
// weights_only=True, gives a dict name -> tensor in this order. Tensors sharing a storage (a tied
// weight's names) load sharing it, as torch.save writes them.
Status encode_torch(const std::vector<NamedTensor>& tensors, std::string* out);

// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length, a JSON
// header {"NAME": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} padded
// with spaces to a multiple of 8 bytes, then each tensor's bytes, contiguous, in the given order.
// Every name has bytes of its own (safetensors has no shared tensors). metadata: strings only.
Status encode_safetensors(const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata,
                          std::string* out);

}  // namespace culprit::harness
