// The trainer's state as culprit stores it: tensors' dtypes and fingerprints (on the CPU or the GPU),
// and the checkpoint and trace I/O: the state copy, the background write, restore on resume.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "rng.h"
#ifdef CULPRIT_HAVE_CUDA
#include "culprit/fingerprint_cuda.h"
#endif
#include "culprit/watchdog.h"
#include "trainer.h"

namespace culprit::harness {

namespace fs = std::filesystem;

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
  const std::size_t n = c.numel() * c.element_size();
  if (c.is_cuda()) {
#ifdef CULPRIT_HAVE_CUDA
    // On the GPU: only the chunk hashes come back (culprit/fingerprint_cuda.h).
    Fingerprint f = 0;
    if (cuda::fingerprint_on(c.get_device(), c.data_ptr(), n, &f).ok()) return f;
#endif
    c = c.cpu();  // the same bytes, the same fingerprint
  }
  return fingerprint_bytes(c.data_ptr(), n);
}

Fingerprint set_fingerprint(const std::vector<NamedTensor>& tensors, std::vector<Fingerprint>* each) {
  FingerprintSet set;
  if (each) each->clear();
  for (const auto& nt : tensors) {
    auto sizes = nt.tensor.sizes();
    const Fingerprint f = tensor_fingerprint(nt.tensor);
    if (each) each->push_back(f);
    set.add(nt.name, to_dtype(nt.tensor.scalar_type()), std::vector<std::int64_t>(sizes.begin(), sizes.end()), f);
  }
  return set.finish();
}

at::ScalarType to_scalar(DType t) { return t == DType::kInt64 ? at::kLong : at::kFloat; }

// Copies the state into *c, reusing its buffers from the previous checkpoint: fresh pages cost a
// page fault each, which dominates the copy on some machines.
void Trainer::snapshot(std::int64_t step, ckpt::Checkpoint* cp, const std::vector<NamedTensor>* buffers) const {
  ckpt::Checkpoint& c = *cp;
  c.step = step;
  auto put = [](std::vector<ckpt::RawTensor>& group, std::size_t& i, const std::string& name, const at::Tensor& t) {
    if (group.size() <= i) group.resize(i + 1);
    ckpt::RawTensor& r = group[i++];
    r.name = name;
    // Contiguous host tensors (parameters, optimizer state) are read in place: on the I/O thread,
    // while the main thread runs the next forward and backward passes, nothing goes through
    // libtorch's dispatcher or touches the tensors' autograd metadata.
    const at::Tensor ct = t.is_cuda() ? t.detach().cpu() : t.is_contiguous() ? t : t.detach().contiguous();
    r.dtype = to_dtype(ct.scalar_type());
    r.shape.assign(ct.sizes().begin(), ct.sizes().end());
    const std::size_t n = ct.numel() * ct.element_size();
    r.bytes.resize(n);
    if (n) std::memcpy(r.bytes.data(), ct.data_ptr(), n);
  };
  std::size_t nm = 0, no = 0, nr = 0;
  for (const auto& p : params_) put(c.model, nm, p.name, p.tensor);
  for (const auto& b : buffers ? *buffers : model_.buffers()) put(c.model, nm, b.name, b.tensor);
  auto& state = opt_->state();
  for (const auto& p : params_) {
    auto it = state.find(optimizer_state_key(state, p.tensor));
    if (it == state.end()) continue;
    if (cfg_.optimizer == "sgd") {
      auto& st = static_cast<torch::optim::SGDParamState&>(*it->second);
      if (st.momentum_buffer().defined()) put(c.optimizer, no, p.name + "/momentum_buffer", st.momentum_buffer());
    } else {
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      put(c.optimizer, no, p.name + "/step", torch::tensor(st.step(), torch::kLong).reshape({}));
      put(c.optimizer, no, p.name + "/exp_avg", st.exp_avg());
      put(c.optimizer, no, p.name + "/exp_avg_sq", st.exp_avg_sq());
    }
  }
  c.model.resize(nm);
  c.optimizer.resize(no);
  // Every rank reseeds before each micro-shard, so the live generator differs by rank; what is
  // saved is the generator as micro-shard 0 of the next step starts it (the same on every rank).
  auto next = at::detail::createCPUGenerator(dropout_seed(cfg_.seed, step + 1, 0));
  put(c.rng, nr, "cpu", next.get_state());
  c.rng.resize(nr);
  const std::int64_t spe = data_.n / cfg_.global_batch;
  c.epoch = step / spe;
  c.cursor = (step % spe) * cfg_.global_batch;
  c.meta = {{"config", to_ini(cfg_)},
            {"model", cfg_.model},
            {"optimizer", cfg_.optimizer},
            {"data", data_.source},
            {"culprit_version", info_.culprit_version},
            {"libtorch_version", info_.torch_version},
            {"mpi_version", info_.mpi_version},
            {"hdf5_version", info_.hdf5_version},
            {"blas", info_.blas_library},
            {"created", info_.created},
            {"slurm_job_id", info_.slurm_job_id}};
  std::string hosts, devices;
  for (int r = 0; r < comm_.size; ++r) {
    hosts += (r ? "," : "") + info_.hosts[r];
    devices += (r ? "," : "") + info_.devices[r];
  }
  c.meta["hosts"] = hosts;
  c.meta["devices"] = devices;
  c.meta_int = {{"seed", static_cast<std::int64_t>(cfg_.seed)},
                {"world_size", comm_.size},
                {"micro_shards", cfg_.micro_shards},
                {"global_batch", cfg_.global_batch},
                {"intra_op_threads", info_.intra_op_threads},
                {"blas_threads", info_.blas_threads}};
}

Status Trainer::drain_io() {
  if (comm_.watchdog) comm_.watchdog->wait_until([this] { return io_->idle(); }, "the checkpoint and trace writer");
  return io_->drain();
}

// Asynchronous checkpoints are pipelined (like CheckFreq's snapshot): the model's buffers (batch-norm
// statistics, changed by every forward pass) are copied here, then the I/O thread copies the
// parameters and optimizer state to host memory while the next step's forward and backward passes
// run, which only read them; the next optimizer step first waits for that copy (fence_snapshot).
// Training waits for: the previous checkpoint's write if still running, the buffer copy, and
// whatever is left of the state copy at the fence. Synchronous: everything, on the spot.
Status Trainer::save_checkpoint(std::int64_t step) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  if (checkpoint_in_flight_) {
    CULPRIT_RETURN_IF_ERROR(agree(comm_, drain_io()));
    checkpoint_in_flight_ = false;
    log_checkpoint();
  }
  const auto t1 = clock::now();
  // The previous checkpoint is written (drained above): its buffers are free for this one.
  if (!snap_) snap_ = std::make_shared<ckpt::Checkpoint>();
  auto c = snap_;
  auto buffers = std::make_shared<std::vector<NamedTensor>>();
  for (const auto& b : model_.buffers()) buffers->push_back({b.name, b.tensor.detach().clone()});
  cost_ = CheckpointCost();
  cost_.step = step;
  cost_.wait = std::chrono::duration<double>(t1 - t0).count();
  snap_copied_ = false;
  const std::string path = ckpt::path_for(cfg_.run_dir, step);
  io_->submit([this, c, buffers, path, step] {
    const auto w0 = clock::now();
    // A test seam: a slow copy, so that the next optimizer step must wait for it (tests/integration).
    static const int delay_ms = [] {
      const char* v = std::getenv("CULPRIT_TEST_SNAPSHOT_DELAY_MS");
      return v ? std::atoi(v) : 0;
    }();
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    snapshot(step, c.get(), buffers.get());
    cost_.copy = std::chrono::duration<double>(clock::now() - w0).count();
    snap_copied_ = true;
    ckpt::compute_fingerprints(c.get());
    Comm io{io_comm_, comm_.rank, comm_.size, comm_.host};
    ckpt::WriteStats stats;
    Status st = ckpt::write(io, path, *c, &stats, writers_);
    if (st.ok() && comm_.rank == 0) st = ckpt::apply_retention(cfg_.run_dir, step, cfg_.keep_last, cfg_.keep_every);
    cost_.bytes = stats.bytes;
    cost_.write = stats.seconds;
    cost_.total_io = std::chrono::duration<double>(clock::now() - w0).count();
    return st;
  });
  checkpoint_in_flight_ = true;
  if (!cfg_.async_checkpoint || serial_io_) {
    Status st = agree(comm_, drain_io());
    checkpoint_in_flight_ = false;
    cost_.stall = std::chrono::duration<double>(clock::now() - t0).count();
    log_checkpoint();
    return st;
  }
  cost_.stall = std::chrono::duration<double>(clock::now() - t0).count();
  return Status::OK();
}

void Trainer::fence_snapshot() {
  if (snap_copied_) return;
  // The copy takes milliseconds: spin for it (a sleeping wait would add its wake-up latency to the
  // stall); past a second, wait where the watchdog can answer the other ranks.
  const auto t0 = std::chrono::steady_clock::now();
  auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  while (!snap_copied_ && waited() < 1.0) std::this_thread::yield();
  if (!snap_copied_ && comm_.watchdog)
    comm_.watchdog->wait_until([this] { return snap_copied_.load(); }, "the checkpoint's copy of the state");
  else
    while (!snap_copied_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  cost_.fence += waited();
  cost_.stall += waited();
}

// One line per checkpoint: what it cost (docs/performance.md).
void Trainer::log_checkpoint() {
  if (comm_.rank != 0 || cost_.step < 0) return;
  std::ofstream log(fs::path(cfg_.run_dir) / "checkpoints.jsonl", std::ios::app);
  log << "{\"step\": " << cost_.step << ", \"bytes\": " << cost_.bytes << ", \"writers\": " << writers_.size()
      << ", \"wait_seconds\": " << cost_.wait
      << ", \"copy_seconds\": " << cost_.copy << ", \"fence_seconds\": " << cost_.fence
      << ", \"stall_seconds\": " << cost_.stall << ", \"write_seconds\": " << cost_.write
      << ", \"total_io_seconds\": " << cost_.total_io
      << ", \"async\": " << (cfg_.async_checkpoint && !serial_io_ ? "true" : "false") << "}\n";
  cost_.step = -1;
}

Status Trainer::restore(const ckpt::Checkpoint& c) {
  std::map<std::string, const ckpt::RawTensor*> model, optim;
  for (const auto& t : c.model) model[t.name] = &t;
  for (const auto& t : c.optimizer) optim[t.name] = &t;
  auto load = [&](const std::string& what, const at::Tensor& dst, const ckpt::RawTensor* src) {
    if (!src) return Status::Error("checkpoint has no " + what);
    std::vector<std::int64_t> shape(dst.sizes().begin(), dst.sizes().end());
    if (src->shape != shape || src->dtype != to_dtype(dst.scalar_type()))
      return Status::Error("checkpoint " + what + " is " + dtype_name(src->dtype) + " " + shape_str(src->shape) +
                           ", the model's is " + dtype_name(to_dtype(dst.scalar_type())) + " " + shape_str(shape));
    torch::NoGradGuard ng;
    auto from = torch::from_blob(const_cast<unsigned char*>(src->bytes.data()), dst.sizes(),
                                 torch::TensorOptions().dtype(dst.scalar_type()));
    dst.copy_(from);
    return Status::OK();
  };
  std::size_t used = 0;
  for (const auto& p : params_) {
    CULPRIT_RETURN_IF_ERROR(load("parameter '" + p.name + "'", p.tensor, model.count(p.name) ? model[p.name] : nullptr));
    ++used;
  }
  for (const auto& b : model_.buffers()) {
    CULPRIT_RETURN_IF_ERROR(load("buffer '" + b.name + "'", b.tensor, model.count(b.name) ? model[b.name] : nullptr));
    ++used;
  }
  if (used != c.model.size()) return Status::Error("checkpoint holds tensors the model does not have");
  auto& state = opt_->state();
  state.clear();
  for (const auto& p : params_) {
    const auto key = optimizer_state_key(state, p.tensor);
    auto tensor_of = [&](const std::string& name) -> at::Tensor {
      auto it = optim.find(p.name + "/" + name);
      if (it == optim.end()) return {};
      auto t = torch::empty(it->second->shape, torch::TensorOptions().dtype(
                                                   it->second->dtype == DType::kInt64 ? torch::kLong : torch::kFloat));
      std::memcpy(t.data_ptr(), it->second->bytes.data(), it->second->bytes.size());
      return t.to(p.tensor.device());
    };
    if (cfg_.optimizer == "sgd") {
      auto buf = tensor_of("momentum_buffer");
      if (!buf.defined()) continue;
      if (!buf.sizes().equals(p.tensor.sizes())) return Status::Error("checkpoint momentum of '" + p.name + "' has the wrong shape");
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(buf);
      state[key] = std::move(st);
    } else {
      auto step = tensor_of("step"), m = tensor_of("exp_avg"), v = tensor_of("exp_avg_sq");
      if (!step.defined() && !m.defined()) continue;
      if (!step.defined() || !m.defined() || !v.defined() || step.scalar_type() != torch::kLong ||
          !m.sizes().equals(p.tensor.sizes()) || !v.sizes().equals(p.tensor.sizes()))
        return Status::Error("checkpoint AdamW state of '" + p.name + "' is incomplete or misshapen");
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(step.item<std::int64_t>());
      st->exp_avg(m);
      st->exp_avg_sq(v);
      state[key] = std::move(st);
    }
  }
  for (const auto& r : c.rng)
    if (r.name == "cpu" && r.dtype == DType::kUInt8) {
      auto t = torch::empty({static_cast<std::int64_t>(r.bytes.size())}, torch::kUInt8);
      std::memcpy(t.data_ptr(), r.bytes.data(), r.bytes.size());
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(t);
    }
  return Status::OK();
}

Status Trainer::open_trace(std::int64_t start_step) {
  if (cfg_.trace == "off") return Status::OK();
  trace::Header h;
  h.rank = comm_.rank;
  h.world_size = comm_.size;
  h.level = cfg_.trace;
  h.forward_detail = model_.per_layer() ? "per-layer" : "per-model";
  for (const auto& p : params_) h.params.push_back(p.name);
  if (cfg_.trace == "layer") h.layers = model_.layers();
  h.faults = cfg_.inject;
  std::string warning;
  Status st = trace_.open(trace::path_for(cfg_.run_dir, comm_.rank), h, start_step, &warning);
  if (!warning.empty()) {
    std::fprintf(stderr, "culprit: warning: rank %d: %s\n", comm_.rank, printable(warning).c_str());
    std::fflush(stderr);
  }
  // Files of ranks beyond this world keep only what precedes the resume point.
  if (st.ok() && comm_.rank == 0) {
    for (const auto& path : trace::list(cfg_.run_dir)) {
      bool in_world = false;
      for (int r = 0; r < comm_.size; ++r) in_world = in_world || path == trace::path_for(cfg_.run_dir, r);
      if (in_world) continue;
      Status t = trace::truncate(path, start_step);
      if (!t.ok()) std::fprintf(stderr, "culprit: warning: %s\n", printable(t.message()).c_str());
    }
  }
  return agree(comm_, st);
}

}  // namespace culprit::harness
