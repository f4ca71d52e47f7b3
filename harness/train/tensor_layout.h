// The trainer's tensor-parallel layout (--tp-chunks, --tensor-parallel T): the ranks form groups of
// T that share each micro-shard (world rank = group x T + tp), and the ranks with the same tp form a
// data-parallel communicator of D = world / T ranks, over which micro-shards are assigned and the
// tree reduction runs as it runs over the world without tensor parallelism. After a micro-shard's
// backward pass, each rank's gradient holds its own chunks of the split parameters (the model's
// TensorSplit list) and the group's every other value; assemble() copies every chunk in from the
// rank that computed it, so all T ranks hold the micro-shard's whole gradient, bit for bit the one
// T = 1 computes. Private to the harness's train/ folder.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "culprit/model.h"
#include "culprit/mpi_util.h"
#include "culprit/tree_reduce.h"
#include "model/flat_params.h"

namespace culprit::harness {

class TensorLayout {
 public:
  // Collective over world; world.size must be a multiple of T.
  TensorLayout(const Comm& world, int T);
  ~TensorLayout();
  TensorLayout(const TensorLayout&) = delete;
  TensorLayout& operator=(const TensorLayout&) = delete;

  const Comm& group() const { return tp_; }  // this rank's T ranks (rank: its tp coordinate)
  const Comm& data() const { return dp_; }   // the D ranks with this rank's tp coordinate
  int size() const { return tp_.size; }
  // The world rank of data-parallel rank g with tp coordinate t (-1: this rank's).
  int world_rank(int g, int t = -1) const { return g * tp_.size + (t < 0 ? tp_.rank : t); }

  // The flat gradient's values of each chunk: runs of (offset, length) in the flat buffer.
  void set_splits(const FlatParams& flat, const std::vector<TensorSplit>& splits, int chunks);
  // Collective in the group: every chunk's values copied in from the rank that computed them.
  void assemble(float* leaf);
  // The tree reduction's comm check over the data-parallel ranks, widened to the world's ranks
  // (the vote compares every rank's): a pair of ranks in different data-parallel communicators
  // exchanged nothing (0: comm_mismatches skips a chunk that never came).
  void widen(CommCheck* check, int world) const;

 private:
  Comm tp_, dp_;
  int chunks_ = 0;
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> runs_;  // [chunk]
  std::int64_t per_chunk_ = 0;  // values in each chunk's runs (the same for every chunk)
  std::vector<float> send_, recv_;
};

}  // namespace culprit::harness
