// The float64 arbiter: one more opinion on a tie between two devices that each repeat their own
// float32 result for a micro-shard or an update (docs/bisect.md, "Settling a tie"). Private to
// culprit_bisect.
#pragma once
#include <string>

#include "actions.h"

namespace culprit::bisect {

struct Arbitration {
  bool tried = false;
  int healthy = -1;              // the rank of this world whose result is healthy; -1: undecided
  double distance[2] = {0, 0};   // each rank's float32 gradient's relative distance to float64
  std::string why;               // for the evidence: what it found, or why it could not tell
};

// Collective, with a world of two: each rank recomputes micro-shard k in float64 from its input as
// loaded; when both get the same bits, each rank's float32 gradient (`mine`, with its values) is
// measured against it and opinions.h's arbitrate() decides. A failed or disagreeing float64
// recomputation leaves the tie (never an error).
Status arbitrate_shard(Context& ctx, int k, const ShardResult& mine, Arbitration* out);
// Collective, with a world of two, the engine after the step and marked before it: the update
// recomputed in float64 from the marked state; each rank's parameters and primary optimizer state
// after the step measured against it, as above.
Status arbitrate_update(Context& ctx, Arbitration* out);
// Collective, with a world of two, engine as above: the exact referee, tried before the float64
// one. The update re-executed element by element in float32 in libtorch's operation order (any
// correct device gets its bits); both ranks' re-executions must be bitwise equal, and the rank whose
// replayed parameters and primary optimizer state equal it bit for bit, the other's not, is healthy.
// Else no opinion (why says which); never an error.
Status referee_update(Context& ctx, Arbitration* out);

}  // namespace culprit::bisect
