// kLocalize and kRerun: at the faulty step, which rank computed what wrongly, in which phase and layer;
// then whether the blamed rank's fault comes back.
#include <algorithm>
#include <cstring>

#include "actions.h"

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

// The replays grouped by equal results, and the largest group (the first of equal size).
struct Groups {
  std::vector<std::vector<int>> members;
  std::size_t major = 0;
};
Groups group(const std::vector<ShardResult>& all) {
  Groups g;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    bool placed = false;
    for (auto& m : g.members)
      if (!placed && same_result(all[m[0]], all[r])) m.push_back(r), placed = true;
    if (!placed) g.members.push_back({r});
  }
  for (std::size_t i = 1; i < g.members.size(); ++i)
    if (g.members[i].size() > g.members[g.major].size()) g.major = i;
  return g;
}

// Where `got` first differs from `want`: the phase (grad when only the leaf or loss differ) and layer.
void place(const Context& ctx, const ShardResult& got, const ShardResult& want, Finding* f, Evidence* ev) {
  const auto d = first_difference(got, want, ctx.schema.layers, ctx.schema.params, ctx.schema.layers_recorded);
  f->phase = d ? d.phase() : Phase::kGrad;
  f->layer = d.layer();
  ev->input_differs = f->phase == Phase::kData;
}

// The differing micro-shard, recomputed on every rank: the record and the replays, compared.
Status localize_shard(Context& ctx, Finding* f, Evidence* ev) {
  const int k = f->bad_shard, W = ctx.W;
  const trace::ShardRow& row = ctx.run.trace.shards.at({f->step, k});
  ShardResult mine;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->compute_shard(k, 0, &mine)));
  mine.rank = ctx.comm.rank;
  const auto all = allgather(ctx.comm, mine, ctx.layer ? ctx.schema.layers.size() : 0,
                             ctx.layer ? ctx.schema.params.size() : 0);
  f->reference = harness::shard_result(row);
  const Groups g = group(all);
  const ShardResult& good = all[g.members[g.major][0]];
  const int orig = row.rank;
  const bool named = ctx.incident_names(f->step);
  const std::string K = "micro-shard " + std::to_string(k);
  if (g.members.size() == 1) {
    // Every replay agrees, and not with the record: the recording rank was wrong there.
    f->blamed = orig;
    ctx.note(K + ": every replay agrees with the others and not with the record of rank " + std::to_string(orig));
  } else if (W == 2 && g.members.size() == 2 && orig < W && same_result(all[orig], f->reference) && !named) {
    // Two ranks, each reproducing its own result: the recording rank its record, the other something
    // else. Either the recording rank is persistently faulty or the other one is; two opinions
    // cannot tell which (an online incident naming a rank would).
    ev->ambiguous_pair = true;
    const int other = 1 - orig;
    place(ctx, all[orig], all[other], f, ev);
    ctx.note(K + ": rank " + std::to_string(orig) + " reproduces its record, rank " + std::to_string(other) +
             " computes it differently (" + name_of(*f->phase) + (f->layer.empty() ? "" : " of " + f->layer) +
             "): a persistent fault on one of ranks 0 and 1; bisect with 3 or more ranks to tell which");
    return Status::OK();
  } else if (g.members.size() == 2 && (g.members[g.major].size() >= 2 || W == 2)) {
    // One rank is the odd one out (with two: the recording one, or the one an incident named).
    const auto& odd = g.members[1 - g.major];
    const int x = W == 2 ? (named ? ctx.first->rank : orig) : odd[0];
    const bool x_is_record = same_result(all[x], f->reference);
    if (odd.size() == 1 || W == 2) {
      f->blamed = x;
      if (!x_is_record) f->reference = all[x];
      ctx.note(K + ": rank " + std::to_string(x) +
               (x_is_record ? " reproduces the record; the other ranks agree among themselves"
                            : "'s replay differs from the other ranks'"));
    } else {
      ev->healthy_disagree = true;
    }
  } else {
    ev->healthy_disagree = true;
    ctx.note(K + ": the replays on " + std::to_string(W) + " ranks fall into " + std::to_string(g.members.size()) +
             " groups");
  }
  if (f->blamed >= 0) {
    ev->blamed = true;
    ev->rerunnable = true;
    place(ctx, f->reference, good, f, ev);
  }
  return Status::OK();
}

// Every rank's replayed parameters, on every rank; the healthy update is the one most ranks
// replayed (a fault at rest may reappear on its own rank; a tie goes away from the rank an
// incident at this step names).
struct Updates {
  std::vector<std::uint64_t> all;
  std::size_t np = 0;
  int good = -1;
  bool odd_now = false;  // some rank's replay differs from the healthy one
  const std::uint64_t* of(int r) const { return all.data() + static_cast<std::size_t>(r) * np; }
};
Updates gather_updates(const Context& ctx, const StepResult& sr, int suspect) {
  Updates u;
  u.np = sr.param_fps.size();
  const int W = ctx.W;
  u.all.resize(u.np * W);
  std::vector<std::uint64_t> mine(sr.param_fps.begin(), sr.param_fps.end());
  CULPRIT_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(u.np), MPI_UINT64_T, u.all.data(),
                                  static_cast<int>(u.np), MPI_UINT64_T, ctx.comm.comm));
  auto same = [&](int a, int b) { return std::equal(u.of(a), u.of(a) + u.np, u.of(b)); };
  int best = 0;
  for (int r = 0; r < W; ++r) {
    int votes = 0;
    for (int q = 0; q < W; ++q) votes += same(r, q);
    if (votes > best || (votes == best && u.good == suspect)) u.good = r, best = votes;
  }
  for (int r = 0; r < W; ++r) u.odd_now = u.odd_now || !same(r, u.good);
  return u;
}

// The micro-shards reproduce; the update does not. Replayed in the original layout (a faulty link
// is exercised as in the run, at the same world size).
Status localize_update(Context& ctx, Finding* f, Evidence* ev) {
  const std::int64_t s = f->step;
  const auto* first = ctx.first;
  const auto& rec = ctx.run.trace;
  StepResult sr;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->set_rotation(0)));
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->mark()));
  CULPRIT_RETURN_IF_ERROR(ctx.engine->run_step(&sr));
  const int suspect = first && first->step >= s - 1 && first->rank >= 0 ? first->rank : -1;
  const Updates u = gather_updates(ctx, sr, suspect);
  // Ranks whose recorded parameters after the step differ from the healthy replayed update.
  std::vector<int> differ;
  std::string first_param;
  for (int r : rec.ranks) {
    auto it = rec.steps.find({r, s});
    if (it == rec.steps.end()) continue;
    const std::vector<Fingerprint> healthy(u.of(u.good), u.of(u.good) + u.np);
    const int i = replay::first_differing_param(healthy, it->second.param_fps);
    if (i < 0 || static_cast<std::size_t>(i) >= ctx.schema.params.size()) continue;
    differ.push_back(r);
    if (first_param.empty()) first_param = ctx.schema.params[i];
  }
  // A reduction fault: the replay's comm check sees a message change on its way (the link's fault
  // reappeared), or the reduced gradient differs from the record.
  const bool comm_now = !sr.comm_faults.empty();
  const bool reduced = comm_now || (rec.steps.count({rec.ranks[0], s}) && rec.steps.at({rec.ranks[0], s}).grad_fp != sr.grad_fp);
  int odd_rank = -1;
  if (reduced) {
    // The replay's own comm check names a sender whose fault reappeared; otherwise the online comm
    // check's incident does.
    f->phase = Phase::kComm;
    odd_rank = comm_now ? sr.comm_faults[0].first
               : first && first->step == s && first->detector == Detector::kComm ? first->rank : -1;
  } else if (differ.size() == 1) {
    // The replica check said which state differed first: the optimizer's shows a step late in the parameters.
    const bool opt_state = first && first->what == Subject::kOptimizerState && first->rank == differ[0];
    f->phase = opt_state ? Phase::kOptimizer : Phase::kParam;
    odd_rank = differ[0];
    if (opt_state && first->step > 0) f->step = first->step;
  } else if (first && first->rank >= 0) {
    odd_rank = first->rank;
    f->phase = Phase::kParam;
  }
  const std::string& param = first_param.empty() ? f->update.param : first_param;
  f->layer = param.substr(0, param.rfind('.') == std::string::npos ? param.size() : param.rfind('.'));
  const bool reproduced = reduced ? comm_now : u.odd_now;
  ev->update_reproduced = reproduced;
  ctx.d->reruns = 1;
  ctx.d->reproduced = reproduced;
  ctx.note("step " + std::to_string(f->step) + ": the micro-shards reproduce, the update does not (" +
           f->update.describe() + "): phase " + (f->phase ? name_of(*f->phase) : "") +
           (odd_rank >= 0 ? ", rank " + std::to_string(odd_rank) : ""));
  f->blamed = odd_rank;
  ev->blamed = odd_rank >= 0;
  ev->healthy_disagree = odd_rank < 0 && !reduced;
  return Status::OK();
}

}  // namespace

Status localize(Context& ctx, Finding* f, Evidence* ev) {
  return f->bad_shard >= 0 ? localize_shard(ctx, f, ev) : localize_update(ctx, f, ev);
}

Status rerun(Context& ctx, Finding* f, Evidence* ev) {
  // The blamed rank recomputes the micro-shard again and again (intermittent faults draw anew).
  const int W = ctx.W, reruns = ctx.opt.reruns;
  if (f->blamed >= W)
    ctx.note("rank " + std::to_string(f->blamed) + " is not part of this bisection's " + std::to_string(W) +
             " ranks and cannot rerun; with at least " + std::to_string(f->blamed + 1) +
             " ranks the reruns tell persistent from transient");
  int reproduced = 0;
  Status st;
  for (int i = 1; i <= reruns && ctx.comm.rank == f->blamed && st.ok(); ++i) {
    ShardResult r;
    st = ctx.engine->compute_shard(f->bad_shard, i, &r);
    if (st.ok() && same_result(r, f->reference)) ++reproduced;
  }
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, st));
  int total = 0;
  CULPRIT_MPI_CHECK(MPI_Allreduce(&reproduced, &total, 1, MPI_INT, MPI_SUM, ctx.comm.comm));
  ev->reproduced = total;
  ctx.d->reruns = f->blamed < W ? reruns : 0;
  ctx.d->reproduced = total;
  if (f->blamed < W)
    ctx.note("rank " + std::to_string(f->blamed) + " recomputed micro-shard " + std::to_string(f->bad_shard) + " " +
             std::to_string(reruns) + " times: the fault reproduced " + std::to_string(total) + " time(s)");
  return Status::OK();
}

}  // namespace culprit::bisect
