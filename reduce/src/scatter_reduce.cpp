// The reduce-scatter along the tree: see culprit/scatter_reduce.h and docs/determinism.md,
// "Sharded gradients".
#include "culprit/scatter_reduce.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "culprit/watchdog.h"

namespace culprit {

int scatter_rounds(int world, int micro_shards) { return (micro_shards + world - 1) / world; }

struct ScatterReduce::Flight {
  std::size_t a = 0, b = 0;
  bool sent = false;  // this rank had a leaf: [a, b) of it left
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> scount, sdispl, rcount, rdispl;
  std::vector<float> recv, copy;  // what arrives; a corrupted copy of what leaves (a faulty link)
};

ScatterReduce::ScatterReduce(const Comm& comm, int micro_shards, std::vector<std::size_t> cuts)
    : comm_(comm), M_(micro_shards), cuts_(std::move(cuts)) {
  if (cuts_.size() != static_cast<std::size_t>(comm.size) + 1 || cuts_.front() != 0 ||
      !std::is_sorted(cuts_.begin(), cuts_.end()))
    throw std::logic_error("ScatterReduce: cuts must be world + 1 ascending offsets from 0");
  CULPRIT_MPI_CHECK(MPI_Comm_dup(comm.comm, &comm_.comm));
}

ScatterReduce::~ScatterReduce() {
  // Nothing is left in flight after end_round; a request still here is an abandoned step (an
  // exception unwinding): it is released before its buffers and the communicator go.
  for (auto& f : flights_)
    if (f->req != MPI_REQUEST_NULL) MPI_Request_free(&f->req);
  MPI_Comm_free(&comm_.comm);
}

void ScatterReduce::begin_step(CommCheck* check) {
  stack_.clear();
  free_.clear();
  for (int s = 0; s < static_cast<int>(slots_.size()); ++s) free_.push_back(s);
  check_ = check && check->enabled ? check : nullptr;
  if (check) check->seconds = 0;
  sent_.assign(static_cast<std::size_t>(comm_.size), {});
  received_.assign(static_cast<std::size_t>(comm_.size), {});
  bytes_sent_ = 0;
}

// The round's program, from the stack's structure alone. A leaf stays where its pieces arrive (the
// receive buffer, location ~r for the round's leaf of rank r); two entries that are siblings in the
// tree become their parent (left += right, in the left one's place); an entry still in the receive
// buffer when the round ends is copied into a slot of its own. So a round's leaves cost no slot
// unless their sum outlives the round: with W a power of two dividing M, the slots hold at most
// log2(M/W) + 1 partial sums.
void ScatterReduce::begin_round(int round) {
  round_ = round;
  ops_.clear();
  for (int r = 0; r < comm_.size && has_leaf(r); ++r) {
    stack_.push_back({TreeNode{round * comm_.size + r, 0}, ~r});
    while (stack_.size() >= 2) {
      auto& right = stack_.back();
      auto& left = stack_[stack_.size() - 2];
      const TreeNode& L = left.first;
      if (L.level != right.first.level || L.lo + L.size() != right.first.lo || L.lo % (2 * L.size()) != 0) break;
      ops_.push_back({left.second, right.second, false});
      if (right.second >= 0) free_.push_back(right.second);
      stack_.pop_back();
      stack_.back().first.level += 1;
    }
  }
  const std::size_t len = hi() - lo();
  for (auto& [node, at] : stack_) {
    if (at >= 0) continue;
    int s;
    if (free_.empty()) {
      s = static_cast<int>(slots_.size());
      slots_.emplace_back(len);
    } else {
      s = free_.back();
      free_.pop_back();
    }
    ops_.push_back({s, at, true});
    at = s;
  }
}

void ScatterReduce::post(std::size_t a, std::size_t b, const float* leaf, const SendFault* fault) {
  // An owner receives a piece's part once per rank: pieces of at most 2^26 / W values keep that
  // receive buffer under 256 MiB and MPI's int counts and displacements far from overflowing. A
  // larger range goes in pieces from its top down, as buckets go (every rank cuts it the same way),
  // so a piece's lowest page, shared with the next piece, is never dropped while that one is in
  // flight (the caller's on_sent).
  const int W = comm_.size;
  const std::size_t most =
      piece_most_ ? piece_most_ : std::max<std::size_t>(1, (std::size_t{1} << 26) / static_cast<std::size_t>(W));
  if (b - a > most) {
    for (std::size_t hi = b; hi > a;) {
      const std::size_t lo = hi - a > most ? hi - most : a;
      post(lo, hi, leaf, fault);
      hi = lo;
    }
    return;
  }
  while (flights_.size() >= window_) complete_oldest();
  auto f = std::make_unique<Flight>();
  f->a = a;
  f->b = b;
  f->sent = leaf != nullptr;
  f->scount.assign(W, 0);
  f->sdispl.assign(W, 0);
  f->rcount.assign(W, 0);
  f->rdispl.assign(W, 0);
  const float* sendbuf = leaf ? leaf + a : nullptr;
  for (int d = 0; d < W && leaf; ++d) {
    const std::size_t x = std::max(a, cuts_[d]), y = std::min(b, cuts_[d + 1]);
    if (x >= y) continue;
    f->scount[d] = static_cast<int>(y - x);
    f->sdispl[d] = static_cast<int>(x - a);
    if (check_ && d != comm_.rank) sent_[d].push_back(fingerprint_bytes(leaf + x, (y - x) * sizeof(float)));
    if (d != comm_.rank) bytes_sent_ += (y - x) * sizeof(float);
  }
  if (leaf && fault && fault->apply && fault->offset >= a && fault->offset < b) {
    f->copy.assign(leaf + a, leaf + b);
    float& v = f->copy[fault->offset - a];
    v = fault->apply(fault->ctx, v);
    sendbuf = f->copy.data();
  }
  const std::size_t x0 = std::max(a, lo()), y0 = std::min(b, hi());
  const std::size_t L = x0 < y0 ? y0 - x0 : 0;
  int n = 0;
  for (int r = 0; r < W && has_leaf(r); ++r, ++n) {
    f->rcount[r] = static_cast<int>(L);
    f->rdispl[r] = static_cast<int>(static_cast<std::size_t>(n) * L);
  }
  f->recv.resize(static_cast<std::size_t>(n) * L);
  CULPRIT_MPI_CHECK(MPI_Ialltoallv(sendbuf, f->scount.data(), f->sdispl.data(), MPI_FLOAT, f->recv.data(),
                                   f->rcount.data(), f->rdispl.data(), MPI_FLOAT, comm_.comm, &f->req));
  flights_.push_back(std::move(f));
}

void ScatterReduce::complete_oldest() {
  Flight& f = *flights_.front();
  complete(comm_, &f.req, "the gradient reduce-scatter (--shard-params)");
  apply(f);
  if (f.sent && on_sent_) on_sent_(f.a, f.b);
  flights_.erase(flights_.begin());
}

// The round's program over the part of the slice this piece holds.
void ScatterReduce::apply(Flight& f) {
  const std::size_t x0 = std::max(f.a, lo()), y0 = std::min(f.b, hi());
  if (x0 >= y0) return;
  const std::size_t L = y0 - x0, off = x0 - lo();
  if (check_)
    for (int r = 0; r < comm_.size && has_leaf(r); ++r)
      if (r != comm_.rank)
        received_[r].push_back(fingerprint_bytes(f.recv.data() + static_cast<std::size_t>(r) * L, L * sizeof(float)));
  // A location: slot s >= 0, or ~r: the round's leaf of rank r, in this piece's receive buffer.
  auto at = [&](int loc) {
    return loc >= 0 ? slots_[static_cast<std::size_t>(loc)].data() + off
                    : f.recv.data() + static_cast<std::size_t>(~loc) * L;
  };
  for (const Op& op : ops_) {
    if (op.copy) std::memcpy(at(op.dst), at(op.src), L * sizeof(float));
    else tree_add(at(op.dst), at(op.src), L);
  }
}

void ScatterReduce::end_round() {
  while (!flights_.empty()) complete_oldest();
}

void ScatterReduce::end_step() {
  if (stack_.size() != 1 || stack_[0].first.lo != 0 || stack_[0].first.size() != M_)
    throw std::logic_error("ScatterReduce: the step's leaves did not make the tree's root");
  if (!check_) return;
  const int W = comm_.size;
  auto fold = [](const std::vector<Fingerprint>& parts) {
    return parts.empty() ? Fingerprint{0} : fingerprint_bytes(parts.data(), parts.size() * sizeof(Fingerprint));
  };
  check_->sent.assign(W, 0);
  check_->received.assign(W, 0);
  check_->chunks.assign(W, 0);  // no phase 2: every rank keeps its own slice
  for (int r = 0; r < W; ++r) {
    check_->sent[r] = fold(sent_[r]);
    check_->received[r] = fold(received_[r]);
  }
}

std::size_t ScatterReduce::partial_bytes() const { return slots_.size() * (hi() - lo()) * sizeof(float); }

const float* ScatterReduce::slice() const { return slots_[static_cast<std::size_t>(stack_.at(0).second)].data(); }

}  // namespace culprit
