// Fault injection: --inject SPEC makes one rank behave like a faulty GPU, link or memory.
// SPEC is a comma list of key=value (docs/fault-injection.md):
//   step=S rank=R|all layer=NAME index=I
//   phase=forward|backward|grad|comm|param|optimizer|data|lr|rng
//   kind=bitflip|nan|scale|noise|stale|hang bit=0..31 factor=F seconds=T
//   mode=transient|persistent|intermittent p=P
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/status.h"

namespace culprit::harness {

enum class Phase { kForward, kBackward, kGrad, kComm, kParam, kOptimizer, kData, kLr, kRng };
// stale: a value that should have been replaced is not (a gradient not zeroed, an update that did not
// land, the previous samples, the previous learning rate or dropout seed). hang: the rank stops
// responding for `seconds` (a stuck device).
enum class FaultKind { kBitflip, kNan, kScale, kNoise, kStale, kHang };
enum class FaultMode { kTransient, kPersistent, kIntermittent };

const char* phase_name(Phase p);
const char* kind_name(FaultKind k);
const char* mode_name(FaultMode m);

struct FaultSpec {
  std::int64_t step = 1;
  int rank = 0;       // -1: every rank (a software bug rather than a device)
  std::string layer;  // a module's dotted name (state-dict prefix); data: unused
  std::int64_t index = 0;
  Phase phase = Phase::kForward;
  FaultKind kind = FaultKind::kBitflip;
  int bit = 30;
  double factor = 1000.0;
  double seconds = 1e9;  // hang: how long
  FaultMode mode = FaultMode::kTransient;
  double p = 0.5;
  std::string text;  // the SPEC as given
};

// Parses one SPEC. `layers` are the model's layer names (for checking layer=); an unknown key,
// phase, kind, mode or layer is an error listing the valid values.
Status parse_fault(const std::string& text, const std::vector<std::string>& layers, FaultSpec* out);

// Whether `spec` fires for this computation. `replay` is true when a step is being recomputed
// (transient faults fire only in the original run). `occurrence` distinguishes repeated executions
// of the same computation (intermittent faults draw from (seed, step, occurrence)).
bool fault_fires(const FaultSpec& spec, int rank, std::int64_t step, bool replay, std::uint64_t seed,
                 std::uint64_t occurrence);

// Applies the fault to one float32 value.
float corrupt_value(const FaultSpec& spec, float v);

}  // namespace culprit::harness
