#include "culprit/fingerprint_cuda.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_generateSecret_fromSeed: the default secret, from libxxhash
#include <cuda_runtime.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "culprit/xxh3_chunk.h"

namespace culprit::cuda {

namespace {

__constant__ __align__(8) unsigned char d_secret[xxh3::kSecretSize];

// Eight threads per 4 KiB chunk (xxh3::lane_long): thread j of a group owns accumulator lane j and
// reads 16 contiguous bytes of every stripe, so a group reads whole 64-byte stripes together; lane 0
// merges. Chunks of 240 bytes or less (only a tensor's last chunk can be that short) take hash64 on
// lane 0. The secret is copied to shared memory: lanes read different words of it at once, which
// constant memory would serialise. Needs blockDim.x == kLanesBlock.
constexpr unsigned kLanes = 8, kLanesBlock = 128;
__global__ void chunk_hashes_lanes(const unsigned char* data, std::size_t n, std::size_t nchunks, std::uint64_t* out) {
  __shared__ std::uint64_t sec_words[xxh3::kSecretSize / 8];
  __shared__ std::uint64_t acc[kLanesBlock];
  for (unsigned i = threadIdx.x; i < xxh3::kSecretSize / 8; i += blockDim.x)
    sec_words[i] = reinterpret_cast<const std::uint64_t*>(d_secret)[i];
  __syncthreads();
  const unsigned char* sec = reinterpret_cast<const unsigned char*>(sec_words);
  const int j = static_cast<int>(threadIdx.x % kLanes);
  const std::size_t c = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const std::size_t off = c * kFingerprintChunkBytes;
  const std::size_t len = c >= nchunks ? 0 : n - off < kFingerprintChunkBytes ? n - off : kFingerprintChunkBytes;
  if (len > 240) acc[threadIdx.x] = xxh3::lane_long(data + off, len, sec, j);
  __syncwarp();  // a group lies within one warp (kLanes divides 32); every thread reaches this
  if (c >= nchunks || j != 0) return;
  out[c] = len > 240 ? xxh3::merge_long(acc + threadIdx.x, len, sec) : xxh3::hash64(data + off, len, sec);
}

// One thread per 4 KiB chunk.
__global__ void chunk_hashes(const unsigned char* data, std::size_t n, std::size_t nchunks, std::uint64_t* out) {
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= nchunks) return;
  const std::size_t off = c * kFingerprintChunkBytes;
  const std::size_t len = n - off < kFingerprintChunkBytes ? n - off : kFingerprintChunkBytes;
  out[c] = xxh3::hash64(data + off, len, d_secret);
}

Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::Internal(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

// The secret lives in each device's constant memory: uploaded once per device.
Status upload_secret() {
  int device = 0;
  CULPRIT_RETURN_IF_ERROR(check(cudaGetDevice(&device), "querying the current device"));
  static std::set<int> done_on;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (done_on.count(device)) return Status::OK();
  unsigned char secret[xxh3::kSecretSize];
  XXH3_generateSecret_fromSeed(secret, 0);  // seed 0: XXH3's default secret
  CULPRIT_RETURN_IF_ERROR(check(cudaMemcpyToSymbol(d_secret, secret, sizeof secret), "copying the secret"));
  done_on.insert(device);
  return Status::OK();
}

// A device buffer freed at scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};

// The chunk hashes' device buffer, kept per thread and device and grown as needed: fingerprints of
// many small tensors (per-layer traces) then cost a launch and a copy each, not a cudaMalloc and a
// synchronising cudaFree. Freed when the thread ends (errors there are moot: the context may be gone).
struct HashWorkspace {
  std::map<int, std::pair<void*, std::size_t>> by_device;
  ~HashWorkspace() {
    for (auto& [device, buf] : by_device) {
      if (cudaSetDevice(device) == cudaSuccess) cudaFree(buf.first);
    }
  }
};

Status hash_buffer(std::size_t bytes, std::uint64_t** out) {
  int device = 0;
  CULPRIT_RETURN_IF_ERROR(check(cudaGetDevice(&device), "querying the current device"));
  thread_local HashWorkspace ws;
  auto& [p, size] = ws.by_device[device];
  if (size < bytes) {
    if (p) cudaFree(p);
    p = nullptr;
    size = 0;
    const std::size_t want = std::max<std::size_t>(bytes, 4096);
    CULPRIT_RETURN_IF_ERROR(check(cudaMalloc(&p, want), "allocating chunk hashes"));
    size = want;
  }
  *out = static_cast<std::uint64_t*>(p);
  return Status::OK();
}

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
    return 0;
  }
  return n;
}

Status fingerprint_device(const void* device_ptr, std::size_t nbytes, Fingerprint* out, Kernel kernel) {
  if (nbytes == 0) {
    *out = combine_chunk_hashes(nullptr, 0);
    return Status::OK();
  }
  CULPRIT_RETURN_IF_ERROR(upload_secret());
  const std::size_t nchunks = (nbytes + kFingerprintChunkBytes - 1) / kFingerprintChunkBytes;
  std::uint64_t* hashes = nullptr;
  CULPRIT_RETURN_IF_ERROR(hash_buffer(nchunks * sizeof(std::uint64_t), &hashes));
  const auto* data = static_cast<const unsigned char*>(device_ptr);
  if (kernel == Kernel::kLanes) {
    const unsigned blocks = static_cast<unsigned>((nchunks * kLanes + kLanesBlock - 1) / kLanesBlock);
    chunk_hashes_lanes<<<blocks, kLanesBlock>>>(data, nbytes, nchunks, hashes);
  } else {
    const unsigned threads = 128;
    const unsigned blocks = static_cast<unsigned>((nchunks + threads - 1) / threads);
    chunk_hashes<<<blocks, threads>>>(data, nbytes, nchunks, hashes);
  }
  CULPRIT_RETURN_IF_ERROR(check(cudaGetLastError(), "launching the fingerprint kernel"));
  std::vector<std::uint64_t> host(nchunks);
  CULPRIT_RETURN_IF_ERROR(check(cudaMemcpy(host.data(), hashes, nchunks * sizeof(std::uint64_t),
                                           cudaMemcpyDeviceToHost), "copying chunk hashes"));
  *out = combine_chunk_hashes(host.data(), nchunks);
  return Status::OK();
}

Status fingerprint_on(int device, const void* device_ptr, std::size_t nbytes, Fingerprint* out) {
  CULPRIT_RETURN_IF_ERROR(check(cudaSetDevice(device), "selecting the device"));
  // Work queued by another library (libtorch) on this device's legacy default stream is ordered
  // before ours; a full synchronisation also covers its other streams.
  CULPRIT_RETURN_IF_ERROR(check(cudaDeviceSynchronize(), "waiting for the device"));
  return fingerprint_device(device_ptr, nbytes, out);
}

Status fingerprint_via_device(const void* host, std::size_t nbytes, Fingerprint* out, Kernel kernel) {
  DeviceBuffer d;
  if (nbytes) {
    CULPRIT_RETURN_IF_ERROR(check(cudaMalloc(&d.p, nbytes), "allocating"));
    CULPRIT_RETURN_IF_ERROR(check(cudaMemcpy(d.p, host, nbytes, cudaMemcpyHostToDevice), "copying to the device"));
  }
  return fingerprint_device(d.p, nbytes, out, kernel);
}

Status bandwidth(std::size_t nbytes, int reps, Kernel kernel, double* fingerprint_gbs, double* copy_gbs) {
  DeviceBuffer a, b;
  CULPRIT_RETURN_IF_ERROR(check(cudaMalloc(&a.p, nbytes), "allocating"));
  CULPRIT_RETURN_IF_ERROR(check(cudaMalloc(&b.p, nbytes), "allocating"));
  CULPRIT_RETURN_IF_ERROR(check(cudaMemset(a.p, 0x5a, nbytes), "filling"));
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  float best_fp = 1e30f, best_copy = 1e30f;
  Fingerprint fp = 0;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    float ms = 0;
    cudaEventRecord(t0);
    CULPRIT_RETURN_IF_ERROR(fingerprint_device(a.p, nbytes, &fp, kernel));
    cudaEventRecord(t1);
    cudaEventSynchronize(t1);
    cudaEventElapsedTime(&ms, t0, t1);
    best_fp = std::min(best_fp, ms);
    cudaEventRecord(t0);
    CULPRIT_RETURN_IF_ERROR(check(cudaMemcpy(b.p, a.p, nbytes, cudaMemcpyDeviceToDevice), "copying"));
    cudaEventRecord(t1);
    cudaEventSynchronize(t1);
    cudaEventElapsedTime(&ms, t0, t1);
    best_copy = std::min(best_copy, ms);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  *fingerprint_gbs = static_cast<double>(nbytes) / (best_fp * 1e-3) / 1e9;
  *copy_gbs = static_cast<double>(nbytes) / (best_copy * 1e-3) / 1e9;  // bytes read (a copy also writes them)
  return Status::OK();
}

}  // namespace culprit::cuda
