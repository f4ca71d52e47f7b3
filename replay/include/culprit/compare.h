// Comparing recomputations with each other and with the run's record: what culprit replay, audit and
// bisect share. Differences are structured (where, which layer or parameter, both values), rendered
// for people by describe(); no caller reads a description back.
#pragma once
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "culprit/checkpoint.h"
#include "culprit/engine.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/names.h"
#include "culprit/records.h"
#include "culprit/status.h"
#include "culprit/trace.h"

namespace culprit::replay {

using harness::ShardResult;
using harness::StepResult;

bool same_bits(float a, float b);
// "0.693147182 (0x3f317218)".
std::string float_bits(float v);

// Where a micro-shard's computation first differs from a reference, in execution order: the input
// as loaded, each layer's forward output, the gradients flowing back (backward order), each
// parameter's gradient, the gradient leaf, the loss.
enum class ShardWhere { kNone, kInput, kForward, kBackward, kParamGrad, kLeaf, kLoss };
inline constexpr NameRow<ShardWhere> kShardWhereNames[] = {
    {ShardWhere::kNone, ""},          {ShardWhere::kInput, "input"},   {ShardWhere::kForward, "forward"},
    {ShardWhere::kBackward, "backward"}, {ShardWhere::kParamGrad, "param-grad"}, {ShardWhere::kLeaf, "leaf"},
    {ShardWhere::kLoss, "loss"}};
constexpr NameTable<ShardWhere> enum_names(ShardWhere) { return {kShardWhereNames, std::size(kShardWhereNames), "place"}; }
struct ShardDifference {
  ShardWhere where = ShardWhere::kNone;
  std::string name;               // the layer (forward, backward) or parameter (param grad)
  Fingerprint got = 0, want = 0;  // input, leaf
  float got_loss = 0, want_loss = 0;
  explicit operator bool() const { return where != ShardWhere::kNone; }
  Phase phase() const;        // where --inject would put it: data, forward, backward or grad
  std::string layer() const;  // the layer, or the parameter's module; "" for input, leaf and loss
  std::string describe() const;
};
// compare_layers: compare per-layer and per-parameter fingerprints (when both have them).
ShardDifference first_difference(const ShardResult& got, const ShardResult& want, const std::vector<std::string>& layers,
                                 const std::vector<std::string>& params, bool compare_layers);
// Two computations agree in every fingerprint: input, layers, parameter gradients, leaf, loss. (A
// fault can change a layer's gradient yet be absorbed before the leaf: the layers count too.)
bool same_result(const ShardResult& a, const ShardResult& b);

// Where a step's update first differs from its record.
// kSlice: --shard-optimizer, a rank's slice (its parameters after the update or its optimizer
// state) differs from the replay's, though no parameter does yet (an optimizer fault).
enum class UpdateWhere { kNone, kReducedGradient, kParameter, kLoss, kSlice };
inline constexpr NameRow<UpdateWhere> kUpdateWhereNames[] = {{UpdateWhere::kNone, ""},
                                                              {UpdateWhere::kReducedGradient, "reduced-gradient"},
                                                              {UpdateWhere::kParameter, "parameter"},
                                                              {UpdateWhere::kLoss, "loss"},
                                                              {UpdateWhere::kSlice, "slice"}};
constexpr NameTable<UpdateWhere> enum_names(UpdateWhere) {
  return {kUpdateWhereNames, std::size(kUpdateWhereNames), "place"};
}
// The first parameter (state-dict order) whose fingerprint differs; -1: none.
int first_differing_param(const std::vector<Fingerprint>& got, const std::vector<Fingerprint>& want);
struct UpdateDifference {
  UpdateWhere where = UpdateWhere::kNone;
  std::string param;  // kParameter
  Fingerprint got = 0, want = 0;
  float got_loss = 0, want_loss = 0;
  int owner = -1;  // --shard-optimizer: the rank whose recorded slice differs (it computed it)
  explicit operator bool() const { return where != UpdateWhere::kNone; }
  std::string describe() const;
};
UpdateDifference update_difference(const StepResult& got, const trace::StepRow& want, const std::vector<std::string>& params);
// --shard-optimizer: each rank's recorded slice of step `step` (trace::StepRow::shard) against the
// engine's, which has just replayed that step; the first rank whose slice differs becomes the
// difference's owner (and the difference, kSlice, when there was none).
void check_slices(const harness::Engine& engine, const trace::RunTrace& rec, std::int64_t step, UpdateDifference* d);

// A replayed step against the run's record: every micro-shard this rank computed, then the update.
struct ShardMismatch {
  int shard = 0;
  int recorded_by = 0;
  std::string host;  // of the recording rank
  ShardDifference diff;
};
struct StepComparison {
  std::vector<ShardMismatch> shards;
  UpdateDifference update;
  bool ok() const { return shards.empty() && !update; }
};
// What the engine and the record are compared by: the run's layers and parameters, and whether the
// trace recorded per-layer fingerprints of those layers.
struct Schema {
  std::vector<std::string> layers, params;
  bool layers_recorded = false;
};
Schema schema_of(const harness::Engine& engine, const trace::RunTrace& rec);
// engine: the engine that replayed the step (its slices are checked; null: not).
StepComparison compare_step(const StepResult& got, const trace::RunTrace& rec, const Schema& schema,
                            const harness::Engine* engine = nullptr);

// The run a replay works on: its configuration and every rank's trace.
struct RunRecord {
  harness::TrainConfig cfg;
  trace::RunTrace trace;
};
// Collective: reads RUN/run.json and the trace, agreed.
Status load_run(const std::string& run_dir, const Comm& comm, RunRecord* out);

// Collective: the engine opened from the newest (or oldest) valid checkpoint before step `before`,
// read and verified once (ckpt::find_valid) and handed to Engine::open as it is. *path names it.
// Only checkpoints of step >= `at_least` are candidates.
Status open_engine_before(const RunRecord& run, const Comm& comm, std::int64_t before, ckpt::Pick pick,
                          bool layer_trace, int rotate, std::unique_ptr<harness::Engine>* engine, std::string* path,
                          std::int64_t at_least = 0);
// The oldest step a replay can start from and find a record of every step it replays: the step
// before the trace's first (a --trace-keep run has retired older rows), or 0.
std::int64_t first_replayable(const trace::RunTrace& rec);

}  // namespace culprit::replay
