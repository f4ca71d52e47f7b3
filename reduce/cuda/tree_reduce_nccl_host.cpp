// tree_allreduce over NCCL: the host side that queues the two phases (docs/cuda.md, "Deterministic
// reduction over NCCL (design)"). It follows reduce/src/tree_reduce.cpp step by step, with the same
// buffer layouts (TreePlan), so that every message, every add and every fingerprint is the CPU
// path's; tree_reduce_nccl.cu holds the kernels.
#include "culprit/tree_reduce_nccl.h"

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "culprit/fingerprint_cuda.h"

namespace culprit::cuda {

namespace {

Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::Internal(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

Status nccl_ok(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::OK();
  return Status::Internal(std::string("NCCL: ") + what + ": " + ncclGetErrorString(r));
}

Status copy(float* to, const float* from, std::size_t floats, cudaStream_t stream) {
  if (floats == 0) return Status::OK();
  return cuda_ok(cudaMemcpyAsync(to, from, floats * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                 "copying on the device");
}

// The comm check's fingerprints (tree_allreduce's, computed on the device): they read what the
// stream has written so far, so the stream is waited for first; the time goes to check->seconds.
template <class F>
Status timed_check(CommCheck* check, cudaStream_t stream, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  CULPRIT_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(stream), "waiting for the reduction"));
  const Status st = f();
  check->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

Status fp(const float* p, std::size_t floats, Fingerprint* out) {
  return fingerprint_device(p, floats * sizeof(float), out);
}

}  // namespace

// ---- the communicator

Status nccl_init(const Comm& mpi, int device, NcclComm* out) {
  Status st = cuda_ok(cudaSetDevice(device), "selecting the device");
  // NCCL refuses two ranks on one device only inside ncclCommInitRank, on some ranks; say it here,
  // on every rank, naming them.
  MPI_Comm local;
  CULPRIT_MPI_CHECK(MPI_Comm_split_type(mpi.comm, MPI_COMM_TYPE_SHARED, mpi.rank, MPI_INFO_NULL, &local));
  int local_size = 0;
  CULPRIT_MPI_CHECK(MPI_Comm_size(local, &local_size));
  std::vector<int> devices(local_size), ranks(local_size);
  CULPRIT_MPI_CHECK(MPI_Allgather(&device, 1, MPI_INT, devices.data(), 1, MPI_INT, local));
  CULPRIT_MPI_CHECK(MPI_Allgather(&mpi.rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, local));
  MPI_Comm_free(&local);
  for (int i = 0; i < local_size && st.ok(); ++i)
    for (int j = i + 1; j < local_size && st.ok(); ++j)
      if (devices[i] == devices[j])
        st = Status::BadInput("ranks " + std::to_string(ranks[i]) + " and " + std::to_string(ranks[j]) +
                              " both use CUDA device " + std::to_string(devices[i]) +
                              ": the NCCL reduction needs a device of its own per rank");
  CULPRIT_RETURN_IF_ERROR(agree(mpi, st));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (mpi.rank == 0) st = nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
  CULPRIT_RETURN_IF_ERROR(broadcast_status(mpi, st));
  CULPRIT_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi.comm));
  out->rank = mpi.rank;
  out->size = mpi.size;
  out->device = device;
  // Blocks until every rank has joined; a rank failing inside leaves the others to the watchdog.
  st = nccl_ok(ncclCommInitRank(&out->comm, mpi.size, id, mpi.rank), "ncclCommInitRank");
  return agree(mpi, st);
}

void nccl_destroy(NcclComm* nc) {
  if (nc->comm) ncclCommDestroy(nc->comm);
  nc->comm = nullptr;
}

Status nccl_wait(NcclComm* nc, cudaStream_t stream, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return Status::OK();
    if (e != cudaErrorNotReady) return cuda_ok(e, "waiting for the reduction");
    ncclResult_t async = ncclSuccess;
    CULPRIT_RETURN_IF_ERROR(nccl_ok(ncclCommGetAsyncError(nc->comm, &async), "ncclCommGetAsyncError"));
    if (async != ncclSuccess && async != ncclInProgress) {
      ncclCommAbort(nc->comm);
      nc->comm = nullptr;
      return nccl_ok(async, "the reduction");
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      ncclCommAbort(nc->comm);  // unblocks the stream; the communicator is gone
      nc->comm = nullptr;
      return Status::Error(StatusCode::kSilentRank, "the NCCL reduction did not complete within " +
                                                        std::to_string(timeout_s) + " s: a rank died or is stuck");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// ---- the workspace

NcclTreeWorkspace::~NcclTreeWorkspace() {
  for (Buffer* b : {&packed_, &recv_, &staging_, &program_})
    if (b->p) cudaFree(b->p);  // errors here are moot: the context may be gone
}

template <class T>
Status NcclTreeWorkspace::grow(Buffer* b, std::size_t bytes, T** p) {
  if (b->bytes < bytes) {
    // Rare (the buffers only grow), so the simple way: the device finishes what may still read the
    // old buffer, and the new one is cleared before any stream (non-blocking ones are not ordered
    // after the legacy stream's memset) writes it.
    CULPRIT_RETURN_IF_ERROR(cuda_ok(cudaDeviceSynchronize(), "waiting before growing the reduction's buffers"));
    if (b->p) cudaFree(b->p);
    b->p = nullptr;
    b->bytes = 0;
    CULPRIT_RETURN_IF_ERROR(cuda_ok(cudaMalloc(&b->p, bytes), "allocating the reduction's buffers"));
    // Defined bytes everywhere: the allgather's padding travels too (and initcheck stays quiet).
    CULPRIT_RETURN_IF_ERROR(cuda_ok(cudaMemset(b->p, 0, bytes), "clearing the reduction's buffers"));
    CULPRIT_RETURN_IF_ERROR(cuda_ok(cudaDeviceSynchronize(), "clearing the reduction's buffers"));
    b->bytes = bytes;
  }
  *p = static_cast<T*>(b->p);
  return Status::OK();
}

const TreePlan& NcclTreeWorkspace::plan(int rank, int world, int micro_shards, std::size_t n) {
  if (!have_plan_ || plan_.rank != rank || plan_.world != world || plan_.micro_shards != micro_shards ||
      plan_.n != n) {
    plan_ = plan_tree_allreduce(rank, world, micro_shards, n);
    have_plan_ = true;
  }
  return plan_;
}

Status NcclTreeWorkspace::program(const TreePlan& plan, cudaStream_t stream, const int** p) {
  int* d = nullptr;
  CULPRIT_RETURN_IF_ERROR(grow(&program_, plan.program.size() * sizeof(int), &d));
  if (program_world_ != plan.world || program_shards_ != plan.micro_shards) {
    // On the stream (after the combines that read the old program), waited for: the plan's vector
    // is pageable memory and may be gone before a later copy would run.
    CULPRIT_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(d, plan.program.data(), plan.program.size() * sizeof(int),
                                                    cudaMemcpyHostToDevice, stream),
                                    "uploading the combine's program"));
    CULPRIT_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(stream), "uploading the combine's program"));
    program_world_ = plan.world;
    program_shards_ = plan.micro_shards;
  }
  *p = d;
  return Status::OK();
}

// ---- the reduction

Status tree_allreduce_nccl(const NcclComm& nc, int micro_shards, const std::vector<const float*>& blocks,
                           std::size_t n, float* out, cudaStream_t stream, NcclTreeWorkspace* ws, CommCheck* check) {
  const bool checking = check && check->enabled;
  if (check) check->seconds = 0;
  const int W = nc.size, me = nc.rank;
  if (checking) {
    check->sent.assign(W, 0);
    check->received.assign(W, 0);
    check->chunks.assign(W, 0);
  }
  const TreePlan& plan = ws->plan(me, W, micro_shards, n);
  if (blocks.size() != plan.blocks.size())
    return Status::Internal("tree_allreduce_nccl: " + std::to_string(blocks.size()) + " blocks given, rank " +
                            std::to_string(me) + " holds " + std::to_string(plan.blocks.size()));
  if (W == 1) return copy(out, blocks[0], n, stream);

  // Phase 1: every block's slice c to chunk owner c, packed as tree_allreduce packs it (one
  // message per peer, the same bytes as on the CPU, hence the same fingerprints).
  const float* send = blocks[0];
  if (!plan.direct) {
    float* packed = nullptr;
    CULPRIT_RETURN_IF_ERROR(ws->packed(n * blocks.size(), &packed));
    for (int c = 0; c < W; ++c) {
      const std::size_t off = chunk_offset(n, W, c), len = chunk_offset(n, W, c + 1) - off;
      for (std::size_t b = 0; b < blocks.size(); ++b)
        CULPRIT_RETURN_IF_ERROR(copy(packed + plan.send_displ[c] + b * len, blocks[b] + off, len, stream));
    }
    send = packed;
  }
  float* recv = nullptr;
  CULPRIT_RETURN_IF_ERROR(ws->recv(plan.recv_total, &recv));
  if (checking)
    CULPRIT_RETURN_IF_ERROR(timed_check(check, stream, [&]() -> Status {
      for (int c = 0; c < W; ++c)
        if (c != me) CULPRIT_RETURN_IF_ERROR(fp(send + plan.send_displ[c], plan.send_count[c], &check->sent[c]));
      return Status::OK();
    }));
  // This rank's own slices never leave the device (as MPI's message to itself never leaves the process).
  CULPRIT_RETURN_IF_ERROR(copy(recv + plan.recv_displ[me], send + plan.send_displ[me], plan.send_count[me], stream));
  // Counts agree pairwise (rank r's send_count[c] is rank c's recv_count[r]: test_tree_plan), so
  // skipping the empty ones (fewer values than ranks) skips both ends.
  CULPRIT_RETURN_IF_ERROR(nccl_ok(ncclGroupStart(), "ncclGroupStart"));
  for (int c = 0; c < W; ++c)
    if (c != me && plan.send_count[c])
      CULPRIT_RETURN_IF_ERROR(nccl_ok(
          ncclSend(send + plan.send_displ[c], plan.send_count[c], ncclFloat32, c, nc.comm, stream), "ncclSend"));
  for (int r = 0; r < W; ++r)
    if (r != me && plan.recv_count[r])
      CULPRIT_RETURN_IF_ERROR(nccl_ok(
          ncclRecv(recv + plan.recv_displ[r], plan.recv_count[r], ncclFloat32, r, nc.comm, stream), "ncclRecv"));
  CULPRIT_RETURN_IF_ERROR(nccl_ok(ncclGroupEnd(), "the reduction's exchange (ncclGroupEnd)"));
  if (checking)
    CULPRIT_RETURN_IF_ERROR(timed_check(check, stream, [&]() -> Status {
      for (int r = 0; r < W; ++r)
        if (r != me) CULPRIT_RETURN_IF_ERROR(fp(recv + plan.recv_displ[r], plan.recv_count[r], &check->received[r]));
      return Status::OK();
    }));

  // The combine, then phase 2. ncclAllGather wants equal counts: when W divides n the chunks are
  // equal and it runs in place in `out`; otherwise through a buffer of W chunks of the longest length.
  const bool equal = n % static_cast<std::size_t>(W) == 0;
  const std::size_t L = (n + W - 1) / W;
  float* staging = nullptr;
  if (!equal) CULPRIT_RETURN_IF_ERROR(ws->staging(L * W, &staging));
  float* mine = equal ? out + plan.chunk_off : staging + me * L;
  CULPRIT_RETURN_IF_ERROR(tree_combine_device(plan, recv, mine, stream, ws));
  if (checking)
    CULPRIT_RETURN_IF_ERROR(timed_check(check, stream, [&] { return fp(mine, plan.chunk_len, &check->chunks[me]); }));
  CULPRIT_RETURN_IF_ERROR(nccl_ok(ncclAllGather(mine, equal ? out : staging, equal ? n / W : L, ncclFloat32, nc.comm,
                                                stream), "the reduction's allgather"));
  if (!equal)
    for (int c = 0; c < W; ++c)
      CULPRIT_RETURN_IF_ERROR(copy(out + chunk_offset(n, W, c), staging + c * L,
                                   chunk_offset(n, W, c + 1) - chunk_offset(n, W, c), stream));
  if (checking)
    CULPRIT_RETURN_IF_ERROR(timed_check(check, stream, [&]() -> Status {
      for (int c = 0; c < W; ++c)
        if (c != me)
          CULPRIT_RETURN_IF_ERROR(fp(out + chunk_offset(n, W, c), chunk_offset(n, W, c + 1) - chunk_offset(n, W, c),
                                     &check->chunks[c]));
      return Status::OK();
    }));
  return Status::OK();
}

}  // namespace culprit::cuda
