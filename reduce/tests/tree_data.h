// Test data for the reduction tree: leaves whose float sums visibly depend on the grouping, and
// the reference sum in the global tree's order.
#pragma once
#include <cstddef>
#include <vector>

namespace culprit::testing {

inline std::vector<float> leaf(int k, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float big = (k + i) % 3 == 0 ? 1.0e8f : 1.0f;
    v[i] = big * (1.0f + 0.1f * static_cast<float>((k * 7 + i * 13) % 11)) * ((k + i) % 2 ? -1.f : 1.f);
  }
  return v;
}

// Leaves [lo, hi) summed as ((g_lo + g_lo+1) + ...) in the complete binary tree.
inline std::vector<float> tree(int lo, int hi, std::size_t n) {
  if (hi - lo == 1) return leaf(lo, n);
  const int mid = (lo + hi) / 2;
  auto a = tree(lo, mid, n), b = tree(mid, hi, n);
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
  return a;
}

}  // namespace culprit::testing
