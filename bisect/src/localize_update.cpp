// kLocalize when the micro-shards reproduce and the update does not: the step replayed in the run's
// layout, its reduction and update settled by the same rules as a micro-shard (opinions.h).
#include <algorithm>

#include "actions.h"
#include "arbiter.h"
#include "opinions.h"

namespace culprit::bisect {

namespace {

// Every rank's replayed update state (Context::update_state) after the step, on every rank.
std::vector<std::vector<Fingerprint>> gather_updates(const Context& ctx, const StepResult& sr) {
  const auto state = ctx.update_state(sr.param_fps, sr.opt_fps);
  const std::size_t np = state.size();
  std::vector<std::uint64_t> mine(state.begin(), state.end()), all(np * ctx.W);
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallgather(mine.data(), static_cast<int>(np), MPI_UINT64_T, all.data(), static_cast<int>(np),
                                  MPI_UINT64_T, ctx.comm.comm, &_culprit_req));
  std::vector<std::vector<Fingerprint>> out(ctx.W);
  for (int r = 0; r < ctx.W; ++r) out[r].assign(all.begin() + r * np, all.begin() + (r + 1) * np);
  return out;
}

// The update's opinions: every rank's record of the parameters after step s and every rank's replay.
struct UpdateVote {
  std::vector<std::vector<Fingerprint>> distinct;
  Opinions o;
  Settlement s;
  int id(const std::vector<Fingerprint>& v) {
    for (std::size_t i = 0; i < distinct.size(); ++i)
      if (distinct[i] == v) return static_cast<int>(i);
    distinct.push_back(v);
    return static_cast<int>(distinct.size()) - 1;
  }
};
// --shard-optimizer: a rank computed only its slice of the update (trace::StepRow::shard) and holds
// the rest as the gather gave it, so its record vouches for its slice and for its copy. Its opinion
// is the state of a replay that computed its slice as recorded, when only some replays did (where
// every replay did, it says nothing they disagree on: its copy of the other slices is the gather's,
// which spreads a wrong slice of another rank to every copy); a value of its own when no replay
// computed its slice so, or its copy is neither a replay's nor every rank's. Every replaying rank's
// view of every record's slice is gathered: the same on every rank.
void sharded_records(const Context& ctx, std::int64_t s, const std::vector<std::vector<Fingerprint>>& replays,
                     UpdateVote* u) {
  std::vector<const trace::StepRow*> rows;
  std::vector<std::uint64_t> mine;
  for (int r : ctx.run.trace.ranks) {
    auto it = ctx.run.trace.steps.find({r, s});
    rows.push_back(it == ctx.run.trace.steps.end() ? nullptr : &it->second);
    const auto slice = rows.back() && rows.back()->shard
                           ? ctx.engine->slice_record(rows.back()->shard->lo, rows.back()->shard->hi).words()
                           : std::array<std::uint64_t, 4>{};
    mine.insert(mine.end(), slice.begin(), slice.end());
  }
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(ctx.W));
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallgather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, all.data(),
                                  static_cast<int>(mine.size()), MPI_UINT64_T, ctx.comm.comm, &_culprit_req));
  const std::size_t np = ctx.schema.params.size();
  auto copy_of = [&](const std::vector<Fingerprint>& state) { return std::vector<Fingerprint>(state.begin(), state.begin() + np); };
  for (std::size_t k = 0; k < rows.size(); ++k) {
    if (!rows[k]) continue;
    const int r = ctx.run.trace.ranks[k];
    // The replaying ranks that computed r's slice as r recorded it; the first of them whose copy
    // is r's too goes first.
    std::vector<int> matching;
    for (int q = 0; q < ctx.W; ++q)
      if (rows[k]->shard && *rows[k]->shard == trace::SliceRecord::of(&all[(q * rows.size() + k) * 4])) matching.push_back(q);
    bool copy_seen = false;  // r's copy is some replay's, or every other rank's (spread by the gather)
    int side = matching.empty() ? -1 : matching[0];
    for (int q = 0; q < ctx.W; ++q)
      if (copy_of(replays[q]) == rows[k]->param_fps) copy_seen = true;
    for (int q : matching)
      if (copy_of(replays[q]) == rows[k]->param_fps) {
        side = q;
        break;
      }
    if (!copy_seen) {
      int others = 0;
      bool same = true;
      for (std::size_t j = 0; j < rows.size(); ++j)
        if (j != k && rows[j]) ++others, same = same && rows[j]->param_fps == rows[k]->param_fps;
      copy_seen = others > 0 && same;
    }
    if (matching.empty() || !copy_seen) {
      // Its slice as no replay computed it, or a copy of its own: a value no other record shares.
      std::vector<Fingerprint> own = ctx.update_state(rows[k]->param_fps, rows[k]->opt_fps);
      own.push_back(static_cast<Fingerprint>(r) + 1);
      u->o.records.push_back({r, u->id(own)});
    } else if (static_cast<int>(matching.size()) < ctx.W) {
      u->o.records.push_back({r, u->id(replays[side])});
    }
    // Else every replay computed r's slice as r recorded it: r's record says nothing the replays
    // disagree on (its copy of the other slices is the gather's, no opinion of its own).
  }
}

UpdateVote vote_update(const Context& ctx, std::int64_t s, const StepResult& sr) {
  UpdateVote u;
  const auto replays = gather_updates(ctx, sr);
  for (const auto& p : replays) u.o.replay.push_back(u.id(p));
  if (ctx.sharded_at(s)) {
    sharded_records(ctx, s, replays, &u);
  } else {
    for (int r : ctx.run.trace.ranks) {
      auto it = ctx.run.trace.steps.find({r, s});
      if (it != ctx.run.trace.steps.end())
        u.o.records.push_back({r, u.id(ctx.update_state(it->second.param_fps, it->second.opt_fps))});
    }
  }
  u.s = settle(u.o);
  return u;
}

bool tensor_parallel(const Context& ctx, std::int64_t s) { return ctx.tensor_parallel_at(s) > 1; }

// A tensor-parallel run reduced over the D ranks of each tp coordinate (TensorLayout); a replay
// (T = 1) reduces over other ranks and cannot exercise those links again. The rank to blame, from
// the run's own records: the sender its online comm check named at this step (a message changed on
// its way), else the one rank whose recorded chunk of the reduction (trace::StepRow::chunk_fp, of D
// chunks, the rank's data-parallel index r / T) differs from `healthy` (the step computed alone:
// a fault in the chunk it kept, which no message carried); -1: no one rank. Agreed (collective).
int tp_reduction(Context& ctx, std::int64_t s, const std::vector<Fingerprint>& healthy) {
  int odd = -1;
  for (const auto& inc : ctx.incidents)
    if (odd < 0 && inc.step == s && inc.detector == Detector::kComm && inc.sender >= 0) odd = inc.sender;
  const int T = ctx.tensor_parallel_at(s);
  std::vector<int> wrong;
  for (int r : ctx.run.trace.ranks) {
    auto it = ctx.run.trace.steps.find({r, s});
    if (odd >= 0 || it == ctx.run.trace.steps.end() || it->second.world != static_cast<int>(healthy.size())) continue;
    if (it->second.chunk_fp != healthy[static_cast<std::size_t>(r / T)]) wrong.push_back(r);
  }
  if (odd < 0 && wrong.size() == 1) odd = wrong[0];
  // Each rank's step computed alone is healthy unless its own device fired in it: agree, or no one.
  int lo = odd, hi = odd;
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, ctx.comm.comm, &_culprit_req));
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, ctx.comm.comm, &_culprit_req));
  odd = lo == hi ? lo : -1;
  if (odd >= 0)
    ctx.note("step " + std::to_string(s) + ": the tensor-parallel run's data-parallel reduction: " +
             (wrong.empty() ? "its comm check named rank " + std::to_string(odd) + " as the sender of a changed message"
                            : "only rank " + std::to_string(odd) + "'s own chunk differs from the healthy one, and no "
                              "message was seen to change") +
             "; a replay reduces over other ranks and cannot repeat it");
  return odd;
}

// The reduced gradient differs from the record. The replay's own comm check names a sender whose
// link fault reappeared; else the online comm check's incident of this step names the sender;
// else the one chunk that differs names the rank that reduced it (a fault in the part a rank keeps
// for itself never crosses a link, and no comm check sees it).
int reduction_fault(const Context& ctx, std::int64_t s, const StepResult& sr, bool* reproduced) {
  *reproduced = !sr.comm_faults.empty();
  if (*reproduced) return sr.comm_faults[0].first;
  const auto* first = ctx.first;
  if (first && first->step == s && first->detector == Detector::kComm && first->rank >= 0) return first->rank;
  std::vector<int> odd;
  for (int r : ctx.run.trace.ranks) {
    auto it = ctx.run.trace.steps.find({r, s});
    if (it == ctx.run.trace.steps.end() || it->second.world <= 0 || r >= it->second.world) continue;
    if (ctx.engine->reduced_chunk_fps(it->second.world)[r] != it->second.chunk_fp) odd.push_back(r);
  }
  return odd.size() == 1 ? odd[0] : -1;
}

// A link that corrupts the same element the same way in every replay leaves the reduced gradient as
// recorded: which parameter it hit comes from the step computed by each process alone (every
// micro-shard, the tree summed with no message), against the replay's. The engine stands after the
// step (localize_update's run_step); it is rewound and run again alone. Local.
// Also whether the record's reduced gradient is the healthy one, the value the ranks' steps computed
// alone agree on; *record_healthy: it is, so the differing reduction was the bisection's own
// replay's (*alone_wrong: the ranks whose own step was wrong too).
// *healthy_fp: that value's fingerprint, when the steps computed alone agree on one (else 0).
Status corrupted_param(Context& ctx, std::int64_t s, Finding* f, bool* record_healthy, std::vector<int>* alone_wrong,
                       std::uint64_t* healthy_fp) {
  const auto linked = ctx.engine->reduced_param_fps();
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->rewind()));
  StepResult alone;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->run_step_alone(&alone, ctx.round)));
  std::uint64_t mine = alone.grad_fp;
  std::vector<std::uint64_t> every(ctx.W);
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallgather(&mine, 1, MPI_UINT64_T, every.data(), 1, MPI_UINT64_T, ctx.comm.comm, &_culprit_req));
  // Every rank's record of the reduced gradient is one opinion, the run's (it is a collective
  // result, the same on every rank unless a link corrupted what reached one); the steps computed
  // alone are independent ones: the value most of them agree on (two or more; one rank: its own).
  std::map<std::uint64_t, int> votes;
  for (auto v : every) ++votes[v];
  std::uint64_t healthy = 0;
  int best = 0, holders = 0;
  for (const auto& [v, n] : votes) {
    if (n > best) best = n, holders = 0, healthy = v;
    if (n == best) ++holders;
  }
  const bool known = holders == 1 && (best >= 2 || ctx.W == 1);
  *healthy_fp = known ? healthy : 0;
  bool all_records = known;
  for (int r : ctx.run.trace.ranks) {
    auto it = ctx.run.trace.steps.find({r, s});
    if (it != ctx.run.trace.steps.end() && it->second.grad_fp != healthy) all_records = false;
  }
  *record_healthy = all_records;
  alone_wrong->clear();
  for (int r = 0; known && r < ctx.W; ++r)
    if (every[r] != healthy) alone_wrong->push_back(r);
  if (!f->update.param.empty()) return Status::OK();
  // The parameter whose slice of the reduced gradient a record holds unlike the healthy one (trace
  // format 4): named from the record itself, also when the update absorbed the fault.
  int at = INT32_MAX;  // the first any rank sees
  const auto alone_fps = ctx.engine->reduced_param_fps();
  for (int r : ctx.run.trace.ranks) {
    auto it = ctx.run.trace.steps.find({r, s});
    if (!known || mine != healthy || it == ctx.run.trace.steps.end() || it->second.reduced_fps.empty()) continue;
    const int i = replay::first_differing_param(alone_fps, it->second.reduced_fps);
    if (i >= 0) at = std::min(at, i);
  }
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &at, 1, MPI_INT, MPI_MIN, ctx.comm.comm, &_culprit_req));
  if (at != INT32_MAX && static_cast<std::size_t>(at) < ctx.schema.params.size()) {
    f->update.param = ctx.schema.params[at];
    return Status::OK();
  }
  // Else the replay in the run's layout against the step computed alone.
  const int i = replay::first_differing_param(alone_fps, linked);
  at = i < 0 ? INT32_MAX : i;
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &at, 1, MPI_INT, MPI_MIN, ctx.comm.comm, &_culprit_req));
  if (at != INT32_MAX && static_cast<std::size_t>(at) < ctx.schema.params.size()) f->update.param = ctx.schema.params[at];
  return Status::OK();
}

// Every record is healthy: the search's replay of this update was wrong. Noted; the step is redone.
Status update_replay_faulted(Context& ctx, std::int64_t s, const Finding& f, const UpdateVote& u, Evidence* ev) {
  std::vector<int> suspects = u.s.wrong_now;
  const int then = f.update.replayed_by;
  if (then >= 0 && std::find(suspects.begin(), suspects.end(), then) == suspects.end()) suspects.push_back(then);
  for (int r : suspects) ctx.replay_fault(s, r, "replayed the update of step " + std::to_string(s) + " unlike the records");
  ctx.redo(s);
  ev->replay_fault = true;
  if (suspects.empty())
    ctx.note("every record of step " + std::to_string(s) +
             " agrees with the steps computed alone: the run's comm incident there is not borne out; the step is redone");
  else
    ctx.note("the update of step " + std::to_string(s) + " agrees with every record when replayed again; rank(s) " +
             rank_list(suspects) + " replayed it wrongly during this bisection (suspect); the step is redone");
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->rewind()));
  return agree(ctx.comm, ctx.engine->set_rotation(1));
}

// No healthy update among the records and one replay: before calling it a tie, the step is redone
// from its start again and again. An intermittent fault at rest draws anew, and a device that
// contradicts itself is faulty (as for micro-shards, vote_shard); a persistent one stays a tie.
// A redo whose reduction came out unlike the first replay's on any rank (a link firing in it) is no
// opinion on the update at rest: the redos stop there. Returns how many times it was redone.
// Collective; the engine stands after the step again.
int rerun_update(Context& ctx, const StepResult& first, UpdateVote* u, Status* st) {
  int i = 0;
  while (i < ctx.opt.reruns && u->s.healthy < 0) {
    ++i;
    *st = agree(ctx.comm, ctx.engine->rewind());
    if (!st->ok()) return i;
    StepResult again;
    *st = agree(ctx.comm, ctx.engine->run_step(&again, ctx.round + i));
    if (!st->ok()) return i;
    int other = again.grad_fp != first.grad_fp || !again.comm_faults.empty();
    CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &other, 1, MPI_INT, MPI_MAX, ctx.comm.comm, &_culprit_req));
    if (other) {
      ctx.note("step " + std::to_string(first.step) + ": redo " + std::to_string(i) +
               " reduced the gradient unlike the first replay; the redos stop");
      return i;
    }
    const auto each = gather_updates(ctx, again);
    for (int r = 0; r < ctx.W; ++r) u->o.more.push_back({r, u->id(each[r])});
    u->s = settle(u->o);
  }
  return i;
}

// How many of rank r's replays of the update (the first and every rerun) came out unlike the
// healthy one.
int update_replays_wrong(const UpdateVote& u, int r) {
  if (r < 0 || r >= static_cast<int>(u.o.replay.size())) return 0;
  int n = u.o.replay[r] != u.s.healthy;
  for (const auto& m : u.o.more) n += m.rank == r && m.value != u.s.healthy;
  return n;
}

// One rank's record of the update is wrong: its parameters, or its optimizer state (which shows in
// the parameters only a step or more later; without optimizer fingerprints in the trace, the
// replica check's incident says which differed first).
void wrong_update_record(const Context& ctx, int r, const UpdateVote& u, Finding* f) {
  const auto& params = ctx.schema.params;
  const auto& row = ctx.run.trace.steps.at({r, f->step});
  const int i = replay::first_differing_param(u.distinct[u.s.healthy], ctx.update_state(row.param_fps, row.opt_fps));
  const std::size_t P = params.size();
  bool opt_state = i >= 0 && static_cast<std::size_t>(i) >= P;
  if (!ctx.opt_recorded) {
    const auto* first = ctx.first;
    const bool named = first && (first->rank == r || (first->rank < 0 && std::find(first->ranks.begin(), first->ranks.end(), r) != first->ranks.end()));
    opt_state = named && first->what == Subject::kOptimizerState;
    if (opt_state && first->step > 0) f->step = first->step;
  }
  f->phase = opt_state ? Phase::kOptimizer : Phase::kParam;
  if (i >= 0 && P > 0) {
    f->update.param = params[static_cast<std::size_t>(i) % P];
    f->update.from_reduced = false;
  }
}

// The rank whose device made a replay of the reduction (rotation 0: rank c reduces chunk c) come
// out unlike the healthy reduced gradient: the sender of a message that changed on its way (the
// replay's comm check, the same on every rank), else the one rank whose reduced chunk differs from
// the step computed alone (`alone`, on the ranks whose own step came out healthy: alone_ok); -1:
// none, or no single one. `chunks`: the replay's reduced chunks. Collective.
int replay_deviates(const Context& ctx, const StepResult& r, const std::vector<Fingerprint>& chunks,
                    const std::vector<Fingerprint>& alone, bool alone_ok) {
  if (!r.comm_faults.empty()) return r.comm_faults[0].first;
  std::vector<int> bad(static_cast<std::size_t>(ctx.W), 0);
  for (int c = 0; alone_ok && c < ctx.W; ++c) bad[c] = chunks[c] != alone[c];
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, bad.data(), ctx.W, MPI_INT, MPI_MAX, ctx.comm.comm, &_culprit_req));
  int n = 0, at = -1;
  for (int c = 0; c < ctx.W; ++c)
    if (bad[c]) ++n, at = c;
  return n == 1 ? at : -1;
}

// The micro-shards reproduce; the update does not. Replayed in the original layout (a faulty link
// is exercised as in the run, at the same world size), then settled as the micro-shards are.
// The reduced gradient differs: the sender or reducer to blame (*odd), or *healthy when the run's
// own reduction was healthy and the replay's was wrong (*redo: the ranks suspected).
// Whether the odd rank's device does it again: a replay of the reduction that comes out unlike the
// healthy value by that rank's doing, whatever its wrong value (a noisy link differs every time; a
// fault in the chunk a rank keeps never crosses a link and no comm check sees it). Its device
// sends every element of its blocks in any layout, so the fault is exercised at any bisection
// world size; the step is replayed up to --reruns more times until it shows (an intermittent link
// fires now and then). *runs: the replays, *wrong: those that showed it. Collective.
Status reduction(Context& ctx, const StepResult& sr, Finding* f, int* odd, bool* reproduced, bool* healthy,
                 std::vector<int>* redo, int* runs, int* wrong) {
  const std::int64_t s = f->step;
  const auto& rec = ctx.run.trace;
  f->phase = Phase::kComm;
  bool record_healthy = false;
  std::vector<int> alone_wrong;
  std::uint64_t healthy_fp = 0;
  const auto linked_chunks = ctx.engine->reduced_chunk_fps(ctx.W);
  CULPRIT_RETURN_IF_ERROR(corrupted_param(ctx, s, f, &record_healthy, &alone_wrong, &healthy_fp));
  const auto alone_chunks = ctx.engine->reduced_chunk_fps(ctx.W);
  // A tensor-parallel run's chunks: D of them (its data-parallel ranks), from the same step.
  const auto row_s = rec.steps.find({rec.ranks.empty() ? 0 : rec.ranks[0], s});
  const int D = row_s == rec.steps.end() ? 1 : std::max(1, row_s->second.world);
  const auto alone_tp = tensor_parallel(ctx, s) ? ctx.engine->reduced_chunk_fps(D) : std::vector<Fingerprint>();
  const bool alone_ok =
      healthy_fp != 0 && std::find(alone_wrong.begin(), alone_wrong.end(), ctx.comm.rank) == alone_wrong.end();
  if (record_healthy) {
    // The run reduced this step correctly: the replay's reduction (a link, or a micro-shard of a
    // rank whose device fired during the search) was wrong. Noted; the step is redone. A difference
    // only the comm incident claimed is not claimed again.
    if (f->update.from_incident) ctx.incident_refuted = s;
    *redo = alone_wrong;
    for (const auto& [from, to] : sr.comm_faults)
      if (std::find(redo->begin(), redo->end(), from) == redo->end()) redo->push_back(from);
    *healthy = true;
    return Status::OK();
  }
  if (tensor_parallel(ctx, s)) {
    *odd = tp_reduction(ctx, s, alone_tp);
    *reproduced = false;
    *runs = 1;
    *wrong = 0;
    return Status::OK();
  }
  *odd = reduction_fault(ctx, s, sr, reproduced);
  // The replay in the run's layout came out as the record's unhealthy reduction: it reproduces.
  const auto& row0 = rec.steps.find({rec.ranks[0], s});
  *reproduced = *reproduced || (row0 != rec.steps.end() && sr.grad_fp == row0->second.grad_fp);
  *runs = 1;
  *wrong = *reproduced || (*odd >= 0 && replay_deviates(ctx, sr, linked_chunks, alone_chunks, alone_ok) == *odd);
  const bool here = *odd >= 0 && *odd < ctx.W;  // else its device is not rerun (hardware-unconfirmed)
  while (here && *wrong == 0 && *runs <= ctx.opt.reruns) {
    CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->rewind()));
    StepResult again;
    CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->run_step(&again, ctx.round + *runs)));
    *wrong += replay_deviates(ctx, again, ctx.engine->reduced_chunk_fps(ctx.W), alone_chunks, alone_ok) == *odd;
    ++*runs;
  }
  *reproduced = *wrong > 0;
  return Status::OK();
}

// No update two devices agree on: the step redone (an intermittent device contradicts itself),
// then, for a tie of two that stays, the float64 recomputation of the update as one more opinion.
// *redone: how many times the step was redone. Collective.
Status settle_tie(Context& ctx, const StepResult& sr, UpdateVote* u, int* redone) {
  const std::int64_t s = sr.step;
  if (u->s.healthy < 0) {
    Status st;
    *redone = rerun_update(ctx, sr, u, &st);
    CULPRIT_RETURN_IF_ERROR(st);
    ctx.note("step " + std::to_string(s) + ": no update two devices agree on; the step was redone " + std::to_string(*redone) +
             " time(s) from its start: " + (u->s.healthy >= 0 ? "a device contradicted itself" : "every device repeated itself"));
  }
  if (!u->s.ambiguous || ctx.W != 2) return Status::OK();
  // The exact referee first (an element-wise phase: its bits are any correct device's), then, when
  // it gives no opinion, the float64 arbiter (which cannot see a flip of a few ulps).
  Arbitration a;
  CULPRIT_RETURN_IF_ERROR(referee_update(ctx, &a));
  ctx.note("step " + std::to_string(s) + ": ranks 0 and 1 each repeat their own update; " + a.why);
  if (a.healthy < 0) {
    CULPRIT_RETURN_IF_ERROR(arbitrate_update(ctx, &a));
    ctx.note("step " + std::to_string(s) + ": " + a.why);
  }
  if (a.healthy >= 0) {
    u->o.more.push_back({kArbiterDevice, u->o.replay[a.healthy]});
    u->s = settle(u->o);
  }
  return Status::OK();
}

}  // namespace

Status localize_update(Context& ctx, Finding* f, Evidence* ev) {
  const std::int64_t s = f->step;
  const auto& rec = ctx.run.trace;
  StepResult sr;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->set_rotation(0)));
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->mark()));
  CULPRIT_RETURN_IF_ERROR(ctx.engine->run_step(&sr, ctx.round));
  UpdateVote u = vote_update(ctx, s, sr);
  // Any rank's recorded reduced gradient unlike this replay's (a link can corrupt what reaches one
  // rank only), agreed before the branches below, which differ in their collectives.
  int reduced_here = !sr.comm_faults.empty();
  for (int r : rec.ranks) {
    auto it = rec.steps.find({r, s});
    if (it != rec.steps.end() && it->second.grad_fp != sr.grad_fp) reduced_here = 1;
  }
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &reduced_here, 1, MPI_INT, MPI_MAX, ctx.comm.comm, &_culprit_req));
  // Or the search saw it differ: a persistent fault in a rank's own chunk comes back in this replay
  // exactly as recorded, and only the step computed alone tells.
  const bool reduced = reduced_here != 0 || f->update.reduced;
  int redone = 0;
  if (!reduced) CULPRIT_RETURN_IF_ERROR(settle_tie(ctx, sr, &u, &redone));
  int odd_rank = -1;
  bool reproduced = false;
  int times = -1;  // of the odd rank's replays, how many came out wrong (-1: told otherwise)
  if (reduced) {
    bool record_healthy = false;
    UpdateVote none;
    int runs = 1, wrong = 0;
    CULPRIT_RETURN_IF_ERROR(
        reduction(ctx, sr, f, &odd_rank, &reproduced, &record_healthy, &none.s.wrong_now, &runs, &wrong));
    if (record_healthy) return update_replay_faulted(ctx, s, *f, none, ev);
    redone = runs - 1;
    times = wrong;
    if (tensor_parallel(ctx, s)) {  // named from the run's records (tp_reduction): never rerun
      ev->exchange = odd_rank >= 0;
      times = -1;
    }
  } else if (u.s.healthy >= 0 && u.s.wrong_records.empty()) {
    return update_replay_faulted(ctx, s, *f, u, ev);
  } else if (u.s.healthy >= 0 && u.s.wrong_records.size() == 1) {
    odd_rank = u.s.wrong_records[0];
    wrong_update_record(ctx, odd_rank, u, f);
    times = update_replays_wrong(u, odd_rank);
    reproduced = times > 0;
  } else {
    f->phase = Phase::kParam;
    f->candidates = u.s.healthy >= 0 ? u.s.wrong_records : u.s.candidates;
    ev->ambiguous_pair = u.s.ambiguous;
    ev->healthy_disagree = !u.s.ambiguous;
  }
  const std::string& param = f->update.param;
  f->layer = param.substr(0, param.rfind('.') == std::string::npos ? param.size() : param.rfind('.'));
  ev->update_reproduced = reproduced;
  ctx.d->reruns = odd_rank >= ctx.W ? 0 : 1 + redone;  // the update's replays on its rank, when it has one here
  ctx.d->reproduced = times >= 0 ? times : reproduced;
  ctx.note("step " + std::to_string(f->step) + ": the micro-shards reproduce, the update does not (" +
           f->update.describe() + "): phase " + (f->phase ? name_of(*f->phase) : "") +
           (odd_rank >= 0 ? ", rank " + std::to_string(odd_rank) : "") +
           (!f->candidates.empty() ? ", one of ranks " + rank_list(f->candidates) : ""));
  f->blamed = odd_rank;
  ev->blamed = odd_rank >= 0;
  ev->outside = odd_rank >= ctx.W;
  if (ev->outside) ctx.note_outside(odd_rank);
  return Status::OK();
}

}  // namespace culprit::bisect
