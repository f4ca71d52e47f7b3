#include "optim/shard_layout.h"

#include <algorithm>
#include <stdexcept>

#include "culprit/watchdog.h"

namespace culprit::harness {

ShardLayout::ShardLayout(const std::vector<std::int64_t>& offsets, const std::vector<std::int64_t>& sizes, int world) {
  std::int64_t total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    param_chunk_.push_back(chunks_.size());
    for (std::int64_t b = 0; b < sizes[i]; b += kChunkElements)
      chunks_.push_back({static_cast<int>(i), offsets[i] + b, offsets[i] + std::min(sizes[i], b + kChunkElements)});
    total = offsets[i] + sizes[i];
  }
  param_chunk_.push_back(chunks_.size());
  // Cut c is the chunk start nearest to c*P/W (the lower one on a tie): slices within half a chunk
  // of equal, never splitting a chunk.
  cuts_.push_back(0);
  first_chunk_.push_back(0);
  std::size_t k = 0;
  for (int c = 1; c < world; ++c) {
    const std::int64_t target = total * c / world;
    while (k + 1 < chunks_.size() && chunks_[k + 1].begin <= target) ++k;
    std::size_t at = k;
    if (k + 1 < chunks_.size() && chunks_[k + 1].begin - target < target - chunks_[k].begin) at = k + 1;
    at = std::max(at, first_chunk_.back());
    cuts_.push_back(at < chunks_.size() ? chunks_[at].begin : total);
    first_chunk_.push_back(std::min(at, chunks_.size()));
  }
  cuts_.push_back(total);
  first_chunk_.push_back(chunks_.size());
}

Fingerprint ShardLayout::param_fp(const std::vector<std::uint64_t>& hashes, std::size_t i) const {
  const std::size_t a = param_chunk_[i], b = param_chunk_[i + 1];
  if (std::all_of(hashes.begin() + a, hashes.begin() + b, [](std::uint64_t h) { return h == 0; })) return 0;
  return combine_chunk_hashes(hashes.data() + a, b - a);
}

Fingerprint ShardLayout::slice_fp(const std::vector<std::uint64_t>& hashes, std::int64_t lo, std::int64_t hi) const {
  auto at = [&](std::int64_t e) {
    return static_cast<std::size_t>(std::lower_bound(chunks_.begin(), chunks_.end(), e,
                                                     [](const ParamChunk& c, std::int64_t v) { return c.begin < v; }) -
                                    chunks_.begin());
  };
  const std::size_t a = at(lo), b = at(hi);
  return combine_chunk_hashes(hashes.data() + a, b - a);
}

std::vector<std::uint64_t> gather_chunk_hashes(const Comm& comm, const ShardLayout& layout,
                                               const std::vector<std::uint64_t>& mine, const char* what) {
  const int W = comm.size;
  std::vector<std::uint64_t> all(layout.chunks().size());
  if (W == 1) {
    if (mine.size() != all.size()) throw std::logic_error("gather_chunk_hashes: one rank holds every chunk");
    return mine;
  }
  std::vector<int> count(W), displ(W);
  for (int c = 0; c < W; ++c) {
    displ[c] = static_cast<int>(layout.first_chunk(c));
    count[c] = static_cast<int>(layout.first_chunk(c + 1) - layout.first_chunk(c));
  }
  if (static_cast<int>(mine.size()) != count[comm.rank]) throw std::logic_error("gather_chunk_hashes: not this rank's chunks");
  CULPRIT_COLLECTIVE(comm, what,
                     MPI_Iallgatherv(mine.data(), count[comm.rank], MPI_UINT64_T, all.data(), count.data(), displ.data(),
                                     MPI_UINT64_T, comm.comm, &_culprit_req));
  return all;
}

}  // namespace culprit::harness
