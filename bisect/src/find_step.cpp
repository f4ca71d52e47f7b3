// kFindStep: the first step whose replay disagrees with the record. Each step's micro-shards are
// recomputed on a rank other than the one that recorded them (a persistent fault would otherwise
// reproduce itself), then its update as the run did it. The rotated engine does both in one
// run_step; only where this world puts a micro-shard back on its recording rank is it computed once
// more, on the next rank.
#include <algorithm>
#include <cmath>

#include "actions.h"

namespace culprit::bisect {

namespace {

// One replayed step against the record, on this rank: the first differing micro-shard and the map's
// rows (input, layers, leaf).
struct StepCheck {
  std::vector<int> bad;  // per micro-shard: 1 where it differs
  std::vector<int> rows;
};

void compare_shard(const Context& ctx, const ShardResult& r, const trace::ShardRow& row, StepCheck* c) {
  const ShardResult want = harness::shard_result(row);
  if (replay::first_difference(r, want, ctx.schema.layers, ctx.schema.params, ctx.schema.layers_recorded))
    c->bad[r.shard] = 1;
  // A tensor-parallel group's every rank's record (a fault can show in one rank's copy only).
  for (std::size_t m = 0; m < row.group.size() && !c->bad[r.shard]; ++m)
    if (replay::first_difference(r, harness::shard_result(trace::merged_view(row.group, m)), ctx.schema.layers,
                                 ctx.schema.params, ctx.schema.layers_recorded))
      c->bad[r.shard] = 1;
  c->rows[0] |= r.input_fp != want.input_fp;
  const std::size_t nl = ctx.schema.layers.size();
  for (std::size_t i = 0; ctx.layer && i < nl && i < r.fwd.size() && i < want.fwd.size(); ++i) {
    c->rows[1 + i] |= r.fwd[i] != want.fwd[i];
    c->rows[1 + nl + (nl - 1 - i)] |= r.bwd[i] != want.bwd[i];
  }
  c->rows[c->rows.size() - 2] |= r.grad_fp != want.grad_fp || !replay::same_bits(r.loss, want.loss);
}

// Local: the micro-shards of step t that this world's layout puts back on their recording rank,
// computed here when this rank is the next one.
Status replay_returned_shards(Context& ctx, std::int64_t t, StepCheck* c) {
  const auto& shards = ctx.run.trace.shards;
  for (int k = 0; k < ctx.M; ++k) {
    auto it = shards.find({t, k});
    if (it == shards.end()) continue;
    const int rr = it->second.rank;
    if (harness::Engine::replay_rank(k, ctx.M, ctx.W, 1) != rr || (rr + 1) % ctx.W != ctx.comm.rank) continue;
    ShardResult r;
    CULPRIT_RETURN_IF_ERROR(ctx.engine->compute_shard(k, ctx.round, &r));
    compare_shard(ctx, r, it->second, c);
  }
  return Status::OK();
}

// Collective: step t's micro-shards, each on a rank that did not record it; *sr: the update.
Status replay_shards(Context& ctx, std::int64_t t, StepCheck* c, StepResult* sr) {
  const auto& shards = ctx.run.trace.shards;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, replay_returned_shards(ctx, t, c)));
  CULPRIT_RETURN_IF_ERROR(ctx.engine->run_step(sr, ctx.round));
  // Every micro-shard this step computed is compared, also one back on its recording rank (that one
  // was recomputed on the next rank too, above): a device firing during the search shows here as a
  // micro-shard, not as an update nobody can explain.
  for (const auto& r : sr->shards) {
    auto it = shards.find({t, r.shard});
    if (it != shards.end()) compare_shard(ctx, r, it->second, c);
  }
  return Status::OK();
}

// Collective: the replayed update against every rank's record of step t, agreed (a rank's own replay
// can differ from the others': a fault at rest reappearing there; every rank then takes the lowest
// differing rank's account).
Finding::Update compare_update(const Context& ctx, std::int64_t t, const StepResult& sr) {
  Finding::Update u;
  const auto& params = ctx.schema.params;
  for (int r : ctx.run.trace.ranks) {
    auto it = ctx.run.trace.steps.find({r, t});
    if (it == ctx.run.trace.steps.end()) continue;
    const bool reduced = it->second.grad_fp != sr.grad_fp;
    u.reduced = u.reduced || reduced;
    const int i = replay::first_differing_param(ctx.update_state(sr.param_fps, sr.opt_fps),
                                                ctx.update_state(it->second.param_fps, it->second.opt_fps));
    // A differing reduced gradient is named by the parameter whose slice of it differs (trace
    // format 4): with --clip-grad-norm one wrong slice changes the clip factor and so every
    // parameter's update, so the first updated parameter that differs would name the wrong layer.
    const int j = reduced && !it->second.reduced_fps.empty()
                      ? replay::first_differing_param(ctx.engine->reduced_param_fps(), it->second.reduced_fps)
                      : -1;
    if (u.param.empty() && j >= 0 && static_cast<std::size_t>(j) < params.size()) {
      u.param = params[j];
      u.from_reduced = true;
      u.absorbed = i < 0;
      u.param_rank = r;
    } else if (u.param.empty() && i >= 0 && !params.empty()) {
      u.param = params[i % params.size()];
      u.optimizer = static_cast<std::size_t>(i) >= params.size();
      u.param_rank = r;
    }
  }
  int differs = u.reduced || !u.param.empty();
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &differs, 1, MPI_INT, MPI_MAX, ctx.comm.comm, &_culprit_req));
  if (!differs) return Finding::Update();
  int from = (u.reduced || !u.param.empty()) ? ctx.comm.rank : ctx.W;
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &from, 1, MPI_INT, MPI_MIN, ctx.comm.comm, &_culprit_req));
  int flags[5] = {u.optimizer, u.reduced, u.param_rank, u.from_reduced, u.absorbed};
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Ibcast(flags, 5, MPI_INT, from, ctx.comm.comm, &_culprit_req));
  u.optimizer = flags[0] != 0;
  u.reduced = flags[1] != 0;
  u.param_rank = flags[2];
  u.from_reduced = flags[3] != 0;
  u.absorbed = flags[4] != 0;
  u.param = broadcast_string(ctx.comm, u.param, from);
  u.replayed_by = from;
  return u;
}

// Nothing differed: a recorded NaN/Inf or spike that reproduced bitwise is the model's own.
void nothing_differs(Context& ctx, Finding* f, Evidence* ev) {
  std::int64_t bad = -1;
  for (const auto& [key, row] : ctx.run.trace.steps)
    if (!std::isfinite(row.loss) && (bad < 0 || key.second < bad)) bad = key.second;
  const auto* first = ctx.first;
  if (bad < 0 && first && (first->detector == Detector::kNonfinite || first->detector == Detector::kSpike))
    bad = first->step;
  if (ctx.searching_back) return;  // the search before a recurring finding says what it found itself
  if (bad > 0) {
    ev->nonfinite_reproduced = true;
    f->step = bad;
    ctx.note("every replayed step reproduced the record bitwise, including the " +
             std::string(first ? name_of(first->detector) : "nonfinite") + " at step " + std::to_string(bad));
  } else {
    ctx.note("every replayed step reproduced the record bitwise (" + std::to_string(ctx.d->steps_replayed) + " steps)" +
             (first ? "; the " + std::string(name_of(first->detector)) + " incident of step " +
                          std::to_string(first->step) + " left no trace in the results"
                    : ""));
  }
}

// Every step reproduced: the data it read may still not be the data that was prepared. The samples
// of the step in question (a reproduced NaN or spike, the first incident; else every step the
// search examined) against the data file's record (docs/data.md); each rank reads the same file,
// and the first changed sample is agreed.
Status check_data(Context& ctx, Finding* f, Evidence* ev) {
  if (ctx.searching_back) return Status::OK();
  if (!data_record_everywhere(ctx)) return Status::OK();
  if (!ctx.engine) {  // the search is over: an engine for the run's sample order and data
    std::string path;
    CULPRIT_RETURN_IF_ERROR(open_from(&ctx, ckpt::kAnyStep, ckpt::Pick::kOldest, &path));
  }
  std::vector<std::int64_t> steps;
  if (f->step > 0) steps.push_back(f->step);
  else if (ctx.first && ctx.first->step > 0) steps.push_back(ctx.first->step);
  else
    for (const auto& r : coverage(ctx, -1).examined)
      for (std::int64_t t = r.from; t <= r.to; ++t) steps.push_back(t);
  // The micro-shards of a step in the order of their recorded loss, the worst first (a damaged
  // sample shows in its micro-shard's loss): of several changed samples, the first is named.
  std::vector<std::int64_t> samples, step_of;
  for (std::int64_t t : steps) {
    std::vector<std::pair<double, int>> order;
    for (int k = 0; k < ctx.M; ++k) {
      auto row = ctx.run.trace.shards.find({t, k});
      const double loss = row == ctx.run.trace.shards.end() ? 0.0 : row->second.loss;
      order.push_back({std::isfinite(loss) ? -loss : -INFINITY, k});
    }
    std::stable_sort(order.begin(), order.end());
    for (const auto& [loss, k] : order)
      for (std::int64_t i : ctx.engine->shard_samples_of(t, k)) samples.push_back(i), step_of.push_back(t);
  }
  std::vector<harness::ChangedSample> changed;
  std::string skipped;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->changed_samples(samples, &changed, &skipped)));
  if (!skipped.empty()) ctx.note(skipped);
  // changed_samples keeps the order it was given: the first is the worst micro-shard's.
  std::int64_t at = changed.empty() ? INT64_MAX
                                    : std::find(samples.begin(), samples.end(), changed[0].sample) - samples.begin();
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &at, 1, MPI_INT64_T, MPI_MIN, ctx.comm.comm, &_culprit_req));
  if (at == INT64_MAX) return Status::OK();
  const std::int64_t first = samples[static_cast<std::size_t>(at)];
  ev->data_changed = true;
  f->sample = first;
  f->step = step_of[static_cast<std::size_t>(at)];
  f->blamed = -1;
  const harness::ChangedSample c = changed.empty() ? harness::ChangedSample{} : changed[0];
  ctx.engine->sample_location(first, &f->sample_file, &f->sample_offset);
  ctx.note("sample " + std::to_string(first) + " of step " + std::to_string(f->step) + " (" + c.where +
           ") lies in bytes " + std::to_string(c.block_offset) + ".." + std::to_string(c.block_offset + c.block_bytes) +
           " of the data file, which changed since prepare-data recorded it (" + std::to_string(changed.size()) +
           " sample(s) of the step(s) in question are in changed blocks): the run trained on a damaged data file");
  return Status::OK();
}

}  // namespace

std::string Finding::Update::describe() const {
  std::string out = reduced ? "reduced gradient" : "";
  if (from_reduced)
    return out + " in the slice of " + param + (param_rank >= 0 ? " in the record of rank " + std::to_string(param_rank) : "") +
           (absorbed ? "; the update absorbed it" : "");
  if (!param.empty())
    out += (out.empty() ? "" : ", ") + std::string(optimizer ? "the optimizer state of parameter " : "parameter ") + param +
           (param_rank >= 0 ? " in the record of rank " + std::to_string(param_rank) : "");
  return out;
}

namespace {

void examined(Context& ctx, std::int64_t t) {
  auto& e = ctx.examined;
  if (!e.empty() && e.back().to + 1 == t) e.back().to = t;
  else if (e.empty() || e.back().to != t) e.push_back({t, t, ""});
}

// Replays step t against the record; true when it does not reproduce (*f then holds where).
Status check_step(Context& ctx, std::int64_t t, Finding* f, bool* differs) {
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->mark()));
  StepCheck c{std::vector<int>(ctx.M, 0), std::vector<int>(ctx.map.rows.size(), 0)};
  StepResult sr;
  CULPRIT_RETURN_IF_ERROR(replay_shards(ctx, t, &c, &sr));
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, c.bad.data(), ctx.M, MPI_INT, MPI_MAX, ctx.comm.comm, &_culprit_req));
  std::vector<int> bad;
  for (int k = 0; k < ctx.M; ++k)
    if (c.bad[k]) bad.push_back(k);
  ++ctx.d->steps_replayed;
  examined(ctx, t);
  Finding::Update u = compare_update(ctx, t, sr);
  // A message that changed on its way in this replay is a difference even when the reduced
  // gradient comes out as recorded (a persistent link fault writing the same NaN again).
  if (!sr.comm_faults.empty() && !u.reduced && u.param.empty()) {
    u.reduced = true;
    u.replayed_by = sr.comm_faults[0].first;
  }
  // So is a step whose messages the run's own comm check saw change (the incident): its record is
  // wrong even when this replay reproduces it exactly (the same device firing again where no
  // message crosses in this layout, e.g. in the chunk it reduces itself).
  const auto* first = ctx.first;
  if (first && first->step == t && first->detector == Detector::kComm && ctx.incident_refuted != t && !u.reduced &&
      u.param.empty()) {
    u.reduced = true;
    u.from_incident = true;
    u.replayed_by = -1;  // nobody in this bisection replayed it differently
  }
  const bool update_differs = u.reduced || !u.param.empty();
  c.rows.back() = update_differs;
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, c.rows.data(), static_cast<int>(c.rows.size()), MPI_INT, MPI_MAX, ctx.comm.comm, &_culprit_req));
  // A step redone after a fault in the bisection's own replay replaces its row of the map.
  if (!ctx.map.steps.empty() && ctx.map.steps.back() == t) {
    ctx.map.cells.back() = c.rows;
  } else {
    ctx.map.steps.push_back(t);
    ctx.map.cells.push_back(c.rows);
  }
  *differs = !bad.empty() || update_differs;
  if (!*differs) return Status::OK();
  f->step = t;
  f->bad_shards = bad;
  f->bad_shard = bad.empty() ? -1 : bad[0];
  f->update = u;
  std::string which;
  for (int k : bad) which += (which.empty() ? "" : ", ") + std::to_string(k);
  ctx.note("step " + std::to_string(t) + " does not reproduce: " +
           (!bad.empty() ? "micro-shard(s) " + which + " differ" : "its update differs (" + u.describe() + ")"));
  return agree(ctx.comm, ctx.engine->rewind());
}

// How often the bisection's own replay of one step may be found faulty before the step is given up.
constexpr int kMaxRedos = 32;

int redos(const Context& ctx, std::int64_t t) {
  auto it = ctx.redone.find(t);
  return it == ctx.redone.end() ? 0 : it->second;
}

}  // namespace

bool recorded(const Context& ctx, std::int64_t t) {
  if (!ctx.run.trace.step(t)) return false;
  for (int k = 0; k < ctx.M; ++k)
    if (!ctx.run.trace.shards.count({t, k})) return false;
  return true;
}

Status find_step(Context& ctx, Finding* f, Evidence* ev) {
  const std::int64_t last = ctx.run.trace.last_step;
  for (;;) {
    // The first part runs to the end of the trace; the second up to where the first started.
    const std::int64_t to = ctx.segment == 0 ? last : ctx.start;
    while (ctx.engine->step() < to) {
      const std::int64_t t = ctx.engine->step() + 1;
      if (redos(ctx, t) > kMaxRedos) {
        ctx.note("step " + std::to_string(t) + ": the bisection's own replays disagreed " + std::to_string(redos(ctx, t)) +
                 " times; the search stops there");
        ctx.stopped_at = t;
        break;
      }
      if (!recorded(ctx, t)) {
        // No whole record of the step (retired, or not traced): replayed only to reach the next
        // one; it stays unexamined.
        StepResult sr;
        CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->run_step(&sr, ctx.round)));
        continue;
      }
      bool differs = false;
      CULPRIT_RETURN_IF_ERROR(check_step(ctx, t, f, &differs));
      if (differs) {
        ev->step_found = true;
        return Status::OK();
      }
    }
    if (ctx.stopped_at >= 0) break;
    ++ctx.segment;
    bool none = false;
    CULPRIT_RETURN_IF_ERROR(open_segment(&ctx, &none));
    if (none) break;
  }
  nothing_differs(ctx, f, ev);
  CULPRIT_RETURN_IF_ERROR(check_data(ctx, f, ev));
  // Steps not examined make the search inconclusive; after a reproduced NaN or spike, only those
  // before it (what came after cannot have made it).
  const auto gaps = coverage(ctx, -1).not_examined;
  ev->unexamined = std::any_of(gaps.begin(), gaps.end(), [&](const records::StepRange& r) {
    return !ev->nonfinite_reproduced || r.from < f->step;
  });
  return Status::OK();
}

bool data_record_everywhere(const Context& ctx) {
  // Each rank looks at the record on its own filesystem: they agree (the lowest answer) before any
  // of them enters a collective that depends on it.
  int record = harness::Engine::has_data_record(ctx.run.cfg) ? 1 : 0;
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &record, 1, MPI_INT, MPI_MIN, ctx.comm.comm, &_culprit_req));
  return record != 0;
}


}  // namespace culprit::bisect
