// The detectors of a training step (docs/detection.md): NaN/Inf, corrupted reduction messages,
// training invariants, spot checks, loss and gradient-norm spikes, replica divergence. The step
// fills one StepFacts as it runs; StepDetectors turns it into incidents through one vote per step.
// No libtorch here: what needs the model's tensors is asked through a StateProbe.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/status.h"
#include "culprit/tree_reduce.h"
#include "culprit/records.h"
#include "detect/replica_check.h"
#include "detect/vote.h"

namespace culprit::harness {

using records::Incident;

// What one step computed, as the detectors see it. The step fills it as it goes.
struct StepFacts {
  std::int64_t step = 0;
  int bad_shard = -1;            // first micro-shard of this rank with a non-finite loss or gradient
  std::string violation;         // the first invariant this rank saw broken
  ShardFacts shards;             // per micro-shard facts (spot check, invariants); empty: not collected
  bool shards_exchanged = false; // the spot check's exchange carried them (metrics: spot_checked)
  const CommCheck* comm = nullptr;       // this step's reduction message fingerprints
  std::vector<Fingerprint> param_fps;    // every parameter after the update
  int params_finite = -1;                // 1/0: they are all finite (scanned with their fingerprints); -1: not scanned
  std::vector<Fingerprint> opt_fps;      // every parameter's optimizer state (with the trace; else empty)
  const float* reduced = nullptr;        // the reduced gradient, P values, then the loss
  // --shard-params: reduced holds only this rank's slice (and the loss); whether the whole is
  // finite, as the ranks found it together (-1: scan reduced).
  int reduced_finite = -1;
  double update_scale = 1;               // --clip-grad-norm: the clip factor the update applied to it
  std::int64_t params = 0;               // P
  std::int64_t held_lo = 0, held_hi = -1;  // the flat parameters this rank holds (--shard-params; -1: all)
  std::int64_t gather_chunk = -1;        // --shard-params: the first chunk gathered unlike its owner's record
  double grad_norm = 0;                  // of the reduced gradient
  double seconds = 0;                    // time in detector work (metrics.jsonl detector_seconds)
  void violated(const std::string& what) {
    if (violation.empty()) violation = what;
  }
};

// What the detectors ask of the trainer's state, only when a check needs it.
struct StateProbe {
  std::function<std::vector<Fingerprint>()> optimizer_fps;  // per parameter (0: no state yet)
  std::function<bool()> params_finite;
  std::function<const float*()> host_params;                // the flat parameters, on the host
  std::function<Fingerprint(int k)> samples_fp;             // the samples micro-shard k must use
  // Recomputes micro-shard k of the step on this rank (attempt 1: spot check, 2: third opinion)
  // and returns its gradient leaf's fingerprint; the model's state is left as it was.
  std::function<Fingerprint(int k, int attempt)> recompute;
  // --shard-params: the rank that owns fp1 chunk k (layout order) and the parameter it is part of.
  std::function<std::pair<int, std::size_t>(std::int64_t k)> chunk_owner;
};

// Adds the time of its scope to *acc.
class Stopwatch {
 public:
  explicit Stopwatch(double* acc);
  ~Stopwatch();
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  double* acc_;
  double t0_;
};

class StepDetectors {
 public:
  // `comm` is referenced, not copied (a replay's layout may change between steps).
  void configure(const TrainConfig& cfg, const Comm& comm, std::vector<std::string> params, StateProbe probe);
  // Hosts and devices of every rank, named in incidents.
  void set_placement(std::vector<std::string> hosts, std::vector<std::string> devices);
  // Parameter fingerprints before the first step (the update invariant compares with them).
  void start(std::vector<Fingerprint> param_fps) { prev_param_fps_ = std::move(param_fps); }

  // Whether this step collects micro-shard facts, and which micro-shards are spot-checked.
  bool collects_shard_facts() const { return cfg_->detect.spot_check > 0 || cfg_->detect.invariants; }
  bool spot_checked(std::int64_t s, int k) const;
  std::vector<int> spot_shards(std::int64_t s, int checker) const;
  int owner_of(int k) const;

  // Collective: exchanges the micro-shard facts and runs the spot-check recomputations.
  void check_shards(StepFacts& f);
  // The update's invariants (the learning rate is the schedule's; parameters with a gradient change).
  // param_lrs: the rate each parameter was updated with (its optimizer group's); empty: used_lr.
  void check_update(StepFacts& f, double scheduled_lr, double used_lr, const std::vector<std::int64_t>& offsets,
                    const std::vector<std::int64_t>& sizes, const std::vector<double>& param_lrs = {});
  // Collective: the step's vote and every decision taken from it.
  void vote(StepFacts& f);
  // Set once a detection halts the run (--on-detect halt or diagnose).
  const Status& halt() const { return halt_; }
  // Whether this job has recorded an incident where a fault shows (records::shows_a_fault).
  bool saw_fault() const { return saw_fault_; }

 private:
  static Incident make_incident(std::int64_t step, Detector d, IncidentClass c, int rank, std::string message);
  void incident(Incident inc, bool may_halt = true);  // rank 0 logs it; it halts the run unless may_halt
  void check_comm(const StepFacts& f, const std::vector<VoteRecord>& votes);
  void check_gather(const StepFacts& f, const std::vector<VoteRecord>& votes);  // --shard-params' gathers
  void check_nonfinite(const StepFacts& f, const std::vector<VoteRecord>& votes);
  void check_invariants(StepFacts& f, const std::vector<VoteRecord>& votes);
  void check_shard_invariants(const StepFacts& f);
  void check_spikes(const StepFacts& f);
  void check_replicas(const StepFacts& f, const std::vector<VoteRecord>& votes);
  void spot_verdict(const StepFacts& f, const std::vector<int>& differ, const std::vector<Fingerprint>& tie);
  int third_opinion(int k) const;  // the rank that recomputes a disputed micro-shard (-1: none)

  const TrainConfig* cfg_ = nullptr;
  const Comm* comm_ = nullptr;
  std::vector<std::string> params_;
  StateProbe probe_;
  std::vector<std::string> hosts_, devices_;
  SpikeDetector loss_spikes_, grad_spikes_;
  std::vector<Fingerprint> prev_rng_;        // the last step's dropout generator states
  std::vector<Fingerprint> prev_param_fps_;  // parameter fingerprints before this step's update
  Status halt_;
  bool saw_fault_ = false;
};

}  // namespace culprit::harness
