// Memory estimates of a configuration (sizes.h).
#include "config/sizes.h"

#include <cmath>
#include <cstdio>

#include "culprit/system.h"

namespace culprit::harness {

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

double product(const std::vector<std::int64_t>& v) {
  double p = 1;
  for (auto d : v) p *= static_cast<double>(d);
  return p;
}

double linear(double in, double out) { return in * out + out; }

// A count for people: exact while it is an integer a double holds, else "1.2e+16".
std::string count_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, v < 1e15 ? "%.0f" : "%.3g", v);
  return buf;
}

// The synthetic data's shape and outputs, as data.cpp makes them.
std::vector<std::int64_t> synthetic_shape(const TrainConfig& c) {
  if (c.model.kind == ModelKind::kGpt) return {gpt_seq_len(c)};
  if (!c.sample_shape.empty()) return c.sample_shape;
  return c.model.kind == ModelKind::kCnn ? std::vector<std::int64_t>{1, 16, 16} : std::vector<std::int64_t>{32};
}
double synthetic_classes(const TrainConfig& c) {
  if (c.model.kind == ModelKind::kGpt) return static_cast<double>(gpt_vocab(c));
  return c.classes ? c.classes : 10;
}

// Bytes the synthetic data needs: no sample is held, but the loader's two steps of micro-shards
// (at most two global batches) and the labelling teacher's weights are; and with --shuffle
// randperm the orders of two epochs (8 bytes a sample each).
double synthetic_data_bytes(const TrainConfig& c) {
  const double n = static_cast<double>(c.samples), d = product(synthetic_shape(c));
  const double b = 2.0 * static_cast<double>(c.global_batch);
  const double order = c.shuffle == Shuffle::kRandperm ? 16 * n : 0;
  if (c.model.kind == ModelKind::kGpt) return order + b * d * 16;  // int64 tokens and next-token targets
  return order + b * (d * 4 + 8) + synthetic_classes(c) * d * 8;
}

// gpt's activations kept for backward, per micro-shard: the attention scores (heads x T x T, three
// tensors per layer: scores, softmax, dropout) and about 20 tensors of T x width per layer
// (norms, qkv, MLP at 4 x width, residuals), and the logits (T x vocab, three tensors).
double gpt_activation_bytes(const TrainConfig& c, double t, double vocab) {
  const double per_shard = std::ceil(static_cast<double>(c.global_batch) / std::max(1, c.micro_shards));
  const double layers = c.gpt.layers, d = static_cast<double>(c.gpt.width);
  return per_shard * 4 * (layers * (3 * c.gpt.heads * t * t + 20 * t * d) + 3 * t * vocab);
}

}  // namespace

double builtin_parameters(const TrainConfig& c, const std::vector<std::int64_t>& x_shape, double out) {
  const ModelKind kind = c.model.kind;
  if (kind == ModelKind::kMlp) {
    const double h = static_cast<double>(c.hidden);
    return linear(product(x_shape), h) + linear(h, h) + linear(h, out);
  }
  if (kind == ModelKind::kCnn) {
    const double cin = x_shape.size() == 3 ? static_cast<double>(x_shape[0]) : 1;
    const double hw = x_shape.size() == 3 ? std::floor(x_shape[1] / 4.0) * std::floor(x_shape[2] / 4.0) : 1;
    return linear(cin * 9, 8) + linear(8 * 9, 16) + linear(16 * hw, out);
  }
  if (kind == ModelKind::kGpt) {
    const double d = static_cast<double>(c.gpt.width), t = product(x_shape);
    const double block = 2 * (2 * d) + linear(d, 3 * d) + linear(d, d) + linear(d, 4 * d) + linear(4 * d, d);
    const double head = c.gpt.tie_head ? 0 : linear(d, out);
    return out * d + t * d + c.gpt.layers * block + 2 * d + head;
  }
  return 0;  // TorchScript: known once loaded
}

double state_bytes(const TrainConfig& c, double parameters, int world) {
  double optimizer = 0;
  if (c.optim.kind == OptimizerKind::kAdamW) {
    optimizer = 2;
  } else if (c.optim.kind == OptimizerKind::kScript) {  // a copy of the parameters per state tensor (at most)
    for (std::size_t at = c.optim.script_state.find(":tensor"); at != std::string::npos;
         at = c.optim.script_state.find(":tensor", at + 1))
      optimizer += 1;
  } else if (c.optim.momentum > 0) {
    optimizer = 1;
  }
  if (c.sharded()) optimizer /= std::max(1, world);  // each rank holds its slice
  // parameters, gradients, reduced gradient, spot-check leaf, checkpoint copy; the tree holds at
  // most log2(M) + 1 blocks and one pending leaf.
  // --clip-grad-norm: the clipped copy; --precision bf16: autocast's bfloat16 copy of the weights.
  const double recipe = (c.optim.clip_grad_norm > 0 ? 1 : 0) + (c.precision == Precision::kBf16 ? 0.5 : 0);
  const double tree = std::log2(std::max(1, c.micro_shards));
  // --shard-params: everything is held in slices — the parameters, their checkpoint copy, the
  // reduced gradient, the reduce-scatter's partial sums (at most log2(M) + 1), the clipped slice —
  // and autograd's gradients and the leaf go bucket by bucket (the gathered layers and the buckets
  // in flight come on top, unknown here).
  if (c.shard_params) return parameters * 4 * ((4 + tree + recipe) / std::max(1, world) + optimizer);
  const double copies = 4 + 1 + tree + 2 + optimizer + recipe;
  return parameters * 4 * copies;
}

Status check_synthetic_sizes(const TrainConfig& c, int world) {
  if (c.data.kind != DataKind::kSynthetic) return Status::OK();
  const std::vector<std::int64_t> shape = synthetic_shape(c);
  const double data = synthetic_data_bytes(c);
  std::string shape_given =
      c.sample_shape.empty() ? "of shape " + shape_str(shape) : "of --sample-shape " + shape_str(c.sample_shape);
  if (c.model.kind == ModelKind::kGpt) shape_given = "of --seq-len " + std::to_string(shape[0]) + " tokens";
  CULPRIT_RETURN_IF_ERROR(
      check_fits_memory("synthetic data (--samples " + std::to_string(c.samples) + " " + shape_given + ")", data));
  if (c.model.kind == ModelKind::kTorchScript || c.model.kind == ModelKind::kPython) return Status::OK();
  const double params = builtin_parameters(c, shape, synthetic_classes(c));
  double bytes = data + state_bytes(c, params, world);
  if (c.model.kind == ModelKind::kGpt) bytes += gpt_activation_bytes(c, product(shape), synthetic_classes(c));
  std::string dims;
  if (c.model.kind == ModelKind::kMlp) dims = ", --hidden " + std::to_string(c.hidden);
  if (c.model.kind == ModelKind::kGpt)
    dims = ", " + std::to_string(c.gpt.layers) + " x " + std::to_string(c.gpt.width) + ", attention over --seq-len " +
           count_text(product(shape)) + " tokens";
  return check_fits_memory("model " + c.model.text() + " (about " + count_text(params) + " parameters" + dims +
                               ") with its training state and data",
                           bytes);
}

Status check_model_size(const TrainConfig& c, const std::vector<std::int64_t>& x_shape, std::int64_t out,
                        int world) {
  if (c.model.kind == ModelKind::kTorchScript || c.model.kind == ModelKind::kPython) return Status::OK();
  const double params = builtin_parameters(c, x_shape, static_cast<double>(out));
  double bytes = state_bytes(c, params, world);
  if (c.model.kind == ModelKind::kGpt) bytes += gpt_activation_bytes(c, product(x_shape), static_cast<double>(out));
  return check_fits_memory("model " + c.model.text() + " for data " + c.data.text() + " (about " +
                               count_text(params) + " parameters, " + std::to_string(out) +
                               " outputs) with its training state",
                           bytes);
}

Status check_order_size(const TrainConfig& c, std::int64_t n) {
  if (c.shuffle != Shuffle::kRandperm) return Status::OK();
  return check_fits_memory("the sample order of " + std::to_string(n) +
                               " samples (--shuffle randperm keeps two epochs' orders, 8 bytes a sample each; "
                               "--shuffle feistel needs none)",
                           16.0 * static_cast<double>(n));
}

}  // namespace culprit::harness
