// The reduction overlapped with the backward pass: see culprit/tree_overlap.h and
// docs/determinism.md, "Overlapping the reduction with the backward pass".
#include "culprit/tree_overlap.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "culprit/watchdog.h"
#include "tree_pack.h"

namespace culprit {

std::vector<Bucket> make_buckets(const std::vector<std::int64_t>& param_offsets, std::size_t n, std::size_t cap) {
  std::vector<Bucket> out;
  std::size_t hi = n;
  for (std::size_t i = param_offsets.size(); i-- > 0;) {
    const auto lo = static_cast<std::size_t>(param_offsets[i]);
    if (i == 0 || (cap > 0 && hi - lo >= cap)) {
      out.push_back({i == 0 ? 0 : lo, hi});
      hi = lo;
    }
  }
  if (out.empty()) out.push_back({0, n});  // no parameters: the loss alone
  return out;
}

OverlapChannel::OverlapChannel(const Comm& comm) {
  CULPRIT_MPI_CHECK(MPI_Comm_dup(comm.comm, &p1_));
  CULPRIT_MPI_CHECK(MPI_Comm_dup(comm.comm, &p2_));
}

OverlapChannel::~OverlapChannel() {
  if (p1_ != MPI_COMM_NULL) MPI_Comm_free(&p1_);
  if (p2_ != MPI_COMM_NULL) MPI_Comm_free(&p2_);
}

namespace {

enum class Stage { kWaiting, kPhase1, kPhase2, kDone };

using tree_detail::Piece;
using tree_detail::timed;
Piece piece(std::size_t n, int W, int c, const Bucket& bk) { return tree_detail::piece(n, W, c, bk.lo, bk.hi); }

}  // namespace

struct OverlappedReduce::Flight {
  Stage stage = Stage::kWaiting;
  MPI_Request req = MPI_REQUEST_NULL;
  const float* sendbuf = nullptr;
  std::vector<int> scount, sdispl, rcount, rdispl;
  std::vector<Fingerprint> sent, received, chunks;  // this bucket's pieces (comm check)
};

OverlappedReduce::OverlappedReduce(const Comm& comm, OverlapChannel* channel, int micro_shards, TreeAccumulator* acc,
                                   int last, float* out, std::vector<Bucket> buckets, const SendFault* fault,
                                   CommCheck* check)
    : comm_(comm), ch_(channel), M_(micro_shards), last_(last), acc_(acc), out_(out), buckets_(std::move(buckets)),
      fault_(fault), check_(check && check->enabled ? check : nullptr) {
  if (check) check->seconds = 0;
  const int W = comm_.size;
  float* leaf = acc_->leaf_buffer();
  chain_ = acc_->merge_chain(last_);
  // The blocks after the push: those the last leaf does not touch, then the one it ends up in.
  const auto& stack = acc_->blocks();
  for (std::size_t i = 0; i + chain_.size() < stack.size(); ++i) blocks_.push_back(stack[i].data.data());
  blocks_.push_back(chain_.empty() ? leaf : chain_.back());
  for (int r = 0; r < W; ++r) nblocks_.push_back(canonical_blocks(shard_range(r, W, M_)).size());
  if (blocks_.size() != nblocks_[comm_.rank])
    throw std::logic_error("OverlappedReduce: the accumulator does not hold this rank's blocks");
  final_.assign(buckets_.size(), false);
  flights_.resize(buckets_.size());
  ch_->send.resize(buckets_.size());
  ch_->recv.resize(buckets_.size());
  if (check_) {
    check_->sent.assign(W, 0);
    check_->received.assign(W, 0);
    check_->chunks.assign(W, 0);
  }
}

OverlappedReduce::~OverlappedReduce() = default;

void OverlappedReduce::ready(std::size_t b) {
  final_.at(b) = true;
  while (next_ < buckets_.size() && final_[next_]) launch(next_++);
  progress();
}

// Bucket b's part of the rank's local tree, then its phase 1.
void OverlappedReduce::launch(std::size_t b) {
  const Bucket bk = buckets_[b];
  const std::size_t n = acc_->length(), len = bk.hi - bk.lo;
  const int W = comm_.size;
  const float* cur = acc_->leaf_buffer();
  for (float* left : chain_) {
    tree_add(left + bk.lo, cur + bk.lo, len);
    cur = left;
  }
  Flight& f = flights_[b];
  if (W == 1) {
    std::memcpy(out_ + bk.lo, blocks_[0] + bk.lo, len * sizeof(float));
    f.stage = Stage::kDone;
    return;
  }
  const std::size_t nb = blocks_.size();
  tree_detail::Outgoing o = tree_detail::pack(blocks_, n, W, bk.lo, bk.hi, nb == 1 && !fault_, &ch_->send[b]);
  if (check_) {
    f.sent.assign(W, 0);
    timed(check_, [&] {
      for (int c = 0; c < W; ++c)
        if (c != comm_.rank) f.sent[c] = fingerprint_bytes(o.buf + o.displ[c], o.count[c] * sizeof(float));
    });
  }
  if (fault_) tree_detail::corrupt_outgoing(*fault_, n, W, bk.lo, bk.hi, nb, o, &ch_->send[b]);
  f.sendbuf = o.buf;
  f.scount = std::move(o.count);
  f.sdispl = std::move(o.displ);
  const Piece mine = piece(n, W, comm_.rank, bk);
  f.rcount.assign(W, 0);
  f.rdispl.assign(W, 0);
  std::size_t total = 0;
  for (int r = 0; r < W; ++r) {
    f.rdispl[r] = static_cast<int>(total);
    f.rcount[r] = static_cast<int>(mine.len() * nblocks_[r]);
    total += mine.len() * nblocks_[r];
  }
  ch_->recv[b].resize(total);
  CULPRIT_MPI_CHECK(MPI_Ialltoallv(f.sendbuf, f.scount.data(), f.sdispl.data(), MPI_FLOAT, ch_->recv[b].data(),
                                   f.rcount.data(), f.rdispl.data(), MPI_FLOAT, ch_->phase1(), &f.req));
  f.stage = Stage::kPhase1;
}

// Phase 1 of bucket b is in: this rank's piece combined to its root, then phase 2 (in place in out).
void OverlappedReduce::arrived(std::size_t b) {
  const Bucket bk = buckets_[b];
  const std::size_t n = acc_->length();
  const int W = comm_.size;
  Flight& f = flights_[b];
  if (check_) {
    f.received.assign(W, 0);
    timed(check_, [&] {
      for (int r = 0; r < W; ++r)
        if (r != comm_.rank)
          f.received[r] = fingerprint_bytes(ch_->recv[b].data() + f.rdispl[r], f.rcount[r] * sizeof(float));
    });
  }
  const Piece mine = piece(n, W, comm_.rank, bk);
  if (mine.len()) {
    const float* root = tree_combine(ch_->recv[b].data(), mine.len(), W, M_);
    std::memcpy(out_ + mine.a, root, mine.len() * sizeof(float));
  }
  for (int c = 0; c < W; ++c) {
    const Piece p = piece(n, W, c, bk);
    f.rdispl[c] = static_cast<int>(p.a);
    f.rcount[c] = static_cast<int>(p.len());
  }
  CULPRIT_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out_, f.rcount.data(), f.rdispl.data(),
                                    MPI_FLOAT, ch_->phase2(), &f.req));
  f.stage = Stage::kPhase2;
}

void OverlappedReduce::progress() {
  // Phase 2s start in bucket order: a bucket whose phase 1 is in waits for those before it.
  for (std::size_t b = 0; b < next_; ++b) {
    Flight& f = flights_[b];
    if (f.stage == Stage::kPhase1 || f.stage == Stage::kPhase2) {
      int done = 0;
      CULPRIT_MPI_CHECK(MPI_Test(&f.req, &done, MPI_STATUS_IGNORE));
      if (!done) {
        if (f.stage == Stage::kPhase1) break;
        continue;
      }
      if (f.stage == Stage::kPhase1) {
        arrived(b);
      } else {
        f.stage = Stage::kDone;
        if (check_) {
          const int W = comm_.size;
          f.chunks.assign(W, 0);
          timed(check_, [&] {
            for (int c = 0; c < W; ++c) {
              const Piece p = piece(acc_->length(), W, c, buckets_[b]);
              f.chunks[c] = fingerprint_bytes(out_ + p.a, p.len() * sizeof(float));
            }
          });
        }
      }
    }
  }
}

bool OverlappedReduce::all_done() {
  progress();
  return std::all_of(flights_.begin(), flights_.end(), [](const Flight& f) { return f.stage == Stage::kDone; });
}

void OverlappedReduce::finish() {
  if (finished_) return;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (!final_[b]) final_[b] = true;
  while (next_ < buckets_.size()) launch(next_++);
  // Polled without a pause for the first 50 ms, as Watchdog::wait polls a collective: a bucket
  // moves one phase per poll, and a pause per poll would add up to milliseconds a step. Longer
  // waits (a slow rank) go through the watchdog, which bounds them.
  const double t0 = MPI_Wtime();
  for (unsigned i = 1; !all_done(); ++i) {
    if (i % 64 == 0 && MPI_Wtime() - t0 > 0.05 && comm_.watchdog) {
      comm_.watchdog->wait_until([this] { return all_done(); }, "the gradient reduction");
      break;
    }
  }
  acc_->push(last_, false);
  if (check_ && comm_.size > 1) fold_check();
  finished_ = true;
}

// One bucket: its pieces' fingerprints are the messages' (tree_allreduce's). More: the fingerprint
// of the pieces' fingerprints, in launch order.
void OverlappedReduce::fold_check() {
  const int W = comm_.size;
  auto fold = [&](std::vector<Fingerprint> Flight::*field, std::vector<Fingerprint>* into) {
    for (int r = 0; r < W; ++r) {
      std::vector<Fingerprint> parts;
      for (const Flight& f : flights_) parts.push_back((f.*field)[r]);
      (*into)[r] = parts.size() == 1 ? parts[0] : fingerprint_bytes(parts.data(), parts.size() * sizeof(Fingerprint));
    }
  };
  timed(check_, [&] {
    fold(&Flight::sent, &check_->sent);
    fold(&Flight::received, &check_->received);
    fold(&Flight::chunks, &check_->chunks);
  });
}

}  // namespace culprit
