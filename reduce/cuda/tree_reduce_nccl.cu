// The tree's arithmetic on the device (docs/cuda.md, "Deterministic reduction over NCCL (design)"):
// the chunk owner's combine and the accumulator's add. Each element is reduced by one thread, with
// __fadd_rn (IEEE round-to-nearest float32 addition, which the compiler never fuses or reorders),
// in the order TreePlan::program gives, which is tree_allreduce's. This file is compiled with
// -ftz=false whatever the build's flags (common/CMakeLists.txt): flushing subnormal sums to zero
// would change bits the CPU keeps.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "culprit/tree_reduce_nccl.h"

namespace culprit::cuda {

namespace {

// The program's stack never holds more than log2(M) + 1 nodes (it is the binary decomposition of
// the leaves combined so far, plus the node just pushed): 32 covers every int M.
constexpr int kMaxDepth = 32;
constexpr unsigned kThreads = 256;

// out[i] = the root of the program over slot s's element i (slot s at recv + s * len). The stack
// lives in registers or local memory; every received value is read once.
__global__ void combine_kernel(const float* __restrict__ recv, std::size_t len, const int* __restrict__ program,
                               int program_len, float* __restrict__ out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < len; i += stride) {
    float stack[kMaxDepth];
    int top = 0;
    for (int p = 0; p < program_len; ++p) {
      const int op = program[p];
      if (op >= 0) {
        stack[top++] = recv[static_cast<std::size_t>(op) * len + i];
      } else {  // TreePlan::kAdd: a (below) + b (top), as tree_add's left[i] += right[i]
        --top;
        stack[top - 1] = __fadd_rn(stack[top - 1], stack[top]);
      }
    }
    out[i] = stack[0];
  }
}

__global__ void add_kernel(float* __restrict__ left, const float* __restrict__ right, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    left[i] = __fadd_rn(left[i], right[i]);
}

unsigned grid_for(std::size_t n) {
  // A grid-stride loop: enough blocks to fill any current GPU, few enough to launch cheaply.
  return static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, 65536));
}

Status launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::OK();
  return Status::Internal(std::string("CUDA: launching ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

Status tree_combine_device(const TreePlan& plan, const float* recv, float* out, cudaStream_t stream,
                           NcclTreeWorkspace* ws) {
  if (plan.max_depth > kMaxDepth) return Status::Internal("tree_combine_device: the tree is too deep");
  if (plan.chunk_len == 0) return Status::OK();
  const int* program = nullptr;
  CULPRIT_RETURN_IF_ERROR(ws->program(plan, stream, &program));
  combine_kernel<<<grid_for(plan.chunk_len), kThreads, 0, stream>>>(recv, plan.chunk_len, program,
                                                                    static_cast<int>(plan.program.size()), out);
  return launched("the tree's combine");
}

Status tree_add_device(float* left, const float* right, std::size_t n, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(left, right, n);
  return launched("the tree's add");
}

}  // namespace culprit::cuda
