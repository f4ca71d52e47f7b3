// The gradient reducer (gradient_reducer.h).
#include "train/gradient_reducer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include "culprit/finite.h"

namespace culprit::harness {

bool copy_grad(const FlatParams& flat, std::size_t i, float* leaf) {
  const auto& g = flat.params[i].tensor.grad();
  float* dst = leaf + flat.offsets[i];
  if (!g.defined()) {
    std::fill(dst, dst + flat.sizes[i], 0.0f);
    return true;
  }
  auto gc = g.is_cuda() ? g.cpu() : g.contiguous();
  return copy_all_finite(gc.data_ptr<float>(), dst, static_cast<std::size_t>(flat.sizes[i]));
}

GradientReducer::~GradientReducer() {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
}

void GradientReducer::install(bool on_gpu) {
  const auto cap = static_cast<std::size_t>(cfg_.bucket_mb * (1 << 20) / sizeof(float));
  if (cfg_.bucket_mb <= 0 || on_gpu) return;
  std::vector<Bucket> buckets = make_buckets(flat_.offsets, static_cast<std::size_t>(flat_.size + 1), cap);
  if (buckets.size() < 2) return;  // one bucket has nothing to overlap
  buckets_ = std::move(buckets);
  size_of_.assign(buckets_.size(), 0);
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    const auto off = static_cast<std::size_t>(flat_.offsets[i]);
    std::size_t b = 0;
    while (!(buckets_[b].lo <= off && off < buckets_[b].hi)) ++b;
    bucket_of_.push_back(b);
    size_of_[b] += 1;
    const at::Tensor& t = flat_.params[i].tensor;
    if (!t.requires_grad()) continue;  // never final in a backward pass: end() copies it
    auto node = torch::autograd::impl::grad_accumulator(t);
    const auto key = node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          if (armed_) gradient_final(i);
          return outputs;
        }));
    hooks_.emplace_back(std::move(node), key);
  }
  channel_ = std::make_unique<OverlapChannel>(comm_);  // collective: every rank took the same path here
}

bool GradientReducer::overlaps(const FireContext& c, int k) const {
  return channel_ && c.mode == StepMode::kTrain && c.attempt == 0 &&
         k == shard_range(comm_.rank, comm_.size, cfg_.micro_shards).hi - 1;
}

void GradientReducer::begin(const FireContext& c, int k, float* leaf, TreeAccumulator* acc, float* reduced,
                            CommCheck* check) {
  fire_ = c;
  shard_ = k;
  leaf_ = leaf;
  finite_ = true;
  reported_.assign(flat_.params.size(), false);
  pending_ = size_of_;
  const SendFault* fault = faults_.on_send(c, &send_);
  reduce_ = std::make_unique<OverlappedReduce>(comm_, channel_.get(), cfg_.micro_shards, acc, k, reduced, buckets_,
                                               fault, check);
  armed_ = true;
}

void GradientReducer::gradient_final(std::size_t i) {
  if (reported_[i]) return;
  reported_[i] = true;
  finite_ = copy_grad(flat_, i, leaf_) && finite_;
  const std::size_t b = bucket_of_[i];
  if (--pending_[b] > 0) return reduce_->progress();
  finite_ = faults_.on_leaf(fire_, shard_, leaf_, buckets_[b].lo, buckets_[b].hi) && finite_;
  reduce_->ready(b);
}

bool GradientReducer::end() {
  armed_ = false;
  // Parameters the backward pass did not reach (no gradient: zeros), and so the last buckets.
  for (std::size_t i = 0; i < flat_.params.size(); ++i) gradient_final(i);
  return finite_;
}

void GradientReducer::finish() {
  if (reduce_) reduce_->finish();
  reduce_.reset();
}

}  // namespace culprit::harness
