#include "faults.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <tuple>

#include "finite.h"
#include "trainer.h"
#include "culprit/watchdog.h"

namespace culprit::harness {

void corrupt_in_place(const FaultSpec& spec, const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || t.scalar_type() != at::kFloat || !t.is_contiguous()) return;
  torch::NoGradGuard ng;
  if (!t.is_cpu()) {  // a GPU tensor: read the element, write the corrupted value back
    auto e = t.view(-1).narrow(0, spec.index % t.numel(), 1);
    e.fill_(corrupt_value(spec, e.item<float>()));
    return;
  }
  float* p = t.data_ptr<float>() + spec.index % t.numel();
  *p = corrupt_value(spec, *p);
}

at::Tensor corrupt_output(const FaultSpec& spec, const at::Tensor& out) {
  if (out.numel() == 0 || out.scalar_type() != at::kFloat) return out;
  const std::int64_t i = spec.index % out.numel();
  torch::Tensor flat = out.detach().reshape(-1);
  const float bad = corrupt_value(spec, flat[i].item<float>());
  auto mask = torch::zeros({out.numel()}, out.options().dtype(torch::kBool));
  mask[i] = true;
  return torch::where(mask.view(out.sizes()), torch::full({}, bad, out.options()), out);
}

void corrupt_tokens(const FaultSpec& spec, const at::Tensor& t, std::int64_t vocab) {
  if (t.numel() == 0 || t.scalar_type() != at::kLong) return;
  std::int64_t* p = t.data_ptr<std::int64_t>() + spec.index % t.numel();
  *p = (*p + 1) % vocab;
}


// ---- fault injection and detection inside the trainer (docs/detection.md) ----

bool Trainer::fires(const FaultSpec& f, Phase phase, int occurrence, bool per_shard) const {
  if (f.phase != phase) return false;
  // A transient fault hits once: the first micro-shard the rank computes in that step.
  if (f.mode == FaultMode::kTransient && per_shard && occurrence != first_shard_) return false;
  // Recomputations (attempt > 0) are further executions: transient faults stay away, intermittent
  // ones draw again.
  const std::uint64_t occ = static_cast<std::uint64_t>(occurrence) +
                            1000003ULL * static_cast<std::uint64_t>(attempt_ + (replaying_ ? 3 + round_ : 0));
  if (!fault_fires(f, self(), cur_step_, /*replay=*/attempt_ > 0 || replaying_, cfg_.seed, occ)) return false;
  if (f.kind == FaultKind::kHang) {
    // A stuck device: the rank stops here, in the middle of the step.
    std::fprintf(stderr, "culprit: injected fault: rank %d hangs for %g s in step %lld (%s)\n", self(), f.seconds,
                 static_cast<long long>(cur_step_), f.text.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
    return false;
  }
  return true;
}

int Trainer::layer_param(const std::string& layer) const {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name.rfind(layer + ".", 0) == 0) return static_cast<int>(i);
  return -1;
}

// Records each layer's forward output fingerprint and, through a gradient hook, the fingerprint of
// the gradient flowing back into it.
LayerTrace::LayerTrace(Trainer* t, std::vector<std::string> layers) : trainer(t) {
  for (std::size_t i = 0; i < layers.size(); ++i) index[layers[i]] = i;
}

at::Tensor LayerTrace::on_forward(const std::string& layer, const at::Tensor& output) {
  at::Tensor out = output;
  Trainer* t = trainer;
  for (const auto& f : t->faults_) {
    if (f.layer != layer) continue;
    if (t->fires(f, Phase::kForward, shard, true)) out = corrupt_output(f, out);
    if (out.requires_grad() && t->fires(f, Phase::kBackward, shard, true)) {
      const FaultSpec spec = f;
      out.register_hook([spec](const at::Tensor& g) {
        auto bad = g.clone();
        corrupt_in_place(spec, bad);
        return bad;
      });
    }
  }
  const auto it = index.find(layer);
  if (it == index.end() || t->fwd_.empty()) return out;
  const std::size_t i = it->second;
  t->fwd_[i] = tensor_fingerprint(out.detach());
  if (out.requires_grad()) out.register_hook([t, i](const at::Tensor& g) { t->bwd_[i] = tensor_fingerprint(g); });
  return out;
}


void Trainer::incident(Incident inc, bool may_halt) {
  if (inc.rank >= 0) {
    inc.host = info_.hosts[inc.rank];
    inc.device = info_.devices[inc.rank];
  }
  if (comm_.rank == 0) {
    std::fprintf(stderr, "culprit: incident: step %lld %s (%s): %s\n", static_cast<long long>(inc.step),
                 inc.detector.c_str(), class_name(inc.cls), inc.message.c_str());
    std::fflush(stderr);
    Status st = log_incident(cfg_.run_dir, inc);
    if (!st.ok()) std::fprintf(stderr, "culprit: warning: %s\n", st.message().c_str());
  }
  if (may_halt && (cfg_.on_detect == "halt" || cfg_.on_detect == "diagnose") && halt_.ok())
    halt_ = Status::Error("halted at step " + std::to_string(inc.step) + " by the " + inc.detector + " detector (" +
                              class_name(inc.cls) + "): " + inc.message,
                          exit_code_for(inc.cls));
}

// The detectors of one step. Every rank contributes one record to a single allgather (the vote);
// every decision is then taken from the same data on every rank, so all ranks act alike.
void Trainer::detect(std::int64_t s) {
  const int W = comm_.size;
  const bool comm_check = cfg_.comm_check && W > 1;
  const bool replicas = cfg_.replica_check_every > 0 && s % cfg_.replica_check_every == 0 && W > 1;
  // The micro-shard facts travel here unless the spot check exchanged them already.
  const bool shard_facts = cfg_.check_invariants && !facts_exchanged_;
  if (!cfg_.detect_nonfinite && !cfg_.check_invariants && !comm_check && !replicas && cfg_.spike_window <= 0) return;
  // Parameters and optimizer state must be bitwise identical on every rank.
  std::vector<Fingerprint> fps;
  std::vector<std::string> names;
  if (replicas) {
    fps = param_fps_;
    for (const auto& p : params_) names.push_back(p.name);
    for (const auto& p : params_) {
      auto it = opt_->state().find(optimizer_state_key(opt_->state(), p.tensor));
      at::Tensor t;
      if (it != opt_->state().end())
        t = cfg_.optimizer == "sgd" ? static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer()
                                    : static_cast<torch::optim::AdamWParamState&>(*it->second).exp_avg();
      fps.push_back(t.defined() ? tensor_fingerprint(t) : 0);
      names.push_back(p.name + " (optimizer state)");
    }
  }
  bool bad_params = false;
  if (cfg_.detect_nonfinite) {
    bad_params = flat_params_.is_cuda() ? !torch::isfinite(flat_params_).all().item<bool>()
                                        : !all_finite(flat_params_.data_ptr<float>(), static_cast<std::size_t>(P_));
  }
  // This rank's record: [bad micro-shard + 1, bad parameters, invariant broken, phase-1 sent (W),
  // phase-1 received (W), phase-2 chunks (W), micro-shard facts (4M), replica fingerprints].
  const std::size_t n_comm = comm_check ? 3 * W : 0, n_facts = shard_facts ? facts_.size() : 0;
  const std::size_t len = 3 + n_comm + n_facts + fps.size();
  std::vector<Fingerprint> rec;
  rec.reserve(len);
  rec.push_back(static_cast<Fingerprint>(bad_shard_ + 1));
  rec.push_back(bad_params);
  rec.push_back(!violation_.empty());
  if (comm_check) {
    rec.insert(rec.end(), cc_.sent.begin(), cc_.sent.end());
    rec.insert(rec.end(), cc_.received.begin(), cc_.received.end());
    rec.insert(rec.end(), cc_.chunks.begin(), cc_.chunks.end());
  }
  if (shard_facts) rec.insert(rec.end(), facts_.begin(), facts_.end());
  rec.insert(rec.end(), fps.begin(), fps.end());
  if (rec.size() != len) throw std::logic_error("detect: record length");
  std::vector<Fingerprint> all(len * W);
  if (W == 1) {
    all = rec;
  } else {
    CULPRIT_COLLECTIVE(comm_, "the detector vote",
                       MPI_Iallgather(rec.data(), static_cast<int>(len), MPI_UINT64_T, all.data(), static_cast<int>(len),
                                      MPI_UINT64_T, comm_.comm, &_culprit_req));
  }
  auto field = [&](int r, std::size_t i) { return all[static_cast<std::size_t>(r) * len + i]; };
  auto first_rank = [&](std::size_t i) {
    for (int r = 0; r < W; ++r)
      if (field(r, i)) return r;
    return -1;
  };

  if (comm_check) {
    std::vector<CommCheck> per_rank(W);
    for (int r = 0; r < W; ++r) {
      auto& c = per_rank[r];
      for (int j = 0; j < W; ++j) {
        c.sent.push_back(field(r, 3 + j));
        c.received.push_back(field(r, 3 + W + j));
        c.chunks.push_back(field(r, 3 + 2 * W + j));
      }
    }
    const auto bad = comm_mismatches(per_rank);
    if (!bad.empty()) {
      std::string pairs;
      for (const auto& [from, to] : bad)
        pairs += (pairs.empty() ? "" : ", ") + std::to_string(from) + " -> " + std::to_string(to);
      incident({s, "comm", IncidentClass::kHardware, bad[0].first, "", "",
                "reduction message(s) arrived unlike they were sent (sender -> receiver): " + pairs});
    }
  }
  if (cfg_.detect_nonfinite) {
    const int shard_rank = first_rank(0), param_rank = first_rank(1);
    const bool bad_reduced = !all_finite(reduced_.data(), static_cast<std::size_t>(P_ + 1));
    if (shard_rank >= 0) {
      incident({s, "nonfinite", IncidentClass::kNumerical, shard_rank, "", "",
                "NaN/Inf in the loss or gradient of micro-shard " + std::to_string(field(shard_rank, 0) - 1) +
                    " computed on rank " + std::to_string(shard_rank)});
    } else if (bad_reduced) {
      incident({s, "nonfinite", IncidentClass::kNumerical, -1, "", "",
                "NaN/Inf in the reduced gradient or loss, though every micro-shard was finite"});
    } else if (param_rank >= 0) {
      incident({s, "nonfinite", IncidentClass::kNumerical, param_rank, "", "",
                "NaN/Inf in the parameters of rank " + std::to_string(param_rank) + " after the update"});
    }
  }
  if (cfg_.check_invariants) {
    const int vr = first_rank(2);
    if (vr >= 0) {
      // The message comes from the first rank that saw the invariant broken.
      const std::string msg = W > 1 ? broadcast_string(comm_, violation_, vr) : violation_;
      int count = 0;
      for (int r = 0; r < W; ++r) count += field(r, 2) ? 1 : 0;
      const std::string who = count == W && count > 1 ? "every rank (first rank " + std::to_string(vr) + ")"
                              : count > 1 ? "rank " + std::to_string(vr) + " and " + std::to_string(count - 1) + " more"
                                          : "rank " + std::to_string(vr);
      incident({s, "invariant", IncidentClass::kInvariant, vr, "", "", who + ": " + msg});
    }
    if (shard_facts) {
      // Each micro-shard's facts come from its owner: gather them from the records.
      for (std::size_t i = 0; i < facts_.size(); ++i) {
        Fingerprint v = 0;
        for (int r = 0; r < W; ++r) v |= field(r, 3 + n_comm + i);
        facts_[i] = v;
      }
    }
    check_shard_invariants(s);
  }
  if (cfg_.spike_window > 0) {
    // Loss and gradient norm are the same on every rank: so is this decision.
    const double loss = reduced_[P_];
    const double gn = grad_norm_;
    for (auto [det, value, what] : {std::tuple<SpikeDetector*, double, const char*>{&loss_spikes_, loss, "loss"},
                                    {&grad_spikes_, gn, "gradient norm"}}) {
      std::string why;
      if (det->observe(value, &why))
        incident({s, "spike", IncidentClass::kNumerical, -1, "", "", std::string(what) + " spike: " + why},
                 cfg_.spike_action == "halt");
    }
  }
  if (replicas) {
    std::vector<Fingerprint> sets;
    for (int r = 0; r < W; ++r)
      for (std::size_t i = 0; i < fps.size(); ++i) sets.push_back(field(r, len - fps.size() + i));
    const ReplicaCheck rc = compare_replicas(W, sets, names);
    if (rc.diverged) {
      std::string ranks;
      for (int r : rc.odd_ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      incident({s, "replica-divergence", IncidentClass::kHardware, rc.odd_ranks[0], "", "",
                "rank(s) " + ranks + " differ from the other replicas, first in '" + rc.first_param + "'"});
    }
  }
}

// ---- spot checks and training invariants (docs/detection.md) ----

void Trainer::violation(const std::string& what) {
  if (violation_.empty()) violation_ = what;
}

// The spot-check schedule: in step s, every rank recomputes the same number q_s of micro-shards of
// the rank before it, so the extra work is spread evenly and costs about 1 + P. q_s is the step's
// share of floor(P * n * s), n the most micro-shards a rank computes; the shards rotate.
std::vector<int> Trainer::spot_shards(std::int64_t s, int checker) const {
  std::vector<int> out;
  if (cfg_.spot_check <= 0) return out;
  const int W = comm_.size, M = cfg_.micro_shards;
  const ShardRange r = shard_range((checker + W - 1) % W, W, M);
  const int count = r.hi - r.lo, n = (M + W - 1) / W;
  auto total = [&](std::int64_t t) {
    return static_cast<std::int64_t>(std::floor(cfg_.spot_check * n * static_cast<double>(t) + 1e-9));
  };
  const std::int64_t first = total(s - 1), q = std::min<std::int64_t>(total(s) - first, count);
  for (std::int64_t j = 0; j < q; ++j) out.push_back(r.lo + static_cast<int>((first + j) % count));
  return out;
}

bool Trainer::spot_checked(std::int64_t s, int k) const {
  const auto v = spot_shards(s, (owner_of(k) + 1) % comm_.size);
  return std::find(v.begin(), v.end(), k) != v.end();
}

int Trainer::owner_of(int k) const {
  for (int r = 0; r < comm_.size; ++r)
    if (shard_range(r, comm_.size, cfg_.micro_shards).hi > k) return r;
  return comm_.size - 1;
}

void Trainer::check_shards(std::int64_t s) {
  facts_exchanged_ = false;
  if (spot_shards(s, 0).empty()) return;  // the same count for every rank: no spot check this step
  facts_exchanged_ = true;
  const int M = cfg_.micro_shards, W = comm_.size;
  // Redundant computation: this rank recomputes its share of the previous rank's micro-shards.
  for (int k : spot_shards(s, comm_.rank)) {
    BufferGuard keep(model_);
    compute_shard(s, k, spot_leaf_.data(), 1);
    facts_[M + k] = fingerprint_bytes(spot_leaf_.data(), spot_leaf_.size() * sizeof(float));
  }
  // Every slot is written by one rank: a bitwise OR gathers them.
  CULPRIT_COLLECTIVE(comm_, "the micro-shard check", MPI_Iallreduce(MPI_IN_PLACE, facts_.data(), static_cast<int>(facts_.size()), MPI_UINT64_T, MPI_BOR,
                                  comm_.comm, &_culprit_req));
  std::vector<int> differ;
  for (int k = 0; k < M; ++k)
    if (spot_checked(s, k) && facts_[k] != facts_[M + k]) differ.push_back(k);
  if (!differ.empty()) {
    // A third opinion: another rank recomputes (with two ranks, the owner itself).
    auto third = [&](int k) {
      const int o = owner_of(k), c = (o + 1) % W;
      if (W == 1) return -1;
      if (W == 2) return o;
      return (c + 1) % W != o ? (c + 1) % W : (c + 2) % W;
    };
    std::vector<Fingerprint> tie(M, 0);
    for (int k : differ)
      if (third(k) == comm_.rank) {
        BufferGuard keep(model_);
        compute_shard(s, k, spot_leaf_.data(), 2);
        tie[k] = fingerprint_bytes(spot_leaf_.data(), spot_leaf_.size() * sizeof(float));
      }
    CULPRIT_COLLECTIVE(comm_, "the micro-shard check", MPI_Iallreduce(MPI_IN_PLACE, tie.data(), M, MPI_UINT64_T, MPI_BOR, comm_.comm, &_culprit_req));
    const int k = differ[0], o = owner_of(k), c = (o + 1) % W, t = third(k);
    int faulty = -1;
    std::string why;
    const std::string so = "rank " + std::to_string(o), sc = "rank " + std::to_string(c);
    if (W == 1) {
      faulty = 0;
      why = "rank 0 computed it differently the second time (a transient fault or a nondeterministic kernel)";
    } else if (tie[k] == facts_[M + k]) {
      faulty = o;
      why = (W == 2 ? so + " itself" : "rank " + std::to_string(t)) + " recomputed it like " + sc;
    } else if (W > 2 && tie[k] == facts_[k]) {
      faulty = c;
      why = "rank " + std::to_string(t) + " recomputed it like " + so + ": the checker is the odd one";
    } else {
      why = W == 2 ? so + " reproduces its own result: one of the two ranks computes wrongly every time (a third "
                          "rank or a replay decides which)"
                   : "no two of the three computations agree";
    }
    std::string list;
    for (int d : differ) list += (list.empty() ? "" : ",") + std::to_string(d);
    incident({s, "spot-check", IncidentClass::kHardware, faulty, "", "",
              "micro-shard " + std::to_string(k) + " computed by " + so + " differs bitwise from its recomputation on " +
                  sc + "; " + why + " (micro-shards that differ: " + list + ")"});
  }
}

// The micro-shard invariants, from the step's gathered facts (same on every rank).
void Trainer::check_shard_invariants(std::int64_t s) {
  const int M = cfg_.micro_shards;
  // Each sample once per epoch: every micro-shard used exactly its share of the epoch's permutation.
  for (int k = 0; k < M; ++k)
    if (facts_[3 * M + k] != tensor_fingerprint(shard_indices(s, k))) {
      incident({s, "invariant", IncidentClass::kInvariant, owner_of(k), "", "",
                "micro-shard " + std::to_string(k) + " on rank " + std::to_string(owner_of(k)) +
                    " did not use its share of the epoch's samples (samples repeated or skipped)"});
      break;
    }
  // Dropout masks differ: no two micro-shards of this step or the last start from one generator state.
  std::map<Fingerprint, int> seen;
  for (int k = 0; k < M; ++k) {
    const Fingerprint f = facts_[2 * M + k];
    const bool last = std::find(prev_rng_.begin(), prev_rng_.end(), f) != prev_rng_.end();
    if (seen.count(f) || last) {
      incident({s, "invariant", IncidentClass::kInvariant, owner_of(k), "", "",
                "micro-shard " + std::to_string(k) + " on rank " + std::to_string(owner_of(k)) +
                    " drew its dropout masks from the same generator state as " +
                    (last ? std::string("a micro-shard of the previous step")
                          : "micro-shard " + std::to_string(seen[f])) + ": the masks repeat"});
      break;
    }
    seen[f] = k;
  }
  prev_rng_.assign(facts_.begin() + 2 * M, facts_.begin() + 3 * M);
}

// Invariants of the update: the learning rate is the schedule's, and every parameter whose gradient
// asks for a change well above float rounding did change.
void Trainer::check_update(std::int64_t s, double lr) {
  const double used = opt_->param_groups()[0].options().get_lr();
  if (used != lr) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "the learning rate of step %lld is %.9g but the schedule gives %.9g",
                  static_cast<long long>(s), used, lr);
    violation(buf);
  }
  if (used != 0 && prev_param_fps_.size() == param_fps_.size()) {
    const at::Tensor host = flat_params_.is_cuda() ? flat_params_.cpu() : flat_params_;
    const float* p = host.data_ptr<float>();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (param_fps_[i] != prev_param_fps_[i]) continue;
      const std::int64_t n = params_[i].tensor.numel();
      for (std::int64_t j = offsets_[i]; j < offsets_[i] + n; ++j)
        if (reduced_[j] != 0 && std::fabs(used * reduced_[j]) > std::ldexp(std::fabs(p[j]), -16)) {
          violation("parameter '" + params_[i].name + "' did not change in step " + std::to_string(s) +
                    " although its gradient is nonzero (a frozen or forgotten parameter, or an update that did "
                    "not land)");
          break;
        }
    }
  }
  prev_param_fps_ = param_fps_;
}

}  // namespace culprit::harness
