// The sharded optimizer (sharded_optimizer.h).
#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "culprit/watchdog.h"
#include "optim/sharded_optimizer.h"

namespace culprit::harness {

ShardedOptimizer::ShardedOptimizer(const Comm& comm, const FlatParams& flat, bool sharded)
    : comm_(comm), flat_(flat), sharded_(sharded), layout_(flat.offsets, flat.sizes, sharded ? comm.size : 1) {}

// This rank's part of every parameter that meets its slice: 1-D views into the flat buffer.
std::vector<OptimizerSlot> ShardedOptimizer::owned_slots() const {
  std::vector<OptimizerSlot> slots;
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    const auto [first, n] = layout_.part(comm_.rank, flat_.offsets[i], flat_.sizes[i]);
    if (n > 0) slots.push_back({i, first, flat_.flat.narrow(0, flat_.offsets[i] + first, n)});
  }
  return slots;
}

// Every rank's updated slice to every rank, in place. On a GPU through host memory (the slice
// goes to the host, the gathered buffer comes back).
void ShardedOptimizer::gather_params() const {
  if (comm_.size == 1) return;
  std::vector<int> count(comm_.size), displ(comm_.size);
  for (int c = 0; c < comm_.size; ++c) {
    displ[c] = static_cast<int>(layout_.lo(c));
    count[c] = static_cast<int>(layout_.hi(c) - layout_.lo(c));
  }
  torch::NoGradGuard ng;
  at::Tensor host = flat_.flat.is_cuda() ? flat_.flat.cpu() : flat_.flat;
  CULPRIT_COLLECTIVE(comm_, "the parameter gather (--shard-optimizer)",
                     MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host.data_ptr<float>(), count.data(),
                                     displ.data(), MPI_FLOAT, comm_.comm, &_culprit_req));
  if (flat_.flat.is_cuda()) flat_.flat.copy_(host);
}

// The chunk hashes of this rank's slice of one optimizer state tensor (state_of: a slot's tensor of
// that kind, undefined before the first update: hashes 0), gathered from every rank.
std::vector<std::uint64_t> ShardedOptimizer::state_chunk_hashes(const std::function<at::Tensor(const OptimizerSlot&)>& state_of,
                                                       bool gather) const {
  std::vector<std::uint64_t> mine;
  const std::size_t first = layout_.first_chunk(comm_.rank), last = layout_.first_chunk(comm_.rank + 1);
  at::Tensor state;
  const OptimizerSlot* held = nullptr;
  for (std::size_t k = first; k < last; ++k) {
    const ParamChunk& ch = layout_.chunks()[k];
    const OptimizerSlot* s = opt_->slot(static_cast<std::size_t>(ch.param));
    if (s != held) {
      held = s;
      state = s ? state_of(*s) : at::Tensor();
      if (state.defined()) state = state.detach().to(at::kCPU).contiguous();
    }
    if (!state.defined()) {
      mine.push_back(0);
      continue;
    }
    const std::int64_t at = ch.begin - (flat_.offsets[ch.param] + s->offset);
    mine.push_back(chunk_hash(state.data_ptr<float>() + at, static_cast<std::size_t>(ch.end - ch.begin) * sizeof(float)));
  }
  return gather ? gather_chunk_hashes(comm_, layout_, mine, "the optimizer state's fingerprints") : mine;
}

std::vector<Fingerprint> ShardedOptimizer::optimizer_fps() const {
  const auto hashes = state_chunk_hashes([this](const OptimizerSlot& s) { return opt_->primary(s.tensor); }, true);
  std::vector<Fingerprint> fps;
  for (std::size_t i = 0; i < flat_.params.size(); ++i) fps.push_back(layout_.param_fp(hashes, i));
  return fps;
}

// The slice record is XXH3 over the fp1 chunk hashes of the parameters and of the primary optimizer
// state in [lo, hi). The state comes from the slot that holds each chunk (sharded: this rank's slice
// of the parameter; unsharded: the parameter), so one function serves the training rank (its own
// slice) and the replay (any slice of any world). Chunks are world-independent (shard_layout.h).
trace::SliceRecord ShardedOptimizer::slice_record(std::int64_t lo, std::int64_t hi) const {
  const ShardLayout whole(flat_.offsets, flat_.sizes, 1);
  const at::Tensor flat = flat_.flat.detach().to(at::kCPU).contiguous();
  std::vector<std::uint64_t> params, opt;
  const OptimizerSlot* held = nullptr;
  at::Tensor state;
  for (const ParamChunk& ch : whole.chunks()) {
    if (ch.begin < lo || ch.end > hi) continue;
    const auto bytes = static_cast<std::size_t>(ch.end - ch.begin) * sizeof(float);
    params.push_back(chunk_hash(flat.data_ptr<float>() + ch.begin, bytes));
    const OptimizerSlot* s = opt_->slot(static_cast<std::size_t>(ch.param));
    if (s != held || !state.defined()) {
      held = s;
      state = s ? opt_->primary(s->tensor) : at::Tensor();
      if (state.defined()) state = state.detach().to(at::kCPU).contiguous();
    }
    const std::int64_t at = state.defined() ? ch.begin - (flat_.offsets[ch.param] + s->offset) : -1;
    opt.push_back(at >= 0 && at < state.numel() ? chunk_hash(state.data_ptr<float>() + at, bytes) : 0);
  }
  return {lo, hi, combine_chunk_hashes(params.data(), params.size()), combine_chunk_hashes(opt.data(), opt.size())};
}

// What a checkpoint of sharded state needs every rank to know (train/trainer_state.cpp): per parameter, whether
// it has optimizer state yet and AdamW's step count; per state tensor, every chunk's hash. And this
// rank's slot tensors, taken here on the main thread for the I/O thread's copy.
ShardedOptimizer::Facts ShardedOptimizer::gather_facts() const {
  Facts g;
  g.info.assign(flat_.params.size(), 0);
  for (const auto& s : opt_->slots())
    for (const auto& [name, t] : opt_->stored(s.tensor)) {
      g.info[s.param] = std::max<std::int64_t>(
          {g.info[s.param], 1, name == OptimizerState::kCounter ? t.item<std::int64_t>() : 1});
      if (name != OptimizerState::kCounter) g.held[{s.param, name}] = t;
    }
  if (comm_.size > 1)
    CULPRIT_COLLECTIVE(comm_, "the optimizer state's checkpoint facts",
                       MPI_Iallreduce(MPI_IN_PLACE, g.info.data(), static_cast<int>(g.info.size()), MPI_INT64_T, MPI_MAX,
                                      comm_.comm, &_culprit_req));
  for (const std::string& name : opt_->state_names()) {
    if (name == OptimizerState::kCounter) continue;
    g.hashes[name] = state_chunk_hashes(
        [&g, &name](const OptimizerSlot& s) {
          auto it = g.held.find({s.param, name});
          return it == g.held.end() ? at::Tensor() : it->second;
        },
        true);
  }
  return g;
}

// The optimizer part of a sharded checkpoint: every parameter's state tensors in stored order, on
// every rank (the file's datasets are made collectively), each holding this rank's slice only, with
// the whole tensor's fingerprint.
void ShardedOptimizer::snapshot(const Facts& g, std::vector<ckpt::RawTensor>* out) const {
  std::size_t n = 0;
  auto next = [&]() -> ckpt::RawTensor& {
    if (out->size() <= n) out->resize(n + 1);
    return (*out)[n++];
  };
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    if (g.info[i] == 0) continue;  // no state yet
    const auto& p = flat_.params[i];
    const OptimizerSlot* s = opt_->slot(i);
    for (const std::string& name : opt_->state_names()) {
      ckpt::RawTensor& r = next();
      r.name = p.name + "/" + name;
      if (name == OptimizerState::kCounter) {  // a scalar every rank knows: written whole
        r.dtype = DType::kInt64;
        r.shape.clear();
        r.slice_lo = -1;
        r.bytes.resize(8);
        std::memcpy(r.bytes.data(), &g.info[i], 8);
        r.fingerprint = fingerprint_bytes(r.bytes.data(), 8);
        continue;
      }
      r.dtype = DType::kFloat32;
      r.shape.assign(p.tensor.sizes().begin(), p.tensor.sizes().end());
      r.slice_lo = s ? s->offset : 0;
      r.fingerprint = layout_.param_fp(g.hashes.at(name), i);
      r.bytes.clear();
      auto it = g.held.find({i, name});
      if (it == g.held.end()) continue;
      // As the unsharded snapshot does: a contiguous host tensor's bytes are read in place (no
      // dispatcher call on this thread); a GPU one comes to the host first.
      const at::Tensor c = it->second.is_cuda() ? it->second.detach().cpu() : it->second;
      r.bytes.resize(c.nbytes());
      std::memcpy(r.bytes.data(), c.data_ptr(), c.nbytes());
    }
  }
  out->resize(n);
}

// A slot's part of a stored optimizer tensor (read back whole from a checkpoint).
at::Tensor ShardedOptimizer::slot_part(const ckpt::RawTensor& r, std::int64_t offset, std::int64_t numel) {
  if (r.sliced() || offset + numel > r.numel() || r.bytes.size() != static_cast<std::size_t>(r.numel()) * sizeof(float))
    return {};
  auto t = torch::empty({numel}, torch::kFloat32);
  std::memcpy(t.data_ptr<float>(), r.bytes.data() + offset * sizeof(float), static_cast<std::size_t>(numel) * sizeof(float));
  return t;
}

}  // namespace culprit::harness
