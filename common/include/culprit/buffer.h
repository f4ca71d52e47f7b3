// Byte buffers for large tensors in host memory. Buffers of 2 MiB and more are 2 MiB-aligned and
// advised as transparent huge pages: on virtual machines a 4 KiB page costs a nested page walk on
// every TLB miss, which made copying and writing 135 MB of checkpoint state several times slower.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace culprit {

template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr std::size_t kHuge = std::size_t{2} << 20;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kHuge) {
      if (void* p = std::malloc(bytes ? bytes : 1)) return static_cast<T*>(p);
      throw std::bad_alloc();
    }
    void* p = nullptr;
    const std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    if (posix_memalign(&p, kHuge, rounded) != 0) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const { return false; }
};

using ByteBuffer = std::vector<unsigned char, HugePageAllocator<unsigned char>>;

}  // namespace culprit
