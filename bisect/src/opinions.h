// Who computed something wrongly, from every opinion about it: the records (a micro-shard's, written
// by the rank that computed it in the run; an update's, one per rank) and each rank's recomputation
// in the bisection. Pure: value ids
// stand for distinct results (equal ids: bitwise equal results), no MPI, no libtorch.
//
// The rules (docs/bisect.md, "Settling a disagreement"):
//  - an opinion's weight is its device, not its count: the record and the recorder's own
//    recomputation are one device's two opinions;
//  - a device that gave two different results for one computation is faulty (the program is
//    deterministic);
//  - the healthy value is the one held by the most devices, when at least two hold it and no other
//    value has as many; without such a value, a single self-consistent device among self-
//    contradicting ones holds it;
//  - otherwise nobody is blamed: two self-consistent devices disagreeing is an ambiguous pair (one
//    of them is persistently faulty), more is a disagreement among healthy devices.
// Never rank order. An ambiguous pair over a micro-shard may get one more opinion, the float64
// arbiter's (arbitrate below; bisect/src/arbiter.cpp): it counts as a device of its own
// (kArbiterDevice) holding the value it sides with.
#pragma once
#include <vector>

namespace culprit::bisect {

struct Opinions {
  struct Record {
    int rank;   // who wrote it (may be outside this world)
    int value;  // its value id
  };
  std::vector<Record> records;
  std::vector<int> replay;  // per rank of this world: its recomputation's value id
  std::vector<Record> more;  // further recomputations (reruns), by rank: opinions, not records
};

struct Settlement {
  int healthy = -1;             // the healthy value id; -1: none could be told
  std::vector<int> wrong_records;  // ranks whose record differs from the healthy value (empty: the
                                  // run computed this correctly)
  bool ambiguous = false;       // no healthy value, two self-consistent devices disagree
  bool disagree = false;        // no healthy value otherwise
  std::vector<int> wrong_now;   // ranks of this world whose recomputation differs from the healthy value
  std::vector<int> candidates;  // no healthy value: the ranks one of which is faulty
};

Settlement settle(const Opinions& o);

// The float64 recomputation as an opinion: a device of its own in Opinions::more.
constexpr int kArbiterDevice = -2;
// The data source read afresh outside the step, alike on both ranks of a tie over a load
// (localize.cpp: witness_load): a device of its own holding the value of the rank whose load it is.
constexpr int kDataSourceDevice = -3;
// The arbiter measures each device's float32 gradient against the float64 one over the elements
// where the two devices' results differ (relative: ||g32 - g64|| / ||g64|| there). It sides with
// one device when the other's distance is at least kArbiterGap times larger and at least
// kFaultFloor: 2^-16, 256 units in the last place of float32, a deviation that a rounding
// coincidence cannot produce (a flip of a low bit can move a result to within a fraction of an ulp
// of the float64 value: distances of a few ulps decide nothing).
constexpr double kArbiterGap = 64;
constexpr double kFaultFloor = 1.0 / 65536;
// ...and only when the nearer one is within 2^-12 of float64, well inside what float32 rounding
// leaves and far from what a float64 computation that is not the float32 one's twin would (kernels
// that take other paths in float64: its distances decide nothing then).
constexpr double kRoundingBound = 1.0 / 4096;
// Which of two devices' results is healthy from the two distances (infinite: not finite; NaN: no
// distance): 0 or 1, or -1 when they do not tell (as close as each other, both far, the near one
// beyond kRoundingBound, or the far one within rounding). The two float32 computations are the same operations on the same inputs, so
// the healthy one's distance is the computation's own rounding error; a fault's effect cannot make
// the faulty result that much closer than that: it would have to cancel the rounding error of
// every differing element.
int arbitrate(double d0, double d1);

}  // namespace culprit::bisect
