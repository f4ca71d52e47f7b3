// The training loop: the step function implementing docs/determinism.md, read as a few named calls,
// and the run around it. Setup: trainer_setup.cpp; snapshot and restore: state.cpp; replay: engine.cpp.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "culprit/checkpoint_format.h"
#include "culprit/math_libraries.h"
#include "culprit/run_files.h"
#include "culprit/watchdog.h"
#include "culprit/finite.h"
#include "culprit/rng.h"
#include "culprit/system.h"
#include "train/run_directory.h"
#include "config/sizes.h"
#include "train/trainer.h"

namespace culprit::harness {

// Here, where GradientReducer, ShardedOptimizer and ParamGatherer are complete. The model outlives
// the trainer, its layer hooks (the observer) do not.
Trainer::~Trainer() { model_.set_observer(nullptr); }

namespace fs = std::filesystem;

namespace {

std::string json_float(float v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

}  // namespace

// ---- micro-shards ----

at::Tensor Trainer::shard_loss(const at::Tensor& x, const at::Tensor& y) {
  // (sum of per-sample losses) / B; a sample's loss is the mean over its target elements. A mean
  // over the micro-shard's samples becomes the same by / (B / n): with n = B / M, / M exactly, as
  // a gradient-accumulation loop divides its micro-batch's mean loss.
  const double denom = static_cast<double>(cfg_.global_batch * std::max<std::int64_t>(1, data_.y_numel()));
  if (model_.owns_loss()) {  // a Python model's forward and loss
    const at::Tensor own = model_.own_loss(x, y);
    return model_.own_loss_is_mean() ? own / (static_cast<double>(cfg_.global_batch) / static_cast<double>(x.size(0)))
                                     : own / denom;
  }
  return loss_of(model_.forward(x), y);
}

at::Tensor Trainer::forward_any(const at::Tensor& x, const at::Tensor& y) {
  return model_.owns_loss() ? model_.own_loss(x, y) : model_.forward(x);
}

at::Tensor Trainer::loss_of(const at::Tensor& out, const at::Tensor& y) const {
  const double denom = static_cast<double>(cfg_.global_batch * std::max<std::int64_t>(1, data_.y_numel()));
  if (data_.classification()) {
    const auto C = out.size(-1);
    return torch::nn::functional::cross_entropy(
               out.reshape({-1, C}), y.reshape({-1}),
               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
           denom;
  }
  return torch::nn::functional::mse_loss(out, y, torch::nn::functional::MSELossFuncOptions(torch::kSum)) / denom;
}

// Every gradient starts at zero (undefined); a stale-gradient fault leaves a layer's in place.
void Trainer::zero_grads(const FireContext& c, int k) {
  for (std::size_t i = 0; i < flat_.params.size(); ++i)
    if (!faults_.keeps_grad(c, k, i)) flat_.params[i].tensor.mutable_grad().reset();
}

// The gradients into the leaf, checked for NaN/Inf while copying (the data passes the cache once).
bool Trainer::copy_grads(float* leaf) const {
  bool finite = true;
  for (std::size_t i = 0; i < flat_.params.size(); ++i) finite = copy_grad(flat_, i, leaf) && finite;
  return finite;
}

void Trainer::compute_shard(const FireContext& c, int k, float* leaf) {
  StepFacts& facts = step_.facts;
  if (layers_) layers_->begin_shard(c, k);
  at::Tensor idx = shard_indices(c.step, k);
  std::uint64_t seed = dropout_seed(cfg_.seed, c.step, k);
  faults_.on_inputs(c, k, &idx, &seed);
  auto [x, y] = load_samples(c.step, k, idx);
  faults_.on_batch(c, k, x, data_.classes);
  step_.input_fp = tensor_fingerprint(x);
  if (cfg_.tracing() || c.mode == StepMode::kReplay) step_.sample_fps = sample_fingerprints(x);
  if (device_.is_cuda()) {
    x = x.to(device_);
    y = y.to(device_);
  }
  torch::manual_seed(seed);  // also every CUDA generator: dropout masks on the GPU follow the seed
  if (c.attempt == 0 && !facts.shards.empty()) {
    Stopwatch sw(&facts.seconds);
    facts.shards.rng[k] = tensor_fingerprint(at::detail::getDefaultCPUGenerator().get_state());
    facts.shards.samples[k] = tensor_fingerprint(idx);
  }
  zero_grads(c, k);
  at::Tensor loss;
  {
    AutocastScope autocast(cfg_.precision, device_);  // the forward pass, model and loss; not the backward
    loss = shard_loss(x, y);
  }
  if (cfg_.detect.invariants) {
    double nested = 0;  // a spot-check recomputation is timed as a whole
    Stopwatch sw(c.attempt == 0 ? &facts.seconds : &nested);
    for (const auto& p : flat_.params) {
      const auto& g = p.tensor.grad();
      if (g.defined() && g.count_nonzero().item<std::int64_t>() != 0) {
        facts.violated("the gradient of '" + p.name + "' was not zero before the backward of micro-shard " +
                       std::to_string(k) + " (a missing zero_grad: gradients accumulate across micro-shards)");
        break;
      }
    }
  }
  leaf[flat_.size] = loss.item<float>();
  bool finite = std::isfinite(leaf[flat_.size]);
  if (!tp_ && reducer_->overlaps(c, k)) {  // the leaf is filled, and reduced, bucket by bucket during the backward pass
    step_.comm.enabled = cfg_.detect.comm_check;
    reducer_->begin(c, k, leaf, acc_.get(), reduced(), &step_.comm);
    loss.backward();
    finite = reducer_->end() && finite;
  } else {
    loss.backward();
    finite = copy_grads(leaf) && finite;
    if (tp_) tp_->assemble(leaf);  // the group's chunks: the micro-shard's whole gradient
    finite = faults_.on_leaf(c, k, leaf) && finite;  // this rank's copy of it
  }
  if (c.attempt == 0 && !finite && facts.bad_shard < 0) facts.bad_shard = k;
}

std::vector<Fingerprint> Trainer::param_grad_fps(const float* leaf) const {
  std::vector<Fingerprint> out;
  for (std::size_t i = 0; i < flat_.params.size(); ++i)
    out.push_back(fingerprint_bytes(leaf + flat_.offsets[i], static_cast<std::size_t>(flat_.sizes[i]) * sizeof(float)));
  return out;
}

trace::ShardRow Trainer::shard_row(int k, const float* leaf) const {
  trace::ShardRow row;
  row.step = step_.fire.step;
  row.shard = k;
  row.rank = self();
  row.host = comm_.host;
  row.device = device_name_;
  row.input_fp = step_.input_fp;
  row.sample_fps = step_.sample_fps;
  if (layers_) {
    row.fwd = layers_->forward();
    row.bwd = layers_->backward();
  }
  if (!leaf) {  // --shard-params: the leaf left bucket by bucket, fingerprinted as it went
    row.loss = reducer_->leaf_loss();
    row.grad_fp = reducer_->leaf_fp();
    if (!row.fwd.empty()) row.param_grad = reducer_->leaf_param_fps();
    return row;
  }
  row.loss = leaf[flat_.size];
  const std::size_t bytes = static_cast<std::size_t>(flat_.size) * sizeof(float);
  if (row.fwd.empty()) row.grad_fp = fingerprint_bytes(leaf, bytes);
  else row.grad_fp = fingerprint_with_parts(leaf, bytes, flat_.byte_offsets, flat_.byte_sizes, &row.param_grad);
  return row;
}

// ---- the step ----

// One optimizer step (1-based s): see docs/determinism.md.
void Trainer::step(std::int64_t s, StepMode mode, trace::StepRow* replayed) {
  const auto t0 = std::chrono::steady_clock::now();
  const double lr = begin_step(s, mode);
  compute_local_shards();
  // A sample the data source refused (a data file changed under the run) computed as zeros: the
  // ranks agree on it before any detector sees the step, and the run ends with the data's error.
  if (mode == StepMode::kTrain) {
    step_.data_error = agree(comm_, data_status_);
    if (!step_.data_error.ok()) {
      reducer_->finish();  // no collective left in flight
      return;
    }
  }
  {
    Stopwatch sw(&step_.facts.seconds);
    detectors_.check_shards(step_.facts);
  }
  reduce();
  update(lr);
  trace::StepRow row;
  const Fingerprint fp = record(lr, &row);
  if (replayed) *replayed = row;
  if (cfg_.tracing() && pipeline_) {
    pipeline_->append_trace(std::move(row), std::move(step_.shard_rows));
    step_.shard_rows.clear();
  }
  {
    Stopwatch sw(&step_.facts.seconds);
    detectors_.vote(step_.facts);
  }
  if (pipeline_ && detectors_.saw_fault()) pipeline_->pin_trace();  // its diagnosis needs the trace
  // The data's cost: what the step waited for its samples (the read stall) and what reading them
  // took (behind the previous step's compute when read ahead).
  step_.data_wait = loader_->take_wait_seconds();
  step_.data_read = loader_->take_read_seconds();
  write_metrics(lr, fp, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The step's firing context and facts; the learning rate (as scheduled) and the one this rank uses.
double Trainer::begin_step(std::int64_t s, StepMode mode) {
  if (comm_.watchdog) comm_.watchdog->set_step(s);
  if (cfg_.memory_metrics && mode == StepMode::kTrain) reset_peak_rss();  // the step's own peak
  const int first = scatters() ? comm_.rank : shard_range(dp().rank, dp().size, cfg_.micro_shards).lo;
  step_.fire = FireContext{s, self(), first, 0, mode, mode == StepMode::kReplay ? replay_round_ : 0};
  StepFacts& f = step_.facts;
  f = StepFacts();
  f.step = s;
  f.shards.reset(detectors_.collects_shard_facts() ? cfg_.micro_shards : 0);
  const std::vector<double> lrs = learning_rates(s);
  // An --inject ...,phase=lr fault changes group 0's rate; the other groups' follow it (a stale one:
  // the previous step's rates).
  const std::vector<double> prev = learning_rates(s - 1);
  bool stale = false;
  const double lr = lrs.at(0), used = faults_.on_lr(step_.fire, lr, prev.at(0), &stale);
  std::vector<double> set = stale ? prev : lrs;
  if (!stale && used != lr) {  // group 0 gets the faulty rate itself, the others its ratio
    for (std::size_t g = 1; g < set.size(); ++g) set[g] = lr != 0 ? lrs[g] * (used / lr) : used;
    set[0] = used;
  }
  opt_->set_lrs(set);
  step_.lrs = lrs;
  return lr;
}

// Each parameter group's learning rate at step s (s < 1: step 1's): the script's schedule, or
// culprit's --lr-schedule scaling each group's base rate (one group: --lr's schedule itself).
std::vector<double> Trainer::learning_rates(std::int64_t s) {
  s = std::max<std::int64_t>(s, 1);
  std::vector<double> lrs = model_.learning_rates(s);
  if (!lrs.empty()) {
    if (lrs.size() != opt_->lr_groups())
      throw UserCodeError("the script's schedule gives " + std::to_string(lrs.size()) + " learning rates at step " +
                          std::to_string(s) + " for " + std::to_string(opt_->lr_groups()) + " optimizer groups");
    return lrs;
  }
  const double lr = learning_rate(cfg_, s);
  lrs = opt_->base_lrs();
  if (lrs.size() == 1) return {lr};
  // Another group's rate follows the schedule's multiplier (--lr 1, --min-lr as its share of --lr),
  // also where group 0's rate is 0.
  TrainConfig unit = cfg_;
  unit.optim.lr = 1;
  unit.optim.min_lr = cfg_.optim.lr > 0 ? cfg_.optim.min_lr / cfg_.optim.lr : 0;
  const double multiplier = learning_rate(unit, s);
  for (double& v : lrs) v = v == cfg_.optim.lr ? lr : v * multiplier;
  return lrs;
}

// Forward and backward of this rank's micro-shards, summed along the tree.
void Trainer::compute_local_shards() {
  if (scatters()) return compute_scattered_shards();
  const ShardRange mine = shard_range(dp().rank, dp().size, cfg_.micro_shards);
  const std::int64_t s = step_.fire.step;
  const bool rows = cfg_.tracing() || step_.fire.mode == StepMode::kReplay;
  // The next step's samples are read while this one computes (a replay reads what it is asked).
  if (step_.fire.mode == StepMode::kTrain) read_ahead(s + 1);
  acc_->clear();
  for (int k = mine.lo; k < mine.hi; ++k) {
    float* leaf = acc_->leaf_buffer();
    compute_shard(step_.fire, k, leaf);
    if (detectors_.spot_checked(s, k)) {
      Stopwatch sw(&step_.facts.seconds);
      step_.facts.shards.leaf[k] = fingerprint_bytes(leaf, static_cast<std::size_t>(flat_.size + 1) * sizeof(float));
    }
    if (rows) step_.shard_rows.push_back(shard_row(k, leaf));
    if (!reducer_->in_flight()) acc_->push(k);  // else when its reduction finishes
  }
}

void Trainer::reduce() {
  if (scatters()) return reduce_scattered();
  if (reducer_->in_flight()) {  // started during the last micro-shard's backward pass
    reducer_->finish();
    step_.facts.seconds += step_.comm.seconds;
    step_.facts.comm = &step_.comm;
    return;
  }
  SendFault storage;
  const SendFault* send_fault = faults_.on_send(step_.fire, &storage);
  step_.comm.enabled = cfg_.detect.comm_check || step_.fire.mode == StepMode::kReplay;  // a replay reports comm faults
  tree_allreduce(dp(), cfg_.micro_shards, *acc_, reduced(), &tree_ws_, send_fault, &step_.comm);
  if (tp_) tp_->widen(&step_.comm, comm_.size);
  step_.facts.seconds += step_.comm.seconds;
  step_.facts.comm = &step_.comm;
}

// The step's fingerprints and trace row; the update's invariants.
Fingerprint Trainer::record(double lr, trace::StepRow* row) {
  StepFacts& f = step_.facts;
  f.grad_norm = scatters() ? sliced_.norm : l2_norm(reduced(), static_cast<std::size_t>(flat_.size));
  f.reduced = reduced();
  if (scatters()) f.reduced_finite = sliced_.finite ? 1 : 0;
  f.update_scale = cfg_.optim.clip_grad_norm > 0 ? step_.clip_factor : 1.0;
  f.params = flat_.size;
  row->step = f.step;
  row->loss = reduced()[flat_.size];
  row->lr = lr;
  row->lrs_fp = fingerprint_bytes(step_.lrs.data(), step_.lrs.size() * sizeof(double));
  // The NaN/Inf detector's scan of the parameters, in the fingerprints' pass on the CPU (on a GPU
  // the vote's one scan of the flat buffer stays: a scan per tensor would sync per tensor).
  const bool scan = cfg_.detect.nonfinite && !flat_.flat.is_cuda();
  bool finite = true;
  const Fingerprint fp = param_fingerprints(&row->param_fps, scan ? &finite : nullptr);
  if (scan) f.params_finite = finite ? 1 : 0;
  f.param_fps = row->param_fps;
  recorded_step_ = f.step;
  recorded_param_fps_ = row->param_fps;
  if (gather_) {
    f.held_lo = gather_->lo();
    f.held_hi = gather_->hi();
    f.gather_chunk = gather_->mismatch();
  }
  if (cfg_.detect.invariants) {
    Stopwatch sw(&f.seconds);
    // The script's optimizer: its update is no rate x gradient (Adam's, Muon's), so "a gradient but
    // no change" would be a guess; the schedule's check stays.
    const std::vector<double> param_lrs(opt_->known() ? 0 : flat_.params.size(), 0.0);
    detectors_.check_update(f, lr, opt_->lr(), flat_.offsets, flat_.sizes, param_lrs);
  }
  if (cfg_.tracing() || step_.fire.mode == StepMode::kReplay) {
    const std::size_t P = static_cast<std::size_t>(flat_.size);
    if (scatters()) {
      row->grad_fp = sliced_.grad_fp;
      row->reduced_fps = sliced_.param_fps;
    } else {
      row->grad_fp = fingerprint_with_parts(reduced(), P * sizeof(float), flat_.byte_offsets, flat_.byte_sizes,
                                            &row->reduced_fps);
    }
    // The chunk this rank reduced (a fault on its way to itself shows nowhere else) and the
    // optimizer state: the bisection compares both with its replay.
    row->world = dp().size;
    row->chunk_fp = scatters() ? sliced_.report_fp : reduced_fp(dp().size, dp().rank);
    row->opt_fps = optimizer_fps();
    if (sharded()) row->shard = zero_->slice_record(zero_->layout().lo(comm_.rank), zero_->layout().hi(comm_.rank));
    f.opt_fps = row->opt_fps;
  }
  return fp;
}

Fingerprint Trainer::reduced_fp(int world, int c) const {
  const std::size_t P = static_cast<std::size_t>(flat_.size);
  const std::size_t lo = chunk_offset(P, world, c), hi = chunk_offset(P, world, c + 1);
  return fingerprint_bytes(reduced() + lo, (hi - lo) * sizeof(float));
}

Fingerprint Trainer::param_fingerprints(std::vector<Fingerprint>* each, bool* finite) const {
  if (!gather_) return set_fingerprint(flat_.params, each, finite);
  // --shard-params: each rank hashes its slice's chunks; composed, they give an unsharded run's values.
  const std::vector<std::uint64_t> hashes =
      gather_chunk_hashes(comm_, zero_->layout(), gather_->own_chunk_hashes(), "the parameters' fingerprints");
  if (finite) *finite = gather_->own_finite();
  gather_->expect(hashes);  // what the next gathers must give (the gather check)
  FingerprintSet set;
  if (each) each->clear();
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    const Fingerprint f = zero_->layout().param_fp(hashes, i);
    if (each) each->push_back(f);
    const auto sizes = flat_.params[i].tensor.sizes();
    set.add(flat_.params[i].name, DType::kFloat32, std::vector<std::int64_t>(sizes.begin(), sizes.end()), f);
  }
  return set.finish();
}

std::vector<Fingerprint> Trainer::reduced_param_fps() const { return param_grad_fps(reduced()); }

std::vector<Fingerprint> Trainer::optimizer_fps() const {
  if (sharded()) return zero_->optimizer_fps();  // collective: the slices' chunk hashes
  std::vector<Fingerprint> fps;
  for (const auto& prm : flat_.params) {
    const at::Tensor t = opt_->primary(prm.tensor);
    fps.push_back(t.defined() ? tensor_fingerprint(t) : 0);
  }
  return fps;
}

std::vector<Fingerprint> Trainer::sample_fingerprints(const at::Tensor& x) const {
  const at::Tensor c = x.contiguous();
  const std::int64_t n = c.size(0);
  const std::size_t each = n > 0 ? c.nbytes() / static_cast<std::size_t>(n) : 0;
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  std::vector<Fingerprint> out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back(fingerprint_bytes(p + i * each, each));
  return out;
}

// Every optimizer group's learning rate, where there are several (the trace's lr is group 0's).
std::string Trainer::group_lrs_json() const {
  if (step_.lrs.size() < 2) return "";
  std::string s = ", \"lrs\": [";
  for (std::size_t g = 0; g < step_.lrs.size(); ++g) s += (g ? ", " : "") + format_json_number(step_.lrs[g]);
  return s + "]";
}

// --memory-metrics: the step's peak resident memory and the parameter buffer's resident bytes, as
// the kernel reports them (docs/performance.md measures --shard-params with them).
std::string Trainer::memory_json() const {
  if (!cfg_.memory_metrics || flat_.flat.is_cuda()) return "";
  const auto resident = resident_bytes(flat_.flat.data_ptr(), static_cast<std::size_t>(flat_.size) * sizeof(float));
  std::string grad;
  if (scatters()) {  // --shard-params: the gradient's buffers, after the step
    const std::uint64_t g = reducer_->resident_bytes() + resident_bytes(reduced(), static_cast<std::size_t>(flat_.size + 1) * sizeof(float)) +
                            (clipped_.defined() ? resident_bytes(clipped_.data_ptr(), clipped_.nbytes()) : 0);
    grad = ", \"grad_resident_bytes\": " + std::to_string(g);
  }
  return ", \"peak_rss_bytes\": " + std::to_string(peak_rss_bytes()) + ", \"param_resident_bytes\": " +
         std::to_string(resident) + grad;
}

void Trainer::write_metrics(double lr, Fingerprint fp, double secs) {
  if (comm_.rank != 0 || !metrics_) return;
  const StepFacts& f = step_.facts;
  const float loss = reduced()[flat_.size];
  std::fprintf(metrics_,
               "{\"step\": %lld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %s, \"fingerprint\": \"%s\", "
               "\"seconds\": %.6f, \"detector_seconds\": %.6f, \"data_wait_seconds\": %.6f, \"data_read_seconds\": %.6f, "
               "\"optimizer_bytes\": %lld%s%s%s%s}\n",
               static_cast<long long>(f.step), json_float(loss).c_str(), format_json_number(f.grad_norm).c_str(),
               format_json_number(lr).c_str(), fingerprint_hex(fp).c_str(), secs, f.seconds, step_.data_wait,
               step_.data_read, static_cast<long long>(opt_->state_bytes()),
               cfg_.optim.clip_grad_norm > 0 ? (", \"clip_factor\": " + json_float(step_.clip_factor) +
                                                 ", \"clip_seconds\": " + format_json_number(step_.clip_seconds)).c_str()
                                              : "",
               f.shards_exchanged ? ", \"spot_checked\": true" : "", group_lrs_json().c_str(), memory_json().c_str());
  if ((std::fflush(metrics_) != 0 || std::ferror(metrics_)) && metrics_status_.ok())
    metrics_status_ = Status::IoError("cannot append to '" + (fs::path(cfg_.run_dir) / "metrics.jsonl").string() +
                                      "': " + std::strerror(errno));
  if (!cfg_.quiet)
    std::printf("step %6lld  loss %-12.9g  grad_norm %-12.6g  lr %-10.4g  fingerprint %s\n",
                static_cast<long long>(f.step), static_cast<double>(loss), f.grad_norm, lr,
                fingerprint_hex(fp).c_str());
  std::fflush(stdout);
}

// ---- the run ----

// Records the run (run.json), opens the metrics and the background I/O; agreed.
Status Trainer::start_run(std::int64_t start_step, const std::string& resumed_from) {
  info_.config_ini = to_ini(cfg_);
  info_.world_size = comm_.size;
  info_.culprit_version = CULPRIT_VERSION;
  info_.torch_version = TORCH_VERSION;
  info_.intra_op_threads = at::get_num_threads();
  info_.data_source = data_.source;
  info_.data_samples = data_.n;
  info_.parameters = flat_.size;
  info_.model = cfg_.model.text();
  info_.blas_threads = setup_determinism(cfg_.threads);
  info_.run_id = cfg_.run_id;
  info_.resumed_from = resumed_from;
  info_.resumed_at_step = start_step;
  fill_environment(&info_);
  info_.math = math_libraries();
  info_.blas_library = info_.math.blas;
  gather_hosts(comm_, &info_);
  info_.devices = gather_strings(comm_, device_name_);
  detectors_.set_placement(info_.hosts, info_.devices);
  // The traces first: a resume that refuses one (another run's, a link) has changed nothing else.
  pipeline_ = std::make_unique<CheckpointPipeline>(cfg_, comm_, env_);
  const trace::Header header = trace_header();
  CULPRIT_RETURN_IF_ERROR(pipeline_->open(start_step, cfg_.tracing() ? &header : nullptr, info_.hosts, info_.mpi_thread_level));
  Status st;
  if (comm_.rank == 0) {
    const std::string path = (fs::path(cfg_.run_dir) / "metrics.jsonl").string();
    st = write_run_json((fs::path(cfg_.run_dir) / "run.json").string(), info_);
    if (st.ok()) st = truncate_metrics(path, start_step);
    int fd = -1;
    if (st.ok()) st = files::open_append(path, &fd);
    if (st.ok() && !(metrics_ = ::fdopen(fd, "a"))) {
      ::close(fd);
      st = Status::IoError("cannot write '" + path + "'");
    }
    if (st.ok()) st = files::ensure_dir((fs::path(cfg_.run_dir) / format::kCheckpointDir).string());
  }
  return agree(comm_, st);
}

Status Trainer::run(std::int64_t start_step, const std::string& resumed_from) {
  CULPRIT_RETURN_IF_ERROR(start_run(start_step, resumed_from));
  if (comm_.rank == 0 && !cfg_.quiet) {
    std::printf("culprit train: %s on %s (%lld samples), %lld parameters, %d rank(s), %d micro-shards, "
                "global batch %lld\n  libtorch %s, BLAS %s (threads %d), intra-op threads %d\n",
                cfg_.model.text().c_str(), data_.source.c_str(), static_cast<long long>(data_.n),
                static_cast<long long>(flat_.size), comm_.size, cfg_.micro_shards,
                static_cast<long long>(cfg_.global_batch), info_.torch_version.c_str(), info_.blas_library.c_str(),
                info_.blas_threads, info_.intra_op_threads);
    if (!resumed_from.empty())
      std::printf("  resumed from %s (step %lld)\n", resumed_from.c_str(), static_cast<long long>(start_step));
  }
  model_.set_training(true);
  if (gather_) {
    // --shard-params: the gradient too is reduced into slices (collective). Its buffers are paged:
    // only what a rank holds has memory.
    std::vector<std::size_t> cuts;
    for (int c = 0; c < comm_.size; ++c) cuts.push_back(static_cast<std::size_t>(zero_->layout().lo(c)));
    cuts.push_back(static_cast<std::size_t>(flat_.size) + 1);  // the loss goes with the last slice
    reducer_->install_scatter(cuts);
    reducer_->set_on_post([this](std::size_t a, std::size_t b) {
      gather_->note_post(static_cast<std::int64_t>(a), static_cast<std::int64_t>(b));
    });
    gather_->set_poster([this](std::int64_t a, std::int64_t b) {
      reducer_->phantom_post(static_cast<std::size_t>(a), static_cast<std::size_t>(b));
    });
    reduced_pages_ = paged_flat_buffer(flat_.size + 1);
    std::vector<float>().swap(reduced_);
    if (clipped_.defined()) clipped_ = paged_flat_buffer(flat_.size + 1);
  } else {
    reducer_->install(device_.is_cuda());  // collective; replays (engine.cpp) reduce after the backward pass
  }
  // --shard-params: from here on each rank holds its slice of the parameters only.
  if (gather_) gather_->shard();
  std::vector<Fingerprint> initial;
  param_fingerprints(&initial);
  detectors_.start(initial);
  if (!gather_) spot_leaf_.assign(static_cast<std::size_t>(flat_.size + 1), 0.0f);
  // The first step's samples are read ahead before the initial checkpoint: an HDF5 source reads on
  // the I/O thread, where they would queue behind the checkpoint's write.
  read_ahead(start_step + 1);
  // A fresh run checkpoints its initial state, so a valid checkpoint from before any fault exists
  // (this also faults in the host buffers of the state copy before training starts).
  Status st = start_step == 0 ? save_checkpoint(0) : Status::OK();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t s = start_step + 1; s <= cfg_.steps && st.ok(); ++s) {
    step(s, StepMode::kTrain);
    st = step_.data_error;  // agreed in the step, before its vote
    if (!st.ok()) break;
    if (!detectors_.halt().ok()) {
      st = detectors_.halt();  // no checkpoint of a state the detectors rejected
      break;
    }
    const bool due = (cfg_.checkpoint.every > 0 && s % cfg_.checkpoint.every == 0) || s == cfg_.steps;
    // A lost metrics line or trace row (a full disk) ends the job at once on every rank, before a
    // checkpoint of a run whose records have a hole (one int all-reduced a step).
    st = agree(comm_, metrics_status_.ok() ? pipeline_->io_error() : metrics_status_);
    if (due && st.ok()) st = save_checkpoint(s);
  }
  Status io_status = pipeline_->close();
  if (st.ok()) st = io_status;
  pipeline_.reset();
  const Fingerprint last_fp = param_fingerprints();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm_.rank == 0) {
    std::fclose(metrics_);
    metrics_ = nullptr;
    if (st.ok()) {
      const std::int64_t ran = cfg_.steps - start_step;
      std::printf("summary: %lld steps in %.2f s (%.1f samples/s), final loss %.9g, final fingerprint %s\n",
                  static_cast<long long>(ran), secs, ran * cfg_.global_batch / std::max(secs, 1e-9),
                  static_cast<double>(reduced()[flat_.size]), fingerprint_hex(last_fp).c_str());
      std::fflush(stdout);
    }
  }
  return st;
}

}  // namespace culprit::harness
