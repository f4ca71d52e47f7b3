// TensorLayout: the tensor-parallel groups, the data-parallel communicator, the gradient's chunks.
#include "train/tensor_layout.h"

#include <limits>
#include <stdexcept>

#include "culprit/watchdog.h"

namespace culprit::harness {

TensorLayout::TensorLayout(const Comm& world, int T) : tp_(world), dp_(world) {
  // Blocking splits at set-up, as the vote's node communicators are made (detectors.cpp).
  CULPRIT_MPI_CHECK(MPI_Comm_split(world.comm, world.rank / T, world.rank % T, &tp_.comm));
  CULPRIT_MPI_CHECK(MPI_Comm_split(world.comm, world.rank % T, world.rank / T, &dp_.comm));
  tp_.rank = world.rank % T;
  tp_.size = T;
  dp_.rank = world.rank / T;
  dp_.size = world.size / T;
}

TensorLayout::~TensorLayout() {
  MPI_Comm_free(&tp_.comm);
  MPI_Comm_free(&dp_.comm);
}

void TensorLayout::set_splits(const FlatParams& flat, const std::vector<TensorSplit>& splits, int chunks) {
  chunks_ = chunks;
  runs_.assign(static_cast<std::size_t>(chunks), {});
  for (const TensorSplit& s : splits) {
    std::size_t i = 0;
    while (i < flat.params.size() && flat.params[i].name != s.name) ++i;
    if (i == flat.params.size()) throw std::logic_error("tensor split of an unknown parameter: " + s.name);
    const at::Tensor& t = flat.params[i].tensor;
    const std::int64_t off = flat.offsets[i], R = t.size(0), width = t.dim() > 1 ? t.numel() / R : 1;
    for (int c = 0; c < chunks; ++c) {
      auto& runs = runs_[static_cast<std::size_t>(c)];
      if (s.dim == 0) {  // rows: in each group, rows [c n, (c+1) n)
        const std::int64_t per_group = R / s.groups, n = per_group / chunks;
        for (int g = 0; g < s.groups; ++g) runs.emplace_back(off + (g * per_group + c * n) * width, n * width);
      } else {  // columns: in every row, columns [c n, (c+1) n)
        const std::int64_t n = width / chunks;
        for (std::int64_t r = 0; r < R; ++r) runs.emplace_back(off + r * width + c * n, n);
      }
    }
  }
  per_chunk_ = 0;
  for (const auto& [o, n] : runs_[0]) per_chunk_ += n;
  const std::size_t mine = static_cast<std::size_t>(per_chunk_ * (chunks / tp_.size));
  send_.resize(mine);
  recv_.resize(mine * static_cast<std::size_t>(tp_.size));
}

void TensorLayout::assemble(float* leaf) {
  if (tp_.size == 1 || per_chunk_ == 0) return;
  const int owned = chunks_ / tp_.size;
  float* p = send_.data();
  for (int j = 0; j < owned; ++j)
    for (const auto& [o, n] : runs_[static_cast<std::size_t>(tp_.rank * owned + j)]) p = std::copy(leaf + o, leaf + o + n, p);
  if (send_.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw std::runtime_error("a tensor-parallel rank's chunks of the gradient hold more than 2^31 values");
  const auto count = static_cast<int>(send_.size());
  CULPRIT_COLLECTIVE(tp_, "the tensor-parallel gradient exchange",
                     MPI_Iallgather(send_.data(), count, MPI_FLOAT, recv_.data(), count, MPI_FLOAT, tp_.comm,
                                    &_culprit_req));
  for (int r = 0; r < tp_.size; ++r) {
    if (r == tp_.rank) continue;
    const float* q = recv_.data() + static_cast<std::size_t>(r) * send_.size();
    for (int j = 0; j < owned; ++j)
      for (const auto& [o, n] : runs_[static_cast<std::size_t>(r * owned + j)]) {
        std::copy(q, q + n, leaf + o);
        q += n;
      }
  }
}

void TensorLayout::widen(CommCheck* check, int world) const {
  if (!check->enabled && check->sent.empty()) return;
  CommCheck w = *check;
  w.sent.assign(static_cast<std::size_t>(world), 0);
  w.received.assign(static_cast<std::size_t>(world), 0);
  w.chunks.assign(static_cast<std::size_t>(world), 0);
  for (int g = 0; g < dp_.size; ++g) {
    const auto q = static_cast<std::size_t>(world_rank(g));
    if (g < static_cast<int>(check->sent.size())) w.sent[q] = check->sent[g];
    if (g < static_cast<int>(check->received.size())) w.received[q] = check->received[g];
    if (g < static_cast<int>(check->chunks.size())) w.chunks[q] = check->chunks[g];
  }
  *check = std::move(w);
}

}  // namespace culprit::harness
