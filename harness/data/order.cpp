#include "data/order.h"

#include <stdexcept>
#include <string>

#include "culprit/rng.h"

namespace culprit::harness {

FeistelOrder::FeistelOrder(std::uint64_t seed, std::int64_t epoch, std::int64_t n) : n_(n), h_(1) {
  if (n < 1 || n > kMaxN)
    throw std::invalid_argument("FeistelOrder: n must be in [1, 2^62], got " + std::to_string(n));
  if (epoch < 0) throw std::invalid_argument("FeistelOrder: epoch must be >= 0, got " + std::to_string(epoch));
  // The smallest even width keeps the domain under 4n, so cycle walking costs under 4 passes on
  // average; h >= 1 because a Feistel network needs two non-empty halves (n = 1 walks in 4 values).
  while ((std::uint64_t{1} << (2 * h_)) < static_cast<std::uint64_t>(n)) ++h_;
  mask_ = (std::uint64_t{1} << h_) - 1;
  for (int r = 0; r < kRounds; ++r)
    keys_[r] = key(seed, kStreamShuffle, static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(r));
}

std::uint64_t FeistelOrder::round(int r, std::uint64_t half) const { return splitmix64(half ^ keys_[r]) & mask_; }

// High half L, low half R; round r maps (L, R) to (R, L ^ F_r(R)).
std::uint64_t FeistelOrder::encrypt(std::uint64_t x) const {
  std::uint64_t l = x >> h_, r = x & mask_;
  for (int i = 0; i < kRounds; ++i) {
    const std::uint64_t t = l ^ round(i, r);
    l = r;
    r = t;
  }
  return (l << h_) | r;
}

std::uint64_t FeistelOrder::decrypt(std::uint64_t x) const {
  std::uint64_t l = x >> h_, r = x & mask_;
  for (int i = kRounds - 1; i >= 0; --i) {
    const std::uint64_t t = r ^ round(i, l);
    r = l;
    l = t;
  }
  return (l << h_) | r;
}

// Cycle walking: the network permutes the whole domain; following a value's cycle until it lands
// back in [0, n) restricts that permutation to [0, n), and walking the other way undoes it, because
// every value passed on the way is >= n.
std::int64_t FeistelOrder::sample_at(std::int64_t position) const {
  if (position < 0 || position >= n_)
    throw std::out_of_range("FeistelOrder: position " + std::to_string(position) + " outside [0, " +
                            std::to_string(n_) + ")");
  std::uint64_t x = static_cast<std::uint64_t>(position);
  do x = encrypt(x);
  while (x >= static_cast<std::uint64_t>(n_));
  return static_cast<std::int64_t>(x);
}

std::int64_t FeistelOrder::position_of(std::int64_t sample) const {
  if (sample < 0 || sample >= n_)
    throw std::out_of_range("FeistelOrder: sample " + std::to_string(sample) + " outside [0, " +
                            std::to_string(n_) + ")");
  std::uint64_t x = static_cast<std::uint64_t>(sample);
  do x = decrypt(x);
  while (x >= static_cast<std::uint64_t>(n_));
  return static_cast<std::int64_t>(x);
}

}  // namespace culprit::harness
