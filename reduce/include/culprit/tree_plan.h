// The host half of the reduction tree over NCCL (docs/cuda.md, "Deterministic reduction over NCCL
// (design)"): what tree_allreduce (reduce/src/tree_reduce.cpp) does, written down as data that a
// device path follows: which block slices this rank sends to whom, where every peer's slices land,
// and the order in which the chunk owner adds them. The buffer layouts are tree_allreduce's own
// (its MPI_Alltoallv's), so the messages and their fingerprints are the same bytes as on the CPU.
// Pure host code: no CUDA, no MPI calls (reduce/tests/test_tree_plan.cpp runs on any machine).
#pragma once
#include <cstddef>
#include <vector>

#include "culprit/tree_reduce.h"

namespace culprit {

struct TreePlan {
  int rank = 0;
  int world = 1;
  int micro_shards = 1;
  std::size_t n = 0;
  std::vector<TreeNode> blocks;  // this rank's canonical blocks, in tree order

  // Phase 1 (tree_allreduce's MPI_Alltoallv), counts and offsets in floats. The packed send buffer
  // holds, for each chunk c, every block's slice c in block order; `direct`: one block, whose chunks
  // are already in place, so the block itself is the send buffer (W a power of two dividing M).
  bool direct = false;
  std::vector<std::size_t> send_count, send_displ;  // [c]: to chunk owner c
  std::vector<std::size_t> recv_count, recv_displ;  // [r]: rank r's blocks' slices of this chunk
  std::size_t recv_total = 0;

  // This rank's chunk: [chunk_off, chunk_off + chunk_len) of the n values (chunk_offset()).
  std::size_t chunk_off = 0;
  std::size_t chunk_len = 0;

  // The combine, as a postfix program over the receive buffer's slots (slot s: chunk_len floats at
  // s * chunk_len; every rank's nodes in rank order, each rank's in tree order): s >= 0 pushes slot
  // s; kAdd pops b (the top) and a (below it) and pushes a + b. These are exactly the adds, with
  // the same operands in the same order, that tree_allreduce's combine() makes.
  static constexpr int kAdd = -1;
  std::vector<int> program;
  std::vector<TreeNode> slots;  // slot s's node of the global tree
  int max_depth = 0;            // the deepest the program's stack gets (at most log2(M) + 1)
};

// The plan of `rank` among `world` ranks reducing n values of micro_shards leaves (a power of two,
// world <= micro_shards: tree_allreduce's domain).
TreePlan plan_tree_allreduce(int rank, int world, int micro_shards, std::size_t n);

}  // namespace culprit
