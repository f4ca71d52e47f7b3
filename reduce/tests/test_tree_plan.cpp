// The host-side plan of the reduction over NCCL (culprit/tree_plan.h) against the CPU tree, without
// a GPU: the messages are tree_allreduce's (counts, places, bytes), every add of the combine is a
// node of the global tree, and running the plan on the host gives the tree's root bit for bit, for
// W = 1..8 ranks and M = 1, 2, 4, 8, 16 leaves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "culprit/tree_plan.h"
#include "culprit/tree_reduce.h"
#include "tree_data.h"
#include "tree_plan_sim.h"

using namespace culprit;
using culprit::testing::tree;

namespace {

const int kShards[] = {1, 2, 4, 8, 16};
const std::size_t kLengths[] = {0, 1, 3, 5, 8, 37, 1000, 4097};

// Evaluates plan.program over one chunk, element by element, as the device kernel does (a + b with
// the same operands), with the CPU's own add.
std::vector<float> run_program(const TreePlan& p, const std::vector<float>& recv) {
  std::vector<float> out(p.chunk_len);
  for (std::size_t i = 0; i < p.chunk_len; ++i) {
    std::vector<float> stack;
    for (int op : p.program) {
      if (op >= 0) {
        stack.push_back(recv[op * p.chunk_len + i]);
      } else {
        const float b = stack.back();
        stack.pop_back();
        tree_add(&stack.back(), &b, 1);
      }
    }
    out[i] = stack.at(0);
  }
  return out;
}

}  // namespace

TEST(TreePlan, HandWrittenExample) {
  // M = 8 over W = 3: ranks hold [0,2) [2,5) [5,8) = nodes (0,1) | (2,1) (4,0) | (5,0) (6,1).
  const TreePlan p = plan_tree_allreduce(1, 3, 8, 9);
  EXPECT_EQ(p.blocks, (std::vector<TreeNode>{{2, 1}, {4, 0}}));
  EXPECT_EQ(p.slots, (std::vector<TreeNode>{{0, 1}, {2, 1}, {4, 0}, {5, 0}, {6, 1}}));
  const int A = TreePlan::kAdd;
  // ((0,1)+(2,1)) + (((4,0)+(5,0)) + (6,1))
  EXPECT_EQ(p.program, (std::vector<int>{0, 1, A, 2, 3, A, 4, A, A}));
  EXPECT_EQ(p.max_depth, 3);
  EXPECT_FALSE(p.direct);
  // Chunks of 9 over 3 ranks: 3 each; two blocks: 6 floats to every owner.
  EXPECT_EQ(p.send_count, (std::vector<std::size_t>{6, 6, 6}));
  EXPECT_EQ(p.send_displ, (std::vector<std::size_t>{0, 6, 12}));
  EXPECT_EQ(p.recv_count, (std::vector<std::size_t>{3, 6, 6}));
  EXPECT_EQ(p.recv_displ, (std::vector<std::size_t>{0, 3, 9}));
  EXPECT_EQ(p.chunk_off, 3u);
  EXPECT_EQ(p.chunk_len, 3u);
}

TEST(TreePlan, EveryAddIsANodeOfTheGlobalTree) {
  // The program evaluated on nodes: each add must join left and right siblings into their parent,
  // and the last must give the root [0, M): the grouping is the CPU tree's, whatever the data.
  for (int m : kShards)
    for (int w = 1; w <= 8 && w <= m; ++w) {
      const TreePlan p = plan_tree_allreduce(0, w, m, 100);
      std::vector<TreeNode> stack;
      int depth = 0;
      for (int op : p.program) {
        if (op >= 0) {
          stack.push_back(p.slots.at(op));
        } else {
          ASSERT_GE(stack.size(), 2u);
          const TreeNode b = stack.back();
          stack.pop_back();
          TreeNode& a = stack.back();
          ASSERT_TRUE(a.level == b.level && a.lo % (2 * a.size()) == 0 && b.lo == a.lo + a.size())
              << "W=" << w << " M=" << m << ": (" << a.lo << "," << a.level << ") + (" << b.lo << "," << b.level << ")";
          a.level += 1;
        }
        depth = std::max<int>(depth, static_cast<int>(stack.size()));
      }
      ASSERT_EQ(stack.size(), 1u);
      EXPECT_EQ(stack[0], (TreeNode{0, __builtin_ctz(m)})) << "W=" << w << " M=" << m;
      EXPECT_EQ(depth, p.max_depth);
      int log2m = 0;
      while ((1 << log2m) < m) ++log2m;
      EXPECT_LE(p.max_depth, log2m + 1);
      // Every rank's plan has the same program (the slots are all ranks' nodes, in rank order).
      for (int r = 1; r < w; ++r) EXPECT_EQ(plan_tree_allreduce(r, w, m, 100).program, p.program);
    }
}

TEST(TreePlan, MessagesAreTreeAllreducesCountsAndBytes) {
  for (int m : kShards)
    for (int w = 1; w <= 8 && w <= m; ++w)
      for (std::size_t n : kLengths) {
        std::vector<TreePlan> plans;
        for (int r = 0; r < w; ++r) plans.push_back(plan_tree_allreduce(r, w, m, n));
        std::size_t covered = 0;
        for (int r = 0; r < w; ++r) {
          const TreePlan& p = plans[r];
          EXPECT_EQ(p.blocks, canonical_blocks(shard_range(r, w, m)));
          EXPECT_EQ(p.direct, p.blocks.size() == 1);
          EXPECT_EQ(p.chunk_off, covered);
          covered += p.chunk_len;
          std::size_t sent = 0;
          for (int c = 0; c < w; ++c) {
            // What r sends to c is what c expects from r.
            EXPECT_EQ(p.send_count[c], plans[c].recv_count[r]) << "W=" << w << " M=" << m << " n=" << n;
            if (c != r) sent += p.send_count[c];
          }
          // Both phases' bytes are the ones tree_allreduce counts for itself.
          const std::size_t phase2 = w > 1 ? p.chunk_len * (w - 1) : 0;
          EXPECT_EQ((sent + phase2) * sizeof(float), tree_allreduce_bytes_sent(r, w, m, n))
              << "rank " << r << " W=" << w << " M=" << m << " n=" << n;
          EXPECT_EQ(p.recv_total, p.chunk_len * p.slots.size());
        }
        EXPECT_EQ(covered, n);
      }
}

TEST(TreePlan, RunOnTheHostGivesTheTreeRootBitwise) {
  for (int m : kShards)
    for (int w = 1; w <= 8 && w <= m; ++w)
      for (std::size_t n : kLengths) {
        std::vector<TreePlan> plans;
        std::vector<std::vector<float>> sent;
        for (int r = 0; r < w; ++r) {
          plans.push_back(plan_tree_allreduce(r, w, m, n));
          sent.push_back(culprit::testing::pack(plans[r], culprit::testing::rank_blocks(r, w, m, n)));
        }
        std::vector<float> out(n, -1.0f);
        for (int c = 0; c < w; ++c) {
          const auto chunk = run_program(plans[c], culprit::testing::receive(plans, sent, c));
          std::copy(chunk.begin(), chunk.end(), out.begin() + plans[c].chunk_off);
        }
        const auto want = tree(0, m, n);
        EXPECT_TRUE(n == 0 || std::memcmp(out.data(), want.data(), n * sizeof(float)) == 0)
            << "W=" << w << " M=" << m << " n=" << n;
      }
}

TEST(TreePlan, NegativeControlAnotherGroupingDiffers) {
  // Guards the test above: the same received nodes added left to right give other bits.
  const std::size_t n = 37;
  std::vector<TreePlan> plans;
  std::vector<std::vector<float>> sent;
  for (int r = 0; r < 3; ++r) {
    plans.push_back(plan_tree_allreduce(r, 3, 8, n));
    sent.push_back(culprit::testing::pack(plans[r], culprit::testing::rank_blocks(r, 3, 8, n)));
  }
  TreePlan chain = plans[0];
  const int A = TreePlan::kAdd;
  chain.program = {0, 1, A, 2, A, 3, A, 4, A};
  const auto recv = culprit::testing::receive(plans, sent, 0);
  const auto good = run_program(plans[0], recv), bad = run_program(chain, recv);
  EXPECT_NE(std::memcmp(good.data(), bad.data(), good.size() * sizeof(float)), 0);
}

TEST(TreePlan, RejectsWhatTreeAllreduceDoesNotDo) {
  EXPECT_THROW(plan_tree_allreduce(0, 3, 2, 10), std::invalid_argument);  // more ranks than leaves
  EXPECT_THROW(plan_tree_allreduce(0, 2, 6, 10), std::invalid_argument);  // M not a power of two
  EXPECT_THROW(plan_tree_allreduce(2, 2, 4, 10), std::invalid_argument);
}
