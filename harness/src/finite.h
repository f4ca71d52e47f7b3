// Finiteness scans at memory speed: x * 0 is 0 for a finite x and NaN for Inf or NaN, and sixteen
// independent partial sums let the compiler vectorise without reassociating anything.
#pragma once
#include <cstddef>

namespace culprit::harness {

inline bool all_finite(const float* p, std::size_t n) {
  float acc[16] = {0};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += p[i + j] * 0.0f;
  float t = 0;
  for (int j = 0; j < 16; ++j) t += acc[j];
  for (; i < n; ++i) t += p[i] * 0.0f;
  return t == 0.0f;
}

// Copies n floats and tells whether all were finite, in one pass.
inline bool copy_all_finite(const float* src, float* dst, std::size_t n) {
  float acc[16] = {0};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) {
      dst[i + j] = src[i + j];
      acc[j] += src[i + j] * 0.0f;
    }
  float t = 0;
  for (int j = 0; j < 16; ++j) t += acc[j];
  for (; i < n; ++i) {
    dst[i] = src[i];
    t += src[i] * 0.0f;
  }
  return t == 0.0f;
}

}  // namespace culprit::harness
