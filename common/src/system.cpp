// What the machine reports about itself (culprit/system.h).
#include "culprit/system.h"

#include <sched.h>
#include <unistd.h>

#include <cstdio>
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

Status check_fits_memory(const std::string& what, double bytes) {
  const std::uint64_t mem = system_memory_bytes();
  // A double: products of option values may exceed every integer type long before they are refused.
  if (mem == 0 || !(bytes > static_cast<double>(mem))) return Status::OK();
  return Status::BadInput(what + " needs about " + human_bytes(bytes) + " per rank, more than the " + human_bytes(static_cast<double>(mem)) +
                          " of memory the system reports (sysconf _SC_PHYS_PAGES)");
}

}  // namespace culprit
