// What the machine reports about itself: the cores a rank may use and the memory it has. Option
// bounds (culprit/options.h) and the size checks before large allocations ask here, so their error
// messages can say what the system reported.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "culprit/status.h"

namespace culprit {

// The cores this process may run on: sched_getaffinity's count (what mpirun's or Slurm's binding
// leaves it), else std::thread::hardware_concurrency(), else 1. Never 0.
int system_cores();
// "the system reports 16 cores (sched_getaffinity)": the reason in a bound's error message.
std::string cores_reason();

// Physical memory of the machine in bytes: sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE); 0 when
// the system does not say.
std::uint64_t system_memory_bytes();

// "1.5 GiB": bytes for people.
std::string human_bytes(double bytes);

// The memory this process may still take, and why: the machine's (sysconf) or, when lower, what
// its address-space limit (RLIMIT_AS, `ulimit -v`) leaves beside what the process maps already.
// 0: the system does not say.
std::uint64_t usable_memory_bytes(std::string* why = nullptr);

// BadInput when `bytes` (an estimate of what `what` needs per rank) exceeds usable_memory_bytes(),
// with the estimate and the memory in the message; OK when it fits or the system does not say.
Status check_fits_memory(const std::string& what, double bytes);

// Whether this process holds (nearly) all the file descriptors RLIMIT_NOFILE allows it (`ulimit
// -n`); *detail: "19 of 21 open (ulimit -n)".
bool out_of_file_descriptors(std::string* detail = nullptr);

// Whether an exception is an allocation that failed (std::bad_alloc, libtorch's allocator).
bool is_out_of_memory(const std::exception& e);
// The one line for an allocation that failed in `what`: BadInput (the run does not fit the memory
// this rank may use), naming the limits and what to do.
Status out_of_memory(const std::string& what);

// Memory measured (--memory-metrics): this process's peak resident set since the last reset
// (VmHWM of /proc/self/status; 0 when unreadable), the reset (writing 5 to /proc/self/clear_refs:
// the peak restarts at what is resident now), and how many bytes of [p, p + n) are resident now
// (mincore).
std::uint64_t peak_rss_bytes();
void reset_peak_rss();
std::uint64_t resident_bytes(const void* p, std::size_t n);

}  // namespace culprit
