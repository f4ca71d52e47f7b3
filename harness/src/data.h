// Training data held in memory as raw arrays; no libtorch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/buffer.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/status.h"

namespace culprit::harness {

struct Dataset {
  std::string source;  // "synthetic" or "hdf5:PATH"
  std::int64_t n = 0;
  DType x_dtype = DType::kFloat32;     // float32, or int64 token ids
  std::vector<std::int64_t> x_shape;   // one sample
  ByteBuffer x;                        // n samples, row-major
  DType y_dtype = DType::kInt64;       // int64: class labels (cross entropy); float32: targets (MSE)
  std::vector<std::int64_t> y_shape;   // one sample's target
  ByteBuffer y;
  std::int64_t classes = 0;            // int64 labels: --classes, or the largest label + 1
  std::int64_t max_label = -1;         // hdf5 int64 labels: the largest, and its element of y
  std::int64_t max_label_at = -1;
  bool classification() const { return y_dtype == DType::kInt64; }
  std::int64_t x_numel() const;        // elements of one sample
  std::int64_t y_numel() const;
};

// Builds synthetic data fitted to the model, or reads hdf5:PATH (datasets x and y).
Status load_dataset(const TrainConfig& cfg, Dataset* out);

std::string shape_str(const std::vector<std::int64_t>& shape);

}  // namespace culprit::harness
