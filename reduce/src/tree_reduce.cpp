#include "culprit/tree_reduce.h"
#include "culprit/watchdog.h"
#include "tree_pack.h"

#include <cstring>
#include <stdexcept>

namespace culprit {

using tree_detail::corrupt_outgoing;
using tree_detail::Outgoing;
using tree_detail::pack;
using tree_detail::timed;

ShardRange shard_range(int rank, int world, int micro_shards) {
  const long long m = micro_shards;
  return {static_cast<int>(rank * m / world), static_cast<int>((rank + 1) * m / world)};
}

std::vector<TreeNode> canonical_blocks(ShardRange r) {
  std::vector<TreeNode> out;
  int lo = r.lo;
  while (lo < r.hi) {
    int level = 0;
    // Grow while the block stays aligned and inside the range.
    while (true) {
      const int next = level + 1;
      if (lo % (1 << next) != 0 || lo + (1 << next) > r.hi) break;
      level = next;
    }
    out.push_back({lo, level});
    lo += 1 << level;
  }
  return out;
}

void tree_add(float* left, const float* right, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) left[i] += right[i];
}

namespace {
bool siblings(const TreeNode& a, const TreeNode& b) {
  return a.level == b.level && a.lo % (2 * a.size()) == 0 && b.lo == a.lo + a.size();
}
}  // namespace

float* TreeAccumulator::leaf_buffer() {
  if (pending_.size() != n_) {
    if (!pool_.empty()) {
      pending_ = std::move(pool_.back());
      pool_.pop_back();
    }
    pending_.resize(n_);
  }
  return pending_.data();
}

std::vector<float*> TreeAccumulator::merge_chain(int k) {
  std::vector<float*> chain;
  TreeNode top{k, 0};
  for (auto it = stack_.rbegin(); it != stack_.rend() && siblings(it->node, top); ++it) {
    chain.push_back(it->data.data());
    top = {it->node.lo, top.level + 1};
  }
  return chain;
}

void TreeAccumulator::push(int k, bool add) {
  leaf_buffer();
  if (!stack_.empty() && stack_.back().node.lo + stack_.back().node.size() != k)
    throw std::logic_error("TreeAccumulator: leaves must be pushed in order without gaps");
  stack_.push_back({{k, 0}, std::move(pending_)});
  pending_.clear();
  while (stack_.size() >= 2 && siblings(stack_[stack_.size() - 2].node, stack_.back().node)) {
    Entry right = std::move(stack_.back());
    stack_.pop_back();
    Entry& left = stack_.back();
    if (add) tree_add(left.data.data(), right.data.data(), n_);
    left.node.level += 1;
    pool_.push_back(std::move(right.data));
  }
}

void TreeAccumulator::clear() {
  for (auto& e : stack_) pool_.push_back(std::move(e.data));
  stack_.clear();
}

std::size_t chunk_offset(std::size_t n, int world, int c) {
  return n * static_cast<std::size_t>(c) / static_cast<std::size_t>(world);
}

namespace {
std::size_t chunk_off(std::size_t n, int world, int c) { return chunk_offset(n, world, c); }
}  // namespace

// This rank's chunk: the nodes every rank sent (rank order, each rank's blocks in tree order),
// combined bottom-up in tree order, in place in the receive buffer; returns the root.
const float* tree_combine(float* recv, std::size_t len, int W, int micro_shards) {
  struct Slot {
    TreeNode node;
    float* data;
  };
  std::vector<Slot> stack;
  std::size_t pos = 0;
  for (int r = 0; r < W; ++r) {
    for (const TreeNode& node : canonical_blocks(shard_range(r, W, micro_shards))) {
      stack.push_back({node, recv + pos});
      pos += len;
      while (stack.size() >= 2 && siblings(stack[stack.size() - 2].node, stack.back().node)) {
        Slot right = stack.back();
        stack.pop_back();
        tree_add(stack.back().data, right.data, len);
        stack.back().node.level += 1;
      }
    }
  }
  if (stack.size() != 1) throw std::logic_error("tree_allreduce: nodes did not combine to a root");
  return stack[0].data;
}

void tree_allreduce(const Comm& comm, int micro_shards, const TreeAccumulator& acc, float* out,
                    TreeWorkspace* ws, const SendFault* fault, CommCheck* check) {
  const bool checking = check && check->enabled;
  if (check) check->seconds = 0;
  const int W = comm.size;
  if (checking) {
    check->sent.assign(W, 0);
    check->received.assign(W, 0);
    check->chunks.assign(W, 0);
  }
  TreeWorkspace local;
  if (!ws) ws = &local;
  const std::size_t n = acc.length();
  const auto& mine = acc.blocks();
  if (mine.size() != canonical_blocks(shard_range(comm.rank, W, micro_shards)).size())
    throw std::logic_error("tree_allreduce: accumulator does not hold this rank's blocks");
  if (W == 1) {
    std::memcpy(out, mine[0].data.data(), n * sizeof(float));
    return;
  }
  // Phase 1: each chunk's owner receives every node's slice of that chunk. The sender fingerprints
  // what it means to send before it leaves its hands (not its message to itself, which never
  // leaves the process).
  std::vector<const float*> blocks;
  for (const auto& b : mine) blocks.push_back(b.data.data());
  const Outgoing o = pack(blocks, n, W, 0, n, mine.size() == 1 && !fault, &ws->packed);
  if (checking)
    timed(check, [&] {
      for (int c = 0; c < W; ++c)
        if (c != comm.rank) check->sent[c] = fingerprint_bytes(o.buf + o.displ[c], o.count[c] * sizeof(float));
    });
  if (fault) corrupt_outgoing(*fault, n, W, 0, n, mine.size(), o, &ws->packed);
  const std::size_t my_off = chunk_off(n, W, comm.rank);
  const std::size_t my_len = chunk_off(n, W, comm.rank + 1) - my_off;
  std::vector<int> rcount(W), rdispl(W);
  std::size_t rtotal = 0;
  for (int r = 0; r < W; ++r) {
    const std::size_t nblocks = canonical_blocks(shard_range(r, W, micro_shards)).size();
    rdispl[r] = static_cast<int>(rtotal);
    rcount[r] = static_cast<int>(my_len * nblocks);
    rtotal += my_len * nblocks;
  }
  std::vector<float>& recv = ws->recv;
  recv.resize(rtotal);
  CULPRIT_COLLECTIVE(comm, "the gradient reduction",
                     MPI_Ialltoallv(o.buf, o.count.data(), o.displ.data(), MPI_FLOAT, recv.data(), rcount.data(),
                                    rdispl.data(), MPI_FLOAT, comm.comm, &_culprit_req));
  if (checking)
    timed(check, [&] {
      for (int r = 0; r < W; ++r)
        if (r != comm.rank) check->received[r] = fingerprint_bytes(recv.data() + rdispl[r], rcount[r] * sizeof(float));
    });
  const float* root = tree_combine(recv.data(), my_len, W, micro_shards);
  if (my_len) std::memcpy(out + my_off, root, my_len * sizeof(float));
  // Phase 2: everyone gets every reduced chunk.
  for (int c = 0; c < W; ++c) {
    rdispl[c] = static_cast<int>(chunk_off(n, W, c));
    rcount[c] = static_cast<int>(chunk_off(n, W, c + 1) - chunk_off(n, W, c));
  }
  if (checking) timed(check, [&] { check->chunks[comm.rank] = fingerprint_bytes(out + my_off, my_len * sizeof(float)); });
  CULPRIT_COLLECTIVE(comm, "the gradient reduction", MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out,
                                                                     rcount.data(), rdispl.data(), MPI_FLOAT,
                                                                     comm.comm, &_culprit_req));
  if (checking)
    timed(check, [&] {
      for (int c = 0; c < W; ++c)
        if (c != comm.rank) check->chunks[c] = fingerprint_bytes(out + rdispl[c], rcount[c] * sizeof(float));
    });
}

std::vector<std::pair<int, int>> comm_mismatches(const std::vector<CommCheck>& all) {
  const int W = static_cast<int>(all.size());
  std::vector<std::pair<int, int>> out;
  for (int from = 0; from < W; ++from)
    for (int to = 0; to < W; ++to) {
      if (from == to || all[from].sent.size() != static_cast<std::size_t>(W) ||
          all[to].received.size() != static_cast<std::size_t>(W))
        continue;
      // Phase 1: what `from` sent to `to`; phase 2: the reduced chunk `from` owns, as `to` got it
      // (0: nothing went from `from` to `to`, as between two tensor-parallel ranks' data-parallel
      // reductions: harness/train/tensor_layout.cpp).
      if (all[from].sent[to] != all[to].received[from] ||
          (all[to].chunks[from] != 0 && all[from].chunks[from] != all[to].chunks[from]))
        out.push_back({from, to});
    }
  return out;
}

std::size_t tree_allreduce_bytes_sent(int rank, int world, int micro_shards, std::size_t n) {
  if (world == 1) return 0;
  const std::size_t nb = canonical_blocks(shard_range(rank, world, micro_shards)).size();
  const std::size_t my_len = chunk_off(n, world, rank + 1) - chunk_off(n, world, rank);
  return ((n - my_len) * nb + my_len * (world - 1)) * sizeof(float);
}

}  // namespace culprit
