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
#pragma once
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "culprit/harness.h"
#include "culprit/mpi_util.h"
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

 private:
  void gradient_final(std::size_t i);  // the hook: parameter i's gradient is final

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
};

}  // namespace culprit::harness
