#include "detect/detectors.h"
#include "detect/node_topology.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "culprit/watchdog.h"
#include "culprit/finite.h"

namespace culprit::harness {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Stopwatch::Stopwatch(double* acc) : acc_(acc), t0_(now_seconds()) {}
Stopwatch::~Stopwatch() { *acc_ += now_seconds() - t0_; }

void StepDetectors::configure(const TrainConfig& cfg, const Comm& comm, std::vector<std::string> params,
                              StateProbe probe) {
  cfg_ = &cfg;
  comm_ = &comm;
  params_ = std::move(params);
  probe_ = std::move(probe);
  loss_spikes_.configure(cfg.detect.spike_window, cfg.detect.spike_z, cfg.detect.spike_ratio);
  grad_spikes_.configure(cfg.detect.spike_window, cfg.detect.spike_z, cfg.detect.spike_ratio);
  // The vote's node communicators now, at start-up, not at the first vote: their splits block (MPI
  // has no nonblocking split), and a rank lost in the middle of training must meet only watched
  // collectives. Start-up's other collectives block as well.
  if (comm.size > 1) node_topology(comm);
}

void StepDetectors::set_placement(std::vector<std::string> hosts, std::vector<std::string> devices) {
  hosts_ = std::move(hosts);
  devices_ = std::move(devices);
}

Incident StepDetectors::make_incident(std::int64_t step, Detector d, IncidentClass c, int rank, std::string message) {
  Incident inc;
  inc.step = step;
  inc.detector = d;
  inc.cls = c;
  inc.rank = rank;
  if (rank >= 0) inc.ranks = {rank};
  inc.message = std::move(message);
  return inc;
}

void StepDetectors::incident(Incident inc, bool may_halt) {
  saw_fault_ = saw_fault_ || records::shows_a_fault(inc);
  if (inc.rank >= 0 && inc.rank < static_cast<int>(hosts_.size())) {
    inc.host = hosts_[inc.rank];
    inc.device = devices_[inc.rank];
  }
  if (comm_->rank == 0) {
    std::fprintf(stderr, "culprit: incident: step %lld %s (%s): %s\n", static_cast<long long>(inc.step),
                 name_of(inc.detector), name_of(inc.cls), inc.message.c_str());
    std::fflush(stderr);
    Status st = records::append_incident(cfg_->run_dir, inc);
    if (!st.ok()) std::fprintf(stderr, "culprit: warning: %s\n", st.message().c_str());
  }
  if (may_halt && cfg_->detect.halts() && halt_.ok())
    halt_ = Status::Error(status_code_for(inc.cls), "halted at step " + std::to_string(inc.step) + " by the " +
                                                        name_of(inc.detector) + " detector (" + name_of(inc.cls) +
                                                        "): " + inc.message);
}

// ---- the vote ----

void StepDetectors::vote(StepFacts& f) {
  const std::int64_t s = f.step;
  const int W = comm_->size;
  const bool comm_check = cfg_->detect.comm_check && W > 1;
  // --shard-params: no rank holds a replica (every rank composes the same fingerprints from the
  // owners' chunk hashes), so there is nothing to compare; the trace's slice records cover the state.
  const bool replicas = cfg_->detect.replica_check_every > 0 && s % cfg_->detect.replica_check_every == 0 && W > 1 &&
                        !cfg_->shard_params;
  // The micro-shard facts travel here unless the spot check exchanged them already.
  const bool shard_facts = cfg_->detect.invariants && !f.shards_exchanged;
  if (!cfg_->detect.nonfinite && !cfg_->detect.invariants && !comm_check && !replicas && cfg_->detect.spike_window <= 0)
    return;
  VoteRecord mine;
  VoteLayout layout;
  layout.world = W;
  if (replicas) {
    // Parameters and optimizer state must be bitwise identical on every rank. With
    // --shard-optimizer the ranks share the parameters only: each holds its own slice of the state
    // (covered by the trace's slice records, which a replay checks).
    mine.replica = f.param_fps;
    if (!cfg_->shard_optimizer) {
      const auto opt = f.opt_fps.empty() ? probe_.optimizer_fps() : f.opt_fps;  // the trace's, once
      mine.replica.insert(mine.replica.end(), opt.begin(), opt.end());
    }
    layout.replica = mine.replica.size();
  }
  mine.bad_shard = f.bad_shard;
  mine.bad_params =
      cfg_->detect.nonfinite && !(f.params_finite >= 0 ? f.params_finite == 1 : probe_.params_finite());
  mine.violated = !f.violation.empty();
  mine.gather_chunk = comm_check ? f.gather_chunk : -1;
  if (comm_check) {
    layout.comm = true;
    mine.comm = *f.comm;
  }
  if (shard_facts) {
    layout.micro_shards = f.shards.micro_shards();
    mine.facts = f.shards;
  }
  const Votes v = exchange_votes(*comm_, mine, layout, "the detector vote");
  // Every rank's record when the summary showed something; empty when every rank was clean, where
  // each check below finds nothing, as it would have in the records.
  const std::vector<VoteRecord>& votes = v.records;
  if (comm_check) check_comm(f, votes);
  if (comm_check && !votes.empty()) check_gather(f, votes);
  if (cfg_->detect.nonfinite) check_nonfinite(f, votes);
  if (cfg_->detect.invariants) {
    // Each micro-shard's facts come from its owner: every slot is set on one rank only; the vote ORs them.
    if (shard_facts) f.shards.assign(v.facts.data(), layout.micro_shards);
    check_invariants(f, votes);
  }
  if (cfg_->detect.spike_window > 0) check_spikes(f);
  if (replicas && !votes.empty()) check_replicas(f, votes);
}

void StepDetectors::check_comm(const StepFacts& f, const std::vector<VoteRecord>& votes) {
  const auto bad = comm_mismatches(comm_checks(votes));
  if (bad.empty()) return;
  std::string pairs;
  for (const auto& [from, to] : bad) pairs += (pairs.empty() ? "" : ", ") + std::to_string(from) + " -> " + std::to_string(to);
  Incident inc = make_incident(f.step, Detector::kComm, IncidentClass::kHardware, bad[0].first,
                               "reduction message(s) arrived unlike they were sent (sender -> receiver): " + pairs);
  inc.what = Subject::kMessage;
  inc.sender = bad[0].first;
  inc.receiver = bad[0].second;
  inc.ranks.clear();
  for (const auto& [from, to] : bad)
    if (std::find(inc.ranks.begin(), inc.ranks.end(), from) == inc.ranks.end()) inc.ranks.push_back(from);
  incident(inc);
}

// --shard-params: every rank hashed each parameter as its first gather of the step gave it, and
// compared the chunks with the hashes their owner recorded after its update. The first chunk any rank
// saw differ names its owner when every other rank saw it too (what the owner sent changed: its
// memory at rest, which its own check then also sees, or its link); a chunk that only some
// receivers saw differ names the first of them (what arrived there).
void StepDetectors::check_gather(const StepFacts& f, const std::vector<VoteRecord>& votes) {
  std::int64_t k = -1;
  for (const auto& v : votes)
    if (v.gather_chunk >= 0 && (k < 0 || v.gather_chunk < k)) k = v.gather_chunk;
  if (k < 0 || !probe_.chunk_owner) return;
  const auto [owner, param] = probe_.chunk_owner(k);
  std::vector<int> saw;
  for (int r = 0; r < static_cast<int>(votes.size()); ++r)
    if (votes[r].gather_chunk == k) saw.push_back(r);
  const bool owner_saw = std::find(saw.begin(), saw.end(), owner) != saw.end();
  const int others = static_cast<int>(saw.size()) - (owner_saw ? 1 : 0);
  const std::string name = param < params_.size() ? params_[param] : "?";
  const bool all_others = others == static_cast<int>(votes.size()) - 1;
  Incident inc;
  if (all_others || owner_saw) {
    inc = make_incident(f.step, Detector::kGatherCheck, IncidentClass::kHardware, owner,
                        "parameter '" + name + "' (chunk " + std::to_string(k) + ", rank " + std::to_string(owner) +
                            "'s slice) " +
                            (owner_saw ? "changed at rest on its owner, rank " + std::to_string(owner) +
                                             ", after its update was recorded: every rank gathered the changed bits"
                                       : "arrived at every other rank unlike rank " + std::to_string(owner) +
                                             " recorded it after its update (what it sent)"));
    inc.ranks = {owner};
    if (!owner_saw) {  // the owner's own copy is right: what left it changed (its link)
      inc.sender = owner;
      inc.receiver = saw.front();
    }
  } else {
    inc = make_incident(f.step, Detector::kGatherCheck, IncidentClass::kHardware, saw.front(),
                        "parameter '" + name + "' (chunk " + std::to_string(k) + ", rank " + std::to_string(owner) +
                            "'s slice) arrived at rank " + std::to_string(saw.front()) +
                            (saw.size() > 1 ? " and " + std::to_string(saw.size() - 1) + " more" : "") +
                            " unlike its owner recorded it (what arrived there)");
    inc.ranks = saw;
  }
  inc.tensor = name;
  inc.what = Subject::kParameter;
  incident(inc);
}

void StepDetectors::check_nonfinite(const StepFacts& f, const std::vector<VoteRecord>& votes) {
  int shard_rank = -1, param_rank = -1;
  for (int r = static_cast<int>(votes.size()) - 1; r >= 0; --r) {
    if (votes[r].bad_shard >= 0) shard_rank = r;
    if (votes[r].bad_params) param_rank = r;
  }
  const bool bad_reduced = f.reduced_finite >= 0 ? f.reduced_finite == 0
                                                 : !all_finite(f.reduced, static_cast<std::size_t>(f.params + 1));
  if (shard_rank >= 0) {
    const int k = votes[shard_rank].bad_shard;
    Incident inc = make_incident(f.step, Detector::kNonfinite, IncidentClass::kNumerical, shard_rank,
                                 "NaN/Inf in the loss or gradient of micro-shard " + std::to_string(k) +
                                     " computed on rank " + std::to_string(shard_rank));
    inc.micro_shard = k;
    inc.what = Subject::kGradient;
    incident(inc);
  } else if (bad_reduced) {
    Incident inc = make_incident(f.step, Detector::kNonfinite, IncidentClass::kNumerical, -1,
                                 "NaN/Inf in the reduced gradient or loss, though every micro-shard was finite");
    inc.what = Subject::kGradient;
    incident(inc);
  } else if (param_rank >= 0) {
    Incident inc = make_incident(f.step, Detector::kNonfinite, IncidentClass::kNumerical, param_rank,
                                 "NaN/Inf in the parameters of rank " + std::to_string(param_rank) + " after the update");
    inc.what = Subject::kParameter;
    incident(inc);
  }
}

void StepDetectors::check_invariants(StepFacts& f, const std::vector<VoteRecord>& votes) {
  const int W = comm_->size, n = static_cast<int>(votes.size());  // n: W, or 0 when all were clean
  int vr = -1, count = 0;
  for (int r = 0; r < n; ++r)
    if (votes[r].violated) {
      if (vr < 0) vr = r;
      ++count;
    }
  if (vr >= 0) {
    // The message comes from the first rank that saw the invariant broken.
    const std::string msg = W > 1 ? broadcast_string(*comm_, f.violation, vr) : f.violation;
    const std::string who = count == W && count > 1 ? "every rank (first rank " + std::to_string(vr) + ")"
                            : count > 1 ? "rank " + std::to_string(vr) + " and " + std::to_string(count - 1) + " more"
                                        : "rank " + std::to_string(vr);
    Incident inc = make_incident(f.step, Detector::kInvariant, IncidentClass::kInvariant, vr, who + ": " + msg);
    inc.ranks.clear();
    for (int r = 0; r < n; ++r)
      if (votes[r].violated) inc.ranks.push_back(r);
    incident(inc);
  }
  check_shard_invariants(f);
}

void StepDetectors::check_spikes(const StepFacts& f) {
  // Loss and gradient norm are the same on every rank: so is this decision.
  const double loss = f.reduced[f.params];
  for (auto [det, value, what] : {std::tuple<SpikeDetector*, double, const char*>{&loss_spikes_, loss, "loss"},
                                  {&grad_spikes_, f.grad_norm, "gradient norm"}}) {
    std::string why;
    if (det->observe(value, &why))
      incident(make_incident(f.step, Detector::kSpike, IncidentClass::kNumerical, -1, std::string(what) + " spike: " + why),
               cfg_->detect.spike_action == SpikeAction::kHalt);
  }
}

// Each rank's set: every parameter's fingerprint, then every parameter's optimizer state's.
void StepDetectors::check_replicas(const StepFacts& f, const std::vector<VoteRecord>& votes) {
  std::vector<Fingerprint> sets;
  for (const auto& v : votes) sets.insert(sets.end(), v.replica.begin(), v.replica.end());
  const std::size_t P = params_.size();
  const ReplicaCheck rc = compare_replicas(static_cast<int>(votes.size()), sets, votes[0].replica.size());
  if (!rc.diverged) return;
  std::string ranks;
  for (int r : rc.odd_ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  const std::size_t i = static_cast<std::size_t>(rc.first_index);
  const bool opt_state = i >= P;
  const std::string& tensor = params_[i % P];
  const std::string where = "first in '" + tensor + (opt_state ? " (optimizer state)" : "") + "'";
  Incident inc = make_incident(f.step, Detector::kReplicaDivergence, IncidentClass::kHardware,
                               rc.tied ? -1 : rc.odd_ranks[0],
                               rc.tied ? "replicas of rank(s) " + ranks + " disagree with no majority, " + where +
                                             ": nobody is blamed before a bisection settles it against the record"
                                       : "rank(s) " + ranks + " differ from the other replicas, " + where);
  inc.ranks = rc.odd_ranks;
  inc.tensor = tensor;
  inc.what = opt_state ? Subject::kOptimizerState : Subject::kParameter;
  incident(inc);
}

// ---- spot checks and training invariants ----

// The spot-check schedule: in step s, every rank recomputes the same number q_s of micro-shards of
// the rank before it, so the extra work is spread evenly and costs about 1 + P. q_s is the step's
// share of floor(P * n * s), n the most micro-shards a rank computes; the shards rotate.
std::vector<int> StepDetectors::spot_shards(std::int64_t s, int checker) const {
  std::vector<int> out;
  if (cfg_->detect.spot_check <= 0) return out;
  const int W = comm_->size, M = cfg_->micro_shards;
  const ShardRange r = shard_range((checker + W - 1) % W, W, M);
  const int count = r.hi - r.lo, n = (M + W - 1) / W;
  auto total = [&](std::int64_t t) {
    return static_cast<std::int64_t>(std::floor(cfg_->detect.spot_check * n * static_cast<double>(t) + 1e-9));
  };
  const std::int64_t first = total(s - 1), q = std::min<std::int64_t>(total(s) - first, count);
  for (std::int64_t j = 0; j < q; ++j) out.push_back(r.lo + static_cast<int>((first + j) % count));
  return out;
}

bool StepDetectors::spot_checked(std::int64_t s, int k) const {
  const auto v = spot_shards(s, (owner_of(k) + 1) % comm_->size);
  return std::find(v.begin(), v.end(), k) != v.end();
}

int StepDetectors::owner_of(int k) const {
  // --shard-params training computes micro-shard k on rank k mod W (determinism.md §2).
  if (cfg_->shard_params) return k % comm_->size;
  // --tensor-parallel T: the group of data-parallel rank g computes it; named by its first rank.
  const int T = cfg_->chunked() ? cfg_->tensor_parallel : 1, D = comm_->size / T;
  for (int g = 0; g < D; ++g)
    if (shard_range(g, D, cfg_->micro_shards).hi > k) return g * T;
  return (D - 1) * T;
}

void StepDetectors::check_shards(StepFacts& f) {
  const std::int64_t s = f.step;
  f.shards_exchanged = false;
  if (spot_shards(s, 0).empty()) return;  // the same count for every rank: no spot check this step
  f.shards_exchanged = true;
  const int M = cfg_->micro_shards, W = comm_->size;
  // Redundant computation: this rank recomputes its share of the previous rank's micro-shards.
  for (int k : spot_shards(s, comm_->rank)) f.shards.recomputed[k] = probe_.recompute(k, 1);
  // Every slot is written by one rank: a bitwise OR gathers them.
  std::vector<Fingerprint> flat = f.shards.flat();
  CULPRIT_COLLECTIVE(*comm_, "the micro-shard check",
                     MPI_Iallreduce(MPI_IN_PLACE, flat.data(), static_cast<int>(flat.size()), MPI_UINT64_T, MPI_BOR,
                                    comm_->comm, &_culprit_req));
  f.shards.assign(flat.data(), M);
  std::vector<int> differ;
  for (int k = 0; k < M; ++k)
    if (spot_checked(s, k) && f.shards.leaf[k] != f.shards.recomputed[k]) differ.push_back(k);
  if (differ.empty()) return;
  // A third opinion: another rank recomputes (with two ranks, the owner itself).
  std::vector<Fingerprint> tie(M, 0);
  for (int k : differ)
    if (W > 1 && third_opinion(k) == comm_->rank) tie[k] = probe_.recompute(k, 2);
  CULPRIT_COLLECTIVE(*comm_, "the micro-shard check",
                     MPI_Iallreduce(MPI_IN_PLACE, tie.data(), M, MPI_UINT64_T, MPI_BOR, comm_->comm, &_culprit_req));
  spot_verdict(f, differ, tie);
}

int StepDetectors::third_opinion(int k) const {
  const int W = comm_->size, o = owner_of(k), c = (o + 1) % W;
  if (W == 1) return -1;
  if (W == 2) return o;
  return (c + 1) % W != o ? (c + 1) % W : (c + 2) % W;
}

// Who computed micro-shard differ[0] wrongly: the owner, its checker or (no majority) nobody named.
void StepDetectors::spot_verdict(const StepFacts& f, const std::vector<int>& differ, const std::vector<Fingerprint>& tie) {
  const int W = comm_->size;
  const int k = differ[0], o = owner_of(k), c = (o + 1) % W, t = third_opinion(k);
  int faulty = -1;
  std::string why;
  const std::string so = "rank " + std::to_string(o), sc = "rank " + std::to_string(c);
  if (W == 1) {
    faulty = 0;
    why = "rank 0 computed it differently the second time (a transient fault or a nondeterministic kernel)";
  } else if (tie[k] == f.shards.recomputed[k]) {
    faulty = o;
    why = (W == 2 ? so + " itself" : "rank " + std::to_string(t)) + " recomputed it like " + sc;
  } else if (W > 2 && tie[k] == f.shards.leaf[k]) {
    faulty = c;
    why = "rank " + std::to_string(t) + " recomputed it like " + so + ": the checker is the odd one";
  } else {
    why = W == 2 ? so + " reproduces its own result: one of the two ranks computes wrongly every time (a third "
                        "rank or a replay decides which)"
                 : "no two of the three computations agree";
  }
  std::string list;
  for (int d : differ) list += (list.empty() ? "" : ",") + std::to_string(d);
  Incident inc = make_incident(f.step, Detector::kSpotCheck, IncidentClass::kHardware, faulty,
                               "micro-shard " + std::to_string(k) + " computed by " + so +
                                   " differs bitwise from its recomputation on " + sc + "; " + why +
                                   " (micro-shards that differ: " + list + ")");
  inc.micro_shard = k;
  inc.what = Subject::kGradient;
  incident(inc);
}

// The micro-shard invariants, from the step's gathered facts (same on every rank).
void StepDetectors::check_shard_invariants(const StepFacts& f) {
  const std::int64_t s = f.step;
  const int M = cfg_->micro_shards;
  // Each sample once per epoch: every micro-shard used exactly its share of the epoch's permutation.
  for (int k = 0; k < M; ++k)
    if (f.shards.samples[k] != probe_.samples_fp(k)) {
      Incident inc = make_incident(s, Detector::kInvariant, IncidentClass::kInvariant, owner_of(k),
                                   "micro-shard " + std::to_string(k) + " on rank " + std::to_string(owner_of(k)) +
                                       " did not use its share of the epoch's samples (samples repeated or skipped)");
      inc.micro_shard = k;
      incident(inc);
      break;
    }
  // Dropout masks differ: no two micro-shards of this step or the last start from one generator state.
  std::map<Fingerprint, int> seen;
  for (int k = 0; k < M; ++k) {
    const Fingerprint g = f.shards.rng[k];
    const bool last = std::find(prev_rng_.begin(), prev_rng_.end(), g) != prev_rng_.end();
    if (seen.count(g) || last) {
      Incident inc = make_incident(s, Detector::kInvariant, IncidentClass::kInvariant, owner_of(k),
                                   "micro-shard " + std::to_string(k) + " on rank " + std::to_string(owner_of(k)) +
                                       " drew its dropout masks from the same generator state as " +
                                       (last ? std::string("a micro-shard of the previous step")
                                             : "micro-shard " + std::to_string(seen[g])) +
                                       ": the masks repeat");
      inc.micro_shard = k;
      incident(inc);
      break;
    }
    seen[g] = k;
  }
  prev_rng_ = f.shards.rng;
}

// Invariants of the update: the learning rate is the schedule's, and every parameter whose gradient
// asks for a change well above float rounding did change.
void StepDetectors::check_update(StepFacts& f, double lr, double used, const std::vector<std::int64_t>& offsets,
                                 const std::vector<std::int64_t>& sizes, const std::vector<double>& param_lrs) {
  if (used != lr) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "the learning rate of step %lld is %.9g but the schedule gives %.9g",
                  static_cast<long long>(f.step), used, lr);
    f.violated(buf);
  }
  if (prev_param_fps_.size() == f.param_fps.size()) {
    const float* p = probe_.host_params();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const double rate = param_lrs.empty() ? used : param_lrs.at(i);
      if (rate == 0 || f.param_fps[i] != prev_param_fps_[i]) continue;
      // --shard-params: the elements of this rank's slice (each rank checks its own).
      const std::int64_t first = std::max(offsets[i], f.held_lo);
      const std::int64_t last = std::min(offsets[i] + sizes[i], f.held_hi < 0 ? offsets[i] + sizes[i] : f.held_hi);
      for (std::int64_t j = first; j < last; ++j)
        if (f.reduced[j] != 0 && std::fabs(rate * f.update_scale * f.reduced[j]) > std::ldexp(std::fabs(p[j]), -16)) {
          f.violated("parameter '" + params_[i] + "' did not change in step " + std::to_string(f.step) +
                     " although its gradient is nonzero (a frozen or forgotten parameter, or an update that did "
                     "not land)");
          break;
        }
    }
  }
  prev_param_fps_ = f.param_fps;
}

}  // namespace culprit::harness
