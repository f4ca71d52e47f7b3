#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <vector>

#include "culprit/fingerprint.h"

using culprit::DType;
using culprit::fingerprint_bytes;
using culprit::fingerprint_with_parts;
using culprit::Fingerprint;
using culprit::kFingerprintChunkBytes;
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

// One pass, the values of separate calls: parts of every size (empty, under, at and across the
// chunk size), parts that leave bytes between them, and none.
TEST(Fingerprint, WithPartsEqualsSeparateCalls) {
  std::vector<unsigned char> buf(3 * kFingerprintChunkBytes + 1234);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 131 + 7);
  std::vector<std::pair<std::vector<std::size_t>, std::vector<std::size_t>>> cases = {
      {{}, {}},
      {{0, 4, 4, 4100}, {4, 0, 4096, 8000}},
      {{0}, {buf.size()}},
      {{100, 5000, 9000}, {10, 3000, buf.size() - 9000}},
      {{0, 4096, 8192, 12288}, {4096, 4096, 4096, buf.size() - 12288}},
      {{buf.size()}, {0}},
  };
  for (const auto& [off, size] : cases) {
    std::vector<Fingerprint> parts;
    const Fingerprint whole = fingerprint_with_parts(buf.data(), buf.size(), off, size, &parts);
    EXPECT_EQ(whole, fingerprint_bytes(buf.data(), buf.size()));
    ASSERT_EQ(parts.size(), off.size());
    for (std::size_t i = 0; i < off.size(); ++i)
      EXPECT_EQ(parts[i], fingerprint_bytes(buf.data() + off[i], size[i])) << "part " << i;
  }
  // Negative control: a changed byte inside a part changes it and the whole.
  std::vector<Fingerprint> before, after;
  const Fingerprint w0 = fingerprint_with_parts(buf.data(), buf.size(), {100}, {10}, &before);
  buf[105] ^= 1;
  const Fingerprint w1 = fingerprint_with_parts(buf.data(), buf.size(), {100}, {10}, &after);
  EXPECT_NE(w0, w1);
  EXPECT_NE(before[0], after[0]);
}
