// The GPU screen's known-answer tests (docs/screen.md): seeded inputs and the three computations,
// defined operation by operation (IEEE binary32, round to nearest, no fused multiply-add) so that a
// healthy GPU and the CPU reference (screen_reference.cpp, compiled with -ffp-contract=off) produce
// the same bits: the known answer is computed once on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "culprit/xxh3_chunk.h"  // CULPRIT_HD

namespace culprit::screen {

// Input element i of matrix `which` (0: A, 1: B): k / 2^23 for a seeded k in [-2^23, 2^23), exact
// in float32, the same on every device.
CULPRIT_HD float input_value(int which, std::size_t i) {
  std::uint64_t z = 0x5eed0000ULL + static_cast<std::uint64_t>(which) * 0x1000003ULL + (i + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  const std::int64_t k = static_cast<std::int64_t>(z >> 40) - (1LL << 23);
  return static_cast<float>(k) / 8388608.0f;
}

// The CPU reference: C = A B (k ascending), r_i = sum_j A_ij B_ij (j ascending),
// p_i = (a b + a) / (1 + b b) elementwise; n x n inputs.
void reference(int n, std::vector<float>* matmul, std::vector<float>* reduce, std::vector<float>* pointwise);

}  // namespace culprit::screen
