// The Trainer: one rank's training step and run loop (trainer.cpp), its state's snapshot and restore
// (state.cpp) and its replay mode (engine.cpp). What it delegates has a unit of its own: the faults
// it injects (fault_plan.h), the detectors (detectors.h, vote.h), the background checkpoint and trace
// writes (checkpoint_pipeline.h), the optimizer state (optim_state.h), layer hooks (layer_trace.h).
// Private to the harness and included only by libtorch translation units.
#pragma once
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_pipeline.h"
#include "culprit/checkpoint.h"
#include "culprit/engine.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/trace.h"
#include "culprit/tree_overlap.h"
#include "culprit/tree_reduce.h"
#include "data.h"
#include "detectors.h"
#include "fault_plan.h"
#include "layer_trace.h"
#include "loader.h"
#include "model.h"
#include "optim_state.h"
#include "runinfo.h"
#include "shard.h"
#include "tensors.h"

namespace culprit::harness {

// Every parameter is a view of one flat float32 buffer (state-dict order), so the reduction, the
// fingerprints and checkpoint I/O are one call each.
struct FlatParams {
  std::vector<NamedTensor> params;
  std::vector<std::int64_t> offsets, sizes;  // of each parameter in the flat buffers
  std::vector<std::size_t> byte_offsets, byte_sizes;  // the same in bytes (fingerprint_with_parts)
  std::int64_t size = 0;                     // P; the gradient buffers hold P + 1 (the loss last)
  std::vector<bool> decay;                   // whether weight decay applies (--weight-decay-params)
  at::Tensor flat;
  std::vector<std::string> names() const;
};

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
  float clip_factor = 1;  // --clip-grad-norm: what the reduced gradient was multiplied by
  double clip_seconds = 0;  // and how long clipping took
  double data_wait = 0, data_read = 0;  // seconds waited for samples, and spent reading them
  Status data_error;   // a refused sample, agreed by every rank (the step stopped there)
};

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const Comm& comm, const Dataset& data, Model& model)
      : cfg_(cfg), comm_(comm), data_(data), model_(model) {}
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

  // Replay (culprit/engine.h; engine.cpp): no trace, metrics or checkpoints; steps run in
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
  // hooks or compute faults (wide_shard.cpp): P gradient values, then the loss.
  void shard_grad_f64(int k, int round, std::vector<double>* out);
  // The last step's update recomputed in float64 from `start` (the state before it) with the step's
  // reduced gradient and learning rate, without faults (float64.cpp). *now: this rank's state after
  // the step; *wide: the float64 one; each P parameter values, then P optimizer state values.
  void update_f64(const ckpt::Checkpoint& start, std::vector<float>* now, std::vector<double>* wide);
  std::int64_t replayed() const { return done_; }
  // The first sample the data source refused since the last call (a file changed under the run).
  Status take_data_status() { return std::exchange(data_status_, Status::OK()); }
  void mark(ckpt::Checkpoint* c) const { snapshot(done_, c); }
  Status rewind(const ckpt::Checkpoint& c);
  std::vector<std::string> layer_names() const { return model_.layers(); }
  std::vector<std::string> param_names() const { return flat_.names(); }

 private:
  // ---- setup (trainer.cpp) ----
  Status select_device();
  void build_flat_params();
  Status check_model(StepMode mode);  // the model accepts the data; its forward pass changes no state
  Status check_forward_changes_no_state();  // no buffer or parameter changed by a forward pass
  Status check_summed_loss(const at::Tensor& out, const at::Tensor& y);  // a model's own loss adds up
  Status check_training_pass();  // one forward (under the run's precision), loss and backward
  Status narrow_output(const std::vector<std::int64_t>& got) const;  // check_model's error: labels past the output
  StateProbe probe();
  Status start_run(std::int64_t start_step, const std::string& resumed_from);  // run.json, metrics, I/O

  // ---- the step (trainer.cpp), docs/determinism.md ----
  // One optimizer step (1-based s). replayed: the step's trace row (replay).
  void step(std::int64_t s, StepMode mode, trace::StepRow* replayed = nullptr);
  double begin_step(std::int64_t s, StepMode mode);  // the firing context, facts, learning rate
  void compute_local_shards();  // this rank's micro-shards into the tree's leaves
  // Forward and backward of micro-shard k into leaf (P gradient values, then the loss).
  void compute_shard(const FireContext& c, int k, float* leaf);
  void reduce();                 // tree_allreduce of the leaves
  void update(double lr);        // the reduced gradient into the parameters, the optimizer step
  at::Tensor clip(const at::Tensor& grads);  // --clip-grad-norm: the clipped copy of the reduced gradient
  Fingerprint record(double lr, trace::StepRow* row);  // fingerprints, invariants, the trace row
  void write_metrics(double lr, Fingerprint fp, double secs);

  // ---- micro-shard helpers (trainer.cpp) ----
  const at::Tensor& epoch_order(std::int64_t epoch);
  // The samples `idx` of micro-shard k of step s as tensors (x, y) of this process's own, from the
  // read-ahead when it holds them.
  std::pair<at::Tensor, at::Tensor> load_samples(std::int64_t s, int k, const at::Tensor& idx);
  std::pair<at::Tensor, at::Tensor> first_samples(std::int64_t n);  // samples 0..n-1 (setup's checks)
  void read_ahead(std::int64_t s);  // this rank's micro-shards of step s, in the background
  at::Tensor loss_of(const at::Tensor& out, const at::Tensor& y) const;
  void zero_grads(const FireContext& c, int k);
  bool copy_grads(float* leaf) const;  // false: a value is not finite
  trace::ShardRow shard_row(int k, const float* leaf) const;
  std::vector<Fingerprint> param_grad_fps(const float* leaf) const;  // per parameter, of a leaf
  std::vector<Fingerprint> optimizer_fps() const;  // per parameter: its optimizer state's (0: none yet)
  std::vector<Fingerprint> sample_fingerprints(const at::Tensor& x) const;  // per sample (row) of x
  int self() const { return device_rank_ < 0 ? comm_.rank : device_rank_; }

  // ---- the reduction overlapped with the last micro-shard's backward pass (overlap.cpp) ----
  void setup_overlap();  // hooks on every parameter's gradient accumulator (training with --bucket-mb)
  bool overlaps(const FireContext& c, int k) const;  // micro-shard k's backward overlaps the reduction
  void begin_overlap(const FireContext& c, int k, float* leaf);  // before its backward pass
  void gradient_final(std::size_t i);  // the hook: parameter i's gradient is final
  bool end_overlap();  // after it: the rest of the leaf, every bucket launched; false: a value not finite
  bool copy_grad(std::size_t i, float* leaf) const;  // parameter i's gradient into the leaf; false: not finite

  // ---- --shard-optimizer (sharded.cpp) ----
  bool sharded() const { return cfg_.shard_optimizer; }
  std::vector<OptimizerSlot> owned_slots() const;  // this rank's slices of the parameters
  void gather_params();  // every rank's updated slice to every rank
  // This rank's chunk hashes of one kind of optimizer state (gather: every rank's, in chunk order).
  std::vector<std::uint64_t> state_chunk_hashes(const std::function<at::Tensor(const OptimizerSlot&)>& state_of,
                                                bool gather) const;
  std::vector<Fingerprint> sharded_optimizer_fps() const;  // collective: per parameter, as unsharded

 public:
  // Flat elements [lo, hi) as a sharded rank records its slice (trace::StepRow::shard), from the
  // state this rank holds: its own slice when sharded, any range when not (the replay engine's).
  trace::SliceRecord slice_record(std::int64_t lo, std::int64_t hi) const;

 private:
  struct ShardedState {
    std::vector<std::int64_t> info;  // per parameter: 0 no state yet; AdamW's step count; 1 (SGD)
    std::map<std::string, std::vector<std::uint64_t>> hashes;  // per state tensor: every chunk's hash
    // This rank's slot tensors of each state, taken on the main thread: the I/O thread's copy only
    // reads their bytes (state.cpp).
    std::map<std::pair<std::size_t, std::string>, at::Tensor> held;
  };
  ShardedState gather_sharded_state() const;  // collective
  void snapshot_sharded_optimizer(const ShardedState& g, std::vector<ckpt::RawTensor>* out) const;
  at::Tensor slot_part(const ckpt::RawTensor& r, std::int64_t offset, std::int64_t numel) const;

  // ---- state (state.cpp) ----
  // Copies the state into *c; buffers: the model's buffers as copied when the checkpoint was taken
  // (null: copy them now).
  // sharded: --shard-optimizer's gathered facts (null: the optimizer state is whole on this rank).
  void snapshot(std::int64_t step, ckpt::Checkpoint* c, const std::vector<NamedTensor>* buffers = nullptr,
                const ShardedState* sharded = nullptr) const;
  Status save_checkpoint(std::int64_t step);
  trace::Header trace_header() const;

  const TrainConfig& cfg_;
  const Comm& comm_;
  const Dataset& data_;
  Model& model_;
  at::Device device_{at::kCPU};  // --device cuda: this rank's GPU (docs/cuda.md)
  std::string device_name_ = "cpu";
  FlatParams flat_;
  std::unique_ptr<OptimizerState> opt_;
  ShardLayout shards_;            // --shard-optimizer: rank c owns flat elements [lo(c), hi(c))
  std::unique_ptr<TreeAccumulator> acc_;
  std::vector<float> reduced_;  // the reduced gradient and loss (P + 1)
  TreeWorkspace tree_ws_;
  EpochOrders orders_;
  std::unique_ptr<SampleLoader> loader_;
  Status data_status_;            // the first sample the data source refused (agreed after the step)
  FaultPlan faults_;
  StepDetectors detectors_;
  std::unique_ptr<LayerTrace> layers_;  // null: no layer hooks needed
  StepState step_;
  std::vector<float> spot_leaf_;  // a recomputed micro-shard's leaf
  struct Overlap {
    std::unique_ptr<OverlapChannel> channel;  // null: no overlap (replay, --bucket-mb 0, one bucket, a GPU)
    std::vector<Bucket> buckets;              // in launch order
    std::vector<std::size_t> bucket_of;       // per parameter
    std::vector<std::size_t> size_of;         // per bucket: its parameters
    std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks;
    // The step in progress: the last micro-shard's backward pass (armed), then its reduction.
    std::unique_ptr<OverlappedReduce> reduce;
    bool armed = false;
    FireContext fire;
    int shard = -1;
    float* leaf = nullptr;
    bool finite = true;
    std::vector<bool> reported;         // per parameter
    std::vector<std::size_t> pending;   // per bucket: parameters not final yet
    SendFault send;
  } overlap_;
  at::Tensor clipped_;            // --clip-grad-norm: the clipped reduced gradient (P + 1)
  at::Tensor host_params_;        // a host copy of GPU parameters (the update invariant)
  RunInfo info_;
  std::unique_ptr<CheckpointPipeline> pipeline_;  // null in a replay
  FILE* metrics_ = nullptr;       // rank 0: RUN/metrics.jsonl
  Status metrics_status_;          // rank 0: the first failed append (agreed at the next checkpoint)
  int device_rank_ = -1;          // begin_replay's; see self()
  int replay_round_ = 0;          // replay_step's draw of intermittent faults
  std::int64_t done_ = 0;         // replay: steps completed
};

}  // namespace culprit::harness
