// The --shard-params step (docs/determinism.md, "Sharded parameters"): the micro-shards round by
// round, each leaf's buckets to their owners during its backward pass, and what every rank learns of
// the reduced gradient it holds a slice of. Part of the Trainer (trainer.h); the step that calls it:
// trainer.cpp.
#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "culprit/scatter_reduce.h"
#include "culprit/watchdog.h"
#include "train/trainer.h"

namespace culprit::harness {

// --shard-params: micro-shard k on rank k mod W, in round k / W; each bucket of each leaf goes to
// its owners during the backward pass (GradientReducer, culprit/scatter_reduce.h). A rank without
// a micro-shard in the last round repeats its last one's collectives (ParamGatherer::phantom).
void Trainer::compute_scattered_shards() {
  const int W = comm_.size, M = cfg_.micro_shards;
  const bool rows = cfg_.tracing() || step_.fire.mode == StepMode::kReplay;
  if (step_.fire.mode == StepMode::kTrain) read_ahead(step_.fire.step + 1);
  step_.comm.enabled = cfg_.detect.comm_check;
  reducer_->begin_step(&step_.comm, rows);
  gather_->begin_step();
  for (int j = 0; j < scatter_rounds(W, M); ++j) {
    reducer_->begin_round(j);
    const int k = scatter_leaf(comm_.rank, W, j);
    if (k < M) {
      gather_->begin_shard();
      compute_shard(step_.fire, k, reducer_->leaf());
      gather_->end_shard();
      if (rows) step_.shard_rows.push_back(shard_row(k, nullptr));
    } else {
      gather_->phantom();
    }
    reducer_->end_round();
  }
  gather_->end_step();
  reducer_->end_step();
}

// --shard-params: the rank's slice of the root into reduced(), and what every rank learns of the
// whole (optim/sliced_gradient.h). Each rank fingerprints tree_allreduce's chunk of it (chunk_fp),
// as an unsharded run does, so the bisection compares it with any replay.
void Trainer::reduce_scattered() {
  const int W = comm_.size;
  const auto P = static_cast<std::size_t>(flat_.size);
  const ShardLayout& layout = zero_->layout();
  const auto lo = static_cast<std::size_t>(layout.lo(comm_.rank));
  const std::size_t hi = comm_.rank == W - 1 ? P + 1 : static_cast<std::size_t>(layout.hi(comm_.rank));
  std::memcpy(reduced() + lo, reducer_->slice(), (hi - lo) * sizeof(float));
  std::vector<std::pair<std::int64_t, std::int64_t>> report;
  for (int c = 0; c < W; ++c)
    report.emplace_back(static_cast<std::int64_t>(chunk_offset(P, W, c)), static_cast<std::int64_t>(chunk_offset(P, W, c + 1)));
  Stopwatch sw(&step_.facts.seconds);
  const bool fps = cfg_.tracing() || step_.fire.mode == StepMode::kReplay;
  sliced_ = sliced_gradient(comm_, layout, flat_.offsets, flat_.sizes, reduced(), flat_.size, fps,
                            cfg_.optim.clip_grad_norm > 0, report);
  step_.facts.comm = &step_.comm;
}

// --shard-params: each parameter's norm by the rank its first element is on (sliced_gradient
// fetched it whole there), summed with the others' zeros: exact, so every rank stacks the same
// values in state-dict order.
std::vector<at::Tensor> Trainer::sliced_norms(const std::function<at::Tensor(std::size_t)>& norm_of) {
  const ShardLayout& layout = zero_->layout();
  const std::size_t n = flat_.params.size();
  std::vector<float> values(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i)
    if (flat_.sizes[i] > 0 && layout.holds(comm_.rank, flat_.offsets[i])) values[i] = norm_of(i).item<float>();
  if (comm_.size > 1)
    CULPRIT_COLLECTIVE(comm_, "the gradient's per-parameter norms (--clip-grad-norm, --shard-params)",
                       MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_.comm,
                                      &_culprit_req));
  std::vector<at::Tensor> norms;
  for (std::size_t i = 0; i < n; ++i)
    norms.push_back(flat_.sizes[i] > 0 ? torch::tensor(values[i], torch::kFloat32).reshape({}) : norm_of(i));
  return norms;
}

}  // namespace culprit::harness
