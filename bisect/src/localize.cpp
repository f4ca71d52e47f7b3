// kLocalize and kRerun: at the faulty step, which rank computed what wrongly, in which phase and layer;
// then whether the blamed rank's fault comes back.
#include <algorithm>
#include <map>
#include <cstring>

#include "actions.h"
#include "opinions.h"

namespace culprit::bisect {

namespace {

using replay::first_difference;
using replay::same_result;

// Every rank's ShardResult fingerprints, on every rank (one all-gather of fixed-size records).
std::vector<ShardResult> allgather(const Comm& comm, const ShardResult& mine, std::size_t nl, std::size_t np) {
  const std::size_t len = 4 + 2 * nl + np;
  std::vector<std::uint64_t> rec(len, 0), all(len * comm.size, 0);
  std::uint32_t lb;
  std::memcpy(&lb, &mine.loss, 4);
  rec[0] = mine.grad_fp, rec[1] = mine.input_fp, rec[2] = lb, rec[3] = static_cast<std::uint64_t>(mine.rank);
  for (std::size_t i = 0; i < nl && i < mine.fwd.size(); ++i) rec[4 + i] = mine.fwd[i], rec[4 + nl + i] = mine.bwd[i];
  for (std::size_t i = 0; i < np && i < mine.param_grad.size(); ++i) rec[4 + 2 * nl + i] = mine.param_grad[i];
  CULPRIT_MPI_CHECK(MPI_Allgather(rec.data(), static_cast<int>(len), MPI_UINT64_T, all.data(), static_cast<int>(len),
                                  MPI_UINT64_T, comm.comm));
  std::vector<ShardResult> out(comm.size);
  for (int r = 0; r < comm.size; ++r) {
    const std::uint64_t* p = all.data() + static_cast<std::size_t>(r) * len;
    auto& s = out[r];
    s.grad_fp = p[0], s.input_fp = p[1];
    const std::uint32_t b = static_cast<std::uint32_t>(p[2]);
    std::memcpy(&s.loss, &b, 4);
    s.rank = r;
    if (!mine.fwd.empty()) {
      s.fwd.assign(p + 4, p + 4 + nl);
      s.bwd.assign(p + 4 + nl, p + 4 + 2 * nl);
    }
    if (!mine.param_grad.empty()) s.param_grad.assign(p + 4 + 2 * nl, p + 4 + 2 * nl + np);
  }
  return out;
}

// Value ids for opinions.h: equal ids for bitwise equal results.
struct Values {
  std::vector<ShardResult> distinct;
  int id(const ShardResult& r) {
    for (std::size_t i = 0; i < distinct.size(); ++i)
      if (same_result(distinct[i], r)) return static_cast<int>(i);
    distinct.push_back(r);
    return static_cast<int>(distinct.size()) - 1;
  }
};

// Where `got` first differs from `want`: the phase (grad when only the leaf or loss differ) and layer.
void place(const Context& ctx, const ShardResult& got, const ShardResult& want, Finding* f, Evidence* ev) {
  const auto d = first_difference(got, want, ctx.schema.layers, ctx.schema.params, ctx.schema.layers_recorded);
  f->phase = d ? d.phase() : Phase::kGrad;
  f->layer = d.layer();
  ev->input_differs = f->phase == Phase::kData;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// Every differing micro-shard's record was healthy: the search's own replay computed them wrongly,
// on the ranks that replayed them then and on any rank whose recomputation differs now. Each is
// noted as suspect; the step is redone.
void replay_faulted(Context& ctx, std::int64_t step, const std::vector<int>& suspects, Evidence* ev) {
  for (int r : suspects) ctx.replay_fault(step, r, "computed a micro-shard of this step unlike its record and the other ranks");
  ctx.redo(step);
  ev->replay_fault = true;
  ctx.note("step " + std::to_string(step) + ": every differing micro-shard's record agrees with the other ranks; rank(s) " +
           rank_list(suspects) + " computed them wrongly during this bisection (suspect); the step is redone");
}

// One micro-shard's opinions: the record and every rank's recomputation, settled by opinions.h
// (never by rank order). Collective.
struct ShardVote {
  Values v;
  Opinions o;
  Settlement s;
  std::vector<ShardResult> all;  // every rank's first recomputation (fingerprints)
  ShardResult mine;              // this rank's, whole
  const trace::ShardRow* row = nullptr;
};
Status vote_shard(Context& ctx, std::int64_t step, int k, ShardVote* out) {
  out->row = &ctx.run.trace.shards.at({step, k});
  const std::size_t nl = ctx.layer ? ctx.schema.layers.size() : 0, np = ctx.layer ? ctx.schema.params.size() : 0;
  ShardResult& mine = out->mine;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->compute_shard(k, ctx.round, &mine)));
  mine.rank = ctx.comm.rank;
  out->all = allgather(ctx.comm, mine, nl, np);
  out->o.records = {{out->row->rank, out->v.id(harness::shard_result(*out->row))}};
  for (const auto& r : out->all) out->o.replay.push_back(out->v.id(r));
  out->s = settle(out->o);
  if (out->s.healthy >= 0) return Status::OK();
  // Before calling it a tie: every rank recomputes it again. A device that contradicts itself is
  // faulty (an intermittent fault draws anew), and with that the tie may be settled.
  for (int i = 1; i <= ctx.opt.reruns; ++i) {
    ShardResult again;
    CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->compute_shard(k, ctx.round + i, &again)));
    again.rank = ctx.comm.rank;
    const auto each = allgather(ctx.comm, again, nl, np);
    for (int r = 0; r < ctx.W; ++r) out->o.more.push_back({r, out->v.id(each[r])});
  }
  out->s = settle(out->o);
  return Status::OK();
}

// The input as loaded differs: the first sample whose fingerprint differs, by its index in the
// data set (format 3 traces record every sample's fingerprint).
void name_sample(Context& ctx, const ShardVote& sv, Finding* f) {
  // The samples as a rank that computed the healthy result loaded them (collective).
  int from = 0;
  while (from < ctx.W && sv.o.replay[from] != sv.s.healthy) ++from;
  std::vector<std::uint64_t> want(sv.mine.sample_fps.begin(), sv.mine.sample_fps.end());
  if (from >= ctx.W) from = sv.row->rank == 0 && ctx.W > 1 ? 1 : 0;  // a tie: a rank that did not record it
  CULPRIT_MPI_CHECK(MPI_Bcast(want.data(), static_cast<int>(want.size()), MPI_UINT64_T, from, ctx.comm.comm));
  const auto& got = f->reference.sample_fps;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i]) {
      const auto idx = ctx.engine->shard_samples(f->bad_shard);
      if (i < idx.size()) f->sample = idx[i];
      ctx.note("micro-shard " + std::to_string(f->bad_shard) + ": sample " + std::to_string(i) + " of the micro-shard (" +
               "data set index " + std::to_string(f->sample) + ") was loaded unlike the healthy ranks loaded it");
      return;
    }
}

// A micro-shard whose record is not the healthy result, or for which none could be told: who is
// blamed, and where the fault first shows.
void judge_shard(Context& ctx, const ShardVote& sv, Finding* f, Evidence* ev) {
  const auto& s = sv.s;
  const auto& row = *sv.row;
  const auto& all = sv.all;
  const std::string K = "micro-shard " + std::to_string(f->bad_shard);
  f->reference = sv.v.distinct[sv.o.records[0].value];
  if (s.healthy < 0) {
    // No healthy value. An online incident naming a rank at this step is the one more opinion.
    if (ctx.incident_names(f->step) && s.ambiguous && ctx.W == 2) {
      f->blamed = ctx.first->rank;
      f->healthy = all[1 - f->blamed];
      f->reference = all[f->blamed];
      ctx.note(K + ": ranks 0 and 1 each reproduce their own result; the " + name_of(ctx.first->detector) +
               " incident of this step names rank " + std::to_string(f->blamed));
    } else {
      ev->ambiguous_pair = s.ambiguous;
      ev->healthy_disagree = s.disagree;
      f->candidates = s.candidates;
      const int other = s.candidates[0] == row.rank ? s.candidates.back() : s.candidates[0];
      f->healthy = all[std::min(other, ctx.W - 1)];
      place(ctx, f->reference, f->healthy, f, ev);
      if (ev->input_differs) name_sample(ctx, sv, f);
      ctx.note(K + (s.ambiguous ? ": ranks " + rank_list(s.candidates) +
                                      " each reproduce their own result, rerun after rerun: one of them is persistently "
                                      "faulty, and two opinions cannot tell which (bisect with 3 or more ranks, or screen "
                                      "both)"
                                : ": the record and the replays on " + std::to_string(ctx.W) +
                                      " ranks give no result two devices agree on (ranks " + rank_list(s.candidates) + ")"));
      return;
    }
  } else {
    f->blamed = row.rank;
    f->healthy = sv.v.distinct[s.healthy];
    for (int r : s.wrong_now)
      if (r != row.rank) ctx.replay_fault(f->step, r, "recomputed " + K + " unlike the healthy result");
    ctx.note(K + ": the healthy result (" + std::to_string(ctx.W) + " rank(s) replaying) differs from the record of rank " +
             std::to_string(row.rank) +
             (row.rank < ctx.W && sv.o.replay[row.rank] == sv.o.records[0].value ? ", whose replay reproduces it" : ""));
  }
  ev->blamed = true;
  ev->rerunnable = true;
  ev->outside = f->blamed >= ctx.W;
  if (ev->outside) ctx.note_outside(f->blamed);
  place(ctx, f->reference, f->healthy, f, ev);
  if (ev->input_differs) name_sample(ctx, sv, f);
}

// The differing micro-shards in order: the first whose record is wrong is the fault; a differing
// one whose record is healthy was the search's own replay's fault.
Status localize_shard(Context& ctx, Finding* f, Evidence* ev) {
  std::vector<int> suspects;
  for (int k : f->bad_shards) {
    ShardVote sv;
    CULPRIT_RETURN_IF_ERROR(vote_shard(ctx, f->step, k, &sv));
    if (sv.s.healthy >= 0 && sv.s.wrong_records.empty()) {
      // Who recomputed it in the search: the rotated layout's rank, or the next one when that is
      // the recording rank (find_step.cpp: replay_returned_shards).
      int then = harness::Engine::replay_rank(k, ctx.M, ctx.W, 1);
      if (then == sv.row->rank) then = (then + 1) % ctx.W;
      suspects.push_back(then);
      suspects.insert(suspects.end(), sv.s.wrong_now.begin(), sv.s.wrong_now.end());
      continue;
    }
    for (int r : suspects) ctx.replay_fault(f->step, r, "computed a micro-shard of this step unlike its record and the other ranks");
    f->bad_shard = k;
    judge_shard(ctx, sv, f, ev);
    return Status::OK();
  }
  std::sort(suspects.begin(), suspects.end());
  suspects.erase(std::unique(suspects.begin(), suspects.end()), suspects.end());
  replay_faulted(ctx, f->step, suspects, ev);
  return Status::OK();
}

// Every rank's replayed update state (Context::update_state) after the step, on every rank.
std::vector<std::vector<Fingerprint>> gather_updates(const Context& ctx, const StepResult& sr) {
  const auto state = ctx.update_state(sr.param_fps, sr.opt_fps);
  const std::size_t np = state.size();
  std::vector<std::uint64_t> mine(state.begin(), state.end()), all(np * ctx.W);
  CULPRIT_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(np), MPI_UINT64_T, all.data(), static_cast<int>(np),
                                  MPI_UINT64_T, ctx.comm.comm));
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
UpdateVote vote_update(const Context& ctx, std::int64_t s, const StepResult& sr) {
  UpdateVote u;
  for (const auto& p : gather_updates(ctx, sr)) u.o.replay.push_back(u.id(p));
  for (int r : ctx.run.trace.ranks) {
    auto it = ctx.run.trace.steps.find({r, s});
    if (it != ctx.run.trace.steps.end())
      u.o.records.push_back({r, u.id(ctx.update_state(it->second.param_fps, it->second.opt_fps))});
  }
  u.s = settle(u.o);
  return u;
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
Status corrupted_param(Context& ctx, std::int64_t s, Finding* f, bool* record_healthy, std::vector<int>* alone_wrong) {
  const auto linked = ctx.engine->reduced_param_fps();
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->rewind()));
  StepResult alone;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->run_step_alone(&alone, ctx.round)));
  std::uint64_t mine = alone.grad_fp;
  std::vector<std::uint64_t> every(ctx.W);
  CULPRIT_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UINT64_T, every.data(), 1, MPI_UINT64_T, ctx.comm.comm));
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
  CULPRIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &at, 1, MPI_INT, MPI_MIN, ctx.comm.comm));
  if (at != INT32_MAX && static_cast<std::size_t>(at) < ctx.schema.params.size()) {
    f->update.param = ctx.schema.params[at];
    return Status::OK();
  }
  // Else the replay in the run's layout against the step computed alone.
  const int i = replay::first_differing_param(alone_fps, linked);
  at = i < 0 ? INT32_MAX : i;
  CULPRIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &at, 1, MPI_INT, MPI_MIN, ctx.comm.comm));
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
  if (i >= 0 && P > 0) f->update.param = params[static_cast<std::size_t>(i) % P];
}

// The micro-shards reproduce; the update does not. Replayed in the original layout (a faulty link
// is exercised as in the run, at the same world size), then settled as the micro-shards are.
Status localize_update(Context& ctx, Finding* f, Evidence* ev) {
  const std::int64_t s = f->step;
  const auto& rec = ctx.run.trace;
  StepResult sr;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->set_rotation(0)));
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->mark()));
  CULPRIT_RETURN_IF_ERROR(ctx.engine->run_step(&sr, ctx.round));
  const UpdateVote u = vote_update(ctx, s, sr);
  // Any rank's recorded reduced gradient unlike this replay's (a link can corrupt what reaches one
  // rank only), agreed before the branches below, which differ in their collectives.
  int reduced_here = !sr.comm_faults.empty();
  for (int r : rec.ranks) {
    auto it = rec.steps.find({r, s});
    if (it != rec.steps.end() && it->second.grad_fp != sr.grad_fp) reduced_here = 1;
  }
  CULPRIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &reduced_here, 1, MPI_INT, MPI_MAX, ctx.comm.comm));
  // Or the search saw it differ: a persistent fault in a rank's own chunk comes back in this replay
  // exactly as recorded, and only the step computed alone tells.
  const bool reduced = reduced_here != 0 || f->update.reduced;
  int odd_rank = -1;
  bool reproduced = false;
  if (reduced) {
    f->phase = Phase::kComm;
    bool record_healthy = false;
    std::vector<int> alone_wrong;
    CULPRIT_RETURN_IF_ERROR(corrupted_param(ctx, s, f, &record_healthy, &alone_wrong));
    if (record_healthy) {
      // The run reduced this step correctly: the replay's reduction (a link, or a micro-shard of a
      // rank whose device fired during the search) was wrong. Noted; the step is redone. A difference
      // only the comm incident claimed is not claimed again.
      if (f->update.from_incident) ctx.incident_refuted = s;
      UpdateVote none;
      none.s.wrong_now = alone_wrong;
      for (const auto& [from, to] : sr.comm_faults)
        if (std::find(none.s.wrong_now.begin(), none.s.wrong_now.end(), from) == none.s.wrong_now.end())
          none.s.wrong_now.push_back(from);
      return update_replay_faulted(ctx, s, *f, none, ev);
    }
    odd_rank = reduction_fault(ctx, s, sr, &reproduced);
    // The replay in the run's layout came out unlike the healthy reduction again: it reproduces.
    const auto& row0 = rec.steps.find({rec.ranks[0], s});
    reproduced = reproduced || (row0 != rec.steps.end() && sr.grad_fp == row0->second.grad_fp);
  } else if (u.s.healthy >= 0 && u.s.wrong_records.empty()) {
    return update_replay_faulted(ctx, s, *f, u, ev);
  } else if (u.s.healthy >= 0 && u.s.wrong_records.size() == 1) {
    odd_rank = u.s.wrong_records[0];
    wrong_update_record(ctx, odd_rank, u, f);
    reproduced = odd_rank < ctx.W && u.o.replay[odd_rank] != u.s.healthy;
  } else {
    f->phase = Phase::kParam;
    f->candidates = u.s.healthy >= 0 ? u.s.wrong_records : u.s.candidates;
    ev->ambiguous_pair = u.s.ambiguous;
    ev->healthy_disagree = !u.s.ambiguous;
  }
  const std::string& param = f->update.param;
  f->layer = param.substr(0, param.rfind('.') == std::string::npos ? param.size() : param.rfind('.'));
  ev->update_reproduced = reproduced;
  ctx.d->reruns = odd_rank >= ctx.W ? 0 : 1;  // the update's replay on its rank, when it has one here
  ctx.d->reproduced = reproduced;
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

}  // namespace

Status localize(Context& ctx, Finding* f, Evidence* ev) {
  return f->bad_shard >= 0 ? localize_shard(ctx, f, ev) : localize_update(ctx, f, ev);
}

Status rerun(Context& ctx, Finding* f, Evidence* ev) {
  // The blamed rank recomputes the micro-shard again and again (intermittent faults draw anew). A
  // rerun reproduces the fault when it differs from the healthy result, whatever its wrong value.
  const int reruns = ctx.opt.reruns;
  int reproduced = 0;
  Status st;
  for (int i = 1; i <= reruns && ctx.comm.rank == f->blamed && st.ok(); ++i) {
    ShardResult r;
    st = ctx.engine->compute_shard(f->bad_shard, ctx.round + i, &r);
    if (st.ok() && !same_result(r, f->healthy)) ++reproduced;
  }
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, st));
  int total = 0;
  CULPRIT_MPI_CHECK(MPI_Allreduce(&reproduced, &total, 1, MPI_INT, MPI_SUM, ctx.comm.comm));
  ev->reproduced = total;
  ctx.d->reruns = reruns;
  ctx.d->reproduced = total;
  ctx.note("rank " + std::to_string(f->blamed) + " recomputed micro-shard " + std::to_string(f->bad_shard) + " " +
           std::to_string(reruns) + " times: " + std::to_string(total) + " differ from the healthy result");
  return Status::OK();
}

}  // namespace culprit::bisect
