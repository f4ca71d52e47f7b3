#include "culprit/screen_cuda.h"

#include <cuda_runtime.h>

#include "culprit/fingerprint_cuda.h"
#include "culprit/screen_kernels.h"

namespace culprit::cuda {

namespace {

// Every product and sum rounded on its own (__fmul_rn/__fadd_rn are never fused), as on the CPU.
__global__ void fill(float* a, float* b, std::size_t nn) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nn) return;
  a[i] = screen::input_value(0, i);
  b[i] = screen::input_value(1, i);
}

__global__ void matmul(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float acc = 0.0f;
  for (int k = 0; k < n; ++k) acc = __fadd_rn(acc, __fmul_rn(a[i * n + k], b[k * n + j]));
  c[i * n + j] = acc;
}

__global__ void reduce_rows(const float* a, const float* b, float* r, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) acc = __fadd_rn(acc, __fmul_rn(a[i * n + j], b[i * n + j]));
  r[i] = acc;
}

__global__ void pointwise(const float* a, const float* b, float* p, std::size_t nn) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nn) return;
  const float num = __fadd_rn(__fmul_rn(a[i], b[i]), a[i]);
  const float den = __fadd_rn(1.0f, __fmul_rn(b[i], b[i]));
  p[i] = __fdiv_rn(num, den);
}

Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::Internal(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

struct Buffers {
  float* p[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};  // a, b, matmul, reduce, pointwise
  ~Buffers() {
    for (float* q : p)
      if (q) cudaFree(q);
  }
};

}  // namespace

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "cuda:" + std::to_string(device);
  return "cuda:" + std::to_string(device) + " (" + prop.name + ")";
}

Status screen_once(int device, int n, const ScreenFlip& flip, Fingerprint out[3]) {
  CULPRIT_RETURN_IF_ERROR(check(cudaSetDevice(device), "selecting the device"));
  const std::size_t nn = static_cast<std::size_t>(n) * n;
  const std::size_t sizes[5] = {nn, nn, nn, static_cast<std::size_t>(n), nn};
  Buffers buf;
  for (int i = 0; i < 5; ++i)
    CULPRIT_RETURN_IF_ERROR(check(cudaMalloc(&buf.p[i], sizes[i] * sizeof(float)), "allocating"));
  const unsigned t = 128;
  fill<<<static_cast<unsigned>((nn + t - 1) / t), t>>>(buf.p[0], buf.p[1], nn);
  matmul<<<dim3((n + t - 1) / t, n), t>>>(buf.p[0], buf.p[1], buf.p[2], n);
  reduce_rows<<<(n + t - 1) / t, t>>>(buf.p[0], buf.p[1], buf.p[3], n);
  pointwise<<<static_cast<unsigned>((nn + t - 1) / t), t>>>(buf.p[0], buf.p[1], buf.p[4], nn);
  CULPRIT_RETURN_IF_ERROR(check(cudaGetLastError(), "launching the screen kernels"));
  CULPRIT_RETURN_IF_ERROR(check(cudaDeviceSynchronize(), "running the screen kernels"));
  if (flip.test >= 0 && flip.test < 3) {
    float* r = buf.p[2 + flip.test];
    const std::size_t i = flip.index % sizes[2 + flip.test];
    unsigned v = 0;
    CULPRIT_RETURN_IF_ERROR(check(cudaMemcpy(&v, r + i, 4, cudaMemcpyDeviceToHost), "reading a result"));
    v ^= 1u << (flip.bit & 31);
    CULPRIT_RETURN_IF_ERROR(check(cudaMemcpy(r + i, &v, 4, cudaMemcpyHostToDevice), "flipping a bit"));
  }
  for (int k = 0; k < 3; ++k)
    CULPRIT_RETURN_IF_ERROR(fingerprint_device(buf.p[2 + k], sizes[2 + k] * sizeof(float), &out[k]));
  return Status::OK();
}

}  // namespace culprit::cuda
