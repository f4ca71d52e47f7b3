// The training loop: one readable step function implementing docs/determinism.md.
#include <dlfcn.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/torch.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>

#include "culprit/fingerprint.h"
#ifdef CULPRIT_HAVE_CUDA
#include "culprit/screen_cuda.h"
#endif
#include "culprit/harness.h"
#include "culprit/trace.h"
#include "culprit/tree_reduce.h"
#include "culprit/inject.h"
#include "culprit/watchdog.h"
#include "data.h"
#include "detect.h"
#include "error_line.h"
#include "faults.h"
#include "finite.h"
#include "io_worker.h"
#include "model.h"
#include "trainer.h"
#include "rng.h"
#include "runinfo.h"

namespace culprit::harness {

namespace fs = std::filesystem;

// Deterministic settings; returns the BLAS thread count set (0: no thread control found).
int setup_determinism(int threads) {
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::set_num_threads(threads);
  static bool interop_set = false;
  if (!interop_set) {
    at::set_num_interop_threads(1);
    interop_set = true;
  }
  // The graph executor would re-optimise TorchScript graphs after a few profiling runs, and how
  // many runs a rank makes depends on the world size: keep it off.
  torch::jit::setGraphExecutorOptimize(false);
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
    return threads;
  }
  return 0;
}

namespace {

std::string json_float(float v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

}  // namespace

Status Trainer::select_device() {
  if (cfg_.device != "cuda") return Status::OK();
  const int local = local_rank(comm_);
  // cuBLAS picks its reduction order by the workspace it gets unless told: fixed before its first call.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
  if (!at::hasCUDA())
    return Status::Error(std::string("--device cuda: this culprit is built against a libtorch without CUDA (") +
                         TORCH_VERSION + "; Debian's libtorch is CPU-only): build it against a CUDA-enabled "
                         "libtorch, see docs/cuda.md");
  const int n = static_cast<int>(torch::cuda::device_count());
  if (n == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return Status::Error("--device cuda: no CUDA device is visible on host " + comm_.host +
                         (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string()));
  }
  device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local % n));
  device_name_ = "cuda:" + std::to_string(local % n);
#ifdef CULPRIT_HAVE_CUDA
  device_name_ += " (" + cuda::device_name(local % n) + ")";
#endif
  // Deterministic kernels (setup_determinism asks for them), no autotuning, no TF32 rounding.
  auto& ctx = at::globalContext();
  ctx.setBenchmarkCuDNN(false);
  ctx.setDeterministicCuDNN(true);
  ctx.setAllowTF32CuBLAS(false);
  ctx.setAllowTF32CuDNN(false);
  return Status::OK();
}

Status Trainer::init() {
  CULPRIT_RETURN_IF_ERROR(select_device());
  // Parameters become views of one flat float32 buffer (state-dict order), on the device.
  params_ = model_.parameters();
  for (const auto& p : params_) {
    offsets_.push_back(P_);
    P_ += p.tensor.numel();
  }
  flat_params_ = torch::empty({P_}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  {
    torch::NoGradGuard ng;
    if (device_.is_cuda())
      for (const auto& b : model_.buffers()) b.tensor.set_data(b.tensor.to(device_));
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& t = params_[i].tensor;
      auto view = flat_params_.narrow(0, offsets_[i], t.numel()).view(t.sizes());
      view.copy_(t);
      t.set_data(view);
    }
  }
  std::vector<at::Tensor> plist;
  for (const auto& p : params_) plist.push_back(p.tensor);
  if (cfg_.optimizer == "sgd") {
    opt_ = std::make_unique<torch::optim::SGD>(
        plist, torch::optim::SGDOptions(cfg_.lr).momentum(cfg_.momentum).nesterov(cfg_.nesterov).weight_decay(
                   cfg_.weight_decay));
  } else {
    opt_ = std::make_unique<torch::optim::AdamW>(
        plist, torch::optim::AdamWOptions(cfg_.lr)
                   .betas({cfg_.beta1, cfg_.beta2})
                   .eps(cfg_.eps)
                   .weight_decay(cfg_.weight_decay));
  }
  acc_ = std::make_unique<TreeAccumulator>(static_cast<std::size_t>(P_ + 1));
  reduced_.assign(static_cast<std::size_t>(P_ + 1), 0.0f);

  auto shape_with_n = [&](const std::vector<std::int64_t>& s) {
    std::vector<std::int64_t> v{data_.n};
    v.insert(v.end(), s.begin(), s.end());
    return v;
  };
  x_all_ = torch::from_blob(const_cast<unsigned char*>(data_.x.data()), shape_with_n(data_.x_shape),
                            torch::TensorOptions().dtype(to_scalar(data_.x_dtype)));
  y_all_ = torch::from_blob(const_cast<unsigned char*>(data_.y.data()), shape_with_n(data_.y_shape),
                            torch::TensorOptions().dtype(to_scalar(data_.y_dtype)));

  loss_spikes_.configure(cfg_.spike_window, cfg_.spike_z, cfg_.spike_ratio);
  grad_spikes_.configure(cfg_.spike_window, cfg_.spike_z, cfg_.spike_ratio);
  // Faults to inject: layer names are the model's layers and its parameters' modules.
  const std::vector<std::string> model_layers = model_.layers();
  std::vector<std::string> layers = model_layers;
  for (const auto& p : params_) {
    const std::string prefix = p.name.substr(0, p.name.rfind('.'));
    if (std::find(layers.begin(), layers.end(), prefix) == layers.end()) layers.push_back(prefix);
  }
  bool hooks = cfg_.trace == "layer";
  for (const auto& text : cfg_.inject) {
    FaultSpec f;
    CULPRIT_RETURN_IF_ERROR(parse_fault(text, layers, &f));
    const bool at_output = f.phase == Phase::kForward || f.phase == Phase::kBackward;
    if (at_output && std::find(model_layers.begin(), model_layers.end(), f.layer) == model_layers.end())
      return Status::Error("--inject: phase " + std::string(phase_name(f.phase)) + " needs a layer forward calls; '" +
                           f.layer + "' is not one");
    const bool layerless = f.phase == Phase::kData || f.phase == Phase::kLr || f.phase == Phase::kRng;
    if (!at_output && !layerless && layer_param(f.layer) < 0)
      return Status::Error("--inject: layer '" + f.layer + "' has no parameters");
    if (f.rank >= comm_.size)
      return Status::Error("--inject: rank " + std::to_string(f.rank) + " does not exist (world size " +
                           std::to_string(comm_.size) + ")");
    hooks = hooks || at_output;
    faults_.push_back(f);
  }
  if (hooks) {
    observer_ = std::make_unique<LayerTrace>(this, model_layers);
    model_.set_observer(observer_.get());
  }
  if (cfg_.trace == "layer") {
    fwd_.assign(model_layers.size(), 0);
    bwd_.assign(model_layers.size(), 0);
  }

  // The model must accept the data and produce outputs the loss can use.
  CULPRIT_RETURN_IF_ERROR(guarded("model " + cfg_.model + " does not accept samples of shape " +
                                      shape_str(data_.x_shape) + " (" + dtype_name(data_.x_dtype) + ")",
                                  [&] {
                                    torch::NoGradGuard ng;
                                    model_.set_training(false);
                                    auto x = x_all_.narrow(0, 0, 1).to(device_);
                                    auto out = model_.forward(x);
                                    model_.set_training(true);
                                    std::vector<std::int64_t> want{1};
                                    want.insert(want.end(), data_.y_shape.begin(), data_.y_shape.end());
                                    std::vector<std::int64_t> got(out.sizes().begin(), out.sizes().end());
                                    if (data_.classification()) {
                                      std::vector<std::int64_t> lead(got.begin(), got.end() - (got.empty() ? 0 : 1));
                                      if (got.empty() || lead != want || got.back() < data_.classes)
                                        return Status::Error("its output " + shape_str(got) + " cannot score " +
                                                             std::to_string(data_.classes) + " classes for targets " +
                                                             shape_str(data_.y_shape) + " per sample");
                                    } else if (got != want) {
                                      return Status::Error("its output " + shape_str(got) + " does not match targets " +
                                                           shape_str(want));
                                    }
                                    return Status::OK();
                                  }));
  // State that a training-mode forward pass changes (batch-norm running statistics) would depend on
  // which micro-shards each rank computed: outside the determinism contract. Refuse it plainly.
  if (data_.n >= 2) {
    std::vector<Fingerprint> before, after;
    std::vector<at::Tensor> saved;
    for (const auto& b : model_.buffers()) {
      before.push_back(tensor_fingerprint(b.tensor));
      saved.push_back(b.tensor.detach().clone());
    }
    if (!before.empty()) {
      CULPRIT_RETURN_IF_ERROR(guarded("model " + cfg_.model, [&] {
        torch::NoGradGuard ng;
        model_.forward(x_all_.narrow(0, 0, 2).to(device_));
        return Status::OK();
      }));
      auto bufs = model_.buffers();
      std::string changed;
      torch::NoGradGuard ng;
      for (std::size_t i = 0; i < bufs.size(); ++i) {
        if (tensor_fingerprint(bufs[i].tensor) != before[i] && changed.empty()) changed = bufs[i].name;
        bufs[i].tensor.copy_(saved[i]);
      }
      if (!changed.empty())
        return Status::Error("model " + cfg_.model + " updates state in its forward pass ('" + changed +
                             "', e.g. batch-norm running statistics): it would depend on which micro-shards each "
                             "rank computed; use LayerNorm or GroupNorm, or BatchNorm with track_running_stats=False");
    }
  }
  return Status::OK();
}

const at::Tensor& Trainer::epoch_order(std::int64_t epoch) {
  if (epoch != order_epoch_) {
    auto gen = at::detail::createCPUGenerator(cfg_.seed + static_cast<std::uint64_t>(epoch));
    order_ = torch::randperm(data_.n, gen, torch::TensorOptions().dtype(torch::kLong));
    order_epoch_ = epoch;
    if (cfg_.check_invariants) {
      // Each sample once per epoch starts with a permutation.
      std::vector<char> seen(static_cast<std::size_t>(data_.n), 0);
      const std::int64_t* o = order_.data_ptr<std::int64_t>();
      for (std::int64_t i = 0; i < data_.n; ++i) {
        if (o[i] < 0 || o[i] >= data_.n || seen[o[i]]) {
          violation("the sample order of epoch " + std::to_string(epoch) + " is not a permutation");
          break;
        }
        seen[o[i]] = 1;
      }
    }
  }
  return order_;
}

at::Tensor Trainer::loss_of(const at::Tensor& out, const at::Tensor& y) const {
  // (sum of per-sample losses) / B; a sample's loss is the mean over its target elements.
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

at::Tensor Trainer::shard_indices(std::int64_t s, int k) {
  const std::int64_t B = cfg_.global_batch, M = cfg_.micro_shards;
  const std::int64_t steps_per_epoch = data_.n / B;
  const at::Tensor& order = epoch_order((s - 1) / steps_per_epoch);
  return order.narrow(0, ((s - 1) % steps_per_epoch) * B + k * (B / M), B / M);
}

void Trainer::compute_shard(std::int64_t s, int k, float* leaf, int attempt) {
  attempt_ = attempt;
  if (observer_) static_cast<LayerTrace*>(observer_.get())->shard = k;
  at::Tensor idx = shard_indices(s, k);
  for (const auto& f : faults_)
    if (f.kind == FaultKind::kStale && last_idx_.defined() && fires(f, Phase::kData, k, true)) idx = last_idx_;
  std::uint64_t seed = dropout_seed(cfg_.seed, s, k);
  for (const auto& f : faults_) {
    if (!fires(f, Phase::kRng, k, true)) continue;
    if (f.kind == FaultKind::kStale && have_last_seed_) seed = last_seed_;
    if (f.kind == FaultKind::kBitflip) seed ^= 1ULL << f.bit;
  }
  if (attempt == 0) {
    last_idx_ = idx;
    last_seed_ = seed;
    have_last_seed_ = true;
  }
  auto x = x_all_.index_select(0, idx);
  auto y = y_all_.index_select(0, idx);
  for (const auto& f : faults_) {
    if (f.kind == FaultKind::kStale || !fires(f, Phase::kData, k, true)) continue;
    if (x.scalar_type() == torch::kLong) corrupt_tokens(f, x, data_.classes);
    else corrupt_in_place(f, x);
  }
  input_fp_ = tensor_fingerprint(x);
  if (device_.is_cuda()) {
    x = x.to(device_);
    y = y.to(device_);
  }
  torch::manual_seed(seed);  // also every CUDA generator: dropout masks on the GPU follow the seed
  if (attempt == 0 && !facts_.empty()) {
    Stopwatch sw(&detector_secs_);
    const std::int64_t M = cfg_.micro_shards;
    facts_[2 * M + k] = tensor_fingerprint(at::detail::getDefaultCPUGenerator().get_state());
    facts_[3 * M + k] = tensor_fingerprint(idx);
  }
  // Every gradient starts at zero (undefined); a stale-gradient fault leaves a layer's in place.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    bool keep = false;
    for (const auto& f : faults_)
      keep = keep || (f.kind == FaultKind::kStale && params_[i].name.rfind(f.layer + ".", 0) == 0 &&
                      fires(f, Phase::kGrad, k, true));
    if (!keep) params_[i].tensor.mutable_grad().reset();
  }
  std::fill(fwd_.begin(), fwd_.end(), 0);
  std::fill(bwd_.begin(), bwd_.end(), 0);
  auto loss = loss_of(model_.forward(x), y);
  if (cfg_.check_invariants) {
    double nested = 0;  // a spot-check recomputation is timed as a whole
    Stopwatch sw(attempt == 0 ? &detector_secs_ : &nested);
    for (const auto& p : params_) {
      const auto& g = p.tensor.grad();
      if (g.defined() && g.count_nonzero().item<std::int64_t>() != 0) {
        violation("the gradient of '" + p.name + "' was not zero before the backward of micro-shard " +
                  std::to_string(k) + " (a missing zero_grad: gradients accumulate across micro-shards)");
        break;
      }
    }
  }
  loss.backward();
  bool finite = true;  // checked while copying: the data passes through the cache once
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].tensor.grad();
    float* dst = leaf + offsets_[i];
    const std::int64_t n = params_[i].tensor.numel();
    if (!g.defined()) {
      std::fill(dst, dst + n, 0.0f);
    } else {
      auto gc = g.is_cuda() ? g.cpu() : g.contiguous();
      finite = copy_all_finite(gc.data_ptr<float>(), dst, static_cast<std::size_t>(n)) && finite;
    }
  }
  leaf[P_] = loss.item<float>();
  finite = finite && std::isfinite(leaf[P_]);
  for (const auto& f : faults_) {
    const int pi = layer_param(f.layer);
    if (pi < 0 || f.kind == FaultKind::kStale || !fires(f, Phase::kGrad, k, true)) continue;
    const std::int64_t n = params_[pi].tensor.numel();
    float& v = leaf[offsets_[pi] + f.index % n];
    v = corrupt_value(f, v);
    finite = finite && std::isfinite(v);
  }
  if (attempt == 0 && !finite && bad_shard_ < 0) bad_shard_ = k;
  attempt_ = 0;
}

std::vector<Fingerprint> Trainer::param_grad_fps(const float* leaf) const {
  std::vector<Fingerprint> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    out.push_back(fingerprint_bytes(leaf + offsets_[i], static_cast<std::size_t>(params_[i].tensor.numel()) * sizeof(float)));
  return out;
}

// One optimizer step (1-based s): see docs/determinism.md.
void Trainer::step(std::int64_t s) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t M = cfg_.micro_shards;
  cur_step_ = s;
  if (comm_.watchdog) comm_.watchdog->set_step(s);
  violation_.clear();
  detector_secs_ = 0;
  const double lr = learning_rate(cfg_, s);
  double lr_used = lr;
  for (const auto& f : faults_) {
    if (!fires(f, Phase::kLr, 0, false)) continue;
    lr_used = f.kind == FaultKind::kStale ? learning_rate(cfg_, s - 1) : corrupt_value(f, static_cast<float>(lr_used));
  }
  for (auto& group : opt_->param_groups()) group.options().set_lr(lr_used);

  // Forward and backward of this rank's micro-shards, summed along the tree.
  acc_->clear();
  const ShardRange mine = shard_range(comm_.rank, comm_.size, static_cast<int>(M));
  first_shard_ = mine.lo;
  bad_shard_ = -1;
  if (cfg_.spot_check > 0 || cfg_.check_invariants) facts_.assign(4 * M, 0);
  for (int k = mine.lo; k < mine.hi; ++k) {
    float* leaf = acc_->leaf_buffer();
    compute_shard(s, k, leaf, 0);
    if (spot_checked(s, k)) {
      Stopwatch sw(&detector_secs_);
      facts_[k] = fingerprint_bytes(leaf, static_cast<std::size_t>(P_ + 1) * sizeof(float));
    }
    if (cfg_.trace != "off" || capture_) {
      trace::ShardRow row;
      row.step = s;
      row.shard = k;
      row.rank = self();
      row.host = comm_.host;
      row.device = device_name_;
      row.loss = leaf[P_];
      row.grad_fp = fingerprint_bytes(leaf, static_cast<std::size_t>(P_) * sizeof(float));
      row.input_fp = input_fp_;
      row.fwd = fwd_;
      row.bwd = bwd_;
      if (!fwd_.empty()) row.param_grad = param_grad_fps(leaf);
      shard_rows_.push_back(std::move(row));
    }
    acc_->push(k);
  }
  {
    Stopwatch sw(&detector_secs_);
    check_shards(s);
  }
  const SendFault* send_fault = nullptr;
  SendFault sf;
  for (const auto& f : faults_) {
    const int pi = layer_param(f.layer);
    if (pi < 0 || !fires(f, Phase::kComm, 0, false)) continue;
    sf.offset = static_cast<std::size_t>(offsets_[pi] + f.index % params_[pi].tensor.numel());
    sf.ctx = &f;
    sf.apply = [](const void* ctx, float v) { return corrupt_value(*static_cast<const FaultSpec*>(ctx), v); };
    send_fault = &sf;
  }
  cc_.enabled = cfg_.comm_check || replaying_;  // a replay reports its comm faults (StepResult)
  tree_allreduce(comm_, static_cast<int>(M), *acc_, reduced_.data(), &tree_ws_, send_fault, &cc_);
  detector_secs_ += cc_.seconds;

  // The reduced gradient becomes every parameter's gradient; the optimizer steps (once the checkpoint
  // in flight has its copy of the parameters and optimizer state).
  fence_snapshot();
  auto grads = torch::from_blob(reduced_.data(), {P_ + 1}, torch::kFloat32);
  if (device_.is_cuda()) grads = grads.to(device_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& t = params_[i].tensor;
    t.mutable_grad() = grads.narrow(0, offsets_[i], t.numel()).view(t.sizes());
  }
  // A stale-parameter fault: the update of that layer does not land on this rank.
  std::vector<std::pair<int, at::Tensor>> lost;
  for (const auto& f : faults_) {
    const int pi = layer_param(f.layer);
    if (pi >= 0 && f.kind == FaultKind::kStale && fires(f, Phase::kParam, 0, false))
      for (std::size_t i = pi; i < params_.size() && params_[i].name.rfind(f.layer + ".", 0) == 0; ++i)
        lost.push_back({static_cast<int>(i), params_[i].tensor.detach().clone()});
  }
  opt_->step();
  {
    torch::NoGradGuard ng;
    for (auto& [i, old] : lost) params_[i].tensor.copy_(old);
  }
  // Faults at rest: this rank's copy of a layer's parameters or optimizer state.
  for (const auto& f : faults_) {
    const int pi = layer_param(f.layer);
    if (pi < 0 || f.kind == FaultKind::kStale) continue;
    if (fires(f, Phase::kParam, 0, false)) corrupt_in_place(f, params_[pi].tensor);
    if (fires(f, Phase::kOptimizer, 0, false)) {
      auto it = opt_->state().find(optimizer_state_key(opt_->state(), params_[pi].tensor));
      if (it != opt_->state().end()) {
        if (cfg_.optimizer == "sgd")
          corrupt_in_place(f, static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
        else
          corrupt_in_place(f, static_cast<torch::optim::AdamWParamState&>(*it->second).exp_avg());
      }
    }
  }

  double sq = 0;
  for (std::int64_t i = 0; i < P_; ++i) sq += static_cast<double>(reduced_[i]) * reduced_[i];
  grad_norm_ = std::sqrt(sq);
  trace::StepRow row;
  row.step = s;
  row.loss = reduced_[P_];
  row.lr = lr;
  const Fingerprint fp = set_fingerprint(params_, &row.param_fps);
  param_fps_ = row.param_fps;
  if (cfg_.check_invariants) {
    Stopwatch sw(&detector_secs_);
    check_update(s, lr);
  }
  if (cfg_.trace != "off" || capture_)
    row.grad_fp = fingerprint_bytes(reduced_.data(), static_cast<std::size_t>(P_) * sizeof(float));
  if (capture_) last_row_ = row;
  if (cfg_.trace != "off" && io_) {
    io_->submit([this, row = std::move(row), shards = std::move(shard_rows_)] { return trace_.append(row, shards); });
    shard_rows_.clear();
    if (serial_io_) {
      Status st = drain_io();
      if (!st.ok()) io_error_ = st;
    }
  }
  {
    Stopwatch sw(&detector_secs_);
    detect(s);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_metrics(s, lr, reduced_[P_], grad_norm_, fp, secs);
}

void Trainer::write_metrics(std::int64_t s, double lr, float loss, double grad_norm, Fingerprint fp,
                            double secs) {
  if (comm_.rank != 0 || !metrics_) return;
  std::fprintf(metrics_,
               "{\"step\": %lld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %s, \"fingerprint\": \"%s\", "
               "\"seconds\": %.6f, \"detector_seconds\": %.6f%s}\n",
               static_cast<long long>(s), json_float(loss).c_str(), format_json_number(grad_norm).c_str(),
               format_json_number(lr).c_str(), fingerprint_hex(fp).c_str(), secs, detector_secs_,
               facts_exchanged_ ? ", \"spot_checked\": true" : "");
  std::fflush(metrics_);
  if (!cfg_.quiet)
    std::printf("step %6lld  loss %-12.9g  grad_norm %-12.6g  lr %-10.4g  fingerprint %s\n",
                static_cast<long long>(s), static_cast<double>(loss), grad_norm, lr, fingerprint_hex(fp).c_str());
  std::fflush(stdout);
}

Status Trainer::run(std::int64_t start_step, const std::string& resumed_from) {
  info_.config_ini = to_ini(cfg_);
  info_.world_size = comm_.size;
  info_.culprit_version = CULPRIT_VERSION;
  info_.torch_version = TORCH_VERSION;
  info_.intra_op_threads = at::get_num_threads();
  info_.data_source = data_.source;
  info_.data_samples = data_.n;
  info_.parameters = P_;
  info_.model = cfg_.model;
  info_.blas_threads = setup_determinism(cfg_.threads);
  info_.resumed_from = resumed_from;
  info_.resumed_at_step = start_step;
  fill_environment(&info_);
  gather_hosts(comm_, &info_);
  info_.devices = gather_strings(comm_, device_name_);
  // Checkpoint writers: the first N ranks of every host (all ranks hold the whole state).
  std::map<std::string, int> per_host;
  for (int r = 0; r < comm_.size; ++r)
    if (cfg_.checkpoint_writers_per_host == 0 || per_host[info_.hosts[r]]++ < cfg_.checkpoint_writers_per_host)
      writers_.push_back(r);
  Status st;
  if (comm_.rank == 0) {
    const std::string path = (fs::path(cfg_.run_dir) / "metrics.jsonl").string();
    st = write_run_json((fs::path(cfg_.run_dir) / "run.json").string(), info_);
    if (st.ok()) st = truncate_metrics(path, start_step);
    if (st.ok()) {
      metrics_ = std::fopen(path.c_str(), "a");
      if (!metrics_) st = Status::Error("cannot write '" + path + "'");
    }
    std::error_code ec;
    fs::create_directories(fs::path(cfg_.run_dir) / "checkpoints", ec);
  }
  CULPRIT_RETURN_IF_ERROR(agree(comm_, st));
  CULPRIT_RETURN_IF_ERROR(open_trace(start_step));
  CULPRIT_MPI_CHECK(MPI_Comm_dup(comm_.comm, &io_comm_));
  io_ = std::make_unique<IoWorker>();
  // The I/O thread calls MPI while the main thread does: that needs MPI_THREAD_MULTIPLE. With less,
  // every I/O job is waited for at once (no two threads in MPI at the same time).
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  serial_io_ = level < MPI_THREAD_MULTIPLE;
  if (serial_io_ && comm_.rank == 0)
    std::fprintf(stderr, "culprit: warning: MPI provides thread level %s, not multiple: checkpoints and trace are "
                 "written synchronously\n", info_.mpi_thread_level.c_str());
  if (comm_.rank == 0 && !cfg_.quiet) {
    std::printf("culprit train: %s on %s (%lld samples), %lld parameters, %d rank(s), %d micro-shards, "
                "global batch %lld\n  libtorch %s, BLAS %s (threads %d), intra-op threads %d\n",
                cfg_.model.c_str(), data_.source.c_str(), static_cast<long long>(data_.n),
                static_cast<long long>(P_), comm_.size, cfg_.micro_shards,
                static_cast<long long>(cfg_.global_batch), info_.torch_version.c_str(), info_.blas_library.c_str(),
                info_.blas_threads, info_.intra_op_threads);
    if (!resumed_from.empty())
      std::printf("  resumed from %s (step %lld)\n", resumed_from.c_str(), static_cast<long long>(start_step));
  }
  model_.set_training(true);
  set_fingerprint(params_, &prev_param_fps_);
  spot_leaf_.assign(static_cast<std::size_t>(P_ + 1), 0.0f);
  // A fresh run checkpoints its initial state, so a valid checkpoint from before any fault exists
  // (this also faults in the host buffers of the state copy before training starts).
  if (start_step == 0) st = save_checkpoint(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t s = start_step + 1; s <= cfg_.steps && st.ok(); ++s) {
    step(s);
    if (!halt_.ok()) {
      st = halt_;  // no checkpoint of a state the detectors rejected
      break;
    }
    const bool due = (cfg_.checkpoint_every > 0 && s % cfg_.checkpoint_every == 0) || s == cfg_.steps;
    if (due) st = save_checkpoint(s);
  }
  Status io_status = drain_io();
  if (checkpoint_in_flight_ && io_status.ok()) log_checkpoint();
  checkpoint_in_flight_ = false;
  if (io_status.ok()) io_status = io_error_;
  io_status = agree(comm_, io_status);
  if (st.ok()) st = io_status;
  io_.reset();
  trace_.close();
  MPI_Comm_free(&io_comm_);
  const Fingerprint last_fp = set_fingerprint(params_);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm_.rank == 0) {
    std::fclose(metrics_);
    if (st.ok()) {
      const std::int64_t ran = cfg_.steps - start_step;
      std::printf("summary: %lld steps in %.2f s (%.1f samples/s), final loss %.9g, final fingerprint %s\n",
                  static_cast<long long>(ran), secs, ran * cfg_.global_batch / std::max(secs, 1e-9),
                  static_cast<double>(reduced_[P_]), fingerprint_hex(last_fp).c_str());
      std::fflush(stdout);
    }
  }
  return st;
}

Status train(const TrainConfig& cfg, const Comm& world) {
  CULPRIT_RETURN_IF_ERROR(agree(world, validate(cfg, world.size)));
  // From here on, every collective of the main thread is bounded by --collective-timeout.
  Watchdog watchdog(world, cfg.collective_timeout);
  Comm comm = world;
  comm.watchdog = &watchdog;
  watchdog.on_silence([&cfg](const SilentReport& rep) {
    Incident inc{rep.step, "collective-timeout", IncidentClass::kHardware, rep.silent.empty() ? -1 : rep.silent[0],
                 "", "", rep.message};
    if (inc.rank >= 0) {
      inc.host = rep.hosts[inc.rank];
      inc.device = "cpu";
    }
    Status st = log_incident(cfg.run_dir, inc);
    if (!st.ok()) std::fprintf(stderr, "culprit: warning: %s\n", st.message().c_str());
  });
  setup_determinism(cfg.threads);
  CULPRIT_RETURN_IF_ERROR(agree(comm, comm.rank == 0 ? prepare_run_dir(cfg) : Status::OK()));
  Dataset data;
  CULPRIT_RETURN_IF_ERROR(agree(comm, load_dataset(cfg, &data)));
  if (cfg.global_batch > data.n)
    return agree(comm, Status::Error("--global-batch " + std::to_string(cfg.global_batch) + " exceeds the " +
                                     std::to_string(data.n) + " samples of the data"));
  std::unique_ptr<Model> model;
  CULPRIT_RETURN_IF_ERROR(agree(comm, guarded("model " + cfg.model, [&] { return make_model(cfg, data, &model); })));
  Trainer trainer(cfg, comm, data, *model);
  CULPRIT_RETURN_IF_ERROR(agree(comm, guarded("setup", [&] { return trainer.init(); })));
  std::int64_t start = 0;
  std::string from;
  if (resuming(cfg)) {
    ckpt::Checkpoint c;
    CULPRIT_RETURN_IF_ERROR(find_checkpoint(cfg, comm, &c, &from));
    CULPRIT_RETURN_IF_ERROR(agree(comm, check_compatible(cfg, data, c, from)));
    CULPRIT_RETURN_IF_ERROR(agree(comm, guarded("restoring " + from, [&] { return trainer.restore(c); })));
    start = c.step;
    if (start >= cfg.steps) {
      if (comm.rank == 0 && !cfg.quiet)
        std::printf("culprit train: the run is complete: %s holds step %lld of --steps %lld\n", from.c_str(),
                    static_cast<long long>(start), static_cast<long long>(cfg.steps));
      return Status::OK();
    }
  }
  return trainer.run(start, from);
}

}  // namespace culprit::harness
