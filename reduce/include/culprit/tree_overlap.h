// The reduction overlapped with the last local micro-shard's backward pass (docs/determinism.md,
// "Overlapping the reduction with the backward pass").
//
// A rank's last leaf is filled bucket by bucket as the backward pass makes gradients final (the
// last layers' first). Each bucket, a range [lo, hi) of the flat gradient, is reduced on its own as
// soon as it and every bucket launched before it are final: the rank's local tree combination of
// that range, phase 1 (each chunk owner receives every block's slice of the bucket's part of its
// chunk), the owner's bottom-up combination, phase 2 (everyone gets the reduced range). The chunks
// and their owners are tree_allreduce's (chunk_offset over the whole buffer), and every element
// is added in the same tree order, so the result is bitwise tree_allreduce's, bucket sizes and the
// order gradients become final notwithstanding.
//
// Nonblocking collectives must start in the same order on every rank, but a rank's buckets become
// final at its own pace, and phase 2 of a bucket can only start once its phase 1 arrived: phase 1
// runs on one communicator of its own and phase 2 on another, each in bucket order. Progress is
// made whenever the owner calls progress() (between layers' backward passes) and in finish().
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "culprit/tree_reduce.h"

namespace culprit {

struct Bucket {
  std::size_t lo = 0, hi = 0;  // [lo, hi) of the flat buffer
};
// Buckets of whole parameters over [0, n) (param_offsets ascending, the first 0; the elements past
// the last parameter, the loss, go with it), built from the end of the buffer — backward passes
// make the last layers' gradients final first — each holding at least `cap` values or running to
// the start of the buffer. In launch order: the highest range first. cap 0: one bucket.
std::vector<Bucket> make_buckets(const std::vector<std::int64_t>& param_offsets, std::size_t n, std::size_t cap);

// What OverlappedReduces reuse from step to step: the communicators they run on (collective to
// create, over comm) and their message buffers (a step's reduction allocates nothing).
class OverlapChannel {
 public:
  explicit OverlapChannel(const Comm& comm);
  ~OverlapChannel();
  OverlapChannel(const OverlapChannel&) = delete;
  OverlapChannel& operator=(const OverlapChannel&) = delete;
  MPI_Comm phase1() const { return p1_; }
  MPI_Comm phase2() const { return p2_; }
  std::vector<std::vector<float>> send, recv;  // per bucket

 private:
  MPI_Comm p1_ = MPI_COMM_NULL, p2_ = MPI_COMM_NULL;
};

// One step's overlapped reduction. `acc` holds this rank's leaves before the last one, `last` (its
// pending leaf_buffer()); `out` gets the n reduced values. fault, check: as for tree_allreduce; a
// CommCheck's fingerprints of a message are those of its one piece with a single bucket (then they
// equal tree_allreduce's), else the fingerprint of the pieces' fingerprints in launch order.
class OverlappedReduce {
 public:
  OverlappedReduce(const Comm& comm, OverlapChannel* channel, int micro_shards, TreeAccumulator* acc, int last,
                   float* out, std::vector<Bucket> buckets, const SendFault* fault, CommCheck* check);
  ~OverlappedReduce();
  OverlappedReduce(const OverlappedReduce&) = delete;
  OverlappedReduce& operator=(const OverlappedReduce&) = delete;
  // Bucket b (an index into the launch order) of the last leaf holds its final values: launches
  // every bucket from the next one due up to the first not final yet.
  void ready(std::size_t b);
  // Advances what is in flight (tests the requests; a bucket whose phase 1 arrived is combined and
  // its phase 2 started). Never blocks.
  void progress();
  // Marks every bucket final, completes every phase (through the watchdog when comm has one) and
  // pushes the last leaf into acc. Afterwards acc holds this rank's blocks, as after push(last).
  void finish();
  bool finished() const { return finished_; }

 private:
  struct Flight;
  void launch(std::size_t b);
  void arrived(std::size_t b);  // phase 1 of b is in: combine it, start its phase 2
  bool all_done();
  void fold_check();  // the pieces' fingerprints into check_

  const Comm& comm_;
  OverlapChannel* ch_;
  int M_, last_;
  TreeAccumulator* acc_;
  float* out_;
  std::vector<Bucket> buckets_;
  const SendFault* fault_;
  CommCheck* check_;
  std::vector<const float*> blocks_;  // this rank's final blocks (the last leaf merged where it will be)
  std::vector<float*> chain_;         // the blocks the last leaf is added into, in order
  std::vector<bool> final_;
  std::size_t next_ = 0;  // the next bucket to launch
  std::vector<Flight> flights_;
  std::vector<std::size_t> nblocks_;  // canonical blocks of every rank
  bool finished_ = false;
};

}  // namespace culprit
