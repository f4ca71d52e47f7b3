// xxh3_chunk.h (the GPU fingerprint kernel's hash, compiled here as host code) against libxxhash, bit
// for bit, for every chunk length 0..4096 at four alignments: every one of XXH3's length paths, and
// the eight-lane form of the long path.
#define XXH_STATIC_LINKING_ONLY
#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/xxh3_chunk.h"

namespace {
// XXH3's default secret, as the GPU gets it.
struct Secret {
  Secret() { XXH3_generateSecret_fromSeed(bytes, 0); }
  unsigned char bytes[culprit::xxh3::kSecretSize];
};
// A chunk's worth of random bytes, and some to shift it by.
std::vector<unsigned char> random_chunk(std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<unsigned char> buf(culprit::kFingerprintChunkBytes + 8);
  for (auto& b : buf) b = static_cast<unsigned char>(g());
  return buf;
}

// `hash` against libxxhash for every length lo..4096 at offsets 0, 1, 2 and 8 of a random chunk.
template <class Hash>
void expect_libxxhash(std::size_t lo, std::uint64_t seed, Hash&& hash) {
  const auto buf = random_chunk(seed);
  int differ = 0;
  for (std::size_t len = lo; len <= culprit::kFingerprintChunkBytes; ++len)
    for (std::size_t off : {0UL, 1UL, 2UL, 8UL})
      if (hash(buf.data() + off, len) != XXH3_64bits(buf.data() + off, len)) {
        ADD_FAILURE() << "length " << len << " offset " << off;
        if (++differ > 5) return;
      }
}
}  // namespace

TEST(Xxh3Chunk, EqualsLibxxhashForEveryChunkLength) {
  const Secret sec;
  expect_libxxhash(0, 20261130, [&](const unsigned char* p, std::size_t len) {
    return culprit::xxh3::hash64(p, len, sec.bytes);
  });
}

// The cooperative form (eight lanes, then a merge), which the GPU kernel uses for long chunks.
TEST(Xxh3Chunk, LanesMergeToLibxxhashForEveryLongLength) {
  const Secret sec;
  const unsigned char* secret = sec.bytes;
  expect_libxxhash(241, 20261201, [&](const unsigned char* p, std::size_t len) {
    std::uint64_t acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = culprit::xxh3::lane_long(p, len, secret, j);
    return culprit::xxh3::merge_long(acc, len, secret);
  });
  const auto buf = random_chunk(20261201);
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
