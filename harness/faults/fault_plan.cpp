#include "faults/fault_plan.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include <unistd.h>

#include "culprit/optim_state.h"

namespace culprit::harness {

namespace {

bool corruptible(const at::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16; }

}  // namespace

// A bfloat16 value (a layer output or its gradient under --precision bf16) is the upper half of a
// float32: widened exactly, corrupted as a float32 (a bit flip of bit b >= 16 is a flip of bf16 bit
// b - 16; FaultPlan::check_dtypes refuses lower bits), then rounded back to nearest. Noise is 32
// times larger (a few bf16 units, varying), and a change that rounds away moves the value one bf16
// unit in its direction: an injected fault always changes the value.
float corrupt_value_as(const FaultSpec& spec, float v, at::ScalarType type) {
  if (type != at::kBFloat16) return corrupt_value(spec, v);
  float bad = corrupt_value(spec, v);
  if (spec.kind == FaultKind::kNoise) bad = v + 32 * (bad - v);
  const c10::BFloat16 was(v), now(bad);
  if (now.x != was.x || !std::isfinite(bad)) return static_cast<float>(now);
  c10::BFloat16 moved = was;
  // Away from zero when the change grows the magnitude, toward zero when it shrinks it.
  moved.x = static_cast<std::uint16_t>(moved.x + ((std::fabs(bad) > std::fabs(v)) ? 1 : (moved.x & 0x7fff ? -1 : 1)));
  return static_cast<float>(moved);
}

void corrupt_in_place(const FaultSpec& spec, const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !corruptible(t) || !t.is_contiguous()) return;
  torch::NoGradGuard ng;
  if (!t.is_cpu() || t.scalar_type() != at::kFloat) {  // read the element, write the corrupted value back
    auto e = t.view(-1).narrow(0, spec.index % t.numel(), 1);
    e.fill_(corrupt_value_as(spec, e.item<float>(), t.scalar_type()));
    return;
  }
  float* p = t.data_ptr<float>() + spec.index % t.numel();
  *p = corrupt_value(spec, *p);
}

at::Tensor corrupt_output(const FaultSpec& spec, const at::Tensor& out) {
  if (out.numel() == 0 || !corruptible(out)) return out;
  const std::int64_t i = spec.index % out.numel();
  torch::Tensor flat = out.detach().reshape(-1);
  const float bad = corrupt_value_as(spec, flat[i].item<float>(), out.scalar_type());
  auto mask = torch::zeros({out.numel()}, out.options().dtype(torch::kBool));
  mask[i] = true;
  return torch::where(mask.view(out.sizes()), torch::full({}, bad, out.options()), out);
}

void corrupt_tokens(const FaultSpec& spec, const at::Tensor& t, std::int64_t vocab) {
  if (t.numel() == 0 || t.scalar_type() != at::kLong) return;
  std::int64_t* p = t.data_ptr<std::int64_t>() + spec.index % t.numel();
  *p = (*p + 1) % vocab;
}

Status FaultPlan::parse(const std::vector<std::string>& texts, const std::vector<std::string>& model_layers,
                        const std::vector<NamedTensor>& params, const std::vector<std::int64_t>& offsets, int world,
                        std::uint64_t seed, StepMode mode) {
  seed_ = seed;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  host_ = host;
  offsets_ = offsets;
  for (const auto& p : params) {
    names_.push_back(p.name);
    sizes_.push_back(p.tensor.numel());
  }
  tied_.assign(names_.size(), {});
  for (const auto& [other, name] : tied_names_)
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) tied_[i].push_back(other);
  // Layer names are the model's layers and its parameters' modules (under every name).
  std::vector<std::string> layers = model_layers;
  const auto add_module_of = [&layers](const std::string& name) {
    const std::string prefix = name.substr(0, name.rfind('.'));
    if (std::find(layers.begin(), layers.end(), prefix) == layers.end()) layers.push_back(prefix);
  };
  for (const auto& p : params) add_module_of(p.name);
  for (const auto& t : tied_names_) add_module_of(t.first);
  for (const auto& text : texts) {
    FaultSpec f;
    CULPRIT_RETURN_IF_ERROR(parse_fault(text, layers, &f));
    const bool at_output = at_layer_output(f.phase);
    if (at_output && std::find(model_layers.begin(), model_layers.end(), f.layer) == model_layers.end())
      return Status::BadInput("--inject: phase " + std::string(name_of(f.phase)) + " needs a layer forward calls; '" +
                           f.layer + "' is not one");
    if (!at_output && needs_layer(f.phase) && layer_param(f.layer) < 0)
      return Status::BadInput("--inject: layer '" + f.layer + "' has no parameters");
    // A replay on fewer ranks than the run: the device of a rank this world lacks is not replaying.
    if (f.rank >= world && mode == StepMode::kReplay) continue;
    if (f.rank >= world)
      return Status::BadInput("--inject: rank " + std::to_string(f.rank) + " does not exist (world size " +
                           std::to_string(world) + ")");
    specs_.push_back(f);
  }
  return Status::OK();
}

bool FaultPlan::at_layer_outputs() const {
  for (const auto& f : specs_)
    if (at_layer_output(f.phase)) return true;
  return false;
}

bool FaultPlan::fires(const FaultSpec& f, Phase phase, const FireContext& c, int occurrence, bool per_shard) const {
  if (f.phase != phase) return false;
  // A transient fault hits once: the first micro-shard the rank computes in that step.
  if (f.mode == FaultMode::kTransient && per_shard && occurrence != c.first_shard) return false;
  // Recomputations (attempt > 0) and replays are further executions: transient faults stay away,
  // intermittent ones draw again.
  const bool replay = c.mode == StepMode::kReplay;
  const std::uint64_t occ = static_cast<std::uint64_t>(occurrence) +
                            1000003ULL * static_cast<std::uint64_t>(c.attempt + (replay ? 3 + c.round : 0));
  return fault_fires(f, c.rank, c.step, /*replay=*/c.attempt > 0 || replay, seed_, occ, host_);
}

void FaultPlan::stall(const FaultSpec& f, const FireContext& c) const {
  // A stuck device: the rank stops here, in the middle of the step.
  std::fprintf(stderr, "culprit: injected fault: rank %d hangs for %g s in step %lld (%s)\n", c.rank, f.seconds,
               static_cast<long long>(c.step), f.text.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
}

bool FaultPlan::hits(const FaultSpec& f, Phase phase, const FireContext& c, int occurrence, bool per_shard) const {
  if (!fires(f, phase, c, occurrence, per_shard)) return false;
  if (f.kind != FaultKind::kHang) return true;
  stall(f, c);
  return false;
}

int FaultPlan::layer_param(const std::string& layer) const {
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (in_layer(i, layer)) return static_cast<int>(i);
  return -1;
}

bool FaultPlan::in_layer(std::size_t i, const std::string& layer) const {
  if (names_[i].rfind(layer + ".", 0) == 0) return true;
  if (i >= tied_.size()) return false;
  for (const auto& other : tied_[i])
    if (other.rfind(layer + ".", 0) == 0) return true;
  return false;
}

double FaultPlan::on_lr(const FireContext& c, double lr, double previous_lr, bool* stale) const {
  for (const auto& f : specs_) {
    if (!hits(f, Phase::kLr, c, 0, false)) continue;
    if (stale && f.kind == FaultKind::kStale) *stale = true;
    lr = f.kind == FaultKind::kStale ? previous_lr : corrupt_value(f, static_cast<float>(lr));
  }
  return lr;
}

void FaultPlan::on_inputs(const FireContext& c, int k, at::Tensor* samples, std::uint64_t* seed) {
  for (const auto& f : specs_)
    if (f.kind == FaultKind::kStale && last_samples_.defined() && hits(f, Phase::kData, c, k, true))
      *samples = last_samples_;
  for (const auto& f : specs_) {
    if (!hits(f, Phase::kRng, c, k, true)) continue;
    if (f.kind == FaultKind::kStale && have_last_seed_) *seed = last_seed_;
    if (f.kind == FaultKind::kBitflip) *seed ^= 1ULL << f.bit;
  }
  if (c.attempt == 0) {
    last_samples_ = *samples;
    last_seed_ = *seed;
    have_last_seed_ = true;
  }
}

void FaultPlan::on_batch(const FireContext& c, int k, const at::Tensor& x, std::int64_t vocab) const {
  for (const auto& f : specs_) {
    if (f.kind == FaultKind::kStale || !hits(f, Phase::kData, c, k, true)) continue;
    if (x.scalar_type() == torch::kLong) corrupt_tokens(f, x, vocab);
    else corrupt_in_place(f, x);
  }
}

Status FaultPlan::check_dtypes(const std::map<std::string, at::ScalarType>& dtypes) const {
  for (const auto& f : specs_) {
    const auto it = dtypes.find(f.layer);
    if (!at_layer_output(f.phase) || f.kind != FaultKind::kBitflip || f.bit >= 16 || it == dtypes.end() ||
        it->second != at::kBFloat16)
      continue;
    return Status::BadInput("--inject '" + f.text + "': layer " + f.layer + "'s output (and the gradient into it) is " +
                            "bfloat16 under --precision bf16, which keeps bits 16..31 of a float32 value: bit must be " +
                            "in [16, 31], got " + std::to_string(f.bit));
  }
  return Status::OK();
}

bool FaultPlan::keeps_grad(const FireContext& c, int k, std::size_t i) const {
  bool keep = false;
  for (const auto& f : specs_)
    keep = keep || (f.kind == FaultKind::kStale && in_layer(i, f.layer) && hits(f, Phase::kGrad, c, k, true));
  return keep;
}

at::Tensor FaultPlan::on_layer_output(const FireContext& c, int k, const std::string& layer, at::Tensor out) const {
  for (const auto& f : specs_) {
    if (f.layer != layer) continue;
    if (hits(f, Phase::kForward, c, k, true)) out = corrupt_output(f, out);
    if (out.requires_grad() && hits(f, Phase::kBackward, c, k, true)) {
      const FaultSpec spec = f;
      out.register_hook([spec](const at::Tensor& g) {
        auto bad = g.clone();
        corrupt_in_place(spec, bad);
        return bad;
      });
    }
  }
  return out;
}

bool FaultPlan::on_leaf(const FireContext& c, int k, float* leaf, std::size_t lo, std::size_t hi) const {
  bool finite = true;
  for (const auto& f : specs_) {
    const int pi = layer_param(f.layer);
    if (pi < 0 || f.kind == FaultKind::kStale) continue;
    const auto e = static_cast<std::size_t>(offsets_[pi] + f.index % sizes_[pi]);
    if (e < lo || e >= hi || !hits(f, Phase::kGrad, c, k, true)) continue;
    float& v = leaf[e];
    v = corrupt_value(f, v);
    finite = finite && std::isfinite(v);
  }
  return finite;
}

const SendFault* FaultPlan::on_send(const FireContext& c, SendFault* sf) const {
  const SendFault* out = nullptr;
  for (const auto& f : specs_) {
    const int pi = layer_param(f.layer);
    if (pi < 0 || !hits(f, Phase::kComm, c, 0, false)) continue;
    sf->offset = static_cast<std::size_t>(offsets_[pi] + f.index % sizes_[pi]);
    sf->ctx = &f;
    sf->apply = [](const void* ctx, float v) { return corrupt_value(*static_cast<const FaultSpec*>(ctx), v); };
    out = sf;
  }
  return out;
}

namespace {

// The part of parameter i a rank holds, as a 1-D view (part_of null: the parameter itself).
at::Tensor held_part(const std::vector<NamedTensor>& params, std::size_t i, const FaultPlan::PartOf& part_of) {
  if (!part_of) return params[i].tensor.detach();
  const auto [first, count] = part_of(i);
  return params[i].tensor.detach().view(-1).narrow(0, first, count);
}

}  // namespace

std::vector<std::pair<std::size_t, at::Tensor>> FaultPlan::before_update(const FireContext& c,
                                                                        const std::vector<NamedTensor>& params,
                                                                        const PartOf& part_of) const {
  std::vector<std::pair<std::size_t, at::Tensor>> lost;
  for (const auto& f : specs_) {
    const int pi = layer_param(f.layer);
    if (pi >= 0 && f.kind == FaultKind::kStale && hits(f, Phase::kParam, c, 0, false))
      for (std::size_t i = pi; i < params.size() && in_layer(i, f.layer); ++i)
        lost.push_back({i, held_part(params, i, part_of).clone()});
  }
  return lost;
}

void FaultPlan::after_update(const FireContext& c, const std::vector<NamedTensor>& params,
                             const std::vector<std::pair<std::size_t, at::Tensor>>& lost, const OptimizerState& opt,
                             RestPart part, const std::function<bool(std::size_t, std::int64_t)>& held,
                             const PartOf& part_of) const {
  if (part != RestPart::kCopy) {
    torch::NoGradGuard ng;
    for (const auto& [i, old] : lost) held_part(params, i, part_of).copy_(old);
  }
  // Faults at rest: this rank's copy of a layer's parameters or optimizer state.
  for (const auto& f : specs_) {
    const int pi = layer_param(f.layer);
    if (pi < 0 || f.kind == FaultKind::kStale) continue;
    const bool mine = !held || held(static_cast<std::size_t>(pi), f.index % params[pi].tensor.numel());
    if (hits(f, Phase::kParam, c, 0, false) && (part == RestPart::kAll || mine == (part == RestPart::kHeld)))
      corrupt_in_place(f, params[pi].tensor);
    if (part == RestPart::kCopy) continue;
    if (hits(f, Phase::kOptimizer, c, 0, false)) {
      // The element of the layer's first parameter, in the part of it this rank holds (all of it,
      // unless the optimizer is sharded).
      const OptimizerSlot* s = opt.slot(static_cast<std::size_t>(pi));
      const std::int64_t e = f.index % params[pi].tensor.numel();
      if (!s || e < s->offset || e >= s->offset + s->tensor.numel()) continue;
      FaultSpec local = f;
      local.index = e - s->offset;
      corrupt_in_place(local, opt.primary(s->tensor));
    }
  }
}

void FaultPlan::on_gather(const FireContext& c, std::size_t param, const std::vector<NamedTensor>& params,
                          const std::function<bool(std::size_t, std::int64_t)>& held) const {
  for (const auto& f : specs_)
    if (layer_param(f.layer) == static_cast<int>(param) && held(param, f.index % params[param].tensor.numel()) &&
        hits(f, Phase::kGather, c, 0, false))
      corrupt_in_place(f, params[param].tensor);
}

void FaultPlan::on_gather_link(const FireContext& c, std::size_t param, const std::vector<NamedTensor>& params) const {
  for (const auto& f : specs_) {
    if (f.phase != Phase::kGatherLink || f.rank == c.rank || layer_param(f.layer) != static_cast<int>(param)) continue;
    FireContext sender = c;
    sender.rank = f.rank;
    if (hits(f, Phase::kGatherLink, sender, 0, false)) corrupt_in_place(f, params[param].tensor);
  }
}

void FaultPlan::on_tp_link(const FireContext& c, int k, const std::string& layer, int sender, float* part,
                           std::int64_t n) const {
  for (const auto& f : specs_) {
    if (f.phase != Phase::kTpLink || f.rank != sender || f.layer != layer || n <= 0) continue;
    FireContext from = c;
    from.rank = sender;
    if (!hits(f, Phase::kTpLink, from, k, true)) continue;
    float& v = part[f.index % n];
    v = corrupt_value(f, v);
  }
}

Status FaultPlan::check_tp_link(const std::vector<std::string>& exchanges, int T) const {
  for (const auto& f : specs_) {
    if (at_layer_output(f.phase) && f.layer.find(".dx[") != std::string::npos)
      return Status::BadInput("--inject " + f.text + ": '" + f.layer + "' is a partial input gradient the model "
                              "records, not a layer's output; give the chunk's layer (without .dx)");
    if (f.phase != Phase::kTpLink) continue;
    if (f.kind == FaultKind::kHang || !f.host.empty())
      return Status::BadInput("--inject " + f.text + ": phase tp-link changes what arrives from the rank's link; it "
                              "takes neither kind=hang nor host= (name the sending rank)");
    if (T < 2)
      return Status::BadInput("--inject " + f.text + ": phase tp-link lands in a tensor-parallel exchange: give "
                              "--tensor-parallel 2 or more");
    if (std::find(exchanges.begin(), exchanges.end(), f.layer) == exchanges.end()) {
      std::string list;
      for (const auto& e : exchanges) list += (list.empty() ? "" : ", ") + e;
      return Status::BadInput("--inject " + f.text + ": layer '" + f.layer + "' exchanges nothing across tensor-parallel "
                              "ranks; phase tp-link takes one of " + list);
    }
  }
  return Status::OK();
}

bool FaultPlan::has_phase(Phase p) const {
  for (const auto& f : specs_)
    if (f.phase == p) return true;
  return false;
}

Status FaultPlan::check_held(const std::function<bool(int, std::size_t, std::int64_t)>& held,
                             const std::function<std::string(int)>& holds, bool params) const {
  const std::string option = params ? "--shard-params" : "--shard-optimizer";
  for (const auto& f : specs_) {
    const int pi = layer_param(f.layer);
    if (f.rank < 0 || pi < 0) continue;
    // A lost update (stale param) lands on what the rank updates: some element of the layer.
    if (f.phase == Phase::kParam && f.kind == FaultKind::kStale && !held(f.rank, static_cast<std::size_t>(pi), -1))
      return Status::BadInput("--inject " + f.text + ": with " + option + " rank " + std::to_string(f.rank) +
                              " updates no element of '" + f.layer + "' (" + holds(f.rank) + ")");
    // With --shard-params a rank holds no copy of another slice for a parameter fault to land on.
    if (params && (f.phase == Phase::kParam || f.phase == Phase::kGather || f.phase == Phase::kGatherLink) &&
        f.kind != FaultKind::kStale &&
        !held(f.rank, static_cast<std::size_t>(pi), f.index))
      return Status::BadInput("--inject " + f.text + ": with --shard-params rank " + std::to_string(f.rank) +
                              " holds no element " + std::to_string(f.index) + " of '" + f.layer + "' (" +
                              holds(f.rank) + "); give an index in its slice");
    if (f.phase != Phase::kOptimizer) continue;
    if (!held(f.rank, static_cast<std::size_t>(pi), f.index))
      return Status::BadInput("--inject " + f.text + ": with " + option + " rank " + std::to_string(f.rank) +
                              " holds no optimizer state of element " + std::to_string(f.index) + " of '" + f.layer +
                              "' (" + holds(f.rank) + "); give an index in its slice");
  }
  return Status::OK();
}

}  // namespace culprit::harness
