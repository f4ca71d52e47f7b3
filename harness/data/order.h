// The feistel epoch order (`--shuffle feistel`, docs/determinism.md "1. Data order"): which sample
// sits at a position of an epoch, computed on demand instead of stored, so a rank needs no N-element
// permutation to find its micro-shards' samples.
#pragma once
#include <cstdint>

namespace culprit::harness {

// A keyed bijection of [0, n): a balanced Feistel network over the smallest domain 4^h >= n (h >= 1),
// cycle-walked into [0, n). Pure function of (seed, epoch, n, position); statistical shuffling, not
// cryptography.
class FeistelOrder {
 public:
  // Eight rounds. Luby-Rackoff's 3 (4 with inverse queries) hold for an observer of far fewer than
  // 2^(h/2) values; an epoch exposes all 4^h of them with h as small as 1, where that bound says
  // nothing. Patarin's analyses need 5 and more rounds (6 with inverse queries) to stay close to a
  // random permutation up to about 2^h values; 8 leaves a margin for rounds that are a fixed mix
  // rather than random functions, at 8 splitmix64 calls per pass.
  static constexpr int kRounds = 8;
  // The largest n whose domain fits an int64: the next even width, 64 bits, does not.
  static constexpr std::int64_t kMaxN = std::int64_t{1} << 62;

  // Throws std::invalid_argument unless 1 <= n <= kMaxN and epoch >= 0.
  FeistelOrder(std::uint64_t seed, std::int64_t epoch, std::int64_t n);

  // The sample at `position` of the epoch; throws std::out_of_range unless 0 <= position < n.
  std::int64_t sample_at(std::int64_t position) const;
  // The inverse: the position of `sample`; throws std::out_of_range unless 0 <= sample < n.
  std::int64_t position_of(std::int64_t sample) const;

  std::int64_t n() const { return n_; }
  // h: each half of the network is h bits, the domain 4^h.
  int half_bits() const { return h_; }

 private:
  std::uint64_t round(int r, std::uint64_t half) const;
  std::uint64_t encrypt(std::uint64_t x) const;
  std::uint64_t decrypt(std::uint64_t x) const;

  std::int64_t n_;
  int h_;
  std::uint64_t mask_;
  std::uint64_t keys_[kRounds];
};

}  // namespace culprit::harness
