// culprit replay: the steps before the examined one replayed as the run computed them, the examined
// step's micro-shards recomputed on the chosen ranks, then its update; every rank's findings travel
// to rank 0 as records (replay_codec.h), which prints the report.
#include <algorithm>
#include <cstdio>

#include "culprit/watchdog.h"
#include "culprit/replay.h"
#include "culprit/run_files.h"
#include "replay_codec.h"

namespace culprit::replay {

namespace {

// The options against the run: the step is in the trace, the ranks and the micro-shard exist.
Status check_options(const Options& opt, const RunRecord& run, const Comm& comm) {
  const auto& rec = run.trace;
  if (opt.step < 1 || !rec.step(opt.step))
    return Status::BadInput("--step " + std::to_string(opt.step) + " is not in the trace of '" + opt.run_dir +
                            "' (steps " +
                            (rec.steps.empty() ? std::string("none")
                                               : std::to_string(rec.first_step) + ".." + std::to_string(rec.last_step)) +
                            ")");
  for (int r : opt.ranks)
    if (r < 0 || r >= comm.size)
      return Status::BadInput("--ranks: rank " + std::to_string(r) + " does not exist (world size " +
                              std::to_string(comm.size) + ")");
  if (opt.micro_shard >= run.cfg.micro_shards)
    return Status::BadInput("--micro-shard " + std::to_string(opt.micro_shard) + " does not exist (the run has " +
                            std::to_string(run.cfg.micro_shards) + " micro-shards)");
  return Status::OK();
}

// Collective: one step before the examined one, as the original run computed it.
Status replay_prior_step(harness::Engine& engine, const RunRecord& run, const Schema& schema, const Comm& comm,
                         PriorStep* out) {
  StepResult sr;
  CULPRIT_RETURN_IF_ERROR(engine.run_step(&sr));
  const StepComparison cmp = compare_step(sr, run.trace, schema, &engine);
  std::vector<std::string> mine;
  for (const auto& m : cmp.shards) mine.push_back(encode(to_json(PriorStep::Shard{comm.rank, m})));
  out->step = sr.step;
  out->recorded = run.trace.step(sr.step) != nullptr;
  out->update = cmp.update;  // the same on every rank
  for (const auto& line : gather_lines(comm, mine)) out->shards.push_back(prior_shard_from(decode(line)));
  return Status::OK();
}

// This rank's recomputations of the examined step's micro-shards (chosen ranks only).
Status recompute_shards(harness::Engine& engine, const RunRecord& run, const Schema& schema, const Comm& comm,
                        std::int64_t step, const std::vector<int>& shards, bool chosen,
                        std::vector<ShardResult>* results, std::vector<ShardReplay>* mine) {
  results->assign(shards.size(), ShardResult());
  for (std::size_t i = 0; i < shards.size() && chosen; ++i) {
    CULPRIT_RETURN_IF_ERROR(engine.compute_shard(shards[i], 0, &(*results)[i]));
    ShardReplay r;
    r.rank = comm.rank;
    r.host = comm.host;
    r.grad_fp = (*results)[i].grad_fp;
    auto it = run.trace.shards.find({step, shards[i]});
    r.in_trace = it != run.trace.shards.end();
    if (r.in_trace)
      r.diff = first_difference((*results)[i], harness::shard_result(it->second), schema.layers, schema.params,
                                schema.layers_recorded);
    mine->push_back(r);
  }
  return Status::OK();
}

// Collective: for each micro-shard whose replays disagree among themselves, the first two ranks that
// differ compare their gradients element by element (rank b sends to rank a).
std::vector<std::string> find_disagreements(const Comm& comm, const std::vector<int>& shards,
                                            const std::vector<ShardResult>& results, bool chosen) {
  const std::size_t W = static_cast<std::size_t>(comm.size);
  std::vector<Fingerprint> fps(shards.size() * W, 0), all(shards.size() * W, 0);
  for (std::size_t i = 0; i < shards.size() && chosen; ++i) fps[i * W + comm.rank] = results[i].grad_fp;
  CULPRIT_COLLECTIVE(comm, "the replay", MPI_Iallreduce(fps.data(), all.data(), static_cast<int>(fps.size()), MPI_UINT64_T, MPI_BOR, comm.comm, &_culprit_req));
  std::vector<std::string> mine;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    int a = -1, b = -1;
    for (int r = 0; r < comm.size; ++r) {
      const Fingerprint f = all[i * W + r];
      if (!f) continue;
      if (a < 0) a = r;
      else if (f != all[i * W + a] && b < 0) b = r;
    }
    if (b < 0) continue;
    const int tag = 9000 + static_cast<int>(i);
    const auto& grad = results[i].grad;
    if (comm.rank == b)
      CULPRIT_COLLECTIVE(comm, "the replay",
                         MPI_Isend(grad.data(), static_cast<int>(grad.size()), MPI_FLOAT, a, tag, comm.comm, &_culprit_req));
    if (comm.rank != a) continue;
    std::vector<float> other(grad.size());
    CULPRIT_COLLECTIVE(comm, "the replay",
                       MPI_Irecv(other.data(), static_cast<int>(other.size()), MPI_FLOAT, b, tag, comm.comm, &_culprit_req));
    for (std::size_t j = 0; j < other.size(); ++j)
      if (!same_bits(other[j], grad[j])) {
        mine.push_back(encode(to_json(Disagreement{a, b, static_cast<std::int64_t>(j), grad[j], other[j]}, shards[i])));
        break;
      }
  }
  return mine;
}

// Collective: the examined step's micro-shards on the chosen ranks; the report's shards on rank 0.
Status examine_step(harness::Engine& engine, const RunRecord& run, const Schema& schema, const Options& opt,
                    const Comm& comm, ReplayReport* rep) {
  const bool chosen =
      opt.ranks.empty() || std::find(opt.ranks.begin(), opt.ranks.end(), comm.rank) != opt.ranks.end();
  std::vector<int> shards;
  for (int k = 0; k < run.cfg.micro_shards; ++k)
    if (opt.micro_shard < 0 || k == opt.micro_shard) shards.push_back(k);
  std::vector<ShardResult> results;
  std::vector<ShardReplay> mine;
  CULPRIT_RETURN_IF_ERROR(agree(comm, recompute_shards(engine, run, schema, comm, opt.step, shards, chosen, &results, &mine)));
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < mine.size(); ++i) lines.push_back(encode(to_json(mine[i], shards[i])));
  const auto replays = gather_lines(comm, lines);
  const auto disagreements = gather_lines(comm, find_disagreements(comm, shards, results, chosen));
  if (comm.rank != 0) return Status::OK();
  for (int k : shards) {
    ShardReport s;
    s.shard = k;
    auto it = run.trace.shards.find({opt.step, k});
    if ((s.recorded = it != run.trace.shards.end())) {
      s.recorded_by = it->second.rank;
      s.recorded_host = it->second.host;
      s.recorded_loss = it->second.loss;
      s.recorded_grad = it->second.grad_fp;
    }
    rep->shards.push_back(s);
  }
  // Micro-shard k's report is the i-th, k = shards[i].
  auto report_of = [&](int k) -> ShardReport& {
    return rep->shards[static_cast<std::size_t>(std::find(shards.begin(), shards.end(), k) - shards.begin())];
  };
  int k = 0;
  for (const auto& line : replays) {
    const ShardReplay r = shard_replay_from(decode(line), &k);
    report_of(k).replays.push_back(r);
  }
  for (const auto& line : disagreements) {
    const Disagreement d = disagreement_from(decode(line), &k);
    report_of(k).disagreement = d;
  }
  return Status::OK();
}

}  // namespace

Status run(const Options& opt, const Comm& given, ReplayReport* out) {
  const Watched watched(given, opt.collective_timeout);
  const Comm& comm = watched.comm();
  // A run another job is writing (train, bisect) has traces and checkpoints in the middle of being
  // written: "in use" (exit 2), never a damaged record. Rank 0 asks; every rank agrees.
  CULPRIT_RETURN_IF_ERROR(agree(comm, comm.rank == 0 ? files::check_not_in_use(opt.run_dir, "culprit replay") : Status::OK()));
  RunRecord run;
  CULPRIT_RETURN_IF_ERROR(load_run(opt.run_dir, comm, &run));
  CULPRIT_RETURN_IF_ERROR(agree(comm, check_options(opt, run, comm)));
  const bool layer = opt.trace == trace::Level::kLayer || run.trace.header.level == trace::Level::kLayer;
  std::unique_ptr<harness::Engine> engine;
  ReplayReport rep;
  CULPRIT_RETURN_IF_ERROR(open_engine_before(run, comm, opt.step, ckpt::Pick::kNewest, layer, 0, &engine, &rep.checkpoint));
  const Schema schema = schema_of(*engine, run.trace);
  rep.run_dir = opt.run_dir;
  rep.step = opt.step;
  rep.world_size = comm.size;
  rep.layers_compared = schema.layers_recorded;
  // The text report streams as the steps are replayed; the JSON record comes whole at the end.
  auto say = [&](const std::string& text) {
    if (comm.rank != 0 || opt.json) return;
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  };
  say(text_header(rep));
  // Up to the step: every step as the original run computed it, compared with its record.
  while (engine->step() + 1 < opt.step) {
    PriorStep p;
    CULPRIT_RETURN_IF_ERROR(replay_prior_step(*engine, run, schema, comm, &p));
    say(text_prior(p));
    rep.before.push_back(p);
  }
  // The step itself: its micro-shards recomputed on the chosen ranks, then its update as the run did it.
  CULPRIT_RETURN_IF_ERROR(examine_step(*engine, run, schema, opt, comm, &rep));
  StepResult sr;
  CULPRIT_RETURN_IF_ERROR(engine->run_step(&sr));
  rep.update = update_difference(sr, *run.trace.step(opt.step), schema.params);
  check_slices(*engine, run.trace, opt.step, &rep.update);
  // Rank 0 holds the whole report; the verdict travels from there.
  int mismatches = rep.mismatches();
  say(text_examined(rep));
  if (comm.rank == 0 && opt.json) std::fputs(to_json(rep).c_str(), stdout);
  if (comm.rank == 0 && out) *out = rep;
  CULPRIT_COLLECTIVE(comm, "the replay", MPI_Ibcast(&mismatches, 1, MPI_INT, 0, comm.comm, &_culprit_req));
  if (mismatches == 0) return Status::OK();
  return Status::Differs("replay of step " + std::to_string(opt.step) + ": " + std::to_string(mismatches) +
                         " mismatch(es) with the trace");
}

}  // namespace culprit::replay
