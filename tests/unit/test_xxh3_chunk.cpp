// xxh3_chunk.h (the GPU fingerprint kernel's hash, compiled here as host code) against libxxhash, bit
// for bit, for every chunk length 0..4096 at three alignments: every one of XXH3's length paths, and
// the eight-lane form of the long path.
#define XXH_STATIC_LINKING_ONLY
#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/xxh3_chunk.h"

TEST(Xxh3Chunk, EqualsLibxxhashForEveryChunkLength) {
  unsigned char secret[culprit::xxh3::kSecretSize];
  XXH3_generateSecret_fromSeed(secret, 0);
  std::mt19937_64 g(20261130);
  std::vector<unsigned char> buf(culprit::kFingerprintChunkBytes + 8);
  for (auto& b : buf) b = static_cast<unsigned char>(g());
  int differ = 0;
  for (std::size_t len = 0; len <= culprit::kFingerprintChunkBytes; ++len)
    for (std::size_t off = 0; off < 3; ++off)
      if (culprit::xxh3::hash64(buf.data() + off, len, secret) != XXH3_64bits(buf.data() + off, len)) {
        ADD_FAILURE() << "length " << len << " offset " << off;
        if (++differ > 5) return;
      }
}

// The cooperative form (eight lanes, then a merge), which the GPU kernel uses for long chunks.
TEST(Xxh3Chunk, LanesMergeToLibxxhashForEveryLongLength) {
  unsigned char secret[culprit::xxh3::kSecretSize];
  XXH3_generateSecret_fromSeed(secret, 0);
  std::mt19937_64 g(20261201);
  std::vector<unsigned char> buf(culprit::kFingerprintChunkBytes + 8);
  for (auto& b : buf) b = static_cast<unsigned char>(g());
  int differ = 0;
  for (std::size_t len = 241; len <= culprit::kFingerprintChunkBytes; ++len)
    for (std::size_t off : {0UL, 8UL, 3UL}) {
      std::uint64_t acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = culprit::xxh3::lane_long(buf.data() + off, len, secret, j);
      if (culprit::xxh3::merge_long(acc, len, secret) != XXH3_64bits(buf.data() + off, len)) {
        ADD_FAILURE() << "length " << len << " offset " << off;
        if (++differ > 5) return;
      }
    }
  // Negative control: lanes swapped give another hash.
  std::uint64_t acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = culprit::xxh3::lane_long(buf.data(), 4096, secret, j ^ 1);
  EXPECT_NE(culprit::xxh3::merge_long(acc, 4096, secret), XXH3_64bits(buf.data(), 4096));
}

TEST(Xxh3Chunk, ChunkHashesCombineToTheFingerprint) {
  unsigned char secret[culprit::xxh3::kSecretSize];
  XXH3_generateSecret_fromSeed(secret, 0);
  std::mt19937_64 g(7);
  for (std::size_t n : {0UL, 1UL, 4095UL, 4096UL, 4097UL, 100003UL}) {
    std::vector<unsigned char> data(n);
    for (auto& b : data) b = static_cast<unsigned char>(g());
    std::vector<std::uint64_t> h;
    for (std::size_t off = 0; off < n; off += culprit::kFingerprintChunkBytes)
      h.push_back(culprit::xxh3::hash64(data.data() + off, std::min(culprit::kFingerprintChunkBytes, n - off), secret));
    EXPECT_EQ(culprit::combine_chunk_hashes(h.data(), h.size()), culprit::fingerprint_bytes(data.data(), n)) << n;
  }
  // Negative control: one flipped bit changes it.
  std::vector<unsigned char> data(10000, 1);
  const auto a = culprit::fingerprint_bytes(data.data(), data.size());
  data[5000] ^= 4;
  EXPECT_NE(a, culprit::fingerprint_bytes(data.data(), data.size()));
}

// The GPU screen's CPU reference (screen_kernels.h): the same bits every time, and the values a
// double-precision computation gives to float accuracy.
#include <cmath>

#include "culprit/screen_kernels.h"

TEST(ScreenReference, DeterministicAndClose) {
  const int n = 48;
  std::vector<float> m, r, p, m2, r2, p2;
  culprit::screen::reference(n, &m, &r, &p);
  culprit::screen::reference(n, &m2, &r2, &p2);
  EXPECT_EQ(culprit::fingerprint_bytes(m.data(), m.size() * 4), culprit::fingerprint_bytes(m2.data(), m2.size() * 4));
  for (int i : {0, 5, n - 1}) {
    double c = 0, s = 0;
    for (int k = 0; k < n; ++k) {
      c += static_cast<double>(culprit::screen::input_value(0, i * n + k)) * culprit::screen::input_value(1, k * n + 3);
      s += static_cast<double>(culprit::screen::input_value(0, i * n + k)) * culprit::screen::input_value(1, i * n + k);
    }
    EXPECT_NEAR(m[i * n + 3], c, 1e-4);
    EXPECT_NEAR(r[i], s, 1e-4);
    const double a = culprit::screen::input_value(0, i), b = culprit::screen::input_value(1, i);
    EXPECT_NEAR(p[i], (a * b + a) / (1 + b * b), 1e-6);
  }
}
