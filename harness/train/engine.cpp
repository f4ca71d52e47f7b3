// The replay engine (culprit/engine.h): a Trainer restored from a checkpoint that re-executes steps
// as the original run did and hands back every fingerprint, for culprit replay, bisect and audit.
#include <torch/torch.h>

#include "culprit/watchdog.h"
#include "culprit/engine.h"
#include "culprit/checkpoint_format.h"
#include "culprit/run_files.h"
#include "culprit/tree_reduce.h"
#include "culprit/data.h"
#include "data/data_prepare.h"
#include "culprit/model.h"
#include "train/run_directory.h"
#include "train/trainer.h"

namespace culprit::harness {

void Trainer::begin_replay(std::int64_t done, int device_rank) {
  device_rank_ = device_rank;
  done_ = done;
  info_.hosts.assign(comm_.size, comm_.host);
  info_.devices.assign(comm_.size, device_name_);
  detectors_.set_placement(info_.hosts, info_.devices);
  model_.set_training(true);
  std::vector<Fingerprint> initial;
  set_fingerprint(flat_.params, &initial);
  detectors_.start(initial);
  spot_leaf_.assign(static_cast<std::size_t>(flat_.size + 1), 0.0f);
}

ShardResult shard_result(const trace::ShardRow& r) {
  ShardResult out;
  out.step = r.step;
  out.shard = r.shard;
  out.rank = r.rank;
  out.loss = r.loss;
  out.grad_fp = r.grad_fp;
  out.input_fp = r.input_fp;
  out.sample_fps = r.sample_fps;
  out.fwd = r.fwd;
  out.bwd = r.bwd;
  out.param_grad = r.param_grad;
  return out;
}

Status Trainer::rewind(const ckpt::Checkpoint& c) {
  CULPRIT_RETURN_IF_ERROR(restore(c));
  done_ = c.step;
  return Status::OK();
}

void Trainer::replay_step(StepResult* out, int round) {
  // Ranks that wait for this one meanwhile (an audit's longer share, a step replayed alone) hear
  // that it is at work, not stopped.
  Watchdog::busy("replaying a step");
  const std::int64_t s = done_ + 1;
  step_.shard_rows.clear();
  trace::StepRow row;
  replay_round_ = round;
  step(s, StepMode::kReplay, &row);
  replay_round_ = 0;
  done_ = s;
  out->step = s;
  out->loss = row.loss;
  out->grad_fp = row.grad_fp;
  out->param_fps = row.param_fps;
  out->opt_fps = row.opt_fps;
  out->shards.clear();
  for (const auto& r : step_.shard_rows) out->shards.push_back(shard_result(r));
  step_.shard_rows.clear();
  // Every rank's message fingerprints, for the reduction's comm faults (ranks as the caller knows them).
  out->comm_faults.clear();
  const int W = comm_.size;
  if (W > 1) {
    VoteRecord mine;
    mine.comm = step_.comm;
    VoteLayout layout;
    layout.world = W;
    layout.comm = true;
    // Records only when a message arrived unlike it was sent (the summary's digest); none: no fault.
    const auto votes = exchange_votes(comm_, mine, layout, "the replay's message check").records;
    const int rot = (self() - comm_.rank + W) % W;  // layout rank -> the process's own rank
    for (const auto& [from, to] : comm_mismatches(comm_checks(votes)))
      out->comm_faults.push_back({(from + rot) % W, (to + rot) % W});
  }
}

void Trainer::replay_shard(int k, int round, ShardResult* out) {
  Watchdog::busy("recomputing a micro-shard");  // reruns only the blamed rank does
  FireContext c = step_.fire;
  c.step = done_ + 1;
  c.rank = self();
  c.attempt = 0;
  c.mode = StepMode::kReplay;
  c.round = round;  // an intermittent fault draws anew on each rerun
  std::vector<float> leaf(static_cast<std::size_t>(flat_.size + 1));
  {
    BufferGuard keep(model_);
    compute_shard(c, k, leaf.data());
  }
  out->step = c.step;
  out->shard = k;
  out->rank = self();
  out->loss = leaf[flat_.size];
  out->grad_fp = fingerprint_bytes(leaf.data(), static_cast<std::size_t>(flat_.size) * sizeof(float));
  out->input_fp = step_.input_fp;
  out->sample_fps = step_.sample_fps;
  if (layers_) {
    out->fwd = layers_->forward();
    out->bwd = layers_->backward();
  }
  if (!out->fwd.empty()) out->param_grad = param_grad_fps(leaf.data());
  out->grad.assign(leaf.begin(), leaf.end() - 1);
}

namespace {

class EngineImpl : public Engine {
 public:
  ~EngineImpl() override {
    trainer_.reset();
    if (layout_.comm != MPI_COMM_NULL && layout_.comm != comm_.comm) MPI_Comm_free(&layout_.comm);
  }
  Status init(const TrainConfig& cfg, const Comm& comm, const ckpt::Checkpoint& c, const std::string& path,
              bool layer_trace, int rotate) {
    comm_ = comm;
    layout_ = comm;
    set_layout(rotate);
    cfg_ = cfg;
    cfg_.detect.nonfinite = false;
    cfg_.detect.comm_check = false;
    cfg_.detect.spike_window = 0;
    cfg_.detect.replica_check_every = 0;
    cfg_.detect.invariants = false;
    cfg_.detect.spot_check = 0;
    cfg_.trace = layer_trace ? TraceLevel::kLayer : TraceLevel::kOff;
    // A replay holds the whole optimizer state on every rank: the same bits as sharded (and any
    // world size, a step alone, the float64 arbiter work on it); the bisection compares a sharded
    // run's slices with the replay's (trace::StepRow::shard).
    cfg_.shard_optimizer = false;
    cfg_.shard_params = false;  // --shard-params too: the replay's parameters are whole
    cfg_.keep_gathered = false;
    cfg_.quiet = true;
    setup_determinism(cfg_.threads);
    CULPRIT_RETURN_IF_ERROR(agree(comm, load_dataset(cfg_, &data_)));
    CULPRIT_RETURN_IF_ERROR(agree(comm, guarded(StatusCode::kInternal, "model " + cfg_.model.text(), [&] { return make_model(cfg_, data_, &model_); })));
    trainer_ = std::make_unique<Trainer>(cfg_, layout_, data_, *model_);
    CULPRIT_RETURN_IF_ERROR(agree(comm, guarded(StatusCode::kInternal, "setup", [&] { return trainer_->init(StepMode::kReplay); })));
    CULPRIT_RETURN_IF_ERROR(trainer_->check_ranks_agree());
    // The configuration as recorded (cfg), not the replay's own changes to it (cfg_: detectors and
    // trace off), is what the checkpoint's must equal.
    CULPRIT_RETURN_IF_ERROR(agree(comm, check_compatible(cfg, data_, c, path)));
    CULPRIT_RETURN_IF_ERROR(agree(comm, guarded(StatusCode::kInternal, "restoring " + path, [&] { return trainer_->restore(c); })));
    trainer_->begin_replay(c.step, comm.rank);
    return Status::OK();
  }
  std::int64_t step() const override { return trainer_->replayed(); }
  Status run_step(StepResult* out, int round = 0) override {
    return agree(comm_, guarded_step(StatusCode::kInternal, "replaying step " + std::to_string(step() + 1), [&] {
      trainer_->replay_step(out, round);
      return trainer_->take_data_status();
    }));
  }
  Status compute_shard(int k, int round, ShardResult* out) override {
    if (k < 0 || k >= cfg_.micro_shards)
      return Status::BadInput("micro-shard " + std::to_string(k) + " does not exist (--micro-shards " +
                           std::to_string(cfg_.micro_shards) + ")");
    return guarded(StatusCode::kInternal, "replaying micro-shard " + std::to_string(k), [&] {
      trainer_->replay_shard(k, round, out);
      return trainer_->take_data_status();
    });
  }
  Status compute_shard_f64(int k, int round, std::vector<double>* out) override {
    if (k < 0 || k >= cfg_.micro_shards)
      return Status::BadInput("micro-shard " + std::to_string(k) + " does not exist (--micro-shards " +
                           std::to_string(cfg_.micro_shards) + ")");
    return guarded(StatusCode::kInternal, "recomputing micro-shard " + std::to_string(k) + " in float64", [&] {
      trainer_->shard_grad_f64(k, round, out);
      return trainer_->take_data_status();
    });
  }
  Status update_f64(std::vector<float>* now, std::vector<double>* wide) override {
    return guarded(StatusCode::kInternal, "recomputing the update in float64", [&] {
      trainer_->update_f64(marked_, now, wide);
      return Status::OK();
    });
  }
  Status update_exact(std::vector<float>* now, std::vector<float>* exact, std::string* why) override {
    why->clear();
    return guarded(StatusCode::kInternal, "re-executing the update element by element", [&] {
      trainer_->update_exact(marked_, now, exact, why);
      return Status::OK();
    });
  }
  std::vector<Fingerprint> reduced_chunk_fps(int world) const override {
    std::vector<Fingerprint> out;
    for (int c = 0; c < world; ++c) out.push_back(trainer_->reduced_fp(world, c));
    return out;
  }
  Status run_step_alone(StepResult* out, int round) override {
    const Comm shared = layout_;
    layout_ = comm_;
    layout_.comm = MPI_COMM_SELF;
    layout_.rank = 0;
    layout_.size = 1;
    const Status st = guarded(StatusCode::kInternal, "replaying step " + std::to_string(step() + 1) + " alone", [&] {
      trainer_->replay_step(out, round);
      return Status::OK();
    });
    layout_ = shared;  // the trainer holds a reference to layout_
    return st;
  }
  std::vector<Fingerprint> reduced_param_fps() const override { return trainer_->reduced_param_fps(); }
  Status changed_samples(const std::vector<std::int64_t>& samples, std::vector<ChangedSample>* out,
                         std::string* skipped) override {
    std::vector<DamagedSample> damaged;
    CULPRIT_RETURN_IF_ERROR(harness::changed_samples(cfg_, samples, &damaged, skipped));
    out->clear();
    for (const auto& d : damaged)
      out->push_back({d.sample, d.where.file, d.where.offset, d.block_offset, d.block_bytes, d.where.text()});
    return Status::OK();
  }
  Status source_samples(const std::vector<std::int64_t>& idx, std::vector<Fingerprint>* out,
                        std::string* source) override {
    switch (cfg_.data.kind) {
      case DataKind::kSynthetic: *source = "the synthetic data set (each sample a function of the seed and its index)"; break;
      case DataKind::kPython: *source = "the script's data set"; break;
      default: *source = "the file '" + cfg_.data.path + "'";
    }
    Status st;
    *out = trainer_->source_sample_fps(idx, &st);
    return st;
  }
  std::string sample_location(std::int64_t i, std::string* file, std::int64_t* offset) override {
    if (i < 0 || i >= data_.n) return "";
    const SampleLocation loc = data_.reader->locate(i, SamplePart::kX);
    if (file) *file = loc.file;
    if (offset) *offset = loc.file.empty() ? -1 : static_cast<std::int64_t>(loc.offset);
    return loc.file.empty() ? "" : loc.text();
  }
  trace::SliceRecord slice_record(std::int64_t lo, std::int64_t hi) const override {
    return trainer_->slice_record(lo, hi);
  }
  std::vector<std::int64_t> shard_samples(int k) override { return shard_samples_of(step() + 1, k); }
  std::vector<std::int64_t> shard_samples_of(std::int64_t s, int k) override {
    const at::Tensor idx = trainer_->shard_indices(s, k).contiguous();
    return std::vector<std::int64_t>(idx.data_ptr<std::int64_t>(), idx.data_ptr<std::int64_t>() + idx.numel());
  }
  Status set_rotation(int rotate) override {
    set_layout(rotate);  // the trainer holds a reference to layout_: it sees the new one
    return Status::OK();
  }
  Status mark() override {
    return guarded(StatusCode::kInternal, "keeping the state", [&] {
      trainer_->mark(&marked_);
      return Status::OK();
    });
  }
  Status rewind() override {
    return guarded(StatusCode::kInternal, "rewinding", [&] { return trainer_->rewind(marked_); });
  }
  std::vector<std::string> params() const override { return trainer_->param_names(); }
  Status learning_rates(std::int64_t step, std::vector<double>* out) override {
    return guarded(StatusCode::kBadInput, "the learning-rate schedule", [&] {
      *out = trainer_->learning_rates(step);
      return Status::OK();
    });
  }
  std::vector<std::string> layers() const override { return trainer_->layer_names(); }

 private:
  void set_layout(int rotate) {
    if (layout_.comm != MPI_COMM_NULL && layout_.comm != comm_.comm) MPI_Comm_free(&layout_.comm);
    layout_ = comm_;
    const int W = comm_.size, rot = ((rotate % W) + W) % W;
    if (rot != 0) {
      layout_.rank = (comm_.rank - rot + W) % W;
      // A split has no nonblocking form: every rank is first seen there through the watchdog, so a
      // stopped rank is named, not waited for in the split.
      CULPRIT_COLLECTIVE(comm_, "the replay's layout", MPI_Ibarrier(comm_.comm, &_culprit_req));
      CULPRIT_MPI_CHECK(MPI_Comm_split(comm_.comm, 0, layout_.rank, &layout_.comm));
    }
  }
  TrainConfig cfg_;
  Comm comm_;
  Comm layout_;  // comm_ re-ordered by `rotate`: the trainer's micro-shard layout and reduction
  Dataset data_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Trainer> trainer_;
  ckpt::Checkpoint marked_;
};

}  // namespace

Status Engine::open(const TrainConfig& run_cfg, const Comm& comm, const ckpt::Checkpoint& start, const std::string& path,
                    bool layer_trace, std::unique_ptr<Engine>* out, int rotate) {
  // A replay computes every chunk of a tensor-parallel run on one rank (--tensor-parallel 1): the
  // same bits (docs/determinism.md, "Tensor parallelism"), at any world size.
  TrainConfig cfg = run_cfg;
  cfg.tensor_parallel = 1;
  CULPRIT_RETURN_IF_ERROR(agree(comm, validate(cfg, comm.size)));
  // A foreign checkpoint (renamed into the run) is refused, never replayed and "reproduced".
  CULPRIT_RETURN_IF_ERROR(agree(comm, ckpt::belongs(path, start, cfg.run_id)));
  auto e = std::make_unique<EngineImpl>();
  CULPRIT_RETURN_IF_ERROR(e->init(cfg, comm, start, path, layer_trace, rotate));
  *out = std::move(e);
  return Status::OK();
}

bool Engine::has_data_record(const TrainConfig& cfg) {
  DataRecord r;
  return cfg.data.kind != DataKind::kSynthetic && read_data_record(cfg.data.path + kDataRecordSuffix, &r).ok();
}

int Engine::replay_rank(int k, int micro_shards, int world, int rotate) {
  int owner = world - 1;
  for (int r = 0; r < world; ++r)
    if (shard_range(r, world, micro_shards).hi > k) {
      owner = r;
      break;
    }
  return (owner + ((rotate % world) + world) % world) % world;
}

}  // namespace culprit::harness
