// Pure checks of the detectors (detectors.h), kept apart so unit tests reach them without a run:
// the replica comparison and the spike detector. No libtorch, no MPI.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/fingerprint.h"

namespace culprit::harness {

// Compares every rank's fingerprint set (all: `world` sets of `n` fingerprints, rank by rank). A set
// held by more ranks than any other wins; the ranks whose set differs from it are "odd". With no
// such set (a tie: 1 vs 1 with two ranks, 2 vs 2 with four), `tied` is set and odd_ranks lists the
// ranks of the largest groups: one of them is wrong, and rank order does not say which.
// first_index is the first position (in the set's order) where the sets differ.
struct ReplicaCheck {
  bool diverged = false;
  bool tied = false;
  std::vector<int> odd_ranks;
  int first_index = -1;
};
ReplicaCheck compare_replicas(int world, const std::vector<Fingerprint>& all, std::size_t n);

// Spikes in a series (loss, gradient norm): a robust z-score over the last `window` values
// (median and MAD) above `z`, guarded by a ratio: the value must also exceed `ratio` times the
// largest value of the last kLongWindows windows (the long horizon). The horizon is what keeps
// long clean runs quiet: a converged model's per-batch loss and gradient norm jump by 10x from one
// batch to the next (a hard batch after easy ones) without ever exceeding what the run saw a few
// hundred steps before; a fault's spike (an exponent bit, a scaled gradient) exceeds it by orders
// of magnitude (docs/detection.md, bench/soak.py). Needs half a window of history. Non-finite
// values are the nonfinite detector's and are not added; nor is a spike.
class SpikeDetector {
 public:
  static constexpr int kLongWindows = 250;
  void configure(int window, double z, double ratio) { window_ = window, z_ = z, ratio_ = ratio; }
  bool observe(double v, std::string* why);

 private:
  void remember(double v);
  double long_max() const;

  int window_ = 0;
  double z_ = 8, ratio_ = 3;
  std::vector<double> recent_;
  std::vector<double> block_max_;  // the maximum of each of the last kLongWindows blocks of `window` values
  int in_block_ = 0;               // values in the newest block
};

}  // namespace culprit::harness
