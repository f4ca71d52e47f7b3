// The reduction tree without MPI: decomposition and accumulation order.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "culprit/tree_reduce.h"
#include "tree_data.h"

using namespace culprit;
using culprit::testing::leaf;
using culprit::testing::tree;

namespace {
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

TEST(ShardRange, CoversAllLeavesContiguously) {
  for (int m : {1, 2, 4, 8, 16, 64})
    for (int w = 1; w <= m && w <= 16; ++w) {
      int next = 0;
      for (int r = 0; r < w; ++r) {
        auto s = shard_range(r, w, m);
        EXPECT_EQ(s.lo, next);
        EXPECT_GT(s.hi, s.lo);
        next = s.hi;
      }
      EXPECT_EQ(next, m);
    }
}

TEST(CanonicalBlocks, AreMaximalAlignedAndCover) {
  EXPECT_EQ(canonical_blocks({0, 8}), (std::vector<TreeNode>{{0, 3}}));
  EXPECT_EQ(canonical_blocks({2, 5}), (std::vector<TreeNode>{{2, 1}, {4, 0}}));
  EXPECT_EQ(canonical_blocks({1, 7}), (std::vector<TreeNode>{{1, 0}, {2, 1}, {4, 1}, {6, 0}}));
  EXPECT_EQ(canonical_blocks({5, 8}), (std::vector<TreeNode>{{5, 0}, {6, 1}}));
}

TEST(TreeAccumulator, BlocksEqualTheGlobalTreesNodes) {
  const std::size_t n = 37;
  for (int m : {1, 2, 4, 8, 16}) {
    for (int w = 1; w <= m; ++w) {
      for (int r = 0; r < w; ++r) {
        const auto range = shard_range(r, w, m);
        TreeAccumulator acc(n);
        for (int k = range.lo; k < range.hi; ++k) {
          auto v = leaf(k, n);
          std::memcpy(acc.leaf_buffer(), v.data(), n * sizeof(float));
          acc.push(k);
        }
        const auto want = canonical_blocks(range);
        ASSERT_EQ(acc.blocks().size(), want.size());
        for (std::size_t b = 0; b < want.size(); ++b) {
          EXPECT_EQ(acc.blocks()[b].node, want[b]);
          const auto& node = want[b];
          EXPECT_TRUE(bitwise_equal(acc.blocks()[b].data, tree(node.lo, node.lo + node.size(), n)));
        }
      }
    }
  }
}

TEST(TreeAccumulator, NegativeControlSequentialSumDiffers) {
  // Guards the test data: if a left-to-right sum gave the same bits the tests above would prove
  // nothing about grouping.
  const std::size_t n = 37;
  auto seq = leaf(0, n);
  for (int k = 1; k < 8; ++k) {
    auto v = leaf(k, n);
    for (std::size_t i = 0; i < n; ++i) seq[i] += v[i];
  }
  EXPECT_FALSE(bitwise_equal(seq, tree(0, 8, n)));
}

TEST(TreeAccumulator, RejectsOutOfOrderLeaves) {
  TreeAccumulator acc(4);
  acc.leaf_buffer();
  acc.push(0);
  acc.leaf_buffer();
  EXPECT_THROW(acc.push(2), std::logic_error);
}
