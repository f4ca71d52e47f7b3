#include "faults.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
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
      auto it = opt_->state().find(c10::guts::to_string(p.tensor.unsafeGetTensorImpl()));
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

}  // namespace culprit::harness
