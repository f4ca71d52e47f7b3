// World-size-invariant gradient reduction (docs/determinism.md, "The reduction tree").
//
// The M micro-shard gradients of a step (M a power of two) are summed in one fixed complete binary
// tree: ((g0+g1)+(g2+g3))+... Rank r computes the contiguous leaves shard_range(r); it sums them
// locally into the maximal aligned power-of-two blocks of that range (each block is a node of the
// global tree), then the ranks exchange block slices chunk by chunk (MPI_Alltoallv), the owner of
// each chunk combines the nodes bottom-up to the root, and MPI_Allgatherv spreads the result.
// The result is bitwise the same for every world size W <= M.
#pragma once
#include <cstddef>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/mpi_util.h"

namespace culprit {

struct ShardRange {
  int lo = 0;  // first micro-shard
  int hi = 0;  // one past the last
};
// Leaves computed by `rank`: [floor(rank*M/W), floor((rank+1)*M/W)).
ShardRange shard_range(int rank, int world, int micro_shards);
// Where chunk c of n values starts when `world` ranks reduce them (chunk c: [offset(c), offset(c + 1)),
// reduced by rank c).
std::size_t chunk_offset(std::size_t n, int world, int c);

// A node of the reduction tree: the sum of leaves [lo, lo + 2^level).
struct TreeNode {
  int lo = 0;
  int level = 0;
  int size() const { return 1 << level; }
  bool operator==(const TreeNode& o) const { return lo == o.lo && level == o.level; }
};
// The canonical (segment-tree) decomposition of [lo, hi) into maximal aligned blocks, in order.
std::vector<TreeNode> canonical_blocks(ShardRange r);

// Sums the leaves of one rank, pushed in increasing order, into its canonical blocks. Two nodes
// are added as soon as they are siblings, so the grouping is exactly the global tree's.
class TreeAccumulator {
 public:
  explicit TreeAccumulator(std::size_t n) : n_(n) {}
  // The buffer to fill with the next leaf's n values; then call push(k).
  float* leaf_buffer();
  // add false: the leaf was already added into the blocks merge_chain(k) named, range by range
  // (tree_overlap.h); only the tree's structure is updated.
  void push(int k, bool add = true);
  // The blocks leaf k will be added into when pushed, in the order of the additions (the last one
  // is the block it ends up in); empty: it stays a block of its own.
  std::vector<float*> merge_chain(int k);
  struct Entry {
    TreeNode node;
    std::vector<float> data;
  };
  const std::vector<Entry>& blocks() const { return stack_; }
  void clear();
  std::size_t length() const { return n_; }

 private:
  std::size_t n_;
  std::vector<Entry> stack_;
  std::vector<std::vector<float>> pool_;
  std::vector<float> pending_;
};

// Adds `right` into `left`, elementwise: the one floating-point operation of the tree.
void tree_add(float* left, const float* right, std::size_t n);
// A chunk owner's combination: `recv` holds, for every rank in order, each of its canonical blocks'
// `len` values of the chunk; they are combined bottom-up in tree order in place. Returns the root.
const float* tree_combine(float* recv, std::size_t len, int world, int micro_shards);

// Buffers tree_allreduce reuses from call to call (a step's reduction allocates nothing).
struct TreeWorkspace {
  std::vector<float> recv;
  std::vector<float> packed;
};

// A faulty link (fault injection): apply(ctx, v) replaces element `offset` of every block slice a
// rank sends in the reduction, after the sender fingerprinted what it meant to send.
struct SendFault {
  std::size_t offset = 0;
  float (*apply)(const void* ctx, float) = nullptr;
  const void* ctx = nullptr;
};
// With `check`, every message is fingerprinted by its sender before it leaves and by its receiver
// on arrival, in both phases, without extra messages: the fingerprints are compared afterwards
// (comm_mismatches) from every rank's CommCheck, gathered with the step's other detector data.
struct CommCheck {
  bool enabled = false;
  std::vector<Fingerprint> sent;      // [r]: phase 1, what this rank sent to rank r, as it meant it (own: 0)
  std::vector<Fingerprint> received;  // [r]: phase 1, what arrived here from rank r (own: 0)
  std::vector<Fingerprint> chunks;    // [c]: phase 2, reduced chunk c as it arrived here (own: as sent)
  double seconds = 0;                 // spent fingerprinting in the last reduction
};
// (sender, receiver) pairs whose message arrived unlike it was sent; all[r] is rank r's CommCheck.
std::vector<std::pair<int, int>> comm_mismatches(const std::vector<CommCheck>& all);
// Collective over comm: combines every rank's accumulated blocks (acc holds leaves
// shard_range(comm.rank, comm.size, micro_shards)) into the root; every rank gets the same n
// values in `out`. `fault`: this rank's link is faulty (SendFault); `check`: the comm check.
void tree_allreduce(const Comm& comm, int micro_shards, const TreeAccumulator& acc, float* out,
                    TreeWorkspace* ws = nullptr, const SendFault* fault = nullptr, CommCheck* check = nullptr);

// Bytes this rank sends in tree_allreduce (both phases), for the benchmark and the docs.
std::size_t tree_allreduce_bytes_sent(int rank, int world, int micro_shards, std::size_t n);

}  // namespace culprit
