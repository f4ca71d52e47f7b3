// The NaN/Inf scans of the detectors (common/include/culprit/finite.h) against std::isfinite: every special
// value at every position of the vectorised body and of the scalar tail.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "culprit/finite.h"

namespace culprit::harness {
namespace {

TEST(Finite, FiniteValuesPass) {
  const float lim = std::numeric_limits<float>::max();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, lim, -lim, std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                          3.0e38f, 1e-40f};
  for (std::size_t n = 0; n <= v.size(); ++n) EXPECT_TRUE(all_finite(v.data(), n)) << n;
  std::vector<float> dst(v.size());
  EXPECT_TRUE(copy_all_finite(v.data(), dst.data(), v.size()));
  EXPECT_EQ(dst, v);
}

TEST(Finite, EveryNonFiniteValueAtEveryPositionIsFound) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (std::size_t n : {1u, 15u, 16u, 17u, 37u, 64u}) {
    std::vector<float> v(n, 0.5f), dst(n);
    for (std::size_t i = 0; i < n; ++i) {
      for (float b : bad) {
        v[i] = b;
        EXPECT_FALSE(all_finite(v.data(), n)) << "n " << n << " at " << i;
        EXPECT_FALSE(copy_all_finite(v.data(), dst.data(), n)) << "n " << n << " at " << i;
        EXPECT_EQ(std::isnan(dst[i]), std::isnan(b));
      }
      v[i] = 0.5f;
    }
    EXPECT_TRUE(all_finite(v.data(), n));
  }
}

}  // namespace
}  // namespace culprit::harness

// grad_norm's order (docs/determinism.md): per chunk of 1024 values, lane j sums elements j, j + 8,
// ... of the chunk in order and the lanes are added pairwise; the chunks' sums are added in order.
// Written out here independently; a value the order matters for tells them apart.
TEST(L2Norm, EightLanesPerChunkThenChunksInOrder) {
  std::vector<float> g(2503);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = (i % 97 == 0 ? 1e8f : 1.0f) * static_cast<float>((i * 37) % 11) * 0.1f;
  double total = 0;
  for (std::size_t c = 0; c < g.size(); c += 1024) {
    double lane[8] = {};
    for (std::size_t i = c; i < std::min(g.size(), c + 1024); ++i) lane[(i - c) % 8] += static_cast<double>(g[i]) * g[i];
    total += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  EXPECT_EQ(culprit::harness::l2_norm(g.data(), g.size()), std::sqrt(total));
  double seq = 0;
  for (float v : g) seq += static_cast<double>(v) * v;
  EXPECT_NEAR(culprit::harness::l2_norm(g.data(), g.size()), std::sqrt(seq), 1e-9 * std::sqrt(seq));
  EXPECT_EQ(culprit::harness::l2_norm(g.data(), 0), 0.0);
}

// The parameters' fingerprint and NaN/Inf scan in one pass: the fingerprint is fingerprint_bytes's
// (format fp1) at every length around the chunk size, and a non-finite value in any chunk is seen.
TEST(FingerprintFinite, SameFingerprintAndScan) {
  for (std::size_t n : {0u, 1u, 17u, 1023u, 1024u, 1025u, 5000u}) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.25f - 3.0f;
    bool finite = false;
    EXPECT_EQ(culprit::harness::fingerprint_finite(v.data(), n, &finite), culprit::fingerprint_bytes(v.data(), n * sizeof(float))) << n;
    EXPECT_TRUE(finite) << n;
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      if (n == 0) break;
      const float keep = v[at];
      v[at] = std::numeric_limits<float>::infinity();
      EXPECT_FALSE((culprit::harness::fingerprint_finite(v.data(), n, &finite), finite)) << n << " at " << at;
      v[at] = keep;
    }
  }
}
