// The training loop: one readable step function implementing docs/determinism.md.
#include <dlfcn.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/tree_reduce.h"
#include "data.h"
#include "error_line.h"
#include "model.h"
#include "rng.h"
#include "runinfo.h"

namespace culprit::harness {

namespace fs = std::filesystem;

namespace {

// Runs f, turning any exception into an error Status.
template <class Fn>
Status guarded(const std::string& what, Fn&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Status::Error(what + ": " + error_line(e.what()));
  }
}

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

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kLong: return DType::kInt64;
    case at::kInt: return DType::kInt32;
    case at::kByte: return DType::kUInt8;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kBool: return DType::kBool;
    default: throw std::runtime_error("unsupported dtype " + std::string(c10::toString(t)));
  }
}

Fingerprint tensor_fingerprint(const at::Tensor& t) {
  auto c = t.contiguous();
  return fingerprint_bytes(c.data_ptr(), c.numel() * c.element_size());
}

Fingerprint set_fingerprint(const std::vector<NamedTensor>& tensors) {
  FingerprintSet set;
  for (const auto& nt : tensors) {
    auto sizes = nt.tensor.sizes();
    set.add(nt.name, to_dtype(nt.tensor.scalar_type()), std::vector<std::int64_t>(sizes.begin(), sizes.end()),
            tensor_fingerprint(nt.tensor));
  }
  return set.finish();
}

at::ScalarType to_scalar(DType t) { return t == DType::kInt64 ? at::kLong : at::kFloat; }

std::string json_float(float v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const Comm& comm, const Dataset& data, Model& model)
      : cfg_(cfg), comm_(comm), data_(data), model_(model) {}

  Status init();
  Status run();

 private:
  at::Tensor loss_of(const at::Tensor& out, const at::Tensor& y) const;
  void step(std::int64_t s);
  const at::Tensor& epoch_order(std::int64_t epoch);
  void write_metrics(std::int64_t s, double lr, float loss, double grad_norm, Fingerprint fp, double secs);

  const TrainConfig& cfg_;
  const Comm& comm_;
  const Dataset& data_;
  Model& model_;
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
};

Status Trainer::init() {
  // Parameters become views of one flat float32 buffer (state-dict order).
  params_ = model_.parameters();
  for (const auto& p : params_) {
    offsets_.push_back(P_);
    P_ += p.tensor.numel();
  }
  flat_params_ = torch::empty({P_}, torch::kFloat32);
  {
    torch::NoGradGuard ng;
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

  // The model must accept the data and produce outputs the loss can use.
  CULPRIT_RETURN_IF_ERROR(guarded("model " + cfg_.model + " does not accept samples of shape " +
                                      shape_str(data_.x_shape) + " (" + dtype_name(data_.x_dtype) + ")",
                                  [&] {
                                    torch::NoGradGuard ng;
                                    model_.set_training(false);
                                    auto x = x_all_.narrow(0, 0, 1);
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
  return Status::OK();
}

const at::Tensor& Trainer::epoch_order(std::int64_t epoch) {
  if (epoch != order_epoch_) {
    auto gen = at::detail::createCPUGenerator(cfg_.seed + static_cast<std::uint64_t>(epoch));
    order_ = torch::randperm(data_.n, gen, torch::TensorOptions().dtype(torch::kLong));
    order_epoch_ = epoch;
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

// One optimizer step (1-based s): see docs/determinism.md.
void Trainer::step(std::int64_t s) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t B = cfg_.global_batch, M = cfg_.micro_shards;
  const std::int64_t steps_per_epoch = data_.n / B;
  const std::int64_t epoch = (s - 1) / steps_per_epoch;
  const std::int64_t start = ((s - 1) % steps_per_epoch) * B;
  const at::Tensor& order = epoch_order(epoch);
  const double lr = learning_rate(cfg_, s);
  for (auto& group : opt_->param_groups()) group.options().set_lr(lr);

  // Forward and backward of this rank's micro-shards, summed along the tree.
  acc_->clear();
  const ShardRange mine = shard_range(comm_.rank, comm_.size, static_cast<int>(M));
  for (int k = mine.lo; k < mine.hi; ++k) {
    auto idx = order.narrow(0, start + k * (B / M), B / M);
    auto x = x_all_.index_select(0, idx);
    auto y = y_all_.index_select(0, idx);
    torch::manual_seed(dropout_seed(cfg_.seed, s, k));
    for (auto& p : params_) p.tensor.mutable_grad().reset();
    auto loss = loss_of(model_.forward(x), y);
    loss.backward();
    float* leaf = acc_->leaf_buffer();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& g = params_[i].tensor.grad();
      float* dst = leaf + offsets_[i];
      const std::int64_t n = params_[i].tensor.numel();
      if (!g.defined()) {
        std::fill(dst, dst + n, 0.0f);
      } else {
        auto gc = g.contiguous();
        std::copy(gc.data_ptr<float>(), gc.data_ptr<float>() + n, dst);
      }
    }
    leaf[P_] = loss.item<float>();
    acc_->push(k);
  }
  tree_allreduce(comm_, static_cast<int>(M), *acc_, reduced_.data(), &tree_ws_);

  // The reduced gradient becomes every parameter's gradient; the optimizer steps.
  auto grads = torch::from_blob(reduced_.data(), {P_ + 1}, torch::kFloat32);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& t = params_[i].tensor;
    t.mutable_grad() = grads.narrow(0, offsets_[i], t.numel()).view(t.sizes());
  }
  opt_->step();

  double sq = 0;
  for (std::int64_t i = 0; i < P_; ++i) sq += static_cast<double>(reduced_[i]) * reduced_[i];
  const Fingerprint fp = set_fingerprint(params_);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_metrics(s, lr, reduced_[P_], std::sqrt(sq), fp, secs);
}

void Trainer::write_metrics(std::int64_t s, double lr, float loss, double grad_norm, Fingerprint fp,
                            double secs) {
  if (comm_.rank != 0) return;
  std::fprintf(metrics_,
               "{\"step\": %lld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %s, \"fingerprint\": \"%s\", "
               "\"seconds\": %.6f}\n",
               static_cast<long long>(s), json_float(loss).c_str(), format_json_number(grad_norm).c_str(),
               format_json_number(lr).c_str(), fingerprint_hex(fp).c_str(), secs);
  std::fflush(metrics_);
  if (!cfg_.quiet)
    std::printf("step %6lld  loss %-12.9g  grad_norm %-12.6g  lr %-10.4g  fingerprint %s\n",
                static_cast<long long>(s), static_cast<double>(loss), grad_norm, lr, fingerprint_hex(fp).c_str());
  std::fflush(stdout);
}

Status Trainer::run() {
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
  fill_environment(&info_);
  gather_hosts(comm_, &info_);
  info_.devices.assign(comm_.size, "cpu");
  Status st;
  if (comm_.rank == 0) {
    st = write_run_json((fs::path(cfg_.run_dir) / "run.json").string(), info_);
    if (st.ok()) {
      const std::string path = (fs::path(cfg_.run_dir) / "metrics.jsonl").string();
      metrics_ = std::fopen(path.c_str(), "w");
      if (!metrics_) st = Status::Error("cannot write '" + path + "'");
    }
  }
  CULPRIT_RETURN_IF_ERROR(agree(comm_, st));
  if (comm_.rank == 0 && !cfg_.quiet) {
    std::printf("culprit train: %s on %s (%lld samples), %lld parameters, %d rank(s), %d micro-shards, "
                "global batch %lld\n  libtorch %s, BLAS %s (threads %d), intra-op threads %d\n",
                cfg_.model.c_str(), data_.source.c_str(), static_cast<long long>(data_.n),
                static_cast<long long>(P_), comm_.size, cfg_.micro_shards,
                static_cast<long long>(cfg_.global_batch), info_.torch_version.c_str(), info_.blas_library.c_str(),
                info_.blas_threads, info_.intra_op_threads);
  }
  model_.set_training(true);
  const auto t0 = std::chrono::steady_clock::now();
  Fingerprint last_fp = 0;
  for (std::int64_t s = 1; s <= cfg_.steps; ++s) step(s);
  last_fp = set_fingerprint(params_);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm_.rank == 0) {
    std::fclose(metrics_);
    std::printf("summary: %lld steps in %.2f s (%.1f samples/s), final loss %.9g, final fingerprint %s\n",
                static_cast<long long>(cfg_.steps), secs, cfg_.steps * cfg_.global_batch / secs,
                static_cast<double>(reduced_[P_]), fingerprint_hex(last_fp).c_str());
    std::fflush(stdout);
  }
  return Status::OK();
}

Status prepare_run_dir(const TrainConfig& cfg) {
  std::error_code ec;
  fs::create_directories(cfg.run_dir, ec);
  if (ec) return Status::Error("cannot create run directory '" + cfg.run_dir + "': " + ec.message());
  for (const char* f : {"run.json", "metrics.jsonl"}) {
    if (fs::exists(fs::path(cfg.run_dir) / f))
      return Status::Error("run directory '" + cfg.run_dir + "' already holds a run (" + f +
                           "); choose another --run-dir");
  }
  return Status::OK();
}

}  // namespace

Status train(const TrainConfig& cfg, const Comm& comm) {
  CULPRIT_RETURN_IF_ERROR(agree(comm, validate(cfg, comm.size)));
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
  return trainer.run();
}

}  // namespace culprit::harness
