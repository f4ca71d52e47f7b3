// culprit screen: a known-answer test of every rank's compute device (docs/screen.md). Each rank
// computes the same deterministic matrix product, reduction and pointwise kernel from seeded inputs,
// again and again for --seconds; the known answer is what the majority of devices computed the first
// time (with one device: its own first result), and every repetition must reproduce it bitwise.
#pragma once
#include <string>
#include <vector>

#include "culprit/command.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/status.h"

namespace culprit::harness {

struct ScreenOptions {
  double seconds = 10;           // how long to repeat (at least one repetition)
  int size = 256;                // matrices are size x size float32
  DeviceKind device = DeviceKind::kCpu;  // cuda: the GPU of the rank's local index (docs/screen.md)
  std::vector<std::string> inject;  // --inject SPECs: layer = a test's name, step = a repetition
  std::string report;            // JSON report path ("" = none)
  int threads = 1;
};

// The tests' names, in order (valid layer= values of an injection).
std::vector<std::string> screen_tests();

// Collective. Rank 0 prints a verdict per device (rank, host, device) and the `--exclude` list of the
// hosts with a failed device, and writes the JSON report (records::ScreenReport). OK when every
// device passed; otherwise a kHardware error naming the failed devices.
Status screen(const ScreenOptions& opt, const Comm& comm);

// Its options, declared once (screen_command.cpp), and `culprit screen`.
const opts::Table<ScreenOptions>& screen_options();
cli::Command screen_command();

}  // namespace culprit::harness
