// The Trainer: one rank's training loop (trainer.cpp), its checkpoint and trace I/O (state.cpp) and
// its fault injection and detection (faults.cpp). Private to the harness and included only by those
// libtorch translation units.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "culprit/checkpoint.h"
#include "culprit/engine.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/inject.h"
#include "culprit/trace.h"
#include "culprit/tree_reduce.h"
#include "data.h"
#include "detect.h"
#include "error_line.h"
#include "io_worker.h"
#include "model.h"
#include "rundir.h"
#include "runinfo.h"

namespace culprit::harness {

// A parameter's key in the optimizer's state map: libtorch 1.13 keys it by its TensorImpl address as
// a string (c10::guts::to_string, which streams the pointer), libtorch 2.x by the address itself.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap&, const at::Tensor& p) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

DType to_dtype(at::ScalarType t);
at::ScalarType to_scalar(DType t);
Fingerprint tensor_fingerprint(const at::Tensor& t);
// The set fingerprint of named tensors; *each (optional) gets every tensor's own fingerprint.
Fingerprint set_fingerprint(const std::vector<NamedTensor>& tensors, std::vector<Fingerprint>* each = nullptr);
// Deterministic libtorch settings (docs/determinism.md); returns the BLAS thread count set (0: no
// thread control found).
int setup_determinism(int threads);

// Runs f, turning any exception into an error Status.
template <class Fn>
Status guarded(const std::string& what, Fn&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Status::Error(what + ": " + error_line(e.what()));
  }
}

// Keeps the model's buffers (batch-norm running statistics) across a recomputation: a spot check or
// a replayed micro-shard runs the forward pass in training mode, which must not change the state.
struct BufferGuard {
  explicit BufferGuard(Model& m) : model(m) {
    for (const auto& b : model.buffers()) saved.push_back(b.tensor.detach().clone());
  }
  ~BufferGuard() {
    torch::NoGradGuard ng;
    auto bufs = model.buffers();
    for (std::size_t i = 0; i < bufs.size() && i < saved.size(); ++i) bufs[i].tensor.copy_(saved[i]);
  }
  Model& model;
  std::vector<at::Tensor> saved;
};


class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const Comm& comm, const Dataset& data, Model& model)
      : cfg_(cfg), comm_(comm), data_(data), model_(model) {}

  // Selects the device (--device), builds the flat parameters and optimizer, checks the model.
  Status init();
  // Restores parameters, buffers and optimizer state from a verified checkpoint.
  Status restore(const ckpt::Checkpoint& c);
  Status run(std::int64_t start_step, const std::string& resumed_from);
  // Replay (culprit/engine.h): no trace, metrics or checkpoints; faults fire as in a replay.
  // device_rank: the rank whose device this process is (its faults, the rank in its results) when
  // `comm` is a re-ordered layout of the ranks; -1: comm's own rank.
  void begin_replay(std::int64_t done, int device_rank = -1);
  void replay_step(StepResult* out);
  void replay_shard(int k, int round, ShardResult* out);
  std::int64_t replayed() const { return done_; }
  void mark(ckpt::Checkpoint* c) const;
  Status rewind(const ckpt::Checkpoint& c);
  std::vector<std::string> layer_names() const { return model_.layers(); }
  std::vector<std::string> param_names() const {
    std::vector<std::string> v;
    for (const auto& p : params_) v.push_back(p.name);
    return v;
  }

 private:
  friend struct LayerTrace;
  // Copies the state into *c; buffers: the model's buffers as copied when the checkpoint was taken
  // (null: copy them now).
  void snapshot(std::int64_t step, ckpt::Checkpoint* c, const std::vector<NamedTensor>* buffers = nullptr) const;
  Status save_checkpoint(std::int64_t step);
  // Waits until the I/O thread has copied the parameters and optimizer state of the checkpoint in
  // flight: called before anything changes them (the next optimizer step).
  void fence_snapshot();
  void log_checkpoint();  // rank 0: the drained checkpoint's line in RUN/checkpoints.jsonl
  // Waits for the I/O thread (bounded by the watchdog) and returns its first error.
  Status drain_io();
  Status open_trace(std::int64_t start_step);
  at::Tensor loss_of(const at::Tensor& out, const at::Tensor& y) const;
  void step(std::int64_t s);
  // The sample indices of micro-shard k of step s.
  at::Tensor shard_indices(std::int64_t s, int k);
  // Forward and backward of micro-shard k of step s into leaf (P_ gradient values, then the loss),
  // with this rank's faults. attempt 0: the step's own computation; 1 and 2: spot-check
  // recomputations (transient faults do not fire again).
  void compute_shard(std::int64_t s, int k, float* leaf, int attempt);
  // Exchanges the step's per-micro-shard facts, runs the spot-check recomputations and the
  // micro-shard invariants (samples, dropout generator); collective.
  void check_shards(std::int64_t s);
  std::vector<int> spot_shards(std::int64_t s, int checker) const;
  bool spot_checked(std::int64_t s, int k) const;
  bool facts_exchanged_ = false;  // this step's facts went through the spot check's exchange
  int owner_of(int k) const;
  void violation(const std::string& what);
  std::vector<Fingerprint> param_grad_fps(const float* leaf) const;  // per parameter, of a leaf
  Fingerprint input_fp_ = 0;  // the current micro-shard's input as loaded
  void check_update(std::int64_t s, double lr);  // a training invariant this rank saw broken
  const at::Tensor& epoch_order(std::int64_t epoch);
  void write_metrics(std::int64_t s, double lr, float loss, double grad_norm, Fingerprint fp, double secs);

  const TrainConfig& cfg_;
  const Comm& comm_;
  const Dataset& data_;
  Model& model_;
  // --device cuda: this rank's GPU (docs/cuda.md); CPU otherwise.
  Status select_device();
  at::Device device_{at::kCPU};
  std::string device_name_ = "cpu";
  std::vector<NamedTensor> params_;
  std::vector<std::int64_t> offsets_;  // of each parameter in the flat buffers
  std::int64_t P_ = 0;                 // parameter elements; the flat buffers hold P_ + 1 (loss)
  at::Tensor flat_params_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::unique_ptr<TreeAccumulator> acc_;
  std::vector<float> reduced_;
  TreeWorkspace tree_ws_;
  at::Tensor x_all_, y_all_;
  std::int64_t order_epoch_ = -1;
  at::Tensor order_;
  FILE* metrics_ = nullptr;
  RunInfo info_;
  // Background HDF5 work (checkpoints, trace) on a communicator of its own.
  MPI_Comm io_comm_ = MPI_COMM_NULL;
  std::unique_ptr<IoWorker> io_;
  bool checkpoint_in_flight_ = false;
  std::vector<int> writers_;  // the ranks that write checkpoint data (--checkpoint-writers-per-host)
  std::shared_ptr<ckpt::Checkpoint> snap_;  // host copy of the state, reused checkpoint to checkpoint
  // The checkpoint in flight: the I/O thread sets snap_copied_ once the state is copied; the
  // other numbers are its cost (written by the I/O thread, read after a drain).
  std::atomic<bool> snap_copied_{true};
  struct CheckpointCost {
    std::int64_t step = -1;
    std::uint64_t bytes = 0;
    double wait = 0, copy = 0, fence = 0, stall = 0, write = 0, total_io = 0;
  } cost_;
  bool serial_io_ = false;
  Status io_error_;  // a trace write that failed while I/O was serialised
  trace::Writer trace_;
  std::vector<trace::ShardRow> shard_rows_;
  std::unique_ptr<LayerObserver> observer_;
  std::vector<Fingerprint> fwd_, bwd_;  // the current micro-shard's layer fingerprints
  // Fault injection and detection (docs/detection.md).
  std::vector<FaultSpec> faults_;
  std::int64_t cur_step_ = 0;
  int first_shard_ = 0;
  int bad_shard_ = -1;  // first micro-shard of this step with a non-finite loss or gradient
  int attempt_ = 0;     // see compute_shard
  int device_rank_ = -1;  // begin_replay's; see self()
  int self() const { return device_rank_ < 0 ? comm_.rank : device_rank_; }
  bool replaying_ = false, capture_ = false;  // replay: faults as replays; keep every micro-shard row
  int round_ = 0;        // the replay's rerun of a micro-shard (intermittent faults draw anew)
  std::int64_t done_ = 0;  // replay: steps completed
  // Per-micro-shard facts of the step (check_shards): [0,M) the owner's leaf fingerprint,
  // [M,2M) the spot-check recomputation's, [2M,3M) the dropout generator state, [3M,4M) the samples.
  std::vector<Fingerprint> facts_, prev_rng_;
  std::vector<float> spot_leaf_;
  trace::StepRow last_row_;  // replay: the last step's row
  at::Tensor last_idx_;             // the samples this rank loaded last (stale data faults)
  std::uint64_t last_seed_ = 0;     // the dropout seed it used last (stale rng faults)
  bool have_last_seed_ = false;
  std::string violation_;           // the first invariant this rank saw broken in this step
  std::vector<Fingerprint> prev_param_fps_;  // parameter fingerprints before this step's update
  Status halt_;         // set when a detection halts the run
  std::vector<Fingerprint> param_fps_;  // this step's parameter fingerprints
  double grad_norm_ = 0;                // this step's reduced-gradient L2 norm
  // This step's time in detector work (metrics.jsonl "detector_seconds"): what a Stopwatch on it
  // times, plus the communication check's fingerprints.
  double detector_secs_ = 0;
  struct Stopwatch {
    explicit Stopwatch(double* acc) : acc_(acc), t0_(std::chrono::steady_clock::now()) {}
    ~Stopwatch() { *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
    Stopwatch(const Stopwatch&) = delete;
    Stopwatch& operator=(const Stopwatch&) = delete;
    double* acc_;
    std::chrono::steady_clock::time_point t0_;
  };
  bool fires(const FaultSpec& f, Phase phase, int occurrence, bool per_shard) const;
  int layer_param(const std::string& layer) const;  // first parameter of a layer, or -1
  void detect(std::int64_t s);
  void check_shard_invariants(std::int64_t s);
  CommCheck cc_;  // this step's reduction message fingerprints
  void incident(Incident inc, bool may_halt = true);
  SpikeDetector loss_spikes_, grad_spikes_;
};


// Layer hooks: injects forward/backward faults and records each layer's forward output fingerprint
// and, through a gradient hook, the fingerprint of the gradient flowing back into it.
struct LayerTrace : LayerObserver {
  LayerTrace(Trainer* t, std::vector<std::string> layers);
  at::Tensor on_forward(const std::string& layer, const at::Tensor& output) override;
  Trainer* trainer;
  std::map<std::string, std::size_t> index;
  int shard = 0;  // the micro-shard being computed
};

}  // namespace culprit::harness
