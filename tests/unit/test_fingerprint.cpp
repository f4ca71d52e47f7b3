#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <vector>

#include "culprit/fingerprint.h"

using culprit::DType;
using culprit::fingerprint_bytes;
using culprit::FingerprintSet;

namespace {
std::vector<unsigned char> pattern(std::size_t n) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 131 + 7);
  return v;
}
}  // namespace

TEST(Fingerprint, EmptyIsXxh3OfNothing) { EXPECT_EQ(fingerprint_bytes(nullptr, 0), XXH3_64bits("", 0)); }

TEST(Fingerprint, SmallInputIsHashOfOneChunkHash) {
  auto v = pattern(100);
  const std::uint64_t h = XXH3_64bits(v.data(), v.size());
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(h >> (8 * i));
  EXPECT_EQ(fingerprint_bytes(v.data(), v.size()), XXH3_64bits(le, 8));
}

TEST(Fingerprint, EveryByteAndTheLengthMatter) {
  for (std::size_t n : {1u, 4095u, 4096u, 4097u, 3u * 4096u + 5u, 70u * 4096u}) {
    auto v = pattern(n);
    const auto fp = fingerprint_bytes(v.data(), n);
    for (std::size_t pos : {std::size_t{0}, n / 2, n - 1}) {
      auto w = v;
      w[pos] ^= 0x10;  // one bit
      EXPECT_NE(fingerprint_bytes(w.data(), n), fp) << "n=" << n << " pos=" << pos;
    }
    if (n > 1) {
      EXPECT_NE(fingerprint_bytes(v.data(), n - 1), fp);
    }
  }
}

TEST(Fingerprint, HexIsSixteenLowercaseDigits) {
  EXPECT_EQ(culprit::fingerprint_hex(0x00ab'cdef'0123'4567ULL), "00abcdef01234567");
}

TEST(FingerprintSet, NamesShapesTypesAndOrderMatter) {
  auto make = [](const char* a, const char* b, DType t, std::vector<std::int64_t> shape) {
    FingerprintSet s;
    s.add(a, t, shape, 1);
    s.add(b, t, {4}, 2);
    return s.finish();
  };
  const auto base = make("fc1.weight", "fc1.bias", DType::kFloat32, {2, 2});
  EXPECT_EQ(make("fc1.weight", "fc1.bias", DType::kFloat32, {2, 2}), base);
  EXPECT_NE(make("fc1.bias", "fc1.weight", DType::kFloat32, {2, 2}), base);
  EXPECT_NE(make("fc1.weight", "fc1.bias", DType::kFloat64, {2, 2}), base);
  EXPECT_NE(make("fc1.weight", "fc1.bias", DType::kFloat32, {4}), base);
}
