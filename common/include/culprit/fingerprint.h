// 64-bit fingerprints of tensor bytes (format "fp1", docs/fingerprint.md).
//
// Data fingerprint of n bytes: the bytes are cut into 4096-byte chunks (the last one shorter);
// each chunk is hashed with XXH3-64 (seed 0); the fingerprint is XXH3-64 (seed 0) of the chunk
// hashes written as little-endian uint64. Zero bytes: XXH3-64 of the empty input.
// A set of named tensors is combined by FingerprintSet, see below.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace culprit {

using Fingerprint = std::uint64_t;

constexpr std::size_t kFingerprintChunkBytes = 4096;

// Element types, with the codes that enter set fingerprints and files.
enum class DType : std::uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kInt64 = 2,
  kInt32 = 3,
  kUInt8 = 4,
  kBFloat16 = 5,
  kFloat16 = 6,
  kBool = 7,
};
const char* dtype_name(DType t);
std::size_t dtype_size(DType t);

Fingerprint fingerprint_bytes(const void* data, std::size_t nbytes);
// The last step of fingerprint_bytes: XXH3-64 of the chunk hashes as little-endian uint64 (the GPU
// path hashes the chunks on the device and combines them here). nchunks = 0: the empty input's.
Fingerprint combine_chunk_hashes(const std::uint64_t* hashes, std::size_t nchunks);

// fingerprint_bytes of the whole buffer and of each part (parts[i]: bytes [offsets[i], offsets[i] +
// sizes[i]), in order, inside the buffer) in one pass over memory: each part's chunks are hashed
// while the whole buffer's chunk holding them is still in cache. The values are those of separate
// calls (a flat gradient and its parameters' slices: the trace's grad_fp and param_grad).
Fingerprint fingerprint_with_parts(const void* data, std::size_t nbytes, const std::vector<std::size_t>& offsets,
                                   const std::vector<std::size_t>& sizes, std::vector<Fingerprint>* parts);

// The hash of one chunk (at most kFingerprintChunkBytes): XXH3-64, seed 0. A tensor held in slices
// by several ranks is fingerprinted from its slices' chunk hashes (culprit_harness's shard.h).
std::uint64_t chunk_hash(const void* data, std::size_t nbytes);

// "0123456789abcdef": 16 lowercase hex digits.
std::string fingerprint_hex(Fingerprint fp);

// A fingerprint of an ordered set of named tensors. Each add() appends one record to an XXH3-64
// (seed 0) stream: uint32 LE name length, the name's bytes, uint8 dtype code, uint8 rank,
// rank x int64 LE dimensions, uint64 LE data fingerprint. finish() is the stream's digest.
class FingerprintSet {
 public:
  FingerprintSet();
  ~FingerprintSet();
  FingerprintSet(const FingerprintSet&) = delete;
  FingerprintSet& operator=(const FingerprintSet&) = delete;
  void add(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape,
           Fingerprint data_fp);
  Fingerprint finish() const;

 private:
  void* state_;
};

}  // namespace culprit
