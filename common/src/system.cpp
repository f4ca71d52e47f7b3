// What the machine reports about itself (culprit/system.h).
#include "culprit/system.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include <filesystem>
#include <new>
#include <thread>

namespace culprit {

namespace {
// Where system_cores() got its count, for the message.
int cores(const char** source) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) {
    *source = "sched_getaffinity";
    return CPU_COUNT(&set);
  }
  *source = "std::thread::hardware_concurrency";
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}
}  // namespace

int system_cores() {
  const char* source = nullptr;
  return cores(&source);
}

std::string cores_reason() {
  const char* source = nullptr;
  const int n = cores(&source);
  return "the system reports " + std::to_string(n) + (n == 1 ? " core" : " cores") + " for this process (" + source + ")";
}

std::uint64_t system_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f %s", bytes, units[u]);
  else std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
  return buf;
}

std::uint64_t usable_memory_bytes(std::string* why) {
  const std::uint64_t mem = system_memory_bytes();
  if (why) *why = "memory the system reports (sysconf _SC_PHYS_PAGES)";
  struct rlimit lim;
  if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return mem;
  // What the process maps already (its libraries, MPI's segments, its heap) counts against the limit.
  std::uint64_t mapped = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long pages = 0;
    if (std::fscanf(f, "%llu", &pages) == 1) mapped = pages * static_cast<std::uint64_t>(sysconf(_SC_PAGE_SIZE));
    std::fclose(f);
  }
  const std::uint64_t left = lim.rlim_cur > mapped ? lim.rlim_cur - mapped : 0;
  if (mem != 0 && left >= mem) return mem;
  if (why)
    *why = "address space left under this process's limit (ulimit -v " + human_bytes(static_cast<double>(lim.rlim_cur)) +
           ", " + human_bytes(static_cast<double>(mapped)) + " of it mapped already)";
  return left;
}

Status check_fits_memory(const std::string& what, double bytes) {
  std::string why;
  const std::uint64_t mem = usable_memory_bytes(&why);
  // A double: products of option values may exceed every integer type long before they are refused.
  if (mem == 0 || !(bytes > static_cast<double>(mem))) return Status::OK();
  return Status::BadInput(what + " needs about " + human_bytes(bytes) + " per rank, more than the " +
                          human_bytes(static_cast<double>(mem)) + " of " + why);
}

bool out_of_file_descriptors(std::string* detail) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return false;
  std::error_code ec;
  std::uint64_t open = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++open;
  // Every descriptor taken: not even the directory opens.
  const bool none_left = ec == std::errc::too_many_files_open;
  // 4: the directory's own descriptor, and those a failed call closed on its way out (a library
  // that could not open its third file closes its first two).
  if (!none_left && (ec || open + 4 < lim.rlim_cur)) return false;
  if (detail)
    *detail = (none_left ? std::string("all ") + std::to_string(lim.rlim_cur) : std::to_string(open) + " of " +
                                                                                  std::to_string(lim.rlim_cur)) +
              " open, ulimit -n";
  return true;
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const std::string w = e.what();
  // libtorch's CPU allocator ("DefaultCPUAllocator: can't allocate memory") and CUDA's.
  return w.find("can't allocate memory") != std::string::npos || w.find("CUDA out of memory") != std::string::npos;
}

Status out_of_memory(const std::string& what) {
  std::string why;
  const std::uint64_t mem = usable_memory_bytes(&why);
  return Status::BadInput(what + ": out of memory (" + (mem ? human_bytes(static_cast<double>(mem)) + " of " + why : why) +
                          "): the run needs more than this rank may use; raise the limit, or shrink the model, "
                          "--global-batch or --micro-shards per rank");
}

std::uint64_t peak_rss_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return static_cast<std::uint64_t>(kib) * 1024;
}

void reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return;
  std::fputs("5", f);
  std::fclose(f);
}

std::uint64_t resident_bytes(const void* p, std::size_t n) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const auto hi = (reinterpret_cast<std::uintptr_t>(p) + n + page - 1) / page * page;
  if (n == 0) return 0;
  std::vector<unsigned char> in((hi - lo) / page);
  if (::mincore(reinterpret_cast<void*>(lo), hi - lo, in.data()) != 0) return 0;
  std::uint64_t pages = 0;
  for (unsigned char c : in) pages += c & 1;
  return pages * page;
}

}  // namespace culprit
