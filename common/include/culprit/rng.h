// Counter-based randomness: every random quantity of a run is a pure function of the seed and
// its coordinates (docs/determinism.md, "Randomness").
#pragma once
#include <cstdint>

namespace culprit::harness {

constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Streams keep the uses apart.
enum Stream : std::uint64_t {
  kStreamSample = 1,   // synthetic sample values
  kStreamTeacher = 2,  // synthetic labelling function
  kStreamDropout = 3,  // the generator seed of (step, micro-shard)
  kStreamShuffle = 4,  // round keys of the feistel epoch order (order.h), per (epoch, round)
};

constexpr std::uint64_t key(std::uint64_t seed, Stream stream, std::uint64_t a, std::uint64_t b) {
  return splitmix64(splitmix64(splitmix64(seed ^ stream) + a) + b);
}

// A float in [-1, 1) with 24 random bits: exact in float32.
inline float unit_float(std::uint64_t h) {
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

// Seed of the generator used inside micro-shard k of 1-based step `step`.
constexpr std::uint64_t dropout_seed(std::uint64_t seed, std::int64_t step, int k) {
  return key(seed, kStreamDropout, static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(k));
}

}  // namespace culprit::harness
