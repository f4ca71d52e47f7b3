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
// Never rank order.
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

}  // namespace culprit::bisect
