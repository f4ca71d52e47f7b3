// kLocalize and kRerun: at the faulty step, which rank computed what wrongly, in which phase and layer;
// then whether the blamed rank's fault comes back.
#include <algorithm>
#include <map>
#include <cstring>

#include "actions.h"
#include "arbiter.h"
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
  CULPRIT_COLLECTIVE(comm, "the bisection", MPI_Iallgather(rec.data(), static_cast<int>(len), MPI_UINT64_T, all.data(), static_cast<int>(len),
                                  MPI_UINT64_T, comm.comm, &_culprit_req));
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
// A tensor-parallel exchange whose part arrived unlike its owner computed it.
struct ExchangeLink {
  int sender = -1, receiver = -1;
  std::string layer;
};
struct ShardVote {
  Values v;
  Opinions o;
  Settlement s;
  std::vector<ShardResult> all;  // every rank's first recomputation (fingerprints)
  ShardResult mine;              // this rank's, whole
  const trace::ShardRow* row = nullptr;
  Arbitration arbiter;           // tried on a tie of two
  ExchangeLink link;             // a tensor-parallel exchange's part changed on its way
  std::size_t majority = 0;      // a tensor-parallel group: the replay most ranks computed (in `all`)
};
// The data source as the third opinion on sample `sample` (data set index), which ranks 0 and 1
// loaded as loads[0] and loads[1]: both ranks read it afresh outside the step (no batch, no device,
// no step's fault). When the two reads agree, they say what the sample is, and the load equal to
// them is the healthy one: loading is reading the source. A data record (prepare-data) that still
// matches the sample's blocks says the file is as it was prepared; its absence is said, not needed.
// Collective.
Status witness_source(Context& ctx, int k, std::int64_t sample, const std::uint64_t* loads, ShardVote* sv) {
  std::vector<Fingerprint> fp;
  std::string source;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->source_samples({sample}, &fp, &source)));
  const std::uint64_t mine = fp.empty() ? 0 : fp[0];
  std::uint64_t read[2] = {0, 0};
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallgather(&mine, 1, MPI_UINT64_T, read, 1, MPI_UINT64_T, ctx.comm.comm, &_culprit_req));
  const std::string K = "micro-shard " + std::to_string(k) + ": ranks 0 and 1 load data set index " +
                        std::to_string(sample) + " unlike each other, and no third device's load of it is in the record; ";
  if (read[0] != read[1]) {
    ctx.note(K + "read afresh from " + source + ", it differs between the two ranks too: no third opinion");
    return Status::OK();
  }
  const int h = read[0] == loads[0] ? 0 : read[0] == loads[1] ? 1 : -1;
  if (h < 0) {
    ctx.note(K + "read afresh from " + source + " on both ranks alike, it is as neither loaded it: no third opinion");
    return Status::OK();
  }
  std::string vouch;
  if (data_record_everywhere(ctx)) {
    std::vector<harness::ChangedSample> changed;
    std::string skipped;
    CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->changed_samples({sample}, &changed, &skipped)));
    // changed_samples reads the same file on every rank: the same answer everywhere.
    if (!changed.empty()) {
      // The file changed since it was prepared: what it says now is no opinion on what was loaded.
      ctx.note(K + "its stored bytes changed since culprit prepare-data (" + changed[0].where + "): no third opinion");
      return Status::OK();
    }
    vouch = !skipped.empty() ? "; " + skipped : "; its stored bytes match the data record of culprit prepare-data";
  } else if (ctx.run.cfg.data.kind != harness::DataKind::kSynthetic) {
    vouch = "; no data record (culprit prepare-data) vouches for the file, whose bytes both ranks read alike";
  }
  sv->o.more.push_back({kDataSourceDevice, sv->o.replay[h]});
  sv->s = settle(sv->o);
  ctx.note(K + "read afresh from " + source + " outside the step, on both ranks alike, it is as rank " + std::to_string(h) +
           " loads it: the data source is the third opinion" + vouch);
  return Status::OK();
}

// A tie of two over micro-shard k of the next step, whose input the two ranks load differently: the
// first sample they load unlike each other, as any third device loaded the same data set index in
// the run's record (a rank outside this world, in another step or micro-shard: the trace holds
// every sample's fingerprint), is one more opinion: a device of its own, siding with the rank whose
// load it matches. Without one, the data source read afresh is (witness_source). Collective (the
// search over the record is the same on every rank).
Status witness_load(Context& ctx, int k, ShardVote* sv) {
  const auto& mine = sv->mine.sample_fps;
  const std::size_t n = mine.size();
  std::vector<std::uint64_t> both(2 * n);
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallgather(mine.data(), static_cast<int>(n), MPI_UINT64_T, both.data(), static_cast<int>(n),
                                  MPI_UINT64_T, ctx.comm.comm, &_culprit_req));
  const auto idx = ctx.engine->shard_samples(k);
  for (std::size_t j = 0; j < n && j < idx.size(); ++j) {
    if (both[j] == both[n + j]) continue;
    for (const auto& [key, row] : ctx.run.trace.shards) {
      if (row.rank < 2 || row.sample_fps.empty()) continue;  // the tied devices' own loads are no witness
      const auto other = ctx.engine->shard_samples_of(key.first, key.second);
      for (std::size_t i = 0; i < other.size() && i < row.sample_fps.size(); ++i) {
        if (other[i] != idx[j]) continue;
        const int h = row.sample_fps[i] == both[j] ? 0 : row.sample_fps[i] == both[n + j] ? 1 : -1;
        if (h < 0) continue;
        sv->o.more.push_back({row.rank, sv->o.replay[h]});
        sv->s = settle(sv->o);
        ctx.note("micro-shard " + std::to_string(k) + ": ranks 0 and 1 load data set index " + std::to_string(idx[j]) +
                 " unlike each other; rank " + std::to_string(row.rank) + " loaded it in step " + std::to_string(key.first) +
                 " as rank " + std::to_string(h) + " does");
        return Status::OK();
      }
    }
    const std::uint64_t loads[2] = {both[j], both[n + j]};
    return witness_source(ctx, k, idx[j], loads, sv);  // the first differing sample decides, or nothing does
  }
  ctx.note("micro-shard " + std::to_string(k) + ": ranks 0 and 1 load its input unlike each other, but every sample's "
           "fingerprint alike: no third opinion");
  return Status::OK();
}

// Where a member of a tensor-parallel group's record first differs from replay r, in
// first_difference's order (forward outputs first to last, gradients last to first, the
// parameters' gradients, the micro-shard's gradient, the loss), among the entries it recorded (it
// leaves other ranks' chunks 0); SIZE_MAX: nowhere.
std::size_t first_recorded_difference(const trace::ShardRow& m, const ShardResult& r) {
  const std::size_t nl = std::min(m.fwd.size(), r.fwd.size());
  for (std::size_t i = 0; i < nl; ++i)
    if (m.fwd[i] != 0 && m.fwd[i] != r.fwd[i]) return i;
  for (std::size_t i = std::min(m.bwd.size(), r.bwd.size()); i-- > 0;)
    if (m.bwd[i] != 0 && m.bwd[i] != r.bwd[i]) return nl + (nl - 1 - i);
  const std::size_t np = std::min(m.param_grad.size(), r.param_grad.size());
  for (std::size_t p = 0; p < np; ++p)
    if (m.param_grad[p] != r.param_grad[p]) return 2 * nl + p;
  if (m.grad_fp != r.grad_fp) return 2 * nl + np;
  if (!replay::same_bits(m.loss, r.loss)) return 2 * nl + np + 1;
  return SIZE_MAX;
}

// The shard a rank of a tensor-parallel run computes: its coordinate in its group and its chunks.
void shard_note(Context& ctx, std::int64_t step, int rank) {
  const int T = ctx.tensor_parallel_at(step), C = ctx.run.cfg.tp_chunks;
  if (T < 2 || C < T) return;
  const int t = rank % T, n = C / T;
  ctx.note("rank " + std::to_string(rank) + " is tensor-parallel shard " + std::to_string(t) + " of " + std::to_string(T) +
           " in group " + std::to_string(rank / T) + " (chunks " + std::to_string(t * n) + ".." +
           std::to_string(t * n + n - 1) + " of " + std::to_string(C) + ")");
}

// A chunk's layer entry (tp_gpt.cpp: "layer[c]", a column-parallel layer's "layer.dx[c]"): its
// exchange's layer and chunk; chunk -1: a layer every rank of the group computes.
std::pair<std::string, int> chunk_entry(const std::string& name) {
  const auto open = name.rfind('[');
  if (open == std::string::npos || name.back() != ']') return {name, -1};
  std::string layer = name.substr(0, open);
  if (layer.size() > 3 && layer.compare(layer.size() - 3, 3, ".dx") == 0) layer.resize(layer.size() - 3);
  return {layer, std::stoi(name.substr(open + 1, name.size() - open - 2))};
}

// A tensor-parallel micro-shard's record is its group's rows (trace_read.cpp), each with the
// layers its rank computed and, for the exchanges, the other chunks' parts as they arrived there.
// The rank that speaks for it is the one whose own record first differs from the replay most ranks
// computed: the rank that computed the chunk (or its copy of a replicated layer) where the fault
// first shows; on a tie, the chunk's own rank. A part that arrived unlike its owner's record of it
// (which the replay confirms) changed on the way: the owner's link (*link). The same on every
// rank: the replays are gathered.
void attribute_group(Context& ctx, std::int64_t step, int k, ShardVote* sv, ExchangeLink* link) {
  trace::ShardRow& row = ctx.run.trace.shards.at({step, k});
  if (row.group.size() < 2 || sv->all.empty()) return;
  const ShardResult* pick = &sv->all[0];
  int most = 0;
  for (const auto& r : sv->all) {
    const int n = static_cast<int>(std::count_if(sv->all.begin(), sv->all.end(),
                                                 [&](const ShardResult& o) { return replay::same_result(o, r); }));
    if (n > most) most = n, pick = &r;
  }
  sv->majority = static_cast<std::size_t>(pick - sv->all.data());
  // A member that loaded another input than the replay (a data fault on its copy) speaks first.
  for (std::size_t m = 0; m < row.group.size(); ++m)
    if (row.group[m].input_fp != pick->input_fp) {
      row = trace::merged_view(row.group, m);
      ctx.note("micro-shard " + std::to_string(k) + ": rank " + std::to_string(row.rank) +
               " of its tensor-parallel group loaded another input than the replay");
      shard_note(ctx, step, row.rank);
      return;
    }
  const int T = ctx.tensor_parallel_at(step), C = std::max(1, ctx.run.cfg.tp_chunks);
  const auto& layers = ctx.schema.layers;
  const auto owner_of = [&](std::size_t at) {  // the tp coordinate that computed entry `at`; -1: every one
    const std::size_t nl = layers.size();
    if (at >= 2 * nl) return -1;
    const int c = chunk_entry(layers[at < nl ? at : 2 * nl - 1 - at]).second;
    return c < 0 ? -1 : c / std::max(1, C / T);
  };
  std::size_t who = 0, best = SIZE_MAX;
  for (std::size_t m = 0; m < row.group.size(); ++m) {
    const std::size_t at = first_recorded_difference(row.group[m], *pick);
    const bool own = at != SIZE_MAX && owner_of(at) == row.group[m].rank % T;
    if (at < best || (at == best && own)) best = at, who = m;
  }
  if (best == SIZE_MAX) return;  // every rank's record is the replay's
  const int owner = owner_of(best);
  if (owner >= 0 && owner != row.group[who].rank % T) {
    const std::size_t nl = layers.size();
    link->sender = row.group[who].rank - row.group[who].rank % T + owner;
    link->receiver = row.group[who].rank;
    link->layer = chunk_entry(layers[best < nl ? best : 2 * nl - 1 - best]).first;
  }
  row = trace::merged_view(row.group, who);
  ctx.note("micro-shard " + std::to_string(k) + ": of its tensor-parallel group's records (ranks " + [&] {
             std::string l;
             for (const auto& m : row.group) l += (l.empty() ? "" : ", ") + std::to_string(m.rank);
             return l;
           }() + "), rank " + std::to_string(row.rank) + "'s differs first from the replay");
  shard_note(ctx, step, link->sender >= 0 ? link->sender : row.rank);
}

Status vote_shard(Context& ctx, std::int64_t step, int k, ShardVote* out) {
  out->row = &ctx.run.trace.shards.at({step, k});
  const std::size_t nl = ctx.layer ? ctx.schema.layers.size() : 0, np = ctx.layer ? ctx.schema.params.size() : 0;
  ShardResult& mine = out->mine;
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, ctx.engine->compute_shard(k, ctx.round, &mine)));
  mine.rank = ctx.comm.rank;
  out->all = allgather(ctx.comm, mine, nl, np);
  attribute_group(ctx, step, k, out, &out->link);
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
  // Still a tie of two self-consistent devices. Loaded unlike each other: another device's load of
  // the same samples in the run is the third opinion; else the float64 recomputation.
  if (out->s.ambiguous && ctx.W == 2 && out->all[0].input_fp != out->all[1].input_fp)
    return witness_load(ctx, k, out);
  if (out->s.ambiguous && ctx.W == 2) {
    CULPRIT_RETURN_IF_ERROR(arbitrate_shard(ctx, k, mine, &out->arbiter));
    ctx.note("micro-shard " + std::to_string(k) + ": ranks 0 and 1 each reproduce their own result; " + out->arbiter.why);
    if (out->arbiter.healthy >= 0) {
      out->o.more.push_back({kArbiterDevice, out->o.replay[out->arbiter.healthy]});
      out->s = settle(out->o);
    }
  }
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
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Ibcast(want.data(), static_cast<int>(want.size()), MPI_UINT64_T, from, ctx.comm.comm, &_culprit_req));
  const auto& got = f->reference.sample_fps;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i]) {
      const auto idx = ctx.engine->shard_samples(f->bad_shard);
      if (i < idx.size()) {
        f->sample = idx[i];
        ctx.engine->sample_location(f->sample, &f->sample_file, &f->sample_offset);
      }
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
                                      "faulty, and no third opinion (reruns, the float64 recomputation, another device's load of "
                                      "the samples, the data source read afresh) tells which (bisect with 3 or more ranks, or screen both)"
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
// The float64 arbiter's decision on one micro-shard of the step names the healthy device for the
// step's other ties too (a device is one device across the micro-shards of a step; on some the
// recomputation has nothing to measure: a fault the ReLU after it erased shows in a forward
// fingerprint only).
struct Sibling {
  int healthy = -1;  // the rank the arbiter sided with; -1: none yet
  int shard = -1;    // on which micro-shard
};
void adopt(Context& ctx, const Sibling& by, int k, ShardVote* sv) {
  sv->o.more.push_back({kArbiterDevice, sv->o.replay[by.healthy]});
  sv->s = settle(sv->o);
  ctx.note("micro-shard " + std::to_string(k) + ": the float64 recomputation of micro-shard " + std::to_string(by.shard) +
           " sides with rank " + std::to_string(by.healthy) + ", taken as the healthy device here too");
}

// A tie the arbiter could not tell on the i-th differing micro-shard, with no decision on an earlier
// one: the step's later differing micro-shards are arbitrated until one decides. Collective.
Status arbitrate_later(Context& ctx, const Finding& f, std::size_t i, Sibling* by) {
  for (std::size_t j = i + 1; j < f.bad_shards.size() && by->healthy < 0; ++j) {
    ShardVote other;
    CULPRIT_RETURN_IF_ERROR(vote_shard(ctx, f.step, f.bad_shards[j], &other));
    if (other.arbiter.healthy >= 0) *by = {other.arbiter.healthy, f.bad_shards[j]};
  }
  return Status::OK();
}

// --shard-params: a slice the online gather check saw change (at rest on its owner, or on its way)
// was gathered by every rank that computed with it, so their records of the step differ together:
// the micro-shards are not where it happened, and the record of micro-shard 0 would name whichever
// rank computed it. The check named the rank; a whole replay holds no slices, so it cannot rerun a
// slice at rest: the verdict is unconfirmed.
bool gathered_slice(Context& ctx, Finding* f, Evidence* ev) {
  const records::Incident* first = ctx.first;
  if (!first || first->step != f->step || first->detector != Detector::kGatherCheck || first->rank < 0 ||
      first->rank >= ctx.W)
    return false;
  f->blamed = first->rank;
  // The owner's own copy was right and every other rank's wrong: what left it (its link); else its
  // memory at rest.
  const bool link = first->sender >= 0;
  f->phase = link ? Phase::kGatherLink : Phase::kGather;
  const auto dot = first->tensor.rfind('.');
  f->layer = dot == std::string::npos ? first->tensor : first->tensor.substr(0, dot);
  ev->blamed = true;
  ev->at_rest = true;
  ctx.note("the gather check of step " + std::to_string(f->step) + " named rank " + std::to_string(f->blamed) +
           (link ? "'s link" : "") + " for parameter '" + first->tensor + "' (" + first->message + "); micro-shard(s) " +
           rank_list(f->bad_shards) +
           " differ because the ranks that gathered it so computed with it. A replay holds the parameters whole: "
           "it cannot rerun a slice as gathered, so transient and persistent cannot be told apart");
  return true;
}

// A tensor-parallel exchange: what rank `sender` computed (its record and the replay agree) arrived
// at `receiver` changed. A replay computes every chunk on one rank: nothing crosses the link again,
// so transient and persistent cannot be told apart.
Status exchange_link(Context& ctx, const ShardVote& sv, int k, Finding* f, Evidence* ev) {
  f->bad_shard = k;
  f->blamed = sv.link.sender;
  f->phase = Phase::kTpLink;
  f->layer = sv.link.layer;
  f->reference = harness::shard_result(*sv.row);
  f->healthy = sv.all[sv.majority];
  ev->blamed = true;
  ev->exchange = true;
  ctx.note("micro-shard " + std::to_string(k) + ": the part of layer " + sv.link.layer + " that rank " +
           std::to_string(sv.link.sender) + " computed (its record and the replay agree) arrived at rank " +
           std::to_string(sv.link.receiver) + " changed: rank " + std::to_string(sv.link.sender) +
           "'s link in the tensor-parallel exchange. A replay computes every chunk on one rank: nothing crosses it "
           "again, so transient and persistent cannot be told apart");
  return Status::OK();
}

Status localize_shard(Context& ctx, Finding* f, Evidence* ev) {
  if (gathered_slice(ctx, f, ev)) return Status::OK();
  std::vector<int> suspects;
  Sibling by;
  for (std::size_t i = 0; i < f->bad_shards.size(); ++i) {
    const int k = f->bad_shards[i];
    ShardVote sv;
    CULPRIT_RETURN_IF_ERROR(vote_shard(ctx, f->step, k, &sv));
    if (sv.link.sender >= 0) return exchange_link(ctx, sv, k, f, ev);
    if (sv.arbiter.healthy >= 0 && by.healthy < 0) by = {sv.arbiter.healthy, k};
    if (sv.s.ambiguous && sv.arbiter.tried && sv.arbiter.healthy < 0) {
      if (by.healthy < 0) CULPRIT_RETURN_IF_ERROR(arbitrate_later(ctx, *f, i, &by));
      if (by.healthy >= 0) adopt(ctx, by, k, &sv);
    }
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

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

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
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(&reproduced, &total, 1, MPI_INT, MPI_SUM, ctx.comm.comm, &_culprit_req));
  ev->reproduced = total;
  ctx.d->reruns = reruns;
  ctx.d->reproduced = total;
  ctx.note("rank " + std::to_string(f->blamed) + " recomputed micro-shard " + std::to_string(f->bad_shard) + " " +
           std::to_string(reruns) + " times: " + std::to_string(total) + " differ from the healthy result");
  return Status::OK();
}

}  // namespace culprit::bisect
