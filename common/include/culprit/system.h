// What the machine reports about itself: the cores a rank may use and the memory it has. Option
// bounds (culprit/options.h) and the size checks before large allocations ask here, so their error
// messages can say what the system reported.
#pragma once
#include <cstdint>
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

// BadInput when `bytes` (an estimate of what `what` needs per rank) exceeds the machine's memory,
// with the estimate and the memory in the message; OK when it fits or the system does not say.
Status check_fits_memory(const std::string& what, double bytes);

}  // namespace culprit
