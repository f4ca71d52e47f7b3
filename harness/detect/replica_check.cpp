#include "detect/replica_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace culprit::harness {

ReplicaCheck compare_replicas(int world, const std::vector<Fingerprint>& all, std::size_t n) {
  ReplicaCheck out;
  if (world == 1) return out;
  // Each rank's set, compared as a whole; a set held by more ranks than any other wins. A tie (1 vs
  // 1 with two ranks) has no winner: rank order is no evidence, so nobody is odd, every rank in the
  // largest groups is a candidate, and the bisection settles it against the record.
  std::map<std::vector<Fingerprint>, int> votes;
  std::vector<std::vector<Fingerprint>> sets(world);
  for (int r = 0; r < world; ++r) {
    sets[r].assign(all.begin() + static_cast<std::ptrdiff_t>(r) * n, all.begin() + static_cast<std::ptrdiff_t>(r + 1) * n);
    votes[sets[r]]++;
  }
  if (votes.size() == 1) return out;
  out.diverged = true;
  int best = 0, holders = 0;
  for (const auto& [set, count] : votes) {
    if (count > best) best = count, holders = 0;
    if (count == best) ++holders;
  }
  const std::vector<Fingerprint>* majority = nullptr;
  for (const auto& [set, count] : votes)
    if (count == best && holders == 1) majority = &set;
  out.tied = majority == nullptr;
  for (int r = 0; r < world; ++r) {
    if (majority ? sets[r] == *majority : votes[sets[r]] != best) continue;
    out.odd_ranks.push_back(r);
  }
  // The first position where the sets differ: from the majority for an odd rank, else among themselves.
  const std::vector<Fingerprint>& ref = majority ? *majority : sets[out.odd_ranks[0]];
  for (std::size_t i = 0; i < n && out.first_index < 0; ++i)
    for (int r = 0; r < world; ++r)
      if (sets[r][i] != ref[i]) {
        out.first_index = static_cast<int>(i);
        break;
      }
  return out;
}

bool SpikeDetector::observe(double v, std::string* why) {
  if (!std::isfinite(v) || window_ <= 0) return false;
  bool spike = false;
  if (static_cast<int>(recent_.size()) >= std::max(4, window_ / 2)) {
    std::vector<double> sorted = recent_;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::vector<double> dev;
    for (double x : recent_) dev.push_back(std::fabs(x - median));
    std::sort(dev.begin(), dev.end());
    const double mad = dev[dev.size() / 2];
    const double z = (v - median) / (1.4826 * mad + 1e-12 * std::max(1.0, std::fabs(median)));
    const double top = long_max();
    if (z > z_ && v > ratio_ * top) {
      spike = true;
      char buf[240];
      std::snprintf(buf, sizeof buf,
                    "%.6g against a median of %.6g (robust z %.1f, %.1fx the maximum %.6g of the last %d values)", v,
                    median, z, v / top, top, window_ * static_cast<int>(block_max_.size() - 1) + in_block_);
      *why = buf;
    }
  }
  if (!spike) remember(v);  // a spike does not become the new normal
  return spike;
}

void SpikeDetector::remember(double v) {
  recent_.push_back(v);
  if (static_cast<int>(recent_.size()) > window_) recent_.erase(recent_.begin());
  if (block_max_.empty() || in_block_ == window_) {
    block_max_.push_back(v);
    in_block_ = 0;
    if (static_cast<int>(block_max_.size()) > kLongWindows) block_max_.erase(block_max_.begin());
  }
  block_max_.back() = std::max(block_max_.back(), v);
  ++in_block_;
}

double SpikeDetector::long_max() const {
  double m = recent_.empty() ? 0 : *std::max_element(recent_.begin(), recent_.end());
  for (double b : block_max_) m = std::max(m, b);
  return m;
}

}  // namespace culprit::harness
