// fp1 fingerprints of tensors in GPU memory (docs/fingerprint.md, docs/cuda.md), without copying the
// tensor to the host: a kernel hashes every 4 KiB chunk on the device (xxh3_chunk.h) and only the
// chunk hashes (8 bytes per 4 KiB) come back to be combined as on the CPU. Bitwise the same
// fingerprint as fingerprint_bytes() of the same bytes. Built when nvcc is found (CULPRIT_HAVE_CUDA);
// this header needs no CUDA headers.
#pragma once
#include <cstddef>
#include <string>

#include "culprit/fingerprint.h"
#include "culprit/status.h"

namespace culprit::cuda {

// Devices visible to this process (0 when there is no driver or device; *why says why).
int device_count(std::string* why);
// Whether a CUDA device can be used; *why says why not.
inline bool device_available(std::string* why) { return device_count(why) > 0; }
// The chunk-hash kernels: eight threads per 4 KiB chunk, each owning one of XXH3's accumulator lanes
// (the default: a group's loads coalesce), or one thread per chunk (kept as a cross-check and for
// the bandwidth comparison). Both give the same fingerprint.
enum class Kernel { kLanes, kThreadPerChunk };
// fp1 of nbytes at device_ptr (device memory of the current device).
Status fingerprint_device(const void* device_ptr, std::size_t nbytes, Fingerprint* out, Kernel kernel = Kernel::kLanes);
// The same for memory of device `device` (made current first), after everything queued on that
// device has finished: for tensors another library (libtorch) computed.
Status fingerprint_on(int device, const void* device_ptr, std::size_t nbytes, Fingerprint* out);
// For tests and the GPU check: copies host bytes to the device, fingerprints them there.
Status fingerprint_via_device(const void* host, std::size_t nbytes, Fingerprint* out, Kernel kernel = Kernel::kLanes);
// For the GPU check: a kernel's and a device-to-device copy's bandwidth on nbytes (GB/s), best of
// `reps`.
Status bandwidth(std::size_t nbytes, int reps, Kernel kernel, double* fingerprint_gbs, double* copy_gbs);

}  // namespace culprit::cuda
