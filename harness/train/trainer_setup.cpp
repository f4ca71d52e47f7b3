// A trainer's setup: deterministic libtorch settings, the device (--device), the flat parameter
// buffer, the optimizer, the faults, the check of the model against the data, and what the
// detectors may ask of the state.
#include <dlfcn.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/torch.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#ifdef CULPRIT_HAVE_CUDA
#include "culprit/screen_cuda.h"
#endif
#include "culprit/watchdog.h"
#include "culprit/finite.h"
#include "train/trainer.h"

namespace culprit::harness {

// ---- setup ----

Status Trainer::select_device() {
  if (cfg_.device != DeviceKind::kCuda) return Status::OK();
  const int local = local_rank(comm_);
  // cuBLAS picks its reduction order by the workspace it gets unless told: fixed before its first call.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
#ifndef CULPRIT_TORCH_CUDA
  return Status::BadInput(std::string("--device cuda: this culprit is built against a libtorch without CUDA (") +
                          TORCH_VERSION + "): build it against a CUDA-enabled libtorch, see docs/cuda.md");
#endif
  const int n = static_cast<int>(torch::cuda::device_count());
  if (n == 0) {
    // libtorch says no more than "0": the CUDA runtime says why (no driver, none visible).
    std::string why = "the CUDA runtime finds none";
#ifdef CULPRIT_HAVE_CUDA
    cuda::device_count(&why);
#endif
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return Status::BadInput("--device cuda: no CUDA device is visible on host " + comm_.host + " (" + why +
                            (visible ? std::string("; CUDA_VISIBLE_DEVICES=") + visible : std::string()) + ")");
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

// Parameters become views of one flat float32 buffer (state-dict order), on the device.
void Trainer::build_flat_params() {
  flat_.params = model_.parameters();
  const std::vector<std::string> embeddings = model_.embeddings();
  for (const auto& p : flat_.params) {
    const bool embedding = std::find(embeddings.begin(), embeddings.end(), p.name) != embeddings.end();
    flat_.decay.push_back(cfg_.optim.decays(p.tensor.dim(), embedding));
    flat_.offsets.push_back(flat_.size);
    flat_.sizes.push_back(p.tensor.numel());
    flat_.byte_offsets.push_back(static_cast<std::size_t>(flat_.size) * sizeof(float));
    flat_.byte_sizes.push_back(static_cast<std::size_t>(p.tensor.numel()) * sizeof(float));
    flat_.size += p.tensor.numel();
  }
  // --shard-params: pages a released parameter gives back (optim/param_gatherer.h).
  flat_.flat = cfg_.shard_params ? paged_flat_buffer(flat_.size)
                                 : torch::empty({flat_.size}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  torch::NoGradGuard ng;
  if (device_.is_cuda())
    for (const auto& b : model_.buffers()) b.tensor.set_data(b.tensor.to(device_));
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    auto& t = flat_.params[i].tensor;
    auto view = flat_.flat.narrow(0, flat_.offsets[i], t.numel()).view(t.sizes());
    view.copy_(t);
    t.set_data(view);
  }
}

Status Trainer::init(StepMode mode) {
  CULPRIT_RETURN_IF_ERROR(select_device());
  // --tensor-parallel: the groups before anything computes (the model's checks below exchange).
  if (cfg_.chunked() && cfg_.tensor_parallel > 1) {
    tp_ = std::make_unique<TensorLayout>(comm_, cfg_.tensor_parallel);
    model_.set_tensor_group(tp_->group());
  }
  build_flat_params();
  if (tp_) tp_->set_splits(flat_, model_.tensor_splits(), model_.chunks());
  zero_ = std::make_unique<ShardedOptimizer>(comm_, flat_, sharded());
  std::vector<at::Tensor> tensors;
  for (const auto& p : flat_.params) tensors.push_back(p.tensor);
  if (cfg_.optim.kind == OptimizerKind::kScript) {
    // The script's own optimizer object, built now over the parameters as views of the flat buffer.
    std::unique_ptr<ScriptOptimizer> script;
    CULPRIT_RETURN_IF_ERROR(guarded(StatusCode::kBadInput, "the script's optimizer", [&] {
      script = model_.make_optimizer(cfg_.optim.script_optimizer, cfg_.optim.script_state);
      return script ? Status::OK()
                    : Status::BadInput("--optimizer script: model " + cfg_.model.text() + " brings no optimizer object");
    }));
    opt_ = std::make_unique<OptimizerState>(cfg_.optim, tensors, std::move(script));
  } else if (sharded()) {
    opt_ = std::make_unique<OptimizerState>(cfg_.optim, zero_->owned_slots(), flat_.decay);
  } else {
    opt_ = std::make_unique<OptimizerState>(cfg_.optim, tensors, flat_.decay);
  }
  zero_->attach(opt_.get());
  reducer_ = std::make_unique<GradientReducer>(cfg_, comm_, flat_, faults_);
  acc_ = std::make_unique<TreeAccumulator>(static_cast<std::size_t>(flat_.size + 1));
  reduced_.assign(static_cast<std::size_t>(flat_.size + 1), 0.0f);
  // The clipped gradient's buffer, written once now: its pages are not faulted in during a step.
  if (cfg_.optim.clip_grad_norm > 0)
    clipped_ = torch::zeros({flat_.size + 1}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  // An HDF5 source reads where the run's other HDF5 calls are made: on the I/O thread once the run
  // has one (start_run), until then here.
  loader_ = std::make_unique<SampleLoader>(
      data_, run_checks(cfg_, data_),
      [this](std::function<Status()> job) {
        if (pipeline_) pipeline_->submit(std::move(job));
        else job();
      },
      [this](const std::function<bool()>& ready, const char* what) {
        if (comm_.watchdog) return comm_.watchdog->wait_until(ready, what);
        while (!ready()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
  detectors_.configure(cfg_, comm_, flat_.names(), probe());
  const std::vector<std::string> model_layers = model_.layers();
  faults_.set_tied(model_.tied());
  CULPRIT_RETURN_IF_ERROR(faults_.parse(cfg_.inject, model_layers, flat_.params, flat_.offsets, comm_.size, cfg_.seed, mode));
  // A device's optimizer fault lands on the state it holds: with --shard-optimizer, its slice.
  if (sharded() && mode == StepMode::kTrain)
    CULPRIT_RETURN_IF_ERROR(faults_.check_held([this](int rank, std::size_t param, std::int64_t element) {
      if (element < 0)  // any element of the parameter
        return zero_->layout().lo(rank) < flat_.offsets[param] + flat_.sizes[param] && flat_.offsets[param] < zero_->layout().hi(rank);
      return zero_->layout().holds(rank, flat_.offsets[param] + element % flat_.sizes[param]);
    }, [this](int rank) {
      return "rank " + std::to_string(rank) + " holds flat elements [" + std::to_string(zero_->layout().lo(rank)) + ", " +
             std::to_string(zero_->layout().hi(rank)) + ")";
    }, cfg_.shard_params));
  // A replay is whole (never sharded): the run's gather faults stay in the run, like transient ones.
  for (const Phase p : {Phase::kGather, Phase::kGatherLink})
    if (mode == StepMode::kTrain && faults_.has_phase(p) && !cfg_.shard_params)
      return Status::BadInput(std::string("--inject phase=") + name_of(p) +
                              " lands in a parameter gather of --shard-params: give --shard-params");
  CULPRIT_RETURN_IF_ERROR(observe_layers(mode, model_layers));
  // --shard-params: the gatherer observes the setup's forward pass (which layers are called).
  if (cfg_.shard_params && mode == StepMode::kTrain) {
    // The layers' uses beyond their names: borrowed parameters, and a tied name's layer.
    std::vector<std::pair<std::string, std::string>> uses = model_.borrowed();
    for (const auto& [other, name] : model_.tied())
      for (const std::string& l : model_layers)
        if (other.compare(0, l.size() + 1, l + ".") == 0) uses.emplace_back(l, name);
    gather_ = std::make_unique<ParamGatherer>(comm_, flat_, zero_->layout(), model_layers, uses, cfg_.keep_gathered,
                                              layers_.get());
    model_.set_observer(gather_.get());
    gather_->set_check(cfg_.detect.comm_check);
    const bool gather_faults = faults_.has_phase(Phase::kGather);
    gather_->set_before_gather([this, gather_faults](std::size_t i) {
      // A fault changes the owner's slice, which the checkpoint in flight may still be copying.
      if (gather_faults && pipeline_) pipeline_->fence();
      faults_.on_gather(step_.fire, i, flat_.params, [this](std::size_t p, std::int64_t e) {
        return zero_->layout().holds(comm_.rank, flat_.offsets[p] + e);
      });
    });
    if (faults_.has_phase(Phase::kGatherLink))
      gather_->set_after_gather([this](std::size_t i) { faults_.on_gather_link(step_.fire, i, flat_.params); });
  }
  return check_model(mode);
}

// The layer hooks (LayerTrace) when the trace or a fault needs them; a tensor-parallel exchange's
// faulty link checked first (the run's only: a replay computes every chunk on one rank).
Status Trainer::observe_layers(StepMode mode, const std::vector<std::string>& model_layers) {
  if (mode == StepMode::kTrain) {
    std::vector<std::string> exchanges;  // the split layers: their weights' names without ".weight"
    for (const auto& s : model_.tensor_splits())
      if (s.name.size() > 7 && s.name.compare(s.name.size() - 7, 7, ".weight") == 0)
        exchanges.push_back(s.name.substr(0, s.name.size() - 7));
    CULPRIT_RETURN_IF_ERROR(faults_.check_tp_link(exchanges, tp_ ? tp_->size() : 1));
  }
  if (cfg_.trace == TraceLevel::kLayer || faults_.at_layer_outputs() || faults_.has_phase(Phase::kTpLink)) {
    layers_ = std::make_unique<LayerTrace>(&faults_, model_layers, cfg_.trace == TraceLevel::kLayer);
    if (tp_) layers_->set_group(tp_->size(), tp_->group().rank);
    model_.set_observer(layers_.get());
  }
  return Status::OK();
}

// The model's output is narrower than the labels need: name the width, the valid labels and the
// label that needs more (the largest), or --classes when it asks for more than the model has.
Status Trainer::narrow_output(const std::vector<std::int64_t>& got) const {
  const std::int64_t width = got.back();
  const std::string head = "model " + cfg_.model.text() + " scores " + std::to_string(width) + " classes (its output " +
                           shape_str(got) + "), so class labels must be in [0, " + std::to_string(width) + ")";
  if (cfg_.classes > width) return Status::BadInput(head + ", but --classes is " + std::to_string(cfg_.classes));
  if (data_.max_label < 0)  // synthetic data: its labels are 0 .. classes - 1 by construction
    return Status::BadInput(head + ", but the synthetic data has " + std::to_string(data_.classes) +
                            " classes (--classes 0: the default); give --classes " + std::to_string(width));
  const std::int64_t per_sample = std::max<std::int64_t>(1, data_.y_numel()), at = data_.max_label_at;
  return Status::BadInput(head + ": data " + cfg_.data.text() + " y holds label " + std::to_string(data_.max_label) +
                          " at sample " + std::to_string(at / per_sample) +
                          (per_sample > 1 ? " (element " + std::to_string(at % per_sample) + ")" : ""));
}

// One training pass on the first micro-shard's worth of samples — the forward pass and the loss under the run's precision
// (autocast with --precision bf16), then the backward pass — so that a model that cannot be trained
// (an op autocast or bfloat16 refuses, a loss that is not floating, an op without a derivative) is
// told so in one line here instead of failing inside the first step. Training only: a replay
// rebuilds a model that trained. Parameters get no gradient from it; buffers are kept.
Status Trainer::check_training_pass() {
  const std::string model = "model " + cfg_.model.text();
  const std::string fwd = cfg_.precision == Precision::kBf16
                              ? model + " does not run under --precision bf16 (autocast to bfloat16)"
                              : model + " cannot be trained: its forward pass and loss fail";
  BufferGuard keep(model_);
  // As many samples as a micro-shard holds (batch norm in training mode needs more than one).
  const std::int64_t n = std::min<std::int64_t>(data_.n, cfg_.global_batch / cfg_.micro_shards);
  at::Tensor loss;
  Status st = guarded(StatusCode::kBadInput, fwd, [&] {
    AutocastScope autocast(cfg_.precision, device_);
    const auto [x, y] = first_samples(n);
    if (model_.owns_loss()) {
      loss = model_.own_loss(x.to(device_), y.to(device_));
    } else {
      const at::Tensor out = model_.forward(x.to(device_));
      if (!out.is_floating_point())
        return Status::BadInput(fwd + ": its output is " + std::string(c10::toString(out.scalar_type())));
      loss = loss_of(out, y.to(device_));
    }
    if (!loss.is_floating_point() || loss.scalar_type() == at::kDouble || !loss.requires_grad())
      return Status::BadInput(fwd + ": its loss is " + std::string(c10::toString(loss.scalar_type())) +
                              (loss.requires_grad() ? "" : " and has no gradient"));
    return Status::OK();
  });
  if (st.ok())
    st = guarded(StatusCode::kBadInput, model + " cannot be trained: its backward pass fails", [&] {
      loss.backward();
      return Status::OK();
    });
  for (auto& p : flat_.params) p.tensor.mutable_grad().reset();
  return st;
}

Status Trainer::check_model(StepMode mode) {
  // The model must accept the data and produce outputs the loss can use.
  CULPRIT_RETURN_IF_ERROR(guarded(
      StatusCode::kBadInput,
      "model " + cfg_.model.text() + " does not accept samples of shape " + shape_str(data_.x_shape) + " (" +
          dtype_name(data_.x_dtype) + ")",
      [&] {
        torch::NoGradGuard ng;
        model_.set_training(false);
        const auto [x, y] = first_samples(1);
        // A model with its own loss is checked by that loss (its output is the script's business).
        const bool own = model_.owns_loss();
        const at::Tensor out = own ? model_.own_loss(x.to(device_), y.to(device_)) : model_.forward(x.to(device_));
        model_.set_training(true);
        if (own) return Status::OK();
        std::vector<std::int64_t> want{1};
        want.insert(want.end(), data_.y_shape.begin(), data_.y_shape.end());
        std::vector<std::int64_t> got(out.sizes().begin(), out.sizes().end());
        if (data_.classification()) {
          std::vector<std::int64_t> lead(got.begin(), got.end() - (got.empty() ? 0 : 1));
          if (got.empty() || lead != want)
            return Status::BadInput("model " + cfg_.model.text() + ": its output " + shape_str(got) +
                                    " cannot score targets " + shape_str(data_.y_shape) + " per sample");
          // A TorchScript module's output width is known only now: the labels must fit it.
          if (got.back() < data_.classes) return narrow_output(got);
        } else if (got != want) {
          return Status::BadInput("its output " + shape_str(got) + " does not match targets " + shape_str(want));
        }
        return Status::OK();
      }));
  if (mode == StepMode::kTrain) {
    CULPRIT_RETURN_IF_ERROR(check_training_pass());
    if (layers_) CULPRIT_RETURN_IF_ERROR(faults_.check_dtypes(layers_->output_dtypes()));
  }
  CULPRIT_RETURN_IF_ERROR(check_forward_changes_no_state());
  if (mode != StepMode::kTrain || !model_.owns_loss()) return Status::OK();
  // Outside autocast (the check compares forward passes of different batch sizes), once the
  // forward pass is known to change no parameter.
  // At least two samples, whatever a micro-shard holds: the check is of the loss, not of the shard.
  const std::int64_t n = std::min<std::int64_t>(data_.n, std::max<std::int64_t>(2, cfg_.global_batch / cfg_.micro_shards));
  return guarded(StatusCode::kBadInput, "model " + cfg_.model.text() + ": its loss", [&] {
    const auto [x, y] = first_samples(n);
    return check_own_loss(x.to(device_), y.to(device_));
  });
}

// State that a training-mode forward pass changes (batch-norm running statistics) would depend on
// which micro-shards each rank computed, and a parameter changed outside the update (a user's
// module scaling its own weights) would escape the update's fingerprints: outside the determinism
// contract. Refuse both plainly.
Status Trainer::check_forward_changes_no_state() {
  if (data_.n < 2) return Status::OK();
  const auto fingerprints = [](const std::vector<NamedTensor>& ts) {
    std::vector<Fingerprint> fps;
    for (const auto& t : ts) fps.push_back(tensor_fingerprint(t.tensor));
    return fps;
  };
  const std::vector<Fingerprint> params = fingerprints(flat_.params), buffers = fingerprints(model_.buffers());
  std::string changed, param;
  {
    BufferGuard keep(model_);
    CULPRIT_RETURN_IF_ERROR(guarded(StatusCode::kBadInput, "model " + cfg_.model.text(), [&] {
      torch::NoGradGuard ng;
      const auto [x, y] = first_samples(2);
      forward_any(x.to(device_), y.to(device_));
      return Status::OK();
    }));
    const auto bufs = model_.buffers();
    for (std::size_t i = 0; i < bufs.size(); ++i)
      if (changed.empty() && tensor_fingerprint(bufs[i].tensor) != buffers[i]) changed = bufs[i].name;
    for (std::size_t i = 0; i < flat_.params.size(); ++i)
      if (param.empty() && tensor_fingerprint(flat_.params[i].tensor) != params[i]) param = flat_.params[i].name;
  }
  if (!param.empty())
    return Status::BadInput("model " + cfg_.model.text() + " changes its parameter '" + param +
                            "' in its forward pass: parameters change only in the update (the optimizer step), "
                            "between culprit's fingerprints");
  if (!changed.empty())
    return Status::BadInput("model " + cfg_.model.text() + " updates state in its forward pass ('" + changed +
                         "', e.g. batch-norm running statistics): it would depend on which micro-shards each "
                         "rank computed; use LayerNorm or GroupNorm, or BatchNorm with track_running_stats=False");
  return Status::OK();
}

Status Trainer::check_ranks_agree() {
  const std::string mine = fingerprint_hex(set_fingerprint(flat_.params)) + " " +
                           fingerprint_hex(tensor_fingerprint(first_samples(1).first));
  const std::string root = broadcast_string(comm_, mine);
  Status st;
  if (mine.substr(0, 16) != root.substr(0, 16))
    st = Status::BadInput("model " + cfg_.model.text() + ": rank " + std::to_string(comm_.rank) +
                          " built other initial parameters than rank 0 (fingerprint " + mine.substr(0, 16) + ", rank 0 " +
                          root.substr(0, 16) + "): the model's construction depends on the rank or on files that differ");
  else if (mine != root)
    st = Status::BadInput("data " + cfg_.data.text() + ": rank " + std::to_string(comm_.rank) +
                          " reads another sample 0 than rank 0: the data differs between ranks");
  return agree(comm_, st);
}

// A model's own loss must be what it declares, the sum of its samples' losses or their mean
// (culprit divides by the batch): the other would scale every gradient by M / B without an error.
// Checked on samples 0..n-1 against sample 0 and the rest, in eval mode (no dropout: the three
// forward passes must see the same model), with the buffers kept.
Status Trainer::check_own_loss(const at::Tensor& x, const at::Tensor& y) {
  const std::int64_t n = x.size(0);
  if (n < 2) return Status::OK();
  BufferGuard keep(model_);
  torch::NoGradGuard ng;
  model_.set_training(false);
  const double all = model_.own_loss(x, y).item<double>();
  const double first = model_.own_loss(x.narrow(0, 0, 1), y.narrow(0, 0, 1)).item<double>();
  const double rest = model_.own_loss(x.narrow(0, 1, n - 1), y.narrow(0, 1, n - 1)).item<double>();
  model_.set_training(true);
  const bool mean = model_.own_loss_is_mean();
  const double parts = mean ? (first + rest * static_cast<double>(n - 1)) / static_cast<double>(n) : first + rest;
  if (std::abs(all - parts) <= 1e-4 * std::max({std::abs(all), std::abs(parts), 1e-6})) return Status::OK();
  const std::string other = mean ? "sum" : "mean";
  return Status::BadInput("model " + cfg_.model.text() + ": its loss of " + std::to_string(n) + " samples is " +
                          std::to_string(all) + " but its losses of sample 0 and of the rest " +
                          (mean ? "average to " : "add up to ") + std::to_string(parts) + ": the loss must be the " +
                          (mean ? "mean" : "sum") + " over the samples as the Setup declares (reduction=\"" +
                          (mean ? "mean" : "sum") + "\"); a " + other + " is declared with Setup(reduction=\"" + other +
                          "\") (docs/python.md)");
}

// What the detectors may ask of this rank's state.
StateProbe Trainer::probe() {
  StateProbe p;
  p.optimizer_fps = [this] { return optimizer_fps(); };
  p.params_finite = [this] {
    if (gather_) return gather_->own_finite();  // --shard-params: this rank's slice
    return flat_.flat.is_cuda() ? torch::isfinite(flat_.flat).all().item<bool>()
                                : all_finite(flat_.flat.data_ptr<float>(), static_cast<std::size_t>(flat_.size));
  };
  p.host_params = [this] {
    if (!flat_.flat.is_cuda()) return static_cast<const float*>(flat_.flat.data_ptr<float>());
    host_params_ = flat_.flat.cpu();
    return static_cast<const float*>(host_params_.data_ptr<float>());
  };
  p.chunk_owner = [this](std::int64_t k) {
    const ShardLayout& l = zero_->layout();
    int owner = 0;
    while (owner + 1 < l.world() && l.first_chunk(owner + 1) <= static_cast<std::size_t>(k)) ++owner;
    return std::make_pair(owner, static_cast<std::size_t>(l.chunks()[static_cast<std::size_t>(k)].param));
  };
  p.samples_fp = [this](int k) { return tensor_fingerprint(shard_indices(step_.facts.step, k)); };
  p.recompute = [this](int k, int attempt) {
    BufferGuard keep(model_);
    FireContext c = step_.fire;
    c.attempt = attempt;
    compute_shard(c, k, spot_leaf_.data());
    return fingerprint_bytes(spot_leaf_.data(), spot_leaf_.size() * sizeof(float));
  };
  return p;
}

}  // namespace culprit::harness
