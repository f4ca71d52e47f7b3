// The GPU fingerprint equals the CPU one for many sizes and dtypes (needs a CUDA device; skips with
// the reason where there is none). Also prints the kernel's bandwidth against a device-to-device copy.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/fingerprint_cuda.h"

namespace {

bool have_device() {
  std::string why;
  if (culprit::cuda::device_available(&why)) return true;
  std::printf("no CUDA device here (%s): GPU tests skipped\n", why.c_str());
  return false;
}

template <class T>
void check_sizes(const char* dtype) {
  std::mt19937_64 g(11);
  for (std::size_t n : {0UL, 1UL, 3UL, 1023UL, 1024UL, 1025UL, 4096UL, 65537UL, 1000003UL, 16777216UL + 5}) {
    std::vector<T> v(n);
    for (auto& x : v) {
      const std::uint64_t r = g();
      std::memcpy(&x, &r, sizeof(T));
    }
    for (auto kernel : {culprit::cuda::Kernel::kLanes, culprit::cuda::Kernel::kThreadPerChunk}) {
      culprit::Fingerprint gpu = 0;
      const auto st = culprit::cuda::fingerprint_via_device(v.data(), n * sizeof(T), &gpu, kernel);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(gpu, culprit::fingerprint_bytes(v.data(), n * sizeof(T)))
          << dtype << " x " << n << (kernel == culprit::cuda::Kernel::kLanes ? " (lanes)" : " (thread per chunk)");
    }
  }
}

}  // namespace

TEST(FingerprintCuda, EqualsCpuForManySizesAndDtypes) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  check_sizes<float>("float32");
  check_sizes<double>("float64");
  check_sizes<std::int64_t>("int64");
  check_sizes<std::uint16_t>("bfloat16");
  check_sizes<std::uint8_t>("uint8");
}

TEST(FingerprintCuda, AFlippedBitChangesIt) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::vector<float> v(1 << 20, 1.0f);
  culprit::Fingerprint a = 0, b = 0;
  ASSERT_TRUE(culprit::cuda::fingerprint_via_device(v.data(), v.size() * 4, &a).ok());
  reinterpret_cast<std::uint32_t*>(v.data())[777777] ^= 1u << 3;
  ASSERT_TRUE(culprit::cuda::fingerprint_via_device(v.data(), v.size() * 4, &b).ok());
  EXPECT_NE(a, b);
}

TEST(FingerprintCuda, Bandwidth) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (std::size_t mb : {64, 1024}) {
    for (auto kernel : {culprit::cuda::Kernel::kLanes, culprit::cuda::Kernel::kThreadPerChunk}) {
      double fp = 0, copy = 0;
      const auto st = culprit::cuda::bandwidth(mb << 20, 5, kernel, &fp, &copy);
      ASSERT_TRUE(st.ok()) << st.message();
      std::printf("fingerprint bandwidth %zu MiB, %s kernel: %.1f GB/s, device-to-device copy %.1f GB/s, ratio %.2f "
                  "(target >= 0.8)\n", mb, kernel == culprit::cuda::Kernel::kLanes ? "lanes (default)" : "thread-per-chunk",
                  fp, copy, fp / copy);
    }
  }
}

// The GPU screen's known answer: each test's result on the GPU is bitwise the CPU reference's.
#include "culprit/screen_cuda.h"
#include "culprit/screen_kernels.h"

TEST(ScreenCuda, KnownAnswersAndAFlippedBit) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (int n : {64, 256}) {
    std::vector<float> ref[3];
    culprit::screen::reference(n, &ref[0], &ref[1], &ref[2]);
    culprit::Fingerprint gpu[3];
    ASSERT_TRUE(culprit::cuda::screen_once(0, n, {}, gpu).ok());
    for (int t = 0; t < 3; ++t)
      EXPECT_EQ(gpu[t], culprit::fingerprint_bytes(ref[t].data(), ref[t].size() * 4)) << "test " << t << " n " << n;
    culprit::cuda::ScreenFlip flip;
    flip.test = 0;
    flip.index = 17;
    flip.bit = 2;
    ASSERT_TRUE(culprit::cuda::screen_once(0, n, flip, gpu).ok());
    EXPECT_NE(gpu[0], culprit::fingerprint_bytes(ref[0].data(), ref[0].size() * 4));
    EXPECT_EQ(gpu[1], culprit::fingerprint_bytes(ref[1].data(), ref[1].size() * 4));
  }
}
