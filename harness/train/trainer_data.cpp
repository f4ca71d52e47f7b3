// The trainer's samples (docs/determinism.md, "1. Data order"; docs/data.md): the epoch's order, the
// samples of a micro-shard, and the read-ahead of the next step's. Part of the Trainer (trainer.h).
#include <torch/torch.h>

#include <algorithm>

#include "data/order.h"
#include "train/trainer.h"

namespace culprit::harness {

const at::Tensor& Trainer::epoch_order(std::int64_t epoch) {
  for (int i = 0; i < 2; ++i)
    if (orders_.epoch[i] == epoch) return orders_.order[i];
  const int slot = orders_.epoch[0] < orders_.epoch[1] ? 0 : 1;  // the older one goes
  auto gen = at::detail::createCPUGenerator(cfg_.seed + static_cast<std::uint64_t>(epoch));
  orders_.order[slot] = torch::randperm(data_.n, gen, torch::TensorOptions().dtype(torch::kLong));
  orders_.epoch[slot] = epoch;
  if (cfg_.detect.invariants) {
    // Each sample once per epoch starts with a permutation.
    std::vector<char> seen(static_cast<std::size_t>(data_.n), 0);
    const std::int64_t* o = orders_.order[slot].data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < data_.n; ++i) {
      if (o[i] < 0 || o[i] >= data_.n || seen[o[i]]) {
        step_.facts.violated("the sample order of epoch " + std::to_string(epoch) + " is not a permutation");
        break;
      }
      seen[o[i]] = 1;
    }
  }
  return orders_.order[slot];
}

at::Tensor Trainer::shard_indices(std::int64_t s, int k) {
  const std::int64_t B = cfg_.global_batch, M = cfg_.micro_shards;
  const std::int64_t steps_per_epoch = data_.n / B;
  const std::int64_t epoch = (s - 1) / steps_per_epoch;
  const std::int64_t first = ((s - 1) % steps_per_epoch) * B + k * (B / M);
  if (cfg_.shuffle == Shuffle::kRandperm) return epoch_order(epoch).narrow(0, first, B / M);
  // Feistel: each position's sample in O(1). Each sample once per epoch: the order's inverse takes
  // every sample drawn back to its position (two positions drawing one sample could not both be).
  const FeistelOrder order(cfg_.seed, epoch, data_.n);
  at::Tensor idx = torch::empty({B / M}, torch::kLong);
  auto* p = idx.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < B / M; ++i) {
    p[i] = order.sample_at(first + i);
    if (cfg_.detect.invariants && (p[i] < 0 || p[i] >= data_.n || order.position_of(p[i]) != first + i))
      step_.facts.violated("the sample order of epoch " + std::to_string(epoch) + " is not a permutation");
  }
  return idx;
}

namespace {
// Sample tensors of `count` rows of `shape` over bytes a loader read (kept alive by the tensor).
at::Tensor rows(std::shared_ptr<const ShardSamples> keep, const std::vector<unsigned char>& bytes, std::int64_t count,
                const std::vector<std::int64_t>& shape, DType dtype) {
  std::vector<std::int64_t> sizes{count};
  sizes.insert(sizes.end(), shape.begin(), shape.end());
  return torch::from_blob(const_cast<unsigned char*>(bytes.data()), sizes, [keep](void*) {},
                          torch::TensorOptions().dtype(to_scalar(dtype)));
}
}  // namespace

std::pair<at::Tensor, at::Tensor> Trainer::load_samples(std::int64_t s, int k, const at::Tensor& idx) {
  const at::Tensor c = idx.contiguous();
  auto got = loader_->fetch(s, k, c.data_ptr<std::int64_t>(), static_cast<std::size_t>(c.numel()));
  if (!got->status.ok()) {
    // A read the checks refused (a data file changed under the run: a token past the vocabulary,
    // a label out of range, a NaN) never reaches the model: an embedding would throw on the token
    // (the process aborted) and a NaN would look like the model's instability. The micro-shard
    // computes on zeros, a valid token, label and value for every source, and the job ends after
    // this step on every rank with the data's error (Trainer::run agrees on it before any
    // detector's verdict; no checkpoint follows).
    if (data_status_.ok()) data_status_ = got->status;
    std::vector<std::int64_t> xs{c.numel()}, ys{c.numel()};
    xs.insert(xs.end(), data_.x_shape.begin(), data_.x_shape.end());
    ys.insert(ys.end(), data_.y_shape.begin(), data_.y_shape.end());
    return {torch::zeros(xs, torch::TensorOptions().dtype(to_scalar(data_.x_dtype))),
            torch::zeros(ys, torch::TensorOptions().dtype(to_scalar(data_.y_dtype)))};
  }
  // The step's own copies: a data fault corrupts its batch in place, never the loader's.
  return {rows(got, got->x, c.numel(), data_.x_shape, data_.x_dtype).clone(),
          rows(got, got->y, c.numel(), data_.y_shape, data_.y_dtype).clone()};
}

std::vector<Fingerprint> Trainer::source_sample_fps(const std::vector<std::int64_t>& idx, Status* st) {
  const auto got = loader_->read_alone(idx);
  *st = got->status;
  std::vector<Fingerprint> out;
  const std::size_t each = data_.x_bytes();
  for (std::size_t i = 0; st->ok() && i < idx.size(); ++i) out.push_back(fingerprint_bytes(got->x.data() + i * each, each));
  return out;
}

std::pair<at::Tensor, at::Tensor> Trainer::first_samples(std::int64_t n) {
  const at::Tensor idx = torch::arange(std::min(n, data_.n), torch::kLong);
  return load_samples(0, 0, idx);
}

void Trainer::read_ahead(std::int64_t s) {
  if (s > cfg_.steps) return;
  const ShardRange mine = shard_range(dp().rank, dp().size, cfg_.micro_shards);
  // --shard-params computes micro-shards rank, rank + W, ... (compute_scattered_shards).
  const int first = scatters() ? comm_.rank : mine.lo, end = scatters() ? cfg_.micro_shards : mine.hi;
  const int stride = scatters() ? comm_.size : 1;
  for (int k = first; k < end; k += stride) {
    const at::Tensor idx = shard_indices(s, k).contiguous();
    const auto* p = idx.data_ptr<std::int64_t>();
    loader_->prefetch(s, k, std::vector<std::int64_t>(p, p + idx.numel()));
  }
}

}  // namespace culprit::harness
