// The parameter gatherer of --shard-params (param_gatherer.h).
#include "optim/param_gatherer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <cerrno>
#include <new>
#include <stdexcept>

#include <sys/mman.h>
#include <unistd.h>

#include "culprit/finite.h"
#include "culprit/watchdog.h"

namespace culprit::harness {

namespace {

// The one gatherer of this process whose buffer a stray read can hit (a replay has none), for the
// fault handler: a model that reads a parameter outside the layers that use it (a weight read
// directly in forward) gets one line naming it, not a crash and not zeros.
struct StrayRead {
  const char* base = nullptr;
  std::size_t bytes = 0;
  const std::vector<std::int64_t>* offsets = nullptr;
  std::vector<std::string> names;
  struct sigaction previous {};
};
StrayRead g_stray;

void write_str(const char* s) {
  const std::size_t n = std::strlen(s);
  if (::write(2, s, n) < 0) return;
}

void on_fault(int sig, siginfo_t* info, void* uctx) {
  const char* at = static_cast<const char*>(info->si_addr);
  if (g_stray.base && at >= g_stray.base && at < g_stray.base + g_stray.bytes) {
    const auto e = static_cast<std::int64_t>((at - g_stray.base) / sizeof(float));
    const auto& off = *g_stray.offsets;
    std::size_t i = static_cast<std::size_t>(std::upper_bound(off.begin(), off.end(), e) - off.begin());
    i = i ? i - 1 : 0;
    write_str("culprit: error: --shard-params: parameter '");
    write_str(i < g_stray.names.size() ? g_stray.names[i].c_str() : "?");
    write_str("' was read outside the layers that use it (only a layer's own parameters, and those its model "
              "names as tied, are gathered around its call): train this model without --shard-params, or "
              "name the parameter as tied to the layer that reads it (docs/determinism.md, \"Sharded parameters\")\n");
    ::_exit(2);  // exit code 2: the model, as given, cannot be trained sharded
  }
  // Not ours: whoever handled it before, or the default action.
  const struct sigaction& p = g_stray.previous;
  if (p.sa_flags & SA_SIGINFO) {
    if (p.sa_sigaction) return p.sa_sigaction(sig, info, uctx);
  } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
    return p.sa_handler(sig);
  }
  ::signal(sig, SIG_DFL);  // the faulting instruction runs again and ends the process as it would have
  if (info->si_code <= 0) ::raise(sig);  // a signal sent (kill): no instruction to run again
}

std::size_t page_bytes() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

}  // namespace

at::Tensor paged_flat_buffer(std::int64_t elements) {
  const std::size_t pb = page_bytes();
  const std::size_t bytes = std::max<std::size_t>(pb, (static_cast<std::size_t>(elements) * sizeof(float) + pb - 1) / pb * pb);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return torch::from_blob(p, {elements}, [bytes](void* q) { ::munmap(q, bytes); }, torch::kFloat32);
}

ParamGatherer::ParamGatherer(const Comm& comm, FlatParams& flat, const ShardLayout& layout,
                             const std::vector<std::string>& layers,
                             const std::vector<std::pair<std::string, std::string>>& uses, bool keep,
                             LayerObserver* inner)
    : comm_(comm), flat_(flat), layout_(layout), keep_(keep), inner_(inner) {
  CULPRIT_MPI_CHECK(MPI_Comm_dup(comm.comm, &comm_.comm));
  base_ = flat_.flat.data_ptr<float>();
  lo_ = layout_.lo(comm.rank);
  hi_ = layout_.hi(comm.rank);
  page_ = page_bytes() / sizeof(float);
  gathered_.assign(flat_.params.size(), 1);  // whole until shard()
  // A layer uses the parameters its name prefixes, and those `uses` gives it.
  std::vector<char> named(flat_.params.size(), 0);
  auto index_of = [this](const std::string& name) -> int {
    for (std::size_t i = 0; i < flat_.params.size(); ++i)
      if (flat_.params[i].name == name) return static_cast<int>(i);
    return -1;
  };
  for (const std::string& layer : layers) {
    std::vector<std::size_t> unit;
    const std::string prefix = layer + ".";
    for (std::size_t i = 0; i < flat_.params.size(); ++i)
      if (flat_.params[i].name.compare(0, prefix.size(), prefix) == 0) unit.push_back(i);
    for (const auto& [user, name] : uses)
      if (user == layer) {
        const int i = index_of(name);
        if (i >= 0 && std::find(unit.begin(), unit.end(), static_cast<std::size_t>(i)) == unit.end())
          unit.push_back(static_cast<std::size_t>(i));
      }
    std::sort(unit.begin(), unit.end());
    for (std::size_t i : unit) named[i] = 1;
    unit_of_.emplace(layer, unit_.size());  // a repeated name: its first unit, as a search found it
    unit_.push_back(std::move(unit));
  }
  for (std::size_t i = 0; i < flat_.params.size(); ++i)
    if (!named[i]) resident_.push_back(i);
  entered_.assign(unit_.size(), 0);
  // After each parameter's gradient accumulator: its gradient is final, so its value is needed by
  // no later node of the backward pass.
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    const at::Tensor& t = flat_.params[i].tensor;
    if (!t.requires_grad()) continue;
    auto node = torch::autograd::impl::grad_accumulator(t);
    const auto key = node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          param_final(i);
          return outputs;
        }));
    hooks_.emplace_back(std::move(node), key);
  }
  g_stray.base = reinterpret_cast<const char*>(base_);
  g_stray.bytes = static_cast<std::size_t>(flat_.size) * sizeof(float);
  g_stray.offsets = &flat_.offsets;
  g_stray.names = flat_.names();
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGSEGV, &sa, &g_stray.previous);
}

ParamGatherer::~ParamGatherer() {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
  ::sigaction(SIGSEGV, &g_stray.previous, nullptr);
  g_stray.base = nullptr;
  try {
    unshard();
  } catch (const std::exception&) {  // the buffer goes with the trainer: nothing reads it again
  }
  MPI_Comm_free(&comm_.comm);
}

int ParamGatherer::param_at(std::int64_t e) const {
  const auto& off = flat_.offsets;
  const auto it = std::upper_bound(off.begin(), off.end(), e);
  return static_cast<int>(it - off.begin()) - 1;
}

void ParamGatherer::protect(std::int64_t a, std::int64_t b, bool access) {
  if (a >= b) return;
  const auto p0 = static_cast<std::size_t>(a) / page_, p1 = (static_cast<std::size_t>(b) + page_ - 1) / page_;
  char* at = reinterpret_cast<char*>(base_) + p0 * page_ * sizeof(float);
  const std::size_t len = (p1 - p0) * page_ * sizeof(float);
  if (::mprotect(at, len, access ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    throw std::runtime_error(std::string("--shard-params: mprotect of the parameter buffer failed: ") + std::strerror(errno) +
                             " (vm.max_map_count too low for this many released ranges?)");
}

// The pages of [a, b) that hold no element of this rank's slice nor of a gathered parameter go
// back to the kernel and become inaccessible.
void ParamGatherer::drop_pages(std::int64_t a, std::int64_t b) {
  const auto pe = static_cast<std::int64_t>(page_);
  std::int64_t run = -1;  // the first page of the run being collected
  auto flush = [&](std::int64_t end_page) {
    if (run < 0) return;
    char* at = reinterpret_cast<char*>(base_) + run * pe * static_cast<std::int64_t>(sizeof(float));
    const auto len = static_cast<std::size_t>((end_page - run) * pe) * sizeof(float);
    // Inaccessible first: pages that could not be protected keep their memory and their values
    // (never zeros a stray read could take for parameters).
    if (::mprotect(at, len, PROT_NONE) == 0) ::madvise(at, len, MADV_DONTNEED);
    run = -1;
  };
  for (std::int64_t p = a / pe; p * pe < b; ++p) {
    const std::int64_t s = p * pe, e = std::min(s + pe, flat_.size);
    bool keep = s < hi_ && lo_ < e;
    for (int i = param_at(s); !keep && i >= 0 && i < static_cast<int>(flat_.params.size()) && flat_.offsets[i] < e; ++i)
      keep = gathered_[static_cast<std::size_t>(i)] != 0;
    // A page past the buffer's last element (its tail) is never dropped: nothing uses it.
    if (keep || e - s < pe) flush(p);
    else if (run < 0) run = p;
  }
  flush((b + pe - 1) / pe);
}

void ParamGatherer::shard() {
  if (sharded_) return;
  // A layer the forward passes before this never called (a Python leaf whose parent reads its
  // parameters directly, as nn.MultiheadAttention reads out_proj's) cannot gather them: they stay
  // gathered for the whole step, like parameters no layer names.
  for (std::size_t u = 0; u < unit_.size(); ++u) {
    if (entered_[u]) continue;
    resident_.insert(resident_.end(), unit_[u].begin(), unit_[u].end());
  }
  std::sort(resident_.begin(), resident_.end());
  resident_.erase(std::unique(resident_.begin(), resident_.end()), resident_.end());
  for (auto& unit : unit_)
    unit.erase(std::remove_if(unit.begin(), unit.end(),
                              [this](std::size_t i) { return std::binary_search(resident_.begin(), resident_.end(), i); }),
               unit.end());
  sharded_ = true;
  std::fill(gathered_.begin(), gathered_.end(), 0);
  drop_pages(0, flat_.size);
}

void ParamGatherer::unshard() {
  if (!sharded_) return;
  sharded_ = false;
  protect(0, flat_.size, true);
  std::fill(gathered_.begin(), gathered_.end(), 1);
}

void ParamGatherer::gather_range(std::int64_t a, std::int64_t b) {
  // MPI counts are ints: a range of more than 2^30 elements (a TorchScript model's, all resident)
  // goes in pieces.
  constexpr std::int64_t kMost = std::int64_t{1} << 30;
  for (; b - a > kMost; a += kMost) gather_range(a, a + kMost);
  protect(a, b, true);
  // Gathers are logged unless kept (--keep-gathered gathers in a rank's first micro-shard only, and
  // a phantom round is never a first one: every rank has a micro-shard in round 0).
  if (logging_ && !keep_) log_.push_back({false, a, b});
  ++gathers_;
  if (comm_.size == 1) return;
  std::vector<int> count(static_cast<std::size_t>(comm_.size)), displ(static_cast<std::size_t>(comm_.size));
  for (int c = 0; c < comm_.size; ++c) {
    const std::int64_t x = std::max(a, layout_.lo(c)), y = std::min(b, layout_.hi(c));
    count[static_cast<std::size_t>(c)] = static_cast<int>(std::max<std::int64_t>(0, y - x));
    displ[static_cast<std::size_t>(c)] = static_cast<int>(y > x ? x - a : 0);
  }
  bytes_ += (b - a - count[static_cast<std::size_t>(comm_.rank)]) * static_cast<std::int64_t>(sizeof(float));
  CULPRIT_COLLECTIVE(comm_, "the parameter gather (--shard-params)",
                     MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base_ + a, count.data(), displ.data(),
                                     MPI_FLOAT, comm_.comm, &_culprit_req));
}

// The parameters not gathered yet, as few collectives as their places allow (a run of neighbours
// is one).
void ParamGatherer::gather(const std::vector<std::size_t>& params) {
  if (!sharded_) return;
  // A parameter's first gather of the step: its faults at rest land, and it is checked after.
  std::vector<std::size_t> first;
  for (std::size_t i : params)
    if (!gathered_[i] && !seen_[i]) {
      seen_[i] = 1;
      first.push_back(i);
      if (before_gather_) before_gather_(i);
    }
  std::int64_t a = -1, b = -1;
  for (std::size_t i : params) {
    if (gathered_[i]) continue;
    gathered_[i] = 1;
    const std::int64_t s = flat_.offsets[i], e = s + flat_.sizes[i];
    if (s == b) {
      b = e;
      continue;
    }
    if (a >= 0) gather_range(a, b);
    a = s;
    b = e;
  }
  if (a >= 0) gather_range(a, b);
  for (std::size_t i : first) {
    if (after_gather_) after_gather_(i);
    verify(i);
  }
}

void ParamGatherer::verify(std::size_t i) {
  if (!check_ || expected_.size() != layout_.chunks().size()) return;
  for (std::size_t k = layout_.param_chunk(i); k < layout_.param_chunk(i + 1); ++k) {
    const ParamChunk& ch = layout_.chunks()[k];
    if (chunk_hash(base_ + ch.begin, static_cast<std::size_t>(ch.end - ch.begin) * sizeof(float)) == expected_[k]) continue;
    if (mismatch_ < 0 || static_cast<std::int64_t>(k) < mismatch_) mismatch_ = static_cast<std::int64_t>(k);
    return;
  }
}

void ParamGatherer::release(const std::vector<std::size_t>& params) {
  if (!sharded_ || keep_) return;
  for (std::size_t i : params) {
    if (!gathered_[i]) continue;
    gathered_[i] = 0;
    drop_pages(flat_.offsets[i], flat_.offsets[i] + flat_.sizes[i]);
  }
}

void ParamGatherer::begin_step() {
  shards_ = 0;
  log_.clear();
  seen_.assign(flat_.params.size(), 0);
  mismatch_ = -1;
  gather(resident_);
}

void ParamGatherer::begin_shard() {
  log_.clear();
  logging_ = true;
  in_backward_ = false;
}

void ParamGatherer::end_shard() {
  logging_ = false;
  in_backward_ = false;
  ++shards_;
  if (keep_) return;
  std::vector<std::size_t> all;
  for (const auto& unit : unit_) all.insert(all.end(), unit.begin(), unit.end());
  release(all);
}

void ParamGatherer::phantom() {
  for (const Logged& e : log_) {
    if (e.post) {
      if (poster_) poster_(e.a, e.b);
      continue;
    }
    if (!sharded_) continue;
    gather_range(e.a, e.b);
    drop_pages(e.a, e.b);
  }
}

void ParamGatherer::end_step() {
  logging_ = false;
  if (!sharded_) return;
  const bool keep = keep_;
  keep_ = false;
  std::vector<std::size_t> all(flat_.params.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  release(all);
  keep_ = keep;
}

void ParamGatherer::on_enter(const std::string& layer) {
  if (inner_) inner_->on_enter(layer);
  const auto it = unit_of_.find(layer);
  if (it == unit_of_.end()) return;
  const std::size_t u = it->second;
  entered_[u] = 1;
  gather(unit_[u]);
}

at::Tensor ParamGatherer::on_forward(const std::string& layer, const at::Tensor& output) {
  at::Tensor out = inner_ ? inner_->on_forward(layer, output) : output;
  const auto it = unit_of_.find(layer);
  if (!sharded_ || it == unit_of_.end()) return out;
  const std::size_t u = it->second;
  // An output that is (a view of) a parameter is read after the call: the unit stays gathered
  // until the micro-shard ends, and a parameter gets no hook (it would stay on it for good).
  const char* p = static_cast<const char*>(out.defined() ? out.data_ptr() : nullptr);
  const char* b = reinterpret_cast<const char*>(base_);
  if (p && p >= b && p < b + static_cast<std::size_t>(flat_.size) * sizeof(float)) return out;
  if (out.requires_grad() && at::GradMode::is_enabled())
    out.register_hook([this, u](const at::Tensor&) {
      in_backward_ = true;
      gather(unit_[u]);
    });
  // A layer recomputed during the backward pass (non-reentrant activation checkpointing) keeps its
  // parameters: its backward node reads them next; the accumulator hooks release them.
  if (!in_backward_) release(unit_[u]);
  return out;
}

void ParamGatherer::param_final(std::size_t i) {
  // A parameter no layer names stays for the whole step (the next micro-shard's forward reads it).
  if (in_backward_ && !std::binary_search(resident_.begin(), resident_.end(), i)) release({i});
}

std::vector<std::uint64_t> ParamGatherer::own_chunk_hashes() const {
  std::vector<std::uint64_t> mine;
  for (std::size_t k = layout_.first_chunk(comm_.rank); k < layout_.first_chunk(comm_.rank + 1); ++k) {
    const ParamChunk& ch = layout_.chunks()[k];
    mine.push_back(chunk_hash(base_ + ch.begin, static_cast<std::size_t>(ch.end - ch.begin) * sizeof(float)));
  }
  return mine;
}

bool ParamGatherer::own_finite() const { return all_finite(base_ + lo_, static_cast<std::size_t>(hi_ - lo_)); }

}  // namespace culprit::harness
