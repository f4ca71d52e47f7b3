// The Trainer: one rank's training step and run loop. Its own units are named trainer_*.cpp in this
// folder (train/README.md lists which part each holds); what it delegates is a class of its own: the
// reduction overlapped with backward (GradientReducer), the sharded optimizer (ShardedOptimizer,
// optim/), the optimizer's arithmetic (OptimizerState), the faults it injects (FaultPlan, faults/),
// the detectors (StepDetectors, detect/), the background checkpoint and trace writes
// (CheckpointPipeline), layer hooks (LayerTrace). Its replay mode is driven by engine.cpp.
// Private to the harness's train/ folder.
#pragma once
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "culprit/checkpoint.h"
#include "culprit/data.h"
#include "culprit/engine.h"
#include "culprit/env.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/model.h"
#include "culprit/optim_state.h"
#include "culprit/tensors.h"
#include "culprit/trace.h"
#include "culprit/tree_reduce.h"

#include "config/run_info.h"
#include "data/loader.h"
#include "detect/detectors.h"
#include "faults/fault_plan.h"
#include "faults/layer_trace.h"
#include "model/flat_params.h"
#include "optim/param_gatherer.h"
#include "optim/sharded_optimizer.h"
#include "optim/sliced_gradient.h"
#include "train/checkpoint_pipeline.h"
#include "train/gradient_reducer.h"
#include "train/tensor_layout.h"

namespace culprit::harness {

// The epochs' sample orders (--shuffle randperm): the last two drawn, since the read-ahead of an
// epoch's first step runs while the previous epoch's last step computes.
struct EpochOrders {
  std::int64_t epoch[2] = {-1, -1};
  at::Tensor order[2];
};

// What the step in progress has produced so far.
struct StepState {
  FireContext fire;    // the step's own computation (attempt 0)
  StepFacts facts;     // for the detectors
  CommCheck comm;      // the reduction's message fingerprints
  std::vector<trace::ShardRow> shard_rows;
  Fingerprint input_fp = 0;  // the micro-shard being computed: its input as loaded
  std::vector<Fingerprint> sample_fps;  // and each of its samples' (with the trace, or replaying)
  std::vector<double> lrs;  // each optimizer group's scheduled learning rate (group 0's: the trace's lr)
  float clip_factor = 1;  // --clip-grad-norm: what the reduced gradient was multiplied by
  double clip_seconds = 0;  // and how long clipping took
  double data_wait = 0, data_read = 0;  // seconds waited for samples, and spent reading them
  Status data_error;   // a refused sample, agreed by every rank (the step stopped there)
};

class Trainer {
 public:
  // env: where the checkpoint pipeline copies the state (culprit/env.h; a test's wrapper).
  Trainer(const TrainConfig& cfg, const Comm& comm, const Dataset& data, Model& model, Env* env = Env::Default())
      : cfg_(cfg), comm_(comm), data_(data), model_(model), env_(env) {}
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Selects the device (--device), builds the flat parameters and optimizer, parses the faults,
  // checks the model against the data. mode: whether the trainer will train or replay.
  Status init(StepMode mode);
  // Collective, after an agreed init(): every rank built the same initial parameters and reads the
  // same first sample (rank-dependent code in a model's construction, rank-local data files).
  Status check_ranks_agree();
  // Restores parameters, buffers and optimizer state from a verified checkpoint.
  Status restore(const ckpt::Checkpoint& c);
  Status run(std::int64_t start_step, const std::string& resumed_from);

  // Replay (culprit/engine.h; engine.cpp drives it): no trace, metrics or checkpoints; steps run in
  // StepMode::kReplay. device_rank: the rank whose device this process is (its faults, the rank in
  // its results) when `comm` is a re-ordered layout of the ranks; -1: comm's own rank.
  void begin_replay(std::int64_t done, int device_rank = -1);
  void replay_step(StepResult* out, int round);
  // The last step's reduced gradient, chunk c of `world` (tree_reduce.h: chunk_offset).
  Fingerprint reduced_fp(int world, int c) const;
  std::vector<Fingerprint> reduced_param_fps() const;  // per parameter, of the last reduced gradient
  at::Tensor shard_indices(std::int64_t s, int k);  // the sample indices of micro-shard k of step s
  void replay_shard(int k, int round, ShardResult* out);
  // Micro-shard k of the next step recomputed in float64 from its input as loaded, without layer
  // hooks or compute faults (trainer_float64.cpp): P gradient values, then the loss.
  void shard_grad_f64(int k, int round, std::vector<double>* out);
  // The last step's update recomputed in float64 from `start` (the state before it) with the step's
  // reduced gradient and learning rate, without faults (trainer_float64.cpp). *now: this rank's state after
  // the step; *wide: the float64 one; each P parameter values, then P optimizer state values.
  void update_f64(const ckpt::Checkpoint& start, std::vector<float>* now, std::vector<double>* wide);
  // The same update re-executed element by element in float32 in libtorch's operation order
  // (trainer_exact.cpp): *exact, its bits, laid out as *now. False, with *why, where it cannot be.
  bool update_exact(const ckpt::Checkpoint& start, std::vector<float>* now, std::vector<float>* exact, std::string* why);
  // The samples `idx` as the data source gives them now, read outside any step (no batch, no data
  // fault): each one's fingerprint as sample_fingerprints gives a loaded sample's. *st: the read's.
  std::vector<Fingerprint> source_sample_fps(const std::vector<std::int64_t>& idx, Status* st);
  std::int64_t replayed() const { return done_; }
  // The first sample the data source refused since the last call (a file changed under the run).
  Status take_data_status() { return std::exchange(data_status_, Status::OK()); }
  void mark(ckpt::Checkpoint* c) const { snapshot(done_, c); }
  Status rewind(const ckpt::Checkpoint& c);
  // Each optimizer group's learning rate at step s, as scheduled (s < 1: step 1's).
  std::vector<double> learning_rates(std::int64_t s);
  std::vector<std::string> layer_names() const { return model_.layers(); }
  std::vector<std::string> param_names() const { return flat_.names(); }

 private:
  // ---- setup (trainer_setup.cpp) ----
  Status select_device();
  void build_flat_params();
  Status check_model(StepMode mode);  // the model accepts the data; its forward pass changes no state
  Status check_forward_changes_no_state();  // no buffer or parameter changed by a forward pass
  Status check_own_loss(const at::Tensor& x, const at::Tensor& y);  // a model's own loss adds up
  Status check_training_pass();  // one forward (under the run's precision), loss and backward
  Status narrow_output(const std::vector<std::int64_t>& got) const;  // check_model's error: labels past the output
  StateProbe probe();
  Status observe_layers(StepMode mode, const std::vector<std::string>& model_layers);  // layer hooks, tp-link check
  Status start_run(std::int64_t start_step, const std::string& resumed_from);  // run.json, metrics, I/O

  // ---- the step (trainer.cpp), docs/determinism.md ----
  // One optimizer step (1-based s). replayed: the step's trace row (replay).
  void step(std::int64_t s, StepMode mode, trace::StepRow* replayed = nullptr);
  double begin_step(std::int64_t s, StepMode mode);  // the firing context, facts, learning rate
  void compute_local_shards();  // this rank's micro-shards into the tree's leaves
  void compute_scattered_shards();  // --shard-params: round by round, each leaf to its owners
  void reduce_scattered();          // the slice into reduced(), what every rank learns of it
  // Forward and backward of micro-shard k into leaf (P gradient values, then the loss).
  void compute_shard(const FireContext& c, int k, float* leaf);
  void reduce();                 // tree_allreduce of the leaves
  void update(double lr);        // the reduced gradient into the parameters, the optimizer step (trainer_update.cpp)
  at::Tensor clip(const at::Tensor& grads);  // --clip-grad-norm: the clipped copy of the reduced gradient
  // --shard-params: every parameter's norm (norm_of(i) where this rank computes it), gathered.
  std::vector<at::Tensor> sliced_norms(const std::function<at::Tensor(std::size_t)>& norm_of);
  Fingerprint record(double lr, trace::StepRow* row);  // fingerprints, invariants, the trace row
  void write_metrics(double lr, Fingerprint fp, double secs);
  std::string group_lrs_json() const;
  std::string memory_json() const;  // --memory-metrics' fields

  // ---- micro-shard helpers (trainer.cpp; the samples: trainer_data.cpp) ----
  const at::Tensor& epoch_order(std::int64_t epoch);
  // The samples `idx` of micro-shard k of step s as tensors (x, y) of this process's own, from the
  // read-ahead when it holds them.
  std::pair<at::Tensor, at::Tensor> load_samples(std::int64_t s, int k, const at::Tensor& idx);
  std::pair<at::Tensor, at::Tensor> first_samples(std::int64_t n);  // samples 0..n-1 (setup's checks)
  void read_ahead(std::int64_t s);  // this rank's micro-shards of step s, in the background
  // The micro-shard's loss of samples x, y, divided as docs/determinism.md says: the model's own
  // (a Python model), else loss_of(forward(x), y).
  at::Tensor shard_loss(const at::Tensor& x, const at::Tensor& y);
  at::Tensor loss_of(const at::Tensor& out, const at::Tensor& y) const;  // culprit's cross entropy or MSE
  at::Tensor forward_any(const at::Tensor& x, const at::Tensor& y);  // a forward pass, by the loss when the model owns it
  void zero_grads(const FireContext& c, int k);
  bool copy_grads(float* leaf) const;  // false: a value is not finite
  trace::ShardRow shard_row(int k, const float* leaf) const;
  std::vector<Fingerprint> param_grad_fps(const float* leaf) const;  // per parameter, of a leaf
  std::vector<Fingerprint> optimizer_fps() const;  // per parameter: its optimizer state's (0: none yet)
  std::vector<Fingerprint> sample_fingerprints(const at::Tensor& x) const;  // per sample (row) of x
  int self() const { return device_rank_ < 0 ? comm_.rank : device_rank_; }

  bool sharded() const { return cfg_.sharded(); }
  // The ranks micro-shards are assigned to and reduced over: the world, or with --tensor-parallel
  // T > 1 the D ranks with this rank's tp coordinate (TensorLayout).
  const Comm& dp() const { return tp_ ? tp_->data() : comm_; }
  // --shard-params in training: the gradient is reduced into slices (GradientReducer::scatters).
  bool scatters() const { return reducer_ && reducer_->scatters(); }
  float* reduced() { return reduced_pages_.defined() ? reduced_pages_.data_ptr<float>() : reduced_.data(); }
  const float* reduced() const {
    return reduced_pages_.defined() ? reduced_pages_.data_ptr<float>() : reduced_.data();
  }
  // Collective with --shard-params (composed from the owners' chunk hashes): every parameter's
  // fingerprint into *each, their set's returned; *finite: whether this rank's (slice of the)
  // parameters is finite.
  Fingerprint param_fingerprints(std::vector<Fingerprint>* each = nullptr, bool* finite = nullptr) const;

 public:
  // Flat elements [lo, hi) as a sharded rank records its slice (ShardedOptimizer::slice_record).
  trace::SliceRecord slice_record(std::int64_t lo, std::int64_t hi) const { return zero_->slice_record(lo, hi); }

 private:
  // ---- state (trainer_state.cpp) ----
  // Copies the state into *c; buffers: the model's buffers as copied when the checkpoint was taken
  // (null: copy them now).
  // sharded: --shard-optimizer's gathered facts (null: the optimizer state is whole on this rank).
  void snapshot(std::int64_t step, ckpt::Checkpoint* c, const std::vector<NamedTensor>* buffers = nullptr,
                const ShardedOptimizer::Facts* sharded = nullptr) const;
  Status save_checkpoint(std::int64_t step);
  trace::Header trace_header() const;

  const TrainConfig& cfg_;
  const Comm& comm_;
  const Dataset& data_;
  Model& model_;
  Env* env_;
  at::Device device_{at::kCPU};  // --device cuda: this rank's GPU (docs/cuda.md)
  std::string device_name_ = "cpu";
  FlatParams flat_;
  std::unique_ptr<OptimizerState> opt_;
  std::unique_ptr<ShardedOptimizer> zero_;  // --shard-optimizer's layout and gathers (and slice records)
  std::unique_ptr<ParamGatherer> gather_;   // --shard-params (training): the layers' gathers; null otherwise
  std::unique_ptr<TreeAccumulator> acc_;
  std::vector<float> reduced_;  // the reduced gradient and loss (P + 1)
  // --shard-params (training): the reduced gradient's paged buffer instead, holding this rank's
  // slice, what sliced_gradient fetched past it, and the loss (GradientReducer::install_scatter).
  at::Tensor reduced_pages_;
  SlicedGradient sliced_;         // the step's facts of it (every rank's)
  TreeWorkspace tree_ws_;
  EpochOrders orders_;
  std::unique_ptr<SampleLoader> loader_;
  Status data_status_;            // the first sample the data source refused (agreed after the step)
  FaultPlan faults_;
  StepDetectors detectors_;
  std::unique_ptr<LayerTrace> layers_;  // null: no layer hooks needed
  StepState step_;
  std::vector<float> spot_leaf_;  // a recomputed micro-shard's leaf
  std::unique_ptr<GradientReducer> reducer_;  // the reduction overlapped with the last backward pass
  std::unique_ptr<TensorLayout> tp_;  // --tensor-parallel T > 1 (training): the groups; null otherwise
  at::Tensor clipped_;            // --clip-grad-norm: the clipped reduced gradient (P + 1)
  at::Tensor host_params_;        // a host copy of GPU parameters (the update invariant)
  RunInfo info_;
  std::unique_ptr<CheckpointPipeline> pipeline_;  // null in a replay
  FILE* metrics_ = nullptr;       // rank 0: RUN/metrics.jsonl
  Status metrics_status_;          // rank 0: the first failed append (agreed at the next checkpoint)
  int device_rank_ = -1;          // begin_replay's; see self()
  int replay_round_ = 0;          // replay_step's draw of intermittent faults
  std::int64_t done_ = 0;         // replay: steps completed
  std::int64_t recorded_step_ = -1;  // the last step record() fingerprinted, and its parameters'
  std::vector<Fingerprint> recorded_param_fps_;  // fingerprints (a checkpoint of that step reuses them)
};

}  // namespace culprit::harness
