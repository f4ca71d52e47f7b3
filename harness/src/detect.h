// Online detection: incident records, the replica-divergence check, exit codes per class.
// No libtorch here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/mpi_util.h"
#include "culprit/status.h"

namespace culprit::harness {

enum class IncidentClass { kHardware, kNumerical, kInvariant };
const char* class_name(IncidentClass c);
int exit_code_for(IncidentClass c);

struct Incident {
  std::int64_t step = 0;
  std::string detector;  // "nonfinite", "replica-divergence", ...
  IncidentClass cls = IncidentClass::kNumerical;
  int rank = -1;         // the rank blamed, -1: none
  std::string host, device;
  std::string message;
};

// Appends to RUN/incidents.log (one key=value line) and RUN/incidents.jsonl. Rank 0 only.
Status log_incident(const std::string& run_dir, const Incident& inc);

// Compares every rank's parameter fingerprints (all: `world` sets of names.size(), rank by rank).
// On disagreement, the ranks whose set differs from the majority are "odd" and first_param names
// the first parameter (state-dict order) where an odd rank differs.
struct ReplicaCheck {
  bool diverged = false;
  std::vector<int> odd_ranks;
  std::string first_param;
};
ReplicaCheck compare_replicas(int world, const std::vector<Fingerprint>& all, const std::vector<std::string>& names);

// Spikes in a series (loss, gradient norm): a robust z-score over the last `window` values
// (median and MAD) above `z`, guarded by a ratio: the value must also exceed `ratio` times the
// largest of those values. Needs half a window of history. Non-finite values are the nonfinite
// detector's and are not added.
class SpikeDetector {
 public:
  void configure(int window, double z, double ratio) { window_ = window, z_ = z, ratio_ = ratio; }
  bool observe(double v, std::string* why);

 private:
  int window_ = 0;
  double z_ = 8, ratio_ = 3;
  std::vector<double> recent_;
};

}  // namespace culprit::harness
