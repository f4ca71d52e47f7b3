// The trainer's state as culprit stores it: the snapshot a checkpoint writes, restore on resume or
// rewind, and the trace's header.
#include <algorithm>
#include <cstring>
#include <map>

#include "culprit/checkpoint_format.h"
#include "culprit/rng.h"
#include "train/trainer.h"

namespace culprit::harness {

// Copies the state into *c, reusing its buffers from the previous checkpoint: fresh pages cost a
// page fault each, which dominates the copy on some machines.
void Trainer::snapshot(std::int64_t step, ckpt::Checkpoint* cp, const std::vector<NamedTensor>* buffers,
                       const ShardedOptimizer::Facts* sharded) const {
  ckpt::Checkpoint& c = *cp;
  c.step = step;
  auto put = [](std::vector<ckpt::RawTensor>& group, std::size_t& i, const std::string& name, const at::Tensor& t) {
    if (group.size() <= i) group.resize(i + 1);
    ckpt::RawTensor& r = group[i++];
    r.name = name;
    r.slice_lo = -1;  // whole
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
  if (sharded && !sharded->params.empty()) {
    // --shard-params: each rank writes its slice of each parameter, with the whole one's fingerprint.
    for (std::size_t i = 0; i < flat_.params.size(); ++i) {
      if (c.model.size() <= nm) c.model.resize(nm + 1);
      ckpt::RawTensor& r = c.model[nm++];
      const auto& p = flat_.params[i];
      r.name = p.name;
      r.dtype = DType::kFloat32;
      r.shape.assign(p.tensor.sizes().begin(), p.tensor.sizes().end());
      r.fingerprint = sharded->params[i];
      const auto [first, n] = zero_->layout().part(comm_.rank, flat_.offsets[i], flat_.sizes[i]);
      r.slice_lo = first;
      r.bytes.resize(static_cast<std::size_t>(n) * sizeof(float));
      if (n > 0) std::memcpy(r.bytes.data(), flat_.flat.data_ptr<float>() + flat_.offsets[i] + first, r.bytes.size());
    }
  } else {
    for (const auto& p : flat_.params) put(c.model, nm, p.name, p.tensor);
  }
  for (const auto& b : buffers ? *buffers : model_.buffers()) put(c.model, nm, b.name, b.tensor);
  if (sharded) {
    zero_->snapshot(*sharded, &c.optimizer);
  } else {
    for (const auto& p : flat_.params)
      for (const auto& [suffix, t] : opt_->stored(p.tensor)) put(c.optimizer, no, p.name + "/" + suffix, t);
    c.optimizer.resize(no);
  }
  c.model.resize(nm);
  // Every rank reseeds before each micro-shard, so the live generator differs by rank; what is
  // saved is the generator as micro-shard 0 of the next step starts it (the same on every rank).
  auto next = at::detail::createCPUGenerator(dropout_seed(cfg_.seed, step + 1, 0));
  put(c.rng, nr, "cpu", next.get_state());
  c.rng.resize(nr);
  const std::int64_t spe = data_.n / cfg_.global_batch;
  c.epoch = step / spe;
  c.cursor = (step % spe) * cfg_.global_batch;
  c.meta = {{"config", to_ini(cfg_)},
            {"model", cfg_.model.text()},
            {"optimizer", name_of(cfg_.optim.kind)},
            {"data", data_.source},
            {"culprit_version", info_.culprit_version},
            {"libtorch_version", info_.torch_version},
            {"mpi_version", info_.mpi_version},
            {"hdf5_version", info_.hdf5_version},
            {"blas", info_.blas_library},
            {"created", info_.created},
            {"slurm_job_id", info_.slurm_job_id},
            {format::kMetaRunId, cfg_.run_id}};
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
                {"blas_threads", info_.blas_threads},
                {"data_samples", data_.n}};
}

// Asynchronous checkpoints are pipelined (checkpoint_pipeline.h): the model's buffers (batch-norm
// statistics, changed by every forward pass) are copied here; the parameters and optimizer state
// are copied on the I/O thread while the next step's forward and backward passes only read them.
Status Trainer::save_checkpoint(std::int64_t step) {
  auto buffers = std::make_shared<std::vector<NamedTensor>>();
  for (const auto& b : model_.buffers()) buffers->push_back({b.name, b.tensor.detach().clone()});
  // Sharded state: what every rank must know of the others' slices is gathered here, on the main
  // thread (the copy runs on the I/O thread, before the next update changes anything).
  std::shared_ptr<ShardedOptimizer::Facts> gathered;
  if (sharded()) gathered = std::make_shared<ShardedOptimizer::Facts>(zero_->gather_facts());
  // --shard-params: the step's record composed them already (a collective spared); step 0's not.
  if (gather_) {
    if (recorded_step_ == step) gathered->params = recorded_param_fps_;
    else param_fingerprints(&gathered->params);
  }
  return pipeline_->save(step, [this, buffers, step, gathered](ckpt::Checkpoint* c) {
    snapshot(step, c, buffers.get(), gathered.get());
  });
}

Status Trainer::restore(const ckpt::Checkpoint& c) {
  std::map<std::string, const ckpt::RawTensor*> model, optim;
  for (const auto& t : c.model) model[t.name] = &t;
  for (const auto& t : c.optimizer) optim[t.name] = &t;
  auto load = [&](const std::string& what, const at::Tensor& dst, const ckpt::RawTensor* src) {
    if (!src) return Status::BadInput("checkpoint has no " + what);
    std::vector<std::int64_t> shape(dst.sizes().begin(), dst.sizes().end());
    if (src->shape != shape || src->dtype != to_dtype(dst.scalar_type()))
      return Status::BadInput("checkpoint " + what + " is " + dtype_name(src->dtype) + " " + shape_str(src->shape) +
                           ", the model's is " + dtype_name(to_dtype(dst.scalar_type())) + " " + shape_str(shape));
    torch::NoGradGuard ng;
    auto from = torch::from_blob(const_cast<unsigned char*>(src->bytes.data()), dst.sizes(),
                                 torch::TensorOptions().dtype(dst.scalar_type()));
    dst.copy_(from);
    return Status::OK();
  };
  std::size_t used = 0;
  for (const auto& p : flat_.params) {
    CULPRIT_RETURN_IF_ERROR(load("parameter '" + p.name + "'", p.tensor, model.count(p.name) ? model[p.name] : nullptr));
    ++used;
  }
  for (const auto& b : model_.buffers()) {
    CULPRIT_RETURN_IF_ERROR(load("buffer '" + b.name + "'", b.tensor, model.count(b.name) ? model[b.name] : nullptr));
    ++used;
  }
  if (used != c.model.size()) return Status::BadInput("checkpoint holds tensors the model does not have");
  // Each slot's state: the parameter's whole, or (--shard-optimizer) its slice of the stored tensor,
  // whatever the world size and sharding that wrote the checkpoint.
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::map<std::string, const OptimizerSlot*> slot_of;
  for (const auto& sl : opt_->slots()) {
    params.push_back({flat_.params[sl.param].name, sl.tensor});
    slot_of[flat_.params[sl.param].name] = &sl;
  }
  CULPRIT_RETURN_IF_ERROR(opt_->load(params, [&](const std::string& name, const std::string& suffix) -> at::Tensor {
    auto it = optim.find(name + "/" + suffix);
    if (it == optim.end()) return {};
    const ckpt::RawTensor& r = *it->second;
    const OptimizerSlot& sl = *slot_of.at(name);
    if (r.dtype == DType::kFloat32 && sharded()) {  // a slot is a 1-D slice of the stored tensor
      at::Tensor part = ShardedOptimizer::slot_part(r, sl.offset, sl.tensor.numel());
      return part.defined() ? part.to(device_) : part;
    }
    auto t = torch::empty(r.shape, torch::TensorOptions().dtype(to_scalar(r.dtype)));
    std::memcpy(t.data_ptr(), r.bytes.data(), r.bytes.size());
    return t.to(device_);
  }));
  for (const auto& r : c.rng)
    if (r.name == "cpu" && r.dtype == DType::kUInt8) {
      auto t = torch::empty({static_cast<std::int64_t>(r.bytes.size())}, torch::kUInt8);
      std::memcpy(t.data_ptr(), r.bytes.data(), r.bytes.size());
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(t);
    }
  return Status::OK();
}

trace::Header Trainer::trace_header() const {
  trace::Header h;
  h.rank = comm_.rank;
  h.world_size = comm_.size;
  h.level = cfg_.trace == TraceLevel::kLayer ? trace::Level::kLayer : trace::Level::kStep;
  h.forward_detail = model_.per_layer() ? trace::ForwardDetail::kPerLayer : trace::ForwardDetail::kPerModel;
  for (const auto& p : flat_.params) h.params.push_back(p.name);
  if (cfg_.trace == TraceLevel::kLayer) h.layers = model_.layers();
  h.faults = cfg_.inject;
  h.samples_per_shard = static_cast<int>(cfg_.global_batch / cfg_.micro_shards);
  h.run_id = cfg_.run_id;
  return h;
}

}  // namespace culprit::harness
