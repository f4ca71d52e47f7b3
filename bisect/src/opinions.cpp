#include "opinions.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace culprit::bisect {

namespace {

// Every device's distinct results: its recomputation (a rank of this world) and its records.
std::map<int, std::set<int>> devices(const Opinions& o) {
  std::map<int, std::set<int>> d;
  for (int r = 0; r < static_cast<int>(o.replay.size()); ++r) d[r].insert(o.replay[r]);
  for (const auto& rec : o.records) d[rec.rank].insert(rec.value);
  for (const auto& rec : o.more) d[rec.rank].insert(rec.value);
  return d;
}

}  // namespace

Settlement settle(const Opinions& o) {
  Settlement s;
  const auto dev = devices(o);
  std::map<int, int> support;  // value -> devices holding it
  for (const auto& [rank, values] : dev)
    for (int v : values) ++support[v];
  int best = 0, best_count = 0;
  for (const auto& [v, n] : support) {
    if (n > best) best = n, best_count = 0;
    if (n == best) ++best_count;
  }
  if (best >= 2 && best_count == 1) {
    for (const auto& [v, n] : support)
      if (n == best) s.healthy = v;
  } else if (best < 2) {
    std::vector<int> consistent;
    for (const auto& [rank, values] : dev)
      if (values.size() == 1) consistent.push_back(rank);
    if (consistent.size() == 1) s.healthy = *dev.at(consistent[0]).begin();
    s.ambiguous = s.healthy < 0 && consistent.size() == 2 && dev.size() == 2;
  }
  if (s.healthy < 0) {
    s.disagree = !s.ambiguous;
    for (const auto& [rank, values] : dev) s.candidates.push_back(rank);
    return s;
  }
  for (const auto& rec : o.records)
    if (rec.value != s.healthy) s.wrong_records.push_back(rec.rank);
  for (int r = 0; r < static_cast<int>(o.replay.size()); ++r)
    if (o.replay[r] != s.healthy) s.wrong_now.push_back(r);
  return s;
}

int arbitrate(double d0, double d1) {
  if (std::isnan(d0) || std::isnan(d1)) return -1;
  const int lo = d1 < d0 ? 1 : 0;
  const double near = lo ? d1 : d0, far = lo ? d0 : d1;
  if (!std::isfinite(near) || near > kRoundingBound) return -1;
  return far >= kFaultFloor && far >= kArbiterGap * near ? lo : -1;
}

}  // namespace culprit::bisect
