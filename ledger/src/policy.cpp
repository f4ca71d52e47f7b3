// The drain policy over the ledger's rows (docs/ledger.md, "Policy"): pure, no SQLite.
#include <algorithm>
#include <cstdio>
#include <set>

#include "culprit/ledger.h"

namespace culprit::ledger {

namespace {

// The policy's kinds and the verdicts each counts. `hardware` (a halt's exit 10, no bisection yet)
// blames a device on the record alone, as hardware-unconfirmed does: it counts with it.
struct Kind {
  const char* option;                  // the policy's option
  int Policy::*threshold;
  std::vector<const char*> verdicts;
};
const std::vector<Kind>& kinds() {
  static const std::vector<Kind> k = {
      {"persistent", &Policy::persistent, {"hardware-persistent"}},
      {"transient", &Policy::transient, {"hardware-transient"}},
      {"silent", &Policy::silent, {"silent-rank"}},
      {"unconfirmed", &Policy::unconfirmed, {"hardware-unconfirmed", "hardware"}},
  };
  return k;
}

// The fault a row is about: (verdict, run, step); without a step (a silent rank), (verdict, run, job).
std::string fault_key(const Entry& e) {
  return e.verdict + '\x1f' + e.run + '\x1f' + (e.step >= 0 ? "s" + std::to_string(e.step) : "j" + e.job);
}

void decide(const Policy& policy, HostSummary* h) {
  for (const auto& k : kinds()) {
    int n = 0;
    std::string names;
    for (const char* v : k.verdicts) {
      const auto it = h->findings.find(v);
      if (it == h->findings.end()) continue;
      n += it->second;
      names += (names.empty() ? "" : "/") + std::string(v);
    }
    const int threshold = policy.*k.threshold;
    if (threshold <= 0 || n == 0) continue;
    h->score += static_cast<double>(n) / threshold;
    if (n < threshold) continue;
    h->drain = true;
    h->why += (h->why.empty() ? "" : ", ") + std::to_string(n) + " " + names + " (--" + k.option + " " +
              std::to_string(threshold) + ")";
  }
}

}  // namespace

std::vector<HostSummary> summarize(const std::vector<Entry>& rows, const Policy& policy) {
  struct Acc {
    HostSummary s;
    // Findings: a job's own verdict (an action other than none) is one per (fault, job): a fault
    // that recurs at the same step of the same run in the next job of a chain (a transient retried
    // on the same node) is a second finding, which is the pattern the policy is for. A row without
    // an action (a post-mortem bisection repeating the in-job diagnosis, a record by hand) is the
    // same fault as any other row about it, and counts only when nothing else does.
    std::set<std::string> job_findings, faults_by_jobs, faults_by_others, runs, jobs, devices;
    std::int64_t last_id = -1;
  };
  std::map<std::string, Acc> by_host;
  for (const auto& e : rows) {
    Acc& a = by_host[e.host];
    a.s.host = e.host;
    ++a.s.rows;
    const std::string fault = fault_key(e);
    if (e.action != "none") {
      a.faults_by_jobs.insert(fault);
      if (a.job_findings.insert(fault + '\x1f' + e.job).second) ++a.s.findings[e.verdict];
    } else {
      a.faults_by_others.insert(fault + '\x1e' + e.verdict);
    }
    a.runs.insert(e.run);
    if (!e.job.empty()) a.jobs.insert(e.job);
    if (!e.device.empty()) a.devices.insert(e.device);
    if (a.s.first.empty() || e.time < a.s.first) a.s.first = e.time;
    if (e.time > a.s.last) a.s.last = e.time;
    if (e.id >= a.last_id) {  // the newest row's action: what was done last
      a.last_id = e.id;
      a.s.last_action = e.action;
    }
  }
  std::vector<HostSummary> out;
  for (auto& [host, a] : by_host) {
    for (const auto& k : a.faults_by_others) {
      const auto sep = k.rfind('\x1e');
      if (!a.faults_by_jobs.count(k.substr(0, sep))) ++a.s.findings[k.substr(sep + 1)];
    }
    a.s.runs = static_cast<int>(a.runs.size());
    a.s.jobs = static_cast<int>(a.jobs.size());
    a.s.devices.assign(a.devices.begin(), a.devices.end());
    decide(policy, &a.s);
    out.push_back(std::move(a.s));
  }
  // Over the policy first, then the most findings for the policy's sake, the most findings of any
  // kind, the latest.
  const auto total = [](const HostSummary& h) {
    int n = 0;
    for (const auto& f : h.findings) n += f.second;
    return n;
  };
  std::sort(out.begin(), out.end(), [&](const HostSummary& x, const HostSummary& y) {
    if (x.drain != y.drain) return x.drain;
    if (x.score != y.score) return x.score > y.score;
    if (total(x) != total(y)) return total(x) > total(y);
    if (x.last != y.last) return x.last > y.last;
    return x.host < y.host;
  });
  return out;
}

}  // namespace culprit::ledger
