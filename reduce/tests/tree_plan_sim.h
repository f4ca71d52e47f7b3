// The exchange a TreePlan describes, simulated on the host for W ranks in one process: each rank's
// blocks (TreeAccumulator over tree_data.h's leaves), its packed send buffer, what chunk owner c
// receives. Shared by the plan test (reduce/tests/test_tree_plan.cpp) and the GPU test
// (reduce/tests/test_tree_nccl.cpp), which feeds the receive buffers to the device's combine.
#pragma once
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "culprit/tree_plan.h"
#include "culprit/tree_reduce.h"
#include "tree_data.h"

namespace culprit::testing {

// Rank r's canonical blocks of leaf(k, n), summed by the CPU's TreeAccumulator.
inline std::vector<std::vector<float>> rank_blocks(int r, int world, int micro_shards, std::size_t n) {
  TreeAccumulator acc(n);
  const auto range = shard_range(r, world, micro_shards);
  for (int k = range.lo; k < range.hi; ++k) {
    auto v = leaf(k, n);
    if (n) std::memcpy(acc.leaf_buffer(), v.data(), n * sizeof(float));
    acc.push(k);
  }
  std::vector<std::vector<float>> out;
  for (const auto& e : acc.blocks()) out.push_back(e.data);
  return out;
}

// The send buffer the plan describes (direct: the block itself).
inline std::vector<float> pack(const TreePlan& p, const std::vector<std::vector<float>>& blocks) {
  if (p.direct) return blocks[0];
  std::vector<float> out(p.n * blocks.size());
  for (int c = 0; c < p.world; ++c) {
    const std::size_t off = chunk_offset(p.n, p.world, c), len = chunk_offset(p.n, p.world, c + 1) - off;
    for (std::size_t b = 0; b < blocks.size(); ++b)
      std::copy(blocks[b].begin() + off, blocks[b].begin() + off + len, out.begin() + p.send_displ[c] + b * len);
  }
  return out;
}

// Chunk owner c's receive buffer: rank r's message to c at plans[c].recv_displ[r].
inline std::vector<float> receive(const std::vector<TreePlan>& plans, const std::vector<std::vector<float>>& sent, int c) {
  std::vector<float> recv(plans[c].recv_total, -1.0f);
  for (int r = 0; r < plans[c].world; ++r) {
    const std::size_t count = plans[r].send_count[c];
    if (count != plans[c].recv_count[r]) throw std::logic_error("receive: sender and receiver disagree on a count");
    const float* from = sent[r].data() + plans[r].send_displ[c];
    std::copy(from, from + count, recv.begin() + plans[c].recv_displ[r]);
  }
  return recv;
}

}  // namespace culprit::testing
