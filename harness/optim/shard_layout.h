// --shard-optimizer (ZeRO-1, docs/determinism.md "Sharded optimizer state"): which slice of the
// flat parameter buffer each rank owns, and the fingerprints of tensors held in slices. No libtorch.
//
// A parameter's fp1 fingerprint is XXH3 over the hashes of its 4 KiB chunks (1024 float32 elements,
// counted from the parameter's first element). Slices are cut only at chunk boundaries (a
// parameter's start, or a multiple of 1024 elements into it), so every chunk lies in one owner's
// slice: each owner hashes its chunks, the ranks gather the hashes (8 bytes per 4 KiB), and every
// rank composes any parameter's fingerprint — the very value an unsharded run computes — and any
// slice's, for any world size.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/mpi_util.h"

namespace culprit::harness {

inline constexpr std::int64_t kChunkElements = static_cast<std::int64_t>(kFingerprintChunkBytes / sizeof(float));

// One fp1 chunk of a float32 parameter: flat elements [begin, end).
struct ParamChunk {
  int param = 0;
  std::int64_t begin = 0, end = 0;
};

class ShardLayout {
 public:
  ShardLayout() = default;
  // offsets, sizes: every parameter's place in the flat buffer (state-dict order, contiguous).
  ShardLayout(const std::vector<std::int64_t>& offsets, const std::vector<std::int64_t>& sizes, int world);
  int world() const { return static_cast<int>(cuts_.size()) - 1; }
  // Rank c owns flat elements [lo(c), hi(c)): the chunk boundary at or below c*P/W starts it.
  std::int64_t lo(int c) const { return cuts_[static_cast<std::size_t>(c)]; }
  std::int64_t hi(int c) const { return cuts_[static_cast<std::size_t>(c) + 1]; }
  const std::vector<std::int64_t>& cuts() const { return cuts_; }
  // Whether rank c owns flat element e.
  bool holds(int c, std::int64_t e) const { return e >= lo(c) && e < hi(c); }
  // The part of flat elements [offset, offset + size) (a parameter) rank c owns: its first element
  // counted from offset, and how many (0, 0: none).
  std::pair<std::int64_t, std::int64_t> part(int c, std::int64_t offset, std::int64_t size) const {
    const std::int64_t a = std::max(lo(c), offset), b = std::min(hi(c), offset + size);
    return a < b ? std::make_pair(a - offset, b - a) : std::make_pair(std::int64_t{0}, std::int64_t{0});
  }
  const std::vector<ParamChunk>& chunks() const { return chunks_; }
  // The chunks of rank c: [first_chunk(c), first_chunk(c + 1)).
  std::size_t first_chunk(int c) const { return first_chunk_[static_cast<std::size_t>(c)]; }
  // Parameter i's chunks: [param_chunk(i), param_chunk(i + 1)).
  std::size_t param_chunk(std::size_t i) const { return param_chunk_[i]; }
  // fp1 of parameter i from every chunk's hash (in chunks() order); a parameter whose chunks all
  // hash to 0 (no state yet) is 0.
  Fingerprint param_fp(const std::vector<std::uint64_t>& hashes, std::size_t i) const;
  // The fingerprint of flat elements [lo, hi) (chunk boundaries): XXH3 over its chunks' hashes.
  Fingerprint slice_fp(const std::vector<std::uint64_t>& hashes, std::int64_t lo, std::int64_t hi) const;

 private:
  std::vector<std::int64_t> cuts_;
  std::vector<ParamChunk> chunks_;
  std::vector<std::size_t> first_chunk_, param_chunk_;
};

// Collective: every chunk's hash, from each rank's hashes of its own chunks (layout.first_chunk
// order). The watchdog bounds the wait.
std::vector<std::uint64_t> gather_chunk_hashes(const Comm& comm, const ShardLayout& layout,
                                               const std::vector<std::uint64_t>& mine, const char* what);

}  // namespace culprit::harness
