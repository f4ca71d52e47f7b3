// --shard-optimizer (ZeRO-1, as Megatron's DistributedOptimizer; docs/determinism.md, "Sharded
// optimizer state"): each rank keeps the optimizer state of one slice of the flat parameter buffer
// (shard_layout.h) and updates only that slice; the ranks then gather the parameters. Every rank
// still holds the whole reduced gradient, which the detectors, clipping and the trace read. This
// class owns the layout and everything that crosses ranks because of it: the parameter gather, the
// optimizer state's fingerprints and checkpoint facts, the trace's slice records. The optimizer's
// arithmetic stays OptimizerState's (culprit/optim_state.h); the Trainer keeps the step.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "culprit/checkpoint.h"
#include "culprit/fingerprint.h"
#include "culprit/mpi_util.h"
#include "culprit/optim_state.h"
#include "culprit/trace.h"
#include "model/flat_params.h"
#include "optim/shard_layout.h"

namespace culprit::harness {

class ShardedOptimizer {
 public:
  // flat must outlive it. sharded: --shard-optimizer (false: the state is whole on every rank, and
  // only slice_record serves, the replay engine's).
  ShardedOptimizer(const Comm& comm, const FlatParams& flat, bool sharded);
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  bool sharded() const { return sharded_; }
  const ShardLayout& layout() const { return layout_; }
  // This rank's part of every parameter that meets its slice: 1-D views into the flat buffer (the
  // slots of the OptimizerState a sharded rank builds).
  std::vector<OptimizerSlot> owned_slots() const;
  // The optimizer state the fingerprints and checkpoints read (the Trainer's; must outlive it).
  void attach(const OptimizerState* opt) { opt_ = opt; }

  // Collective: every rank's updated slice to every rank, in place in flat.flat.
  void gather_params() const;
  // Collective: per parameter, its primary optimizer state's fingerprint, as an unsharded run has it.
  std::vector<Fingerprint> optimizer_fps() const;
  // Flat elements [lo, hi) as a sharded rank records its slice (trace::StepRow::shard), from the
  // state this rank holds: its own slice when sharded, any range when not.
  trace::SliceRecord slice_record(std::int64_t lo, std::int64_t hi) const;

  // What a checkpoint of sharded state needs every rank to know.
  struct Facts {
    std::vector<std::int64_t> info;  // per parameter: 0 no state yet; AdamW's step count; 1 (SGD)
    std::map<std::string, std::vector<std::uint64_t>> hashes;  // per state tensor: every chunk's hash
    // This rank's slot tensors of each state, taken on the main thread: the I/O thread's copy only
    // reads their bytes (train/trainer_state.cpp).
    std::map<std::pair<std::size_t, std::string>, at::Tensor> held;
    // --shard-params: every parameter's fingerprint, composed (empty: the parameters are whole).
    std::vector<Fingerprint> params;
  };
  Facts gather_facts() const;  // collective
  // The optimizer part of a sharded checkpoint from gathered facts (runs on the I/O thread).
  void snapshot(const Facts& g, std::vector<ckpt::RawTensor>* out) const;
  // A slot's part of a stored optimizer tensor (read back whole from a checkpoint); undefined when
  // the tensor does not hold it.
  static at::Tensor slot_part(const ckpt::RawTensor& r, std::int64_t offset, std::int64_t numel);

 private:
  // This rank's chunk hashes of one kind of optimizer state (gather: every rank's, in chunk order).
  std::vector<std::uint64_t> state_chunk_hashes(const std::function<at::Tensor(const OptimizerSlot&)>& state_of,
                                                bool gather) const;

  const Comm& comm_;
  const FlatParams& flat_;
  bool sharded_;
  ShardLayout layout_;  // rank c owns flat elements [lo(c), hi(c))
  const OptimizerState* opt_ = nullptr;
};

}  // namespace culprit::harness
