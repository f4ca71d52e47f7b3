// The gradient reducer (gradient_reducer.h).
#include "train/gradient_reducer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "culprit/finite.h"
#include "culprit/system.h"
#include "optim/param_gatherer.h"

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
  add_hooks(std::move(buckets));
  channel_ = std::make_unique<OverlapChannel>(comm_);  // collective: every rank took the same path here
}

void GradientReducer::add_hooks(std::vector<Bucket> buckets) {
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
}

void GradientReducer::install_scatter(const std::vector<std::size_t>& cuts) {
  // The buckets bound what is in flight, so the leaf's resident part: --bucket-mb's, or 25 MiB
  // (c10d's default) where the run asked for none.
  const double mb = cfg_.bucket_mb > 0 ? cfg_.bucket_mb : 25.0;
  const auto cap = static_cast<std::size_t>(mb * (1 << 20) / sizeof(float));
  add_hooks(make_buckets(flat_.offsets, static_cast<std::size_t>(flat_.size + 1), cap));
  leaf_pages_ = paged_flat_buffer(flat_.size + 1);
  scatter_ = std::make_unique<ScatterReduce>(comm_, cfg_.micro_shards, cuts);  // collective
  scatter_->set_on_sent([this](std::size_t a, std::size_t b) { drop_leaf(a, b); });
}

void GradientReducer::begin_step(CommCheck* check, bool hash) {
  hash_ = hash;
  const auto P = static_cast<std::size_t>(flat_.size);
  chunk_hashes_.assign((P + kNormChunk - 1) / kNormChunk, 0);
  scatter_->begin_step(check);
}

// The leaf's pages from the first whole chunk of [a, b) to the one holding b: the piece has left,
// the one above it left before, and every chunk starting in there was hashed when the piece was
// posted (launch_scatter).
void GradientReducer::drop_leaf(std::size_t a, std::size_t b) {
  static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) / sizeof(float);
  const std::size_t p0 = (a + page - 1) / page, p1 = (b + page - 1) / page;
  if (p0 >= p1) return;
  ::madvise(leaf() + p0 * page, (p1 - p0) * page * sizeof(float), MADV_DONTNEED);
}

void GradientReducer::launch_scatter(std::size_t b) {
  const std::size_t lo = buckets_[b].lo, hi = buckets_[b].hi;
  finite_ = faults_.on_leaf(fire_, shard_, leaf_, lo, hi) && finite_;
  if (hash_) {
    // The leaf above lo is final: the chunks wholly in it that are not hashed yet.
    const auto P = static_cast<std::size_t>(flat_.size);
    const std::size_t from = (lo + kNormChunk - 1) / kNormChunk * kNormChunk;
    for (std::size_t s = from; s < hashed_lo_; s += kNormChunk)
      chunk_hashes_[s / kNormChunk] = chunk_hash(leaf_ + s, std::min(kNormChunk, P - s) * sizeof(float));
    hashed_lo_ = std::min(hashed_lo_, from);
    for (std::size_t i = 0; i < flat_.params.size(); ++i)
      if (bucket_of_[i] == b)
        param_fps_[i] = fingerprint_bytes(leaf_ + flat_.offsets[i], static_cast<std::size_t>(flat_.sizes[i]) * sizeof(float));
  }
  if (on_post_) on_post_(lo, hi);
  scatter_->post(lo, hi, leaf_, send_fault_);
}

std::uint64_t GradientReducer::resident_bytes() const {
  if (!scatter_) return 0;
  return culprit::resident_bytes(leaf_pages_.data_ptr(), leaf_pages_.nbytes()) + scatter_->partial_bytes();
}

Fingerprint GradientReducer::leaf_fp() const { return combine_chunk_hashes(chunk_hashes_.data(), chunk_hashes_.size()); }

bool GradientReducer::overlaps(const FireContext& c, int k) const {
  if (scatter_) return c.mode == StepMode::kTrain && c.attempt == 0;  // every micro-shard
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
  if (scatter_) {
    // A faulty link corrupts one message a step, as in tree_allreduce (its one block message): the
    // rank's first leaf's.
    send_fault_ = k == c.first_shard ? faults_.on_send(c, &send_) : nullptr;
    final_.assign(buckets_.size(), false);
    next_ = 0;
    loss_ = leaf[flat_.size];
    hashed_lo_ = chunk_hashes_.size() * kNormChunk;
    param_fps_.assign(flat_.params.size(), 0);
    armed_ = true;
    return;
  }
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
  if (scatter_) {
    // The gradient is in the leaf: autograd's copy goes (a stale-gradient fault keeps it for the
    // rank's next micro-shard to add to).
    if (!faults_.keeps_grad(fire_, shard_ + comm_.size, i)) flat_.params[i].tensor.mutable_grad().reset();
    if (--pending_[b] > 0) return;
    final_[b] = true;
    while (next_ < buckets_.size() && final_[next_]) launch_scatter(next_++);
    return;
  }
  if (--pending_[b] > 0) return reduce_->progress();
  finite_ = faults_.on_leaf(fire_, shard_, leaf_, buckets_[b].lo, buckets_[b].hi) && finite_;
  reduce_->ready(b);
}

bool GradientReducer::end() {
  armed_ = false;
  // Parameters the backward pass did not reach (no gradient: zeros), and so the last buckets.
  for (std::size_t i = 0; i < flat_.params.size(); ++i) gradient_final(i);
  if (scatter_)  // a bucket without parameters (none in the model)
    while (next_ < buckets_.size()) launch_scatter(next_++);
  return finite_;
}

void GradientReducer::finish() {
  if (reduce_) reduce_->finish();
  reduce_.reset();
}

}  // namespace culprit::harness
