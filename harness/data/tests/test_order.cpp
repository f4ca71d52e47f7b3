// The feistel epoch order (harness/data/order.h; docs/determinism.md "1. Data order"): a bijection of
// [0, N) for every N, its inverse, and statistics that a shuffle of large N must show.
//
// Statistical thresholds are fixed, not tuned: each chi-square limit is the upper 0.1% quantile of
// the chi-square distribution for its degrees of freedom (37.70 for 16 buckets), and |correlation|
// < 0.02 is over 6 standard deviations (1/sqrt(10^5) = 0.0032) of an uncorrelated sample. Every input
// is fixed, so each check passes or fails the same way every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <vector>

#include "data/order.h"

namespace {

using culprit::harness::FeistelOrder;

constexpr std::int64_t kSampleCount = 100000;
constexpr double kChi2Df15P001 = 37.70;  // chi-square, 15 degrees of freedom, upper 0.1% quantile
constexpr double kChi2Df23P001 = 49.73;  // 23 degrees of freedom
constexpr double kMaxAbsCorrelation = 0.02;

// Sixteen equal buckets of [0, n): the chi-square statistic of the values against uniform.
double chi_square16(const std::vector<std::int64_t>& values, std::int64_t n) {
  std::array<double, 16> count{};
  for (std::int64_t v : values)
    count[static_cast<std::size_t>(static_cast<unsigned __int128>(v) * 16 / static_cast<unsigned __int128>(n))] += 1;
  const double expected = static_cast<double>(values.size()) / 16;
  double chi2 = 0;
  for (double c : count) chi2 += (c - expected) * (c - expected) / expected;
  return chi2;
}

// Pearson correlation of consecutive values (as fractions of n).
double lag1_correlation(const std::vector<std::int64_t>& values, std::int64_t n) {
  const std::size_t m = values.size() - 1;
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const double x = static_cast<double>(values[i]) / static_cast<double>(n);
    const double y = static_cast<double>(values[i + 1]) / static_cast<double>(n);
    sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
  }
  const double cov = sxy / m - (sx / m) * (sy / m);
  return cov / std::sqrt((sxx / m - (sx / m) * (sx / m)) * (syy / m - (sy / m) * (sy / m)));
}

std::vector<std::int64_t> first_samples(const FeistelOrder& order, std::int64_t count) {
  std::vector<std::int64_t> v;
  v.reserve(static_cast<std::size_t>(count));
  for (std::int64_t p = 0; p < count; ++p) v.push_back(order.sample_at(p));
  return v;
}

// Visits all of [0, n): every sample once, and position_of undoes sample_at.
void expect_permutation(const FeistelOrder& order) {
  const std::int64_t n = order.n();
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  for (std::int64_t p = 0; p < n; ++p) {
    const std::int64_t s = order.sample_at(p);
    ASSERT_TRUE(s >= 0 && s < n) << "n=" << n << " p=" << p << " s=" << s;
    ASSERT_FALSE(seen[static_cast<std::size_t>(s)]) << "n=" << n << " sample " << s << " twice";
    seen[static_cast<std::size_t>(s)] = true;
    ASSERT_EQ(order.position_of(s), p) << "n=" << n;
  }
}

struct Key {
  std::uint64_t seed;
  std::int64_t epoch;
};
constexpr Key kKeys[] = {{0, 0}, {1234, 0}, {1234, 7}};

TEST(FeistelOrder, IsAPermutationForEveryNUpTo3000) {
  for (const Key& k : kKeys) {
    int identities = 0;
    for (std::int64_t n = 1; n <= 3000; ++n) {
      const FeistelOrder order(k.seed, k.epoch, n);
      ASSERT_NO_FATAL_FAILURE(expect_permutation(order));
      bool identity = true;
      for (std::int64_t p = 0; p < n && identity; ++p) identity = order.sample_at(p) == p;
      identities += identity && n >= 8;
    }
    // A permutation that does not move anything is still a permutation: the shuffle must shuffle.
    EXPECT_EQ(identities, 0) << "seed " << k.seed << " epoch " << k.epoch;
  }
}

TEST(FeistelOrder, IsAPermutationForALargeN) {
  const std::int64_t n = (std::int64_t{1} << 20) + 12345;
  for (const Key& k : {kKeys[1], kKeys[2]}) {
    const FeistelOrder order(k.seed, k.epoch, n);
    EXPECT_EQ(order.half_bits(), 11);  // 4^10 < n <= 4^11
    ASSERT_NO_FATAL_FAILURE(expect_permutation(order));
    std::int64_t fixed = 0;
    for (std::int64_t p = 0; p < n; ++p) fixed += order.sample_at(p) == p;
    EXPECT_LT(fixed, 10) << "a random permutation has 1 fixed point on average";
  }
}

TEST(FeistelOrder, DomainIsTheSmallestEvenWidthPowerOfTwo) {
  const std::pair<std::int64_t, int> cases[] = {{1, 1}, {4, 1}, {5, 2}, {16, 2}, {17, 3}, {3000, 6},
                                                {(std::int64_t{1} << 40) + 3, 21}, {FeistelOrder::kMaxN, 31}};
  for (const auto& [n, h] : cases) EXPECT_EQ(FeistelOrder(1, 0, n).half_bits(), h) << "n=" << n;
}

TEST(FeistelOrder, SingleSample) {
  for (std::int64_t e = 0; e < 50; ++e) {
    const FeistelOrder order(99, e, 1);
    EXPECT_EQ(order.sample_at(0), 0);
    EXPECT_EQ(order.position_of(0), 0);
  }
}

// Across epochs, every order of a tiny N turns up, about equally often.
TEST(FeistelOrder, SmallNOrdersAreUniformOverEpochs) {
  for (std::int64_t n : {2, 3, 4}) {
    std::map<std::vector<std::int64_t>, int> count;
    const int epochs = 2400;
    for (int e = 0; e < epochs; ++e) count[first_samples(FeistelOrder(5, e, n), n)] += 1;
    const int orders = n == 2 ? 2 : n == 3 ? 6 : 24;
    ASSERT_EQ(static_cast<int>(count.size()), orders) << "n=" << n;
    const double expected = static_cast<double>(epochs) / orders;
    double chi2 = 0;
    for (const auto& [o, c] : count) chi2 += (c - expected) * (c - expected) / expected;
    // p = 0.001 quantiles for 1, 5 and 23 degrees of freedom.
    const double limit = n == 2 ? 10.83 : n == 3 ? 20.52 : kChi2Df23P001;
    EXPECT_LT(chi2, limit) << "n=" << n;
  }
}

TEST(FeistelOrder, InverseAtLargeN) {
  for (std::int64_t n : {std::int64_t{1000000000000}, std::int64_t{3000000007}, (std::int64_t{1} << 40) + 3,
                         FeistelOrder::kMaxN}) {
    const FeistelOrder order(42, 3, n);
    for (std::int64_t i = 0; i < 20000; ++i) {
      // Spread over the whole range, ends included.
      const std::int64_t p = static_cast<std::int64_t>(static_cast<unsigned __int128>(n - 1) * i / 19999);
      const std::int64_t s = order.sample_at(p);
      ASSERT_TRUE(s >= 0 && s < n) << "n=" << n;
      ASSERT_EQ(order.position_of(s), p) << "n=" << n;
      ASSERT_EQ(order.sample_at(order.position_of(p)), p) << "n=" << n;
    }
  }
}

TEST(FeistelOrder, StatisticsAtLargeN) {
  for (std::int64_t n : {std::int64_t{1000000000000}, std::int64_t{3000000007}}) {
    for (const Key& k : kKeys) {
      const FeistelOrder order(k.seed, k.epoch, n);
      // The first positions (what an epoch's first steps read) and positions strided over the epoch.
      std::vector<std::int64_t> strided;
      for (std::int64_t i = 0; i < kSampleCount; ++i) strided.push_back(order.sample_at(i * (n / kSampleCount)));
      for (const auto& values : {first_samples(order, kSampleCount), strided}) {
        std::vector<std::int64_t> sorted = values;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "collision, n=" << n;
        EXPECT_LT(chi_square16(values, n), kChi2Df15P001) << "n=" << n << " seed " << k.seed;
        EXPECT_LT(std::abs(lag1_correlation(values, n)), kMaxAbsCorrelation) << "n=" << n << " seed " << k.seed;
      }
    }
  }
}

// The statistics above can fail: an unshuffled or sorted order fails both.
TEST(FeistelOrder, StatisticsRejectAnOrderedSequence) {
  const std::int64_t n = 1000000000000;
  std::vector<std::int64_t> ordered;
  for (std::int64_t i = 0; i < kSampleCount; ++i) ordered.push_back(i * (n / kSampleCount));
  std::vector<std::int64_t> low(ordered.begin(), ordered.end());
  for (auto& v : low) v /= 2;  // all in the lower half
  EXPECT_GT(chi_square16(low, n), kChi2Df15P001);
  EXPECT_GT(std::abs(lag1_correlation(ordered, n)), kMaxAbsCorrelation);
}

TEST(FeistelOrder, EpochsAndSeedsGiveDifferentOrders) {
  const std::int64_t n = 1000000000000;
  const std::vector<std::int64_t> base = first_samples(FeistelOrder(1234, 0, n), 1000);
  for (const auto& [seed, epoch] : std::vector<std::pair<std::uint64_t, std::int64_t>>{
           {1234, 1}, {1234, 2}, {1235, 0}, {0, 0}, {1234, 1000000}, {~std::uint64_t{0}, 0}}) {
    const std::vector<std::int64_t> other = first_samples(FeistelOrder(seed, epoch, n), 1000);
    int same = 0;
    for (std::size_t i = 0; i < base.size(); ++i) same += base[i] == other[i];
    EXPECT_EQ(same, 0) << "seed " << seed << " epoch " << epoch;  // expected 10^-9 matches
  }
  // Seed S, epoch e+1 is not seed S+1, epoch e (randperm's S+e would make them equal).
  EXPECT_NE(first_samples(FeistelOrder(7, 1, 50), 50), first_samples(FeistelOrder(8, 0, 50), 50));
  // Every pair of 20 epochs of a small N differs.
  std::vector<std::vector<std::int64_t>> orders;
  for (int e = 0; e < 20; ++e) orders.push_back(first_samples(FeistelOrder(7, e, 50), 50));
  std::sort(orders.begin(), orders.end());
  EXPECT_EQ(std::adjacent_find(orders.begin(), orders.end()), orders.end());
}

// Pinned (the same values as tests/integration/test_order.py): a change here changes every feistel
// run's data order.
TEST(FeistelOrder, KnownValues) {
  EXPECT_EQ(first_samples(FeistelOrder(1234, 0, 10), 10), (std::vector<std::int64_t>{2, 1, 4, 6, 8, 5, 3, 7, 9, 0}));
  EXPECT_EQ(first_samples(FeistelOrder(~std::uint64_t{0}, 3, (std::int64_t{1} << 40) + 3), 3),
            (std::vector<std::int64_t>{340959048080, 868096139855, 1000721408572}));
}

TEST(FeistelOrder, RefusesOutOfRangeInputs) {
  EXPECT_THROW(FeistelOrder(1, 0, 0), std::invalid_argument);
  EXPECT_THROW(FeistelOrder(1, 0, -5), std::invalid_argument);
  EXPECT_THROW(FeistelOrder(1, 0, FeistelOrder::kMaxN + 1), std::invalid_argument);
  EXPECT_THROW(FeistelOrder(1, 0, INT64_MAX), std::invalid_argument);
  EXPECT_THROW(FeistelOrder(1, -1, 10), std::invalid_argument);
  EXPECT_NO_THROW(FeistelOrder(1, 0, FeistelOrder::kMaxN));

  const FeistelOrder order(1, 0, 10);
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{10}, std::int64_t{11}, INT64_MAX, INT64_MIN}) {
    EXPECT_THROW(order.sample_at(bad), std::out_of_range) << bad;
    EXPECT_THROW(order.position_of(bad), std::out_of_range) << bad;
  }
  const FeistelOrder max(3, 2, FeistelOrder::kMaxN);
  EXPECT_THROW(max.sample_at(FeistelOrder::kMaxN), std::out_of_range);
  const std::int64_t last = max.sample_at(FeistelOrder::kMaxN - 1);
  EXPECT_TRUE(last >= 0 && last < FeistelOrder::kMaxN);
  EXPECT_EQ(max.position_of(last), FeistelOrder::kMaxN - 1);
}

}  // namespace
