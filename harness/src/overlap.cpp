// The reduction overlapped with the last local micro-shard's backward pass (docs/determinism.md,
// "Overlapping the reduction with the backward pass"; the MPI side: culprit/tree_overlap.h). Part of
// the Trainer (trainer.h).
//
// A hook after every parameter's gradient accumulator copies the parameter's final gradient into
// the leaf (as copy_grads does after the backward pass) and, once a bucket's parameters are all in,
// applies the leaf faults of that range and hands the bucket to the reduction. A hook after the
// accumulator, not on the gradient: a stale-gradient fault keeps a gradient that the new one is
// added to, and the leaf must hold the sum. The hooks do nothing unless armed: the spot check's and
// setup's backward passes, and every micro-shard but a rank's last, take the usual path.
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include "finite.h"
#include "trainer.h"

namespace culprit::harness {

Trainer::~Trainer() {
  for (auto& [node, key] : overlap_.hooks) node->del_post_hook(key);
}

void Trainer::setup_overlap() {
  const auto cap = static_cast<std::size_t>(cfg_.bucket_mb * (1 << 20) / sizeof(float));
  // A GPU's gradients would be copied to the host in the hook, on the device's autograd thread:
  // not done (docs/cuda.md). One bucket has nothing to overlap.
  if (cfg_.bucket_mb <= 0 || device_.is_cuda()) return;
  std::vector<Bucket> buckets = make_buckets(flat_.offsets, static_cast<std::size_t>(flat_.size + 1), cap);
  if (buckets.size() < 2) return;
  Overlap& o = overlap_;
  o.buckets = std::move(buckets);
  o.size_of.assign(o.buckets.size(), 0);
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    const auto off = static_cast<std::size_t>(flat_.offsets[i]);
    std::size_t b = 0;
    while (!(o.buckets[b].lo <= off && off < o.buckets[b].hi)) ++b;
    o.bucket_of.push_back(b);
    o.size_of[b] += 1;
    const at::Tensor& t = flat_.params[i].tensor;
    if (!t.requires_grad()) continue;  // never final in a backward pass: end_overlap copies it
    auto node = torch::autograd::impl::grad_accumulator(t);
    const auto key = node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          if (overlap_.armed) gradient_final(i);
          return outputs;
        }));
    o.hooks.emplace_back(std::move(node), key);
  }
  o.channel = std::make_unique<OverlapChannel>(comm_);  // collective: every rank took the same path here
}

bool Trainer::overlaps(const FireContext& c, int k) const {
  return overlap_.channel && c.mode == StepMode::kTrain && c.attempt == 0 &&
         k == shard_range(comm_.rank, comm_.size, cfg_.micro_shards).hi - 1;
}

void Trainer::begin_overlap(const FireContext& c, int k, float* leaf) {
  Overlap& o = overlap_;
  o.fire = c;
  o.shard = k;
  o.leaf = leaf;
  o.finite = true;
  o.reported.assign(flat_.params.size(), false);
  o.pending = o.size_of;
  const SendFault* fault = faults_.on_send(c, &o.send);
  step_.comm.enabled = cfg_.detect.comm_check;
  o.reduce = std::make_unique<OverlappedReduce>(comm_, o.channel.get(), cfg_.micro_shards, acc_.get(), k,
                                                reduced_.data(), o.buckets, fault, &step_.comm);
  o.armed = true;
}

bool Trainer::copy_grad(std::size_t i, float* leaf) const {
  const auto& g = flat_.params[i].tensor.grad();
  float* dst = leaf + flat_.offsets[i];
  if (!g.defined()) {
    std::fill(dst, dst + flat_.sizes[i], 0.0f);
    return true;
  }
  auto gc = g.is_cuda() ? g.cpu() : g.contiguous();
  return copy_all_finite(gc.data_ptr<float>(), dst, static_cast<std::size_t>(flat_.sizes[i]));
}

void Trainer::gradient_final(std::size_t i) {
  Overlap& o = overlap_;
  if (o.reported[i]) return;
  o.reported[i] = true;
  o.finite = copy_grad(i, o.leaf) && o.finite;
  const std::size_t b = o.bucket_of[i];
  if (--o.pending[b] > 0) return o.reduce->progress();
  o.finite = faults_.on_leaf(o.fire, o.shard, o.leaf, o.buckets[b].lo, o.buckets[b].hi) && o.finite;
  o.reduce->ready(b);
}

bool Trainer::end_overlap() {
  overlap_.armed = false;
  // Parameters the backward pass did not reach (no gradient: zeros), and so the last buckets.
  for (std::size_t i = 0; i < flat_.params.size(); ++i) gradient_final(i);
  return overlap_.finite;
}

}  // namespace culprit::harness
