// The NaN/Inf scans of the detectors (harness/src/finite.h) against std::isfinite: every special
// value at every position of the vectorised body and of the scalar tail.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "finite.h"

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
