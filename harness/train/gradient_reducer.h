// The reduction overlapped with the last local micro-shard's backward pass (docs/determinism.md,
// "Overlapping the reduction with the backward pass"; the MPI side: culprit/tree_overlap.h). As
// c10d's Reducer, one class owns the autograd hooks and their buckets; the Trainer asks it whether
// a micro-shard overlaps, arms it around that backward pass, and finishes the reduction it started.
//
// A hook after every parameter's gradient accumulator copies the parameter's final gradient into
// the leaf (as copy_grad does after the backward pass) and, once a bucket's parameters are all in,
// applies the leaf faults of that range and hands the bucket to the reduction. A hook after the
// accumulator, not on the gradient: a stale-gradient fault keeps a gradient that the new one is
// added to, and the leaf must hold the sum. The hooks do nothing unless armed: the spot check's and
// setup's backward passes, and every micro-shard but a rank's last, take the usual path.
//
// --shard-params (install_scatter): every micro-shard's backward pass is armed, and each bucket goes
// to its owners at once (culprit/scatter_reduce.h) instead of into a local tree. The leaf is paged
// memory whose pages go back to the kernel once their bucket has left, and the hook drops autograd's
// gradient after copying it, so no rank ever holds a whole gradient. The shard row's fingerprints
// are taken bucket by bucket as the buckets leave (the flat leaf's 4 KiB chunks: a page each).
#pragma once
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/scatter_reduce.h"
#include "culprit/tree_overlap.h"
#include "culprit/tree_reduce.h"
#include "faults/fault_plan.h"
#include "model/flat_params.h"

namespace culprit::harness {

// Parameter i's gradient into the leaf (zeros when it has none); false: a value is not finite.
bool copy_grad(const FlatParams& flat, std::size_t i, float* leaf);

class GradientReducer {
 public:
  // flat and faults must outlive it. Inert until install().
  GradientReducer(const TrainConfig& cfg, const Comm& comm, const FlatParams& flat, const FaultPlan& faults)
      : cfg_(cfg), comm_(comm), flat_(flat), faults_(faults) {}
  ~GradientReducer();  // removes the hooks
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Collective: the buckets and the hooks when the run overlaps (training with --bucket-mb, more
  // than one bucket, on the host: a GPU's gradients would be copied in the hook, on the device's
  // autograd thread; docs/cuda.md). Replays never call it: they reduce after the backward pass.
  void install(bool on_gpu);
  // Micro-shard k's backward pass overlaps the reduction (the rank's last, in training, attempt 0).
  bool overlaps(const FireContext& c, int k) const;
  // Before that backward pass: arms the hooks; the reduction of acc's leaves into `reduced` then
  // starts bucket by bucket (check: the reduction's message fingerprints).
  void begin(const FireContext& c, int k, float* leaf, TreeAccumulator* acc, float* reduced, CommCheck* check);
  // After it: the rest of the leaf, every bucket launched; false: a value was not finite.
  bool end();
  // A reduction begun and not finished.
  bool in_flight() const { return reduce_ != nullptr; }
  // Waits for it (nothing when none is in flight): no collective is left pending.
  void finish();

  // ---- --shard-params: the reduce-scatter (training) ----
  // Collective: the buckets, hooks and the reduce-scatter over `cuts` (world + 1 offsets over the
  // P + 1 leaf values; rank c owns [cuts[c], cuts[c + 1])). From here on every training micro-shard
  // overlaps (overlaps()), and begin() ignores acc and reduced.
  void install_scatter(const std::vector<std::size_t>& cuts);
  bool scatters() const { return scatter_ != nullptr; }
  float* leaf() { return leaf_pages_.data_ptr<float>(); }  // the paged leaf (P + 1 values)
  // The step: begin_step, then per round begin_round, a micro-shard's armed backward pass or
  // phantom posts (a rank without one), end_round; end_step. hash: the shard rows' fingerprints.
  void begin_step(CommCheck* check, bool hash);
  void begin_round(int round) { scatter_->begin_round(round); }
  void end_round() { scatter_->end_round(); }
  void end_step() { scatter_->end_step(); }
  // A rank without a leaf this round: the piece the others post (the gatherer's log replays it).
  void phantom_post(std::size_t a, std::size_t b) { scatter_->post(a, b, nullptr); }
  // Each piece as it is posted, for the gatherer's log (phantom rounds repeat them in order).
  void set_on_post(std::function<void(std::size_t, std::size_t)> f) { on_post_ = std::move(f); }
  const float* slice() const { return scatter_->slice(); }
  // The last micro-shard's leaf as it left: fingerprint_bytes of its P gradient values, and each
  // parameter's (with begin_step's hash).
  Fingerprint leaf_fp() const;
  const std::vector<Fingerprint>& leaf_param_fps() const { return param_fps_; }
  float leaf_loss() const { return loss_; }
  // What the gradient's reduction holds now: the leaf's resident pages (as the kernel counts them)
  // and the partial sums.
  std::uint64_t resident_bytes() const;

 private:
  void gradient_final(std::size_t i);  // the hook: parameter i's gradient is final
  void add_hooks(std::vector<Bucket> buckets);  // the buckets and a hook per parameter
  void launch_scatter(std::size_t b);  // bucket b of the leaf to its owners
  void drop_leaf(std::size_t a, std::size_t b);  // the leaf's pages wholly inside [a, b) (sent, hashed)

  const TrainConfig& cfg_;
  const Comm& comm_;
  const FlatParams& flat_;
  const FaultPlan& faults_;
  std::unique_ptr<OverlapChannel> channel_;  // null: no overlap (replay, --bucket-mb 0, one bucket, a GPU)
  std::vector<Bucket> buckets_;              // in launch order
  std::vector<std::size_t> bucket_of_;       // per parameter
  std::vector<std::size_t> size_of_;         // per bucket: its parameters
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
  // The step in progress: the last micro-shard's backward pass (armed), then its reduction.
  std::unique_ptr<OverlappedReduce> reduce_;
  bool armed_ = false;
  FireContext fire_;
  int shard_ = -1;
  float* leaf_ = nullptr;
  bool finite_ = true;
  std::vector<bool> reported_;         // per parameter
  std::vector<std::size_t> pending_;   // per bucket: parameters not final yet
  SendFault send_;
  // --shard-params
  std::unique_ptr<ScatterReduce> scatter_;
  at::Tensor leaf_pages_;
  const SendFault* send_fault_ = nullptr;
  std::vector<bool> final_;            // per bucket, this micro-shard
  std::size_t next_ = 0;               // the next bucket to post
  bool hash_ = false;
  std::vector<std::uint64_t> chunk_hashes_;  // the leaf's 4 KiB chunks' (of its P gradient values)
  std::vector<Fingerprint> param_fps_;
  std::size_t hashed_lo_ = 0;           // chunks from here on are hashed
  float loss_ = 0;
  std::function<void(std::size_t, std::size_t)> on_post_;
};

}  // namespace culprit::harness
