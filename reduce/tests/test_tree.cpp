// The reduction tree without MPI: decomposition and accumulation order.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "culprit/tree_overlap.h"
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

// Buckets hold whole parameters, cover the buffer once, go from its end (launch order) and hold at
// least the cap, the first parameter's bucket excepted.
TEST(MakeBuckets, WholeParametersFromTheEnd) {
  const std::vector<std::int64_t> offsets = {0, 10, 30, 31, 100};  // sizes 10, 20, 1, 69, 50 (+ the loss)
  const std::size_t n = 151;
  const auto b = make_buckets(offsets, n, 60);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].lo, 31u);  // the last two parameters and the loss: 51 < 60 values, then 120
  EXPECT_EQ(b[0].hi, 151u);
  EXPECT_EQ(b[1].lo, 0u);  // the rest: fewer than the cap, down to the start
  EXPECT_EQ(b[1].hi, 31u);
  const auto one = make_buckets(offsets, n, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].lo, 0u);
  EXPECT_EQ(one[0].hi, n);
  const auto each = make_buckets(offsets, n, 1);
  ASSERT_EQ(each.size(), offsets.size());
  for (std::size_t i = 0; i < each.size(); ++i) EXPECT_EQ(each[i].lo, static_cast<std::size_t>(offsets[offsets.size() - 1 - i]));
}

// Two data-parallel reductions side by side (a tensor-parallel run's, widened to world ranks by
// harness/train/tensor_layout.cpp): ranks {0, 2} and {1, 3}. A pair across them exchanged nothing
// (fingerprints 0), so a corrupted chunk in one reduction names its own pair only.
TEST(CommMismatches, PairsThatExchangedNothingAreSkipped) {
  const auto check = [](std::vector<Fingerprint> sent, std::vector<Fingerprint> received, std::vector<Fingerprint> chunks) {
    CommCheck c;
    c.enabled = true;
    c.sent = std::move(sent);
    c.received = std::move(received);
    c.chunks = std::move(chunks);
    return c;
  };
  // Rank 2's message to rank 0 arrived changed (phase 1); the chunk rank 0 owns is then another sum
  // in {0, 2} than in {1, 3}, which a cross comparison would call a mismatch of every pair.
  std::vector<CommCheck> all = {check({0, 0, 11, 0}, {0, 0, 99, 0}, {50, 0, 60, 0}),
                                check({0, 0, 0, 13}, {0, 0, 0, 14}, {0, 51, 0, 61}),
                                check({12, 0, 0, 0}, {11, 0, 0, 0}, {50, 0, 60, 0}),
                                check({0, 14, 0, 0}, {0, 13, 0, 0}, {0, 51, 0, 61})};
  EXPECT_EQ(comm_mismatches(all), (std::vector<std::pair<int, int>>{{2, 0}}));
  // Control: rank 1 filling in rank 0's chunk as its own reduction holds it (another sum) is
  // compared, and named.
  all[1].chunks = {52, 51, 60, 61};
  EXPECT_EQ(comm_mismatches(all).size(), 2u);
}
