#include "detect.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "culprit/exit_codes.h"
#include "culprit/watchdog.h"

namespace culprit::harness {

const char* class_name(IncidentClass c) {
  switch (c) {
    case IncidentClass::kHardware: return "hardware";
    case IncidentClass::kNumerical: return "numerical";
    case IncidentClass::kInvariant: return "invariant";
  }
  return "?";
}

int exit_code_for(IncidentClass c) {
  switch (c) {
    case IncidentClass::kHardware: return kExitHardware;
    case IncidentClass::kNumerical: return kExitNumerical;
    case IncidentClass::kInvariant: return kExitInvariant;
  }
  return kExitFailure;
}

Status log_incident(const std::string& run_dir, const Incident& inc) {
  char when[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::string slurm = job ? job : "";
  namespace fs = std::filesystem;
  std::ofstream log(fs::path(run_dir) / "incidents.log", std::ios::app);
  // Values are quoted when they hold spaces; the message last.
  log << "time=" << when << " step=" << inc.step << " detector=" << inc.detector << " class=" << class_name(inc.cls)
      << " rank=" << inc.rank << " host=" << (inc.host.empty() ? "-" : inc.host)
      << " device=" << (inc.device.empty() ? "-" : inc.device) << " slurm_job_id=" << (slurm.empty() ? "-" : slurm)
      << " message=\"" << inc.message << "\"\n";
  nlohmann::ordered_json j = {{"time", when},      {"step", inc.step},    {"detector", inc.detector},
                              {"class", class_name(inc.cls)}, {"rank", inc.rank}, {"host", inc.host},
                              {"device", inc.device}, {"slurm_job_id", slurm}, {"message", inc.message}};
  std::ofstream jl(fs::path(run_dir) / "incidents.jsonl", std::ios::app);
  jl << j.dump() << "\n";
  if (!log || !jl) return Status::Error("cannot append to the incident log in '" + run_dir + "'");
  return Status::OK();
}

ReplicaCheck compare_replicas(int world, const std::vector<Fingerprint>& all, const std::vector<std::string>& names) {
  ReplicaCheck out;
  if (world == 1) return out;
  const int n = static_cast<int>(names.size());
  // Each rank's set, compared as a whole; the majority set wins (ties: rank 0's).
  std::map<std::vector<Fingerprint>, int> votes;
  std::vector<std::vector<Fingerprint>> sets(world);
  for (int r = 0; r < world; ++r) {
    sets[r].assign(all.begin() + static_cast<std::ptrdiff_t>(r) * n, all.begin() + static_cast<std::ptrdiff_t>(r + 1) * n);
    votes[sets[r]]++;
  }
  const std::vector<Fingerprint>* majority = &sets[0];
  for (const auto& [set, count] : votes)
    if (count > votes[*majority]) majority = &set;
  for (int r = 0; r < world; ++r) {
    if (sets[r] == *majority) continue;
    out.diverged = true;
    out.odd_ranks.push_back(r);
    if (out.first_param.empty())
      for (int i = 0; i < n; ++i)
        if (sets[r][i] != (*majority)[i]) {
          out.first_param = names[i];
          break;
        }
  }
  return out;
}

bool SpikeDetector::observe(double v, std::string* why) {
  if (!std::isfinite(v) || window_ <= 0) return false;
  bool spike = false;
  if (static_cast<int>(recent_.size()) >= std::max(4, window_ / 2)) {
    std::vector<double> sorted = recent_;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::vector<double> dev;
    for (double x : recent_) dev.push_back(std::fabs(x - median));
    std::sort(dev.begin(), dev.end());
    const double mad = dev[dev.size() / 2];
    const double z = (v - median) / (1.4826 * mad + 1e-12 * std::max(1.0, std::fabs(median)));
    const double top = sorted.back();
    if (z > z_ && v > ratio_ * top) {
      spike = true;
      char buf[200];
      std::snprintf(buf, sizeof buf, "%.6g against a median of %.6g (robust z %.1f, %.1fx the recent maximum %.6g)", v,
                    median, z, v / top, top);
      *why = buf;
    }
  }
  // A spike does not become the new normal.
  if (!spike) {
    recent_.push_back(v);
    if (static_cast<int>(recent_.size()) > window_) recent_.erase(recent_.begin());
  }
  return spike;
}

}  // namespace culprit::harness
