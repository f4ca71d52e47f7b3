// The reduction tree over NCCL, on device buffers (docs/cuda.md, "Deterministic reduction over NCCL
// (design)"): tree_allreduce's two phases with ncclSend/ncclRecv and ncclAllGather, the chunk
// owner's adds in a CUDA kernel following TreePlan::program (IEEE float32 adds, tree_allreduce's
// grouping), so the result has the CPU path's bits at every world size. Built with -DCULPRIT_NCCL=ON
// (library culprit_nccl); compiled here, not yet run on a GPU.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <vector>

#include "culprit/mpi_util.h"
#include "culprit/status.h"
#include "culprit/tree_plan.h"
#include "culprit/tree_reduce.h"

namespace culprit::cuda {

// One NCCL communicator over the ranks of an MPI communicator, rank for rank.
struct NcclComm {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = -1;  // this rank's CUDA device
};
// Collective over `mpi`: this rank on CUDA device `device`. NCCL needs a device of its own per rank:
// two ranks of a host on one device are refused here, by name, before NCCL is asked.
Status nccl_init(const Comm& mpi, int device, NcclComm* out);
void nccl_destroy(NcclComm* nc);
// Waits for the work queued on `stream`, polling NCCL's asynchronous errors; after timeout_s (a
// peer died or is stuck: NCCL would wait for ever) it aborts the communicator (nc->comm becomes
// null) and returns kSilentRank. The watchdog's part on the device path.
Status nccl_wait(NcclComm* nc, cudaStream_t stream, double timeout_s);

// Device buffers reused from call to call (grown as needed; freed with the workspace). One stream
// at a time: calls on one stream are ordered, so the next call may reuse what the last one used.
class NcclTreeWorkspace {
 public:
  NcclTreeWorkspace() = default;
  NcclTreeWorkspace(const NcclTreeWorkspace&) = delete;
  NcclTreeWorkspace& operator=(const NcclTreeWorkspace&) = delete;
  ~NcclTreeWorkspace();
  // The plan of (rank, world, micro_shards, n), made once.
  const TreePlan& plan(int rank, int world, int micro_shards, std::size_t n);
  Status packed(std::size_t floats, float** p) { return grow(&packed_, floats * sizeof(float), p); }
  Status recv(std::size_t floats, float** p) { return grow(&recv_, floats * sizeof(float), p); }
  Status staging(std::size_t floats, float** p) { return grow(&staging_, floats * sizeof(float), p); }
  // plan.program on the device (uploaded when the plan changes).
  Status program(const TreePlan& plan, cudaStream_t stream, const int** p);

 private:
  struct Buffer {
    void* p = nullptr;
    std::size_t bytes = 0;
  };
  template <class T>
  Status grow(Buffer* b, std::size_t bytes, T** p);
  Buffer packed_, recv_, staging_, program_;
  TreePlan plan_;
  bool have_plan_ = false;
  int program_world_ = 0, program_shards_ = 0;  // the uploaded program's (it depends on these only)
};

// Collective over nc: tree_allreduce on device memory. blocks[b] (device, n floats each): this
// rank's canonical blocks of leaves shard_range(nc.rank, nc.size, micro_shards), in tree order, each
// summed in the global tree's grouping (tree_add_device, as TreeAccumulator does). Every rank gets
// the same n floats in `out` (device): the bits tree_allreduce gives for the same blocks. Queued on
// `stream` (the current device must be nc.device); with check->enabled the sent and received
// messages are fingerprinted on the device as tree_allreduce does (the same values), which waits
// for `stream` between the phases.
Status tree_allreduce_nccl(const NcclComm& nc, int micro_shards, const std::vector<const float*>& blocks,
                           std::size_t n, float* out, cudaStream_t stream, NcclTreeWorkspace* ws,
                           CommCheck* check = nullptr);

// The chunk owner's combine alone: plan.program over `recv` (device, plan.recv_total floats in the
// plan's layout) into out (device, plan.chunk_len floats). For the GPU test on one device.
Status tree_combine_device(const TreePlan& plan, const float* recv, float* out, cudaStream_t stream,
                           NcclTreeWorkspace* ws);
// left[i] = left[i] + right[i] for i < n, in IEEE float32 (no FMA, no flush to zero): the one
// floating-point operation of the tree, for a device TreeAccumulator and the combine.
Status tree_add_device(float* left, const float* right, std::size_t n, cudaStream_t stream);

}  // namespace culprit::cuda
