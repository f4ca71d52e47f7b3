// The reduction tree left with each slice's owner (a reduce-scatter), for --shard-params
// (docs/determinism.md, "Sharded gradients"): the same root as tree_allreduce, bit for bit, with no
// rank ever holding more than its slice of it.
//
// tree_allreduce needs every rank's local blocks whole (each a sum over the rank's contiguous
// leaves, all P values): they cannot shrink with W. Here micro-shard k is computed by rank k mod W
// instead, in round k / W, so the leaves of a round are consecutive in the tree's leaf order. Each
// leaf is sent piece by piece (a bucket of the backward pass at a time) straight to the owners of
// its values; owner c pushes the leaves of [cuts[c], cuts[c + 1]), in leaf order, onto a stack of
// partial sums and adds two entries as soon as they are siblings in the global tree (the grouping
// TreeAccumulator makes). Every node of the tree is left + right of the same two children as in
// tree_allreduce, so the root is the same bits; the owner holds at most log2(M) + 1 slices of it
// (log2(M/W) + 1 with W a power of two dividing M: a round's leaves are summed where they arrive).
//
// A rank without a leaf in a round (W does not divide M) still makes the round's collectives, with
// nothing to send. Pieces must be posted in the same order on every rank.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/mpi_util.h"
#include "culprit/tree_reduce.h"

namespace culprit {

// Rounds of a step: ceil(M / W). Leaf (micro-shard) of `rank` in round j: j * W + rank, if < M.
int scatter_rounds(int world, int micro_shards);
inline int scatter_leaf(int rank, int world, int round) { return round * world + rank; }

class ScatterReduce {
 public:
  // cuts: world + 1 ascending offsets, cuts[0] = 0, cuts[world] = n: rank c owns [cuts[c],
  // cuts[c + 1]). Collective (a communicator of its own).
  ScatterReduce(const Comm& comm, int micro_shards, std::vector<std::size_t> cuts);
  ~ScatterReduce();
  ScatterReduce(const ScatterReduce&) = delete;
  ScatterReduce& operator=(const ScatterReduce&) = delete;

  // check: the messages' fingerprints (as tree_allreduce's CommCheck, phase 1; no phase 2), or null.
  void begin_step(CommCheck* check);
  void begin_round(int round);
  // Collective: this rank's leaf values [a, b) are final (leaf: the leaf's first value; null: no
  // leaf this round). Each owner gets its part. `fault`: a faulty link corrupts element
  // fault->offset of the message that holds it, after the sender fingerprinted it. Completes the
  // oldest pieces first so that at most `window` stay in flight.
  void post(std::size_t a, std::size_t b, const float* leaf, const SendFault* fault = nullptr);
  void end_round();  // every piece of the round in and added
  void end_step();   // the check's fingerprints folded
  // After end_step: the root over this rank's slice [cuts[rank], cuts[rank + 1]).
  const float* slice() const;
  std::size_t lo() const { return cuts_[static_cast<std::size_t>(comm_.rank)]; }
  std::size_t hi() const { return cuts_[static_cast<std::size_t>(comm_.rank) + 1]; }
  // Called when the leaf's [a, b) has left (its piece completed): the caller may drop its pages.
  void set_on_sent(std::function<void(std::size_t, std::size_t)> f) { on_sent_ = std::move(f); }
  void set_window(std::size_t pieces) { window_ = pieces < 1 ? 1 : pieces; }
  // The most values a piece spans (0: 2^26 / W); a test makes it small to cut ranges into pieces.
  void set_piece_limit(std::size_t values) { piece_most_ = values; }
  std::size_t bytes_sent() const { return bytes_sent_; }  // this step's, for the benchmark
  // The partial sums' memory (slots of this rank's slice, kept from step to step): at most
  // log2(M/W) + 1 slices when W is a power of two dividing M, log2(M) + 1 in general.
  std::size_t partial_bytes() const;

 private:
  struct Flight;
  struct Op {  // locations: a slot s >= 0, or ~r, the round's leaf of rank r as received
    int dst = 0;
    int src = 0;
    bool copy = false;  // dst = src; else dst += src
  };
  void complete_oldest();
  void apply(Flight& f);
  bool has_leaf(int rank) const { return round_ * comm_.size + rank < M_; }

  Comm comm_;  // a duplicate
  int M_;
  std::vector<std::size_t> cuts_;
  int round_ = 0;
  std::vector<Op> ops_;                      // the round's program (applied to every piece)
  std::vector<std::vector<float>> slots_;    // partial sums over the slice
  std::vector<std::pair<TreeNode, int>> stack_;  // (node, slot), in leaf order
  std::vector<int> free_;
  std::vector<std::unique_ptr<Flight>> flights_;  // in posting order
  std::size_t window_ = 2;
  std::size_t piece_most_ = 0;
  CommCheck* check_ = nullptr;
  std::vector<std::vector<Fingerprint>> sent_, received_;  // per peer: each piece's
  std::function<void(std::size_t, std::size_t)> on_sent_;
  std::size_t bytes_sent_ = 0;
};

}  // namespace culprit
