#include "culprit/compare.h"

#include "culprit/math_libraries.h"

#include <cstdio>
#include <cstring>

namespace culprit::replay {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string float_bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(v), u);
  return buf;
}

namespace {

std::string xor_bits(float a, float b) {
  std::uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%08x", x ^ y);
  return buf;
}

std::string module_of(const std::string& param) {
  const auto dot = param.rfind('.');
  return dot == std::string::npos ? param : param.substr(0, dot);
}

}  // namespace

// ---- micro-shards ----

Phase ShardDifference::phase() const {
  switch (where) {
    case ShardWhere::kInput: return Phase::kData;
    case ShardWhere::kForward: return Phase::kForward;
    case ShardWhere::kBackward: return Phase::kBackward;
    default: return Phase::kGrad;
  }
}

std::string ShardDifference::layer() const {
  if (where == ShardWhere::kForward || where == ShardWhere::kBackward) return name;
  if (where == ShardWhere::kParamGrad) return module_of(name);
  return "";
}

std::string ShardDifference::describe() const {
  switch (where) {
    case ShardWhere::kNone: return "";
    case ShardWhere::kInput:
      return "first in the input samples as loaded (fingerprint " + fingerprint_hex(got) + ", recorded " +
             fingerprint_hex(want) + ")";
    case ShardWhere::kForward: return "first in the forward output of layer " + name;
    case ShardWhere::kBackward: return "first in the gradient flowing back into layer " + name;
    case ShardWhere::kParamGrad: return "first in the gradient of parameter '" + name + "'";
    case ShardWhere::kLeaf:
      return "in the micro-shard gradient (fingerprint " + fingerprint_hex(got) + ", recorded " + fingerprint_hex(want) +
             ")";
    case ShardWhere::kLoss:
      return "in the loss: replayed " + float_bits(got_loss) + ", recorded " + float_bits(want_loss) + ", bits " +
             xor_bits(got_loss, want_loss) + " differ";
  }
  return "";
}

ShardDifference first_difference(const ShardResult& got, const ShardResult& want, const std::vector<std::string>& layers,
                                 const std::vector<std::string>& params, bool compare_layers) {
  ShardDifference d;
  auto at = [&](ShardWhere w, std::string name = std::string()) {
    d.where = w;
    d.name = std::move(name);
    return d;
  };
  d.got_loss = got.loss;
  d.want_loss = want.loss;
  if (got.input_fp != want.input_fp) {
    d.got = got.input_fp, d.want = want.input_fp;
    return at(ShardWhere::kInput);
  }
  if (compare_layers && got.fwd.size() == want.fwd.size() && got.fwd.size() == layers.size() &&
      got.bwd.size() == want.bwd.size() && got.bwd.size() == layers.size()) {
    // A record's 0 is a layer it did not record: another tensor-parallel rank's chunk (a group
    // member's row missing, trace::merged_view) or a backward-only entry's forward slot.
    for (std::size_t i = 0; i < layers.size(); ++i)
      if (want.fwd[i] != 0 && got.fwd[i] != want.fwd[i]) return at(ShardWhere::kForward, layers[i]);
    for (std::size_t i = layers.size(); i-- > 0;)
      if (want.bwd[i] != 0 && got.bwd[i] != want.bwd[i]) return at(ShardWhere::kBackward, layers[i]);
  }
  if (compare_layers && got.param_grad.size() == want.param_grad.size())
    for (std::size_t i = 0; i < got.param_grad.size() && i < params.size(); ++i)
      if (got.param_grad[i] != want.param_grad[i]) return at(ShardWhere::kParamGrad, params[i]);
  if (got.grad_fp != want.grad_fp) {
    d.got = got.grad_fp, d.want = want.grad_fp;
    return at(ShardWhere::kLeaf);
  }
  if (!same_bits(got.loss, want.loss)) return at(ShardWhere::kLoss);
  return ShardDifference();
}

bool same_result(const ShardResult& a, const ShardResult& b) {
  return a.grad_fp == b.grad_fp && same_bits(a.loss, b.loss) && a.input_fp == b.input_fp && a.fwd == b.fwd &&
         a.bwd == b.bwd && a.param_grad == b.param_grad;
}

// ---- updates ----

std::string UpdateDifference::describe() const {
  switch (where) {
    case UpdateWhere::kNone: return "";
    case UpdateWhere::kReducedGradient:
      return "the reduced gradient differs (fingerprint " + fingerprint_hex(got) + ", recorded " + fingerprint_hex(want) +
             ")";
    case UpdateWhere::kParameter:
      return "parameter '" + param + "' differs after the update" +
             (owner >= 0 ? " (in the slice rank " + std::to_string(owner) + " updated: --shard-optimizer)" : "");
    case UpdateWhere::kSlice:
      return "the slice rank " + std::to_string(owner) +
             " updated (--shard-optimizer: its parameters or optimizer state) differs from the replay's";
    case UpdateWhere::kLoss:
      return "the step's loss differs: replayed " + float_bits(got_loss) + ", recorded " + float_bits(want_loss);
  }
  return "";
}

int first_differing_param(const std::vector<Fingerprint>& got, const std::vector<Fingerprint>& want) {
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i]) return static_cast<int>(i);
  return -1;
}

UpdateDifference update_difference(const StepResult& got, const trace::StepRow& want, const std::vector<std::string>& params) {
  UpdateDifference d;
  d.got_loss = got.loss;
  d.want_loss = want.loss;
  if (got.grad_fp != want.grad_fp) {
    d.where = UpdateWhere::kReducedGradient;
    d.got = got.grad_fp, d.want = want.grad_fp;
    return d;
  }
  const int i = first_differing_param(got.param_fps, want.param_fps);
  if (i >= 0 && static_cast<std::size_t>(i) < params.size()) {
    d.where = UpdateWhere::kParameter;
    d.param = params[i];
    d.got = got.param_fps[i], d.want = want.param_fps[i];
    return d;
  }
  if (!same_bits(got.loss, want.loss)) d.where = UpdateWhere::kLoss;
  return d;
}

void check_slices(const harness::Engine& engine, const trace::RunTrace& rec, std::int64_t step, UpdateDifference* d) {
  for (int r : rec.ranks) {
    auto it = rec.steps.find({r, step});
    if (it == rec.steps.end() || !it->second.shard) continue;
    const trace::SliceRecord& want = *it->second.shard;
    const trace::SliceRecord got = engine.slice_record(want.lo, want.hi);
    if (got == want) continue;
    d->owner = r;
    if (!*d) {
      d->where = UpdateWhere::kSlice;
      d->got = got.optimizer != want.optimizer ? got.optimizer : got.params;
      d->want = got.optimizer != want.optimizer ? want.optimizer : want.params;
    }
    return;
  }
}

// ---- steps ----

Schema schema_of(const harness::Engine& engine, const trace::RunTrace& rec) {
  Schema s;
  s.layers = engine.layers();
  s.params = engine.params();
  s.layers_recorded = rec.header.level == trace::Level::kLayer && rec.header.layers == s.layers;
  return s;
}

StepComparison compare_step(const StepResult& got, const trace::RunTrace& rec, const Schema& schema,
                            const harness::Engine* engine) {
  StepComparison out;
  for (const auto& r : got.shards) {
    auto it = rec.shards.find({r.step, r.shard});
    if (it == rec.shards.end()) continue;
    const auto d = first_difference(r, harness::shard_result(it->second), schema.layers, schema.params,
                                    schema.layers_recorded);
    if (d) out.shards.push_back({r.shard, it->second.rank, it->second.host, d});
  }
  if (const trace::StepRow* row = rec.step(got.step)) out.update = update_difference(got, *row, schema.params);
  if (engine) check_slices(*engine, rec, got.step, &out.update);
  return out;
}

// ---- opening a run ----

Status load_run(const std::string& run_dir, const Comm& comm, RunRecord* out) {
  CULPRIT_RETURN_IF_ERROR(agree(comm, harness::load_run_config(run_dir, &out->cfg)));
  CULPRIT_RETURN_IF_ERROR(agree(comm, harness::check_math_libraries(run_dir, "replaying its steps")));
  CULPRIT_RETURN_IF_ERROR(agree(comm, harness::stored_run_id(run_dir, &out->cfg.run_id)));
  return agree(comm, trace::read_run(run_dir, &out->trace, out->cfg.run_id));
}

namespace {

// The steps a replay from checkpoint `from` recomputes must get the learning rates the run used: a
// script whose schedule now gives others (edited in a module it imports, or a schedule that reads
// the clock) would replay another run. Format 6 traces record every group's rates (lrs_fp).
Status check_schedule(const RunRecord& run, std::int64_t from, harness::Engine& engine) {
  for (const auto& [key, row] : run.trace.steps) {
    if (key.first != run.trace.ranks.front() || row.step <= from || row.lrs_fp == 0) continue;
    std::vector<double> lrs;
    CULPRIT_RETURN_IF_ERROR(engine.learning_rates(row.step, &lrs));
    if (fingerprint_bytes(lrs.data(), lrs.size() * sizeof(double)) == row.lrs_fp) continue;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", lrs.empty() ? 0.0 : lrs[0]);
    char rec[64];
    std::snprintf(rec, sizeof rec, "%.9g", row.lr);
    return Status::BadInput("the learning-rate schedule now gives step " + std::to_string(row.step) +
                            " other rates than the run used (group 0: " + buf + ", recorded " + rec + ", over " +
                            std::to_string(lrs.size()) + " groups): a replay would not reproduce the run; restore the "
                            "script's schedule (and the modules it imports) as trained");
  }
  return Status::OK();
}

}  // namespace

Status open_engine_before(const RunRecord& run, const Comm& comm, std::int64_t before, ckpt::Pick pick,
                          bool layer_trace, int rotate, std::unique_ptr<harness::Engine>* engine, std::string* path,
                          std::int64_t at_least) {
  ckpt::Checkpoint start;
  CULPRIT_RETURN_IF_ERROR(ckpt::find_valid(comm, run.cfg.run_dir, before, pick, &start, path, at_least));
  CULPRIT_RETURN_IF_ERROR(harness::Engine::open(run.cfg, comm, start, *path, layer_trace, engine, rotate));
  return agree(comm, check_schedule(run, start.step, **engine));
}



std::int64_t first_replayable(const trace::RunTrace& rec) {
  return rec.first_step > 1 ? rec.first_step - 1 : 0;
}

}  // namespace culprit::replay
