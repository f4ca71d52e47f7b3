// XXH3-64 (seed 0) of one fingerprint chunk (at most kFingerprintChunkBytes = 4096 bytes), written from
// the XXH3 specification for code that cannot call libxxhash: a CUDA kernel hashing each chunk of a
// tensor in device memory. It compiles as host code as well (CULPRIT_HD is empty there), where
// common/tests/test_xxh3_chunk.cpp checks it bit for bit against libxxhash for every length 0..4096.
// `secret` is XXH3's 192-byte default secret (fingerprint_cuda.cu gets it from libxxhash with
// XXH3_generateSecret_fromSeed(buf, 0) and copies it to the device). Inputs are read a byte at a
// time (no alignment needed); little-endian as fp1 defines.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CULPRIT_HD __host__ __device__ __forceinline__
#else
#define CULPRIT_HD inline
#endif

namespace culprit::xxh3 {

constexpr std::size_t kSecretSize = 192;
constexpr std::uint64_t kP32_1 = 0x9E3779B1U, kP32_2 = 0x85EBCA77U, kP32_3 = 0xC2B2AE3DU;
constexpr std::uint64_t kP64_1 = 0x9E3779B185EBCA87ULL, kP64_2 = 0xC2B2AE3D27D4EB4FULL,
                        kP64_3 = 0x165667B19E3779F9ULL, kP64_4 = 0x85EBCA77C2B2AE63ULL,
                        kP64_5 = 0x27D4EB2F165667C5ULL;
constexpr std::uint64_t kMx1 = 0x165667919E3779F9ULL, kMx2 = 0x9FB21C651E98DF25ULL;

CULPRIT_HD std::uint32_t le32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
CULPRIT_HD std::uint64_t le64(const unsigned char* p) {
#if defined(__CUDA_ARCH__)
  // GPUs are little-endian: an aligned word is one load (tensor storage is aligned; the secret's odd
  // offsets take the byte path).
  if ((reinterpret_cast<std::uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const std::uint64_t*>(p);
#endif
  return static_cast<std::uint64_t>(le32(p)) | (static_cast<std::uint64_t>(le32(p + 4)) << 32);
}
CULPRIT_HD std::uint64_t rotl64(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
CULPRIT_HD std::uint32_t swap32(std::uint32_t x) {
  return ((x << 24) & 0xff000000U) | ((x << 8) & 0x00ff0000U) | ((x >> 8) & 0x0000ff00U) | ((x >> 24) & 0xffU);
}
CULPRIT_HD std::uint64_t swap64(std::uint64_t x) {
  return (static_cast<std::uint64_t>(swap32(static_cast<std::uint32_t>(x))) << 32) |
         swap32(static_cast<std::uint32_t>(x >> 32));
}
// The 128-bit product of a and b, its two halves xor-ed.
CULPRIT_HD std::uint64_t mul128_fold64(std::uint64_t a, std::uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<std::uint64_t>(p) ^ static_cast<std::uint64_t>(p >> 64);
#endif
}
CULPRIT_HD std::uint64_t xxh64_avalanche(std::uint64_t h) {
  h ^= h >> 33;
  h *= kP64_2;
  h ^= h >> 29;
  h *= kP64_3;
  return h ^ (h >> 32);
}
CULPRIT_HD std::uint64_t avalanche(std::uint64_t h) {
  h ^= h >> 37;
  h *= kMx1;
  return h ^ (h >> 32);
}
CULPRIT_HD std::uint64_t rrmxmx(std::uint64_t h, std::uint64_t len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= kMx2;
  h ^= (h >> 35) + len;
  h *= kMx2;
  return h ^ (h >> 28);
}
CULPRIT_HD std::uint64_t mix16(const unsigned char* in, const unsigned char* sec) {
  return mul128_fold64(le64(in) ^ le64(sec), le64(in + 8) ^ le64(sec + 8));
}

// Lengths 0..16.
CULPRIT_HD std::uint64_t hash_0to16(const unsigned char* in, std::size_t len, const unsigned char* sec) {
  if (len > 8) {
    const std::uint64_t lo = le64(in) ^ (le64(sec + 24) ^ le64(sec + 32));
    const std::uint64_t hi = le64(in + len - 8) ^ (le64(sec + 40) ^ le64(sec + 48));
    return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
  }
  if (len >= 4) {
    const std::uint64_t in1 = le32(in), in2 = le32(in + len - 4);
    const std::uint64_t keyed = (in2 + (in1 << 32)) ^ (le64(sec + 8) ^ le64(sec + 16));
    return rrmxmx(keyed, len);
  }
  if (len > 0) {
    const std::uint32_t combined = (static_cast<std::uint32_t>(in[0]) << 16) |
                                   (static_cast<std::uint32_t>(in[len >> 1]) << 24) |
                                   static_cast<std::uint32_t>(in[len - 1]) | (static_cast<std::uint32_t>(len) << 8);
    const std::uint64_t bitflip = le32(sec) ^ le32(sec + 4);
    return xxh64_avalanche(static_cast<std::uint64_t>(combined) ^ bitflip);
  }
  return xxh64_avalanche(le64(sec + 56) ^ le64(sec + 64));
}

// Lengths 17..128.
CULPRIT_HD std::uint64_t hash_17to128(const unsigned char* in, std::size_t len, const unsigned char* sec) {
  std::uint64_t acc = len * kP64_1;
  if (len > 32) {
    if (len > 64) {
      if (len > 96) {
        acc += mix16(in + 48, sec + 96);
        acc += mix16(in + len - 64, sec + 112);
      }
      acc += mix16(in + 32, sec + 64);
      acc += mix16(in + len - 48, sec + 80);
    }
    acc += mix16(in + 16, sec + 32);
    acc += mix16(in + len - 32, sec + 48);
  }
  acc += mix16(in, sec);
  acc += mix16(in + len - 16, sec + 16);
  return avalanche(acc);
}

// Lengths 129..240.
CULPRIT_HD std::uint64_t hash_129to240(const unsigned char* in, std::size_t len, const unsigned char* sec) {
  std::uint64_t acc = len * kP64_1;
  const std::size_t rounds = len / 16;
  for (std::size_t i = 0; i < 8; ++i) acc += mix16(in + 16 * i, sec + 16 * i);
  acc = avalanche(acc);
  for (std::size_t i = 8; i < rounds; ++i) acc += mix16(in + 16 * i, sec + 16 * (i - 8) + 3);
  acc += mix16(in + len - 16, sec + 136 - 17);
  return avalanche(acc);
}

// One 64-byte stripe into the eight accumulators.
CULPRIT_HD void accumulate_512(std::uint64_t* acc, const unsigned char* in, const unsigned char* sec) {
  for (int i = 0; i < 8; ++i) {
    const std::uint64_t v = le64(in + 8 * i);
    const std::uint64_t k = v ^ le64(sec + 8 * i);
    acc[i ^ 1] += v;
    acc[i] += (k & 0xffffffffULL) * (k >> 32);
  }
}
CULPRIT_HD void scramble(std::uint64_t* acc, const unsigned char* sec) {
  for (int i = 0; i < 8; ++i) {
    std::uint64_t a = acc[i];
    a ^= a >> 47;
    a ^= le64(sec + 8 * i);
    acc[i] = a * kP32_1;
  }
}

// The long inputs' last step: the eight accumulators into the hash.
CULPRIT_HD std::uint64_t merge_long(const std::uint64_t* acc, std::size_t len, const unsigned char* sec) {
  std::uint64_t result = len * kP64_1;
  for (int i = 0; i < 4; ++i) result += mul128_fold64(acc[2 * i] ^ le64(sec + 11 + 16 * i), acc[2 * i + 1] ^ le64(sec + 11 + 16 * i + 8));
  return avalanche(result);
}

// Lengths above 240.
CULPRIT_HD std::uint64_t hash_long(const unsigned char* in, std::size_t len, const unsigned char* sec) {
  std::uint64_t acc[8] = {kP32_3, kP64_1, kP64_2, kP64_3, kP64_4, kP32_2, kP64_5, kP32_1};
  const std::size_t stripes_per_block = (kSecretSize - 64) / 8, block = 64 * stripes_per_block;
  const std::size_t blocks = (len - 1) / block;
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t s = 0; s < stripes_per_block; ++s) accumulate_512(acc, in + b * block + 64 * s, sec + 8 * s);
    scramble(acc, sec + kSecretSize - 64);
  }
  const std::size_t stripes = ((len - 1) - block * blocks) / 64;
  for (std::size_t s = 0; s < stripes; ++s) accumulate_512(acc, in + blocks * block + 64 * s, sec + 8 * s);
  accumulate_512(acc, in + len - 64, sec + kSecretSize - 64 - 7);
  return merge_long(acc, len, sec);
}

// The long-input loop split by accumulator lane, for eight GPU threads hashing one chunk together
// (each reads 16 contiguous bytes of every 64-byte stripe: a group's loads coalesce). Lane j of
// accumulate_512 adds word j's 32x32-bit product and word j^1; scramble is per lane. Sums modulo 2^64
// commute, so lane_long(in, len, sec, j) for j = 0..7 followed by merge_long is hash_long exactly
// (common/tests/test_xxh3_chunk.cpp checks every length 241..4096 against libxxhash).
CULPRIT_HD std::uint64_t lane_long(const unsigned char* in, std::size_t len, const unsigned char* sec, int j) {
  std::uint64_t acc = 0;
  switch (j) {  // hash_long's initial accumulators
    case 0: acc = kP32_3; break;
    case 1: acc = kP64_1; break;
    case 2: acc = kP64_2; break;
    case 3: acc = kP64_3; break;
    case 4: acc = kP64_4; break;
    case 5: acc = kP32_2; break;
    case 6: acc = kP64_5; break;
    default: acc = kP32_1; break;
  }
  auto stripe = [&](const unsigned char* p, const unsigned char* k) {
    const std::uint64_t key = le64(p + 8 * j) ^ le64(k + 8 * j);
    acc += le64(p + 8 * (j ^ 1)) + (key & 0xffffffffULL) * (key >> 32);
  };
  const std::size_t stripes_per_block = (kSecretSize - 64) / 8, block = 64 * stripes_per_block;
  const std::size_t blocks = (len - 1) / block;
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t s = 0; s < stripes_per_block; ++s) stripe(in + b * block + 64 * s, sec + 8 * s);
    acc ^= acc >> 47;
    acc ^= le64(sec + kSecretSize - 64 + 8 * j);
    acc *= kP32_1;
  }
  const std::size_t stripes = ((len - 1) - block * blocks) / 64;
  for (std::size_t s = 0; s < stripes; ++s) stripe(in + blocks * block + 64 * s, sec + 8 * s);
  stripe(in + len - 64, sec + kSecretSize - 64 - 7);
  return acc;
}

// XXH3_64bits(in, len) with seed 0 and the default secret.
CULPRIT_HD std::uint64_t hash64(const unsigned char* in, std::size_t len, const unsigned char* sec) {
  if (len <= 16) return hash_0to16(in, len, sec);
  if (len <= 128) return hash_17to128(in, len, sec);
  if (len <= 240) return hash_129to240(in, len, sec);
  return hash_long(in, len, sec);
}

}  // namespace culprit::xxh3
