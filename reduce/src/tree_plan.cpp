#include "culprit/tree_plan.h"

#include <algorithm>
#include <stdexcept>

namespace culprit {

namespace {
// tree_reduce.cpp's sibling rule (private there): b is a's right sibling in the global tree.
// reduce/tests/test_tree_plan.cpp checks every add of the program against the tree itself.
bool siblings(const TreeNode& a, const TreeNode& b) {
  return a.level == b.level && a.lo % (2 * a.size()) == 0 && b.lo == a.lo + a.size();
}
}  // namespace

TreePlan plan_tree_allreduce(int rank, int world, int micro_shards, std::size_t n) {
  if (world < 1 || world > micro_shards || rank < 0 || rank >= world || (micro_shards & (micro_shards - 1)) != 0)
    throw std::invalid_argument("plan_tree_allreduce: needs 0 <= rank < world <= micro_shards, a power of two");
  TreePlan p;
  p.rank = rank;
  p.world = world;
  p.micro_shards = micro_shards;
  p.n = n;
  p.blocks = canonical_blocks(shard_range(rank, world, micro_shards));
  p.direct = p.blocks.size() == 1;
  p.chunk_off = chunk_offset(n, world, rank);
  p.chunk_len = chunk_offset(n, world, rank + 1) - p.chunk_off;

  // Phase 1, as tree_allreduce's pack(): chunk by chunk, each chunk's slices of every block.
  const std::size_t nb = p.blocks.size();
  p.send_count.resize(world);
  p.send_displ.resize(world);
  for (int c = 0; c < world; ++c) {
    const std::size_t off = chunk_offset(n, world, c), len = chunk_offset(n, world, c + 1) - off;
    p.send_displ[c] = p.direct ? off : off * nb;
    p.send_count[c] = len * nb;
  }
  // What arrives here: every rank's nodes' slice of this chunk, rank by rank.
  p.recv_count.resize(world);
  p.recv_displ.resize(world);
  for (int r = 0; r < world; ++r) {
    const auto nodes = canonical_blocks(shard_range(r, world, micro_shards));
    p.recv_displ[r] = p.recv_total;
    p.recv_count[r] = p.chunk_len * nodes.size();
    p.recv_total += p.recv_count[r];
    p.slots.insert(p.slots.end(), nodes.begin(), nodes.end());
  }

  // The combine, as tree_allreduce's combine() does it: push each node; add while the top two are
  // siblings. Done here on nodes only, recording the operations.
  std::vector<TreeNode> stack;
  for (std::size_t s = 0; s < p.slots.size(); ++s) {
    stack.push_back(p.slots[s]);
    p.program.push_back(static_cast<int>(s));
    p.max_depth = std::max(p.max_depth, static_cast<int>(stack.size()));
    while (stack.size() >= 2 && siblings(stack[stack.size() - 2], stack.back())) {
      stack.pop_back();
      stack.back().level += 1;
      p.program.push_back(TreePlan::kAdd);
    }
  }
  if (stack.size() != 1) throw std::logic_error("plan_tree_allreduce: nodes did not combine to a root");
  return p;
}

}  // namespace culprit
