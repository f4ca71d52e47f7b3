// Fault injection's vocabulary: --inject SPEC makes one rank behave like a faulty GPU, link or
// memory. SPEC is a comma list of key=value (docs/detection.md, "Injecting a fault"):
//   step=S rank=R|all layer=NAME index=I
//   phase=forward|backward|grad|comm|param|optimizer|data|lr|rng
//   kind=bitflip|nan|scale|noise|stale|hang bit=0..31 factor=F seconds=T
//   mode=transient|persistent|intermittent p=P
// Parsing and the firing decision live here; where each phase's fault lands is FaultPlan's
// (harness/faults/fault_plan.h).
#pragma once
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "culprit/names.h"
#include "culprit/records.h"  // Phase: a fault's phase is also where a diagnosis places it
#include "culprit/status.h"

namespace culprit::harness {

using culprit::Phase;

// stale: a value that should have been replaced is not (a gradient not zeroed, an update that did not
// land, the previous samples, the previous learning rate or dropout seed). hang: the rank stops
// responding for `seconds` (a stuck device).
enum class FaultKind { kBitflip, kNan, kScale, kNoise, kStale, kHang };
inline constexpr NameRow<FaultKind> kFaultKindNames[] = {{FaultKind::kBitflip, "bitflip"}, {FaultKind::kNan, "nan"},
                                                          {FaultKind::kScale, "scale"},     {FaultKind::kNoise, "noise"},
                                                          {FaultKind::kStale, "stale"},     {FaultKind::kHang, "hang"}};
constexpr NameTable<FaultKind> enum_names(FaultKind) { return {kFaultKindNames, std::size(kFaultKindNames), "kind"}; }

enum class FaultMode { kTransient, kPersistent, kIntermittent };
inline constexpr NameRow<FaultMode> kFaultModeNames[] = {{FaultMode::kTransient, "transient"},
                                                          {FaultMode::kPersistent, "persistent"},
                                                          {FaultMode::kIntermittent, "intermittent"}};
constexpr NameTable<FaultMode> enum_names(FaultMode) { return {kFaultModeNames, std::size(kFaultModeNames), "mode"}; }

struct FaultSpec {
  std::int64_t step = 1;
  int rank = 0;       // -1: every rank (a software bug rather than a device)
  std::string host;   // only on this host (its gethostname()): a faulty node; "" every host
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

// Where a phase's fault lands: on a layer's output as forward calls it (forward, backward), on a
// layer's parameters or what derives from them (grad, comm, param, optimizer), or on no layer (data,
// lr, rng). One place for the whole vocabulary: parsing and the FaultPlan ask here.
bool at_layer_output(Phase p);
bool needs_layer(Phase p);
// The kinds a phase takes beyond bitflip, nan, scale and noise (stale: a value not replaced).
bool takes_stale(Phase p);

// Parses one SPEC. `layers` are the model's layer names (for checking layer=); an unknown key,
// phase, kind, mode or layer is an error listing the valid values.
Status parse_fault(const std::string& text, const std::vector<std::string>& layers, FaultSpec* out);
// What parse_fault checks of a SPEC's form before it knows the model: key=value items separated by
// single commas (no empty item: a trailing or doubled comma is a mistake), known keys, each key
// once, numbers in decimal (0x3, inf, " 3" are refused). BadInput naming the key or the item.
Status check_fault_text(const std::string& text);
// The --inject texts of one run together: each checked as above, and at most kMaxInjectBytes in
// all (they are recorded in run.json, every checkpoint and every trace header; an HDF5 attribute
// has a size limit). Checked before the run directory is touched.
constexpr std::size_t kMaxInjectBytes = 16384;
Status check_fault_texts(const std::vector<std::string>& texts);

// Whether `spec` fires for this computation. `replay` is true when a step is being recomputed
// (transient faults fire only in the original run). `occurrence` distinguishes repeated executions
// of the same computation (intermittent faults draw from (seed, step, occurrence)). `host`: the
// computing process's host name (a spec with host= fires only there).
bool fault_fires(const FaultSpec& spec, int rank, std::int64_t step, bool replay, std::uint64_t seed,
                 std::uint64_t occurrence, const std::string& host = "");

// Applies the fault to one float32 value.
float corrupt_value(const FaultSpec& spec, float v);

}  // namespace culprit::harness
