// The audit and screen reports (culprit/records.h; schemas in docs/records.md): one to_json and one
// from_json per record.
#include <cstdio>
#include <filesystem>

#include "culprit/records.h"
#include "record_json.h"
#include "culprit/run_files.h"

namespace culprit::records {

namespace fs = std::filesystem;
using namespace detail;

namespace {

// ---- audit ----

json to_json(const IntervalResult& r) {
  return json{{"from", r.from},     {"to", r.to},
              {"rank", r.rank},     {"share", r.share},
              {"verdict", name_of(r.reproduced ? IntervalVerdict::kReproduced : IntervalVerdict::kMismatch)},
              {"detail", r.detail}};
}

IntervalResult interval_from(const json& j) {
  IntervalResult r;
  r.from = integer_at<std::int64_t>(j, "from");
  r.to = integer_at<std::int64_t>(j, "to");
  r.rank = integer_at<int>(j, "rank");
  r.share = integer_at<int>(j, "share");
  r.reproduced = named<IntervalVerdict>(j, "verdict") == IntervalVerdict::kReproduced;
  r.detail = j.at("detail").get<std::string>();
  return r;
}

json to_json(const AuditReport& a) {
  json j = header("audit", kAuditVersion);
  j["run_dir"] = a.run_dir;
  if (!a.merged) j["share"] = a.share;
  j["shares"] = a.shares;
  if (!a.merged) j["world_size"] = a.world_size;
  j["all_intervals"] = json::array();
  for (const auto& [from, to] : a.all_intervals) j["all_intervals"].push_back({from, to});
  j["intervals"] = json::array();
  for (const auto& r : a.intervals) j["intervals"].push_back(to_json(r));
  const IntervalResult* bad = a.first_bad();
  j["first_bad"] = bad ? json(interval_line(*bad)) : json(nullptr);  // for people
  j["mismatches"] = a.mismatches();
  j["damaged"] = a.damaged;
  j["seconds"] = a.seconds;
  return j;
}

AuditReport audit_from(const json& j) {
  AuditReport a;
  a.run_dir = j.at("run_dir").get<std::string>();
  a.merged = !j.contains("share");
  a.share = a.merged ? 0 : integer_at<int>(j, "share");
  a.shares = integer_at<int>(j, "shares");
  a.world_size = a.merged ? 0 : integer_at<int>(j, "world_size");
  for (const auto& v : j.at("all_intervals")) a.all_intervals.push_back({integer<std::int64_t>(v.at(0), "all_intervals"), integer<std::int64_t>(v.at(1), "all_intervals")});
  for (const auto& v : j.at("intervals")) a.intervals.push_back(interval_from(v));
  a.damaged = j.at("damaged").get<std::vector<std::string>>();
  a.seconds = field_or(j, "seconds", 0.0);  // version 0 merges had none
  return a;
}

// ---- screen ----

json to_json(const ScreenReport& r) {
  json j = header("screen", kScreenVersion);
  j["tests"] = r.tests;
  j["size"] = r.size;
  j["repetitions"] = r.repetitions;
  j["seconds"] = r.seconds;
  j["devices"] = json::array();
  for (const auto& d : r.devices) {
    json dj = {{"rank", d.rank}, {"host", d.host}, {"device", d.device}, {"verdict", name_of(d.verdict)}};
    dj["failures"] = json::object();
    for (std::size_t t = 0; t < r.tests.size() && t < d.failures.size(); ++t) dj["failures"][r.tests[t]] = d.failures[t];
    dj["first_failure"] = d.first_failure ? json(d.first_failure) : json(nullptr);
    j["devices"].push_back(dj);
  }
  std::string ex;
  for (const auto& h : r.exclude) ex += (ex.empty() ? "" : ",") + h;
  j["exclude"] = ex;  // ready for sbatch --exclude=
  return j;
}

ScreenReport screen_from(const json& j) {
  ScreenReport r;
  r.tests = j.at("tests").get<std::vector<std::string>>();
  r.size = integer_at<int>(j, "size");
  r.repetitions = integer_at<std::int64_t>(j, "repetitions");
  r.seconds = j.at("seconds").get<double>();
  for (const auto& dj : j.at("devices")) {
    ScreenDevice d;
    d.rank = integer_at<int>(dj, "rank");
    d.host = dj.at("host").get<std::string>();
    d.device = dj.at("device").get<std::string>();
    d.verdict = named<DeviceVerdict>(dj, "verdict");
    for (const auto& t : r.tests) d.failures.push_back(dj.at("failures").at(t).get<int>());
    d.first_failure = dj.at("first_failure").is_null() ? 0 : integer_at<std::int64_t>(dj, "first_failure");
    r.devices.push_back(d);
  }
  const auto ex = j.at("exclude").get<std::string>();
  for (std::size_t pos = 0; pos < ex.size();) {
    const auto end = ex.find(',', pos);
    r.exclude.push_back(ex.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return r;
}

}  // namespace

// ---- audit ----

int AuditReport::mismatches() const {
  int n = 0;
  for (const auto& r : intervals) n += !r.reproduced;
  return n;
}

const IntervalResult* AuditReport::first_bad() const {
  for (const auto& r : intervals)
    if (!r.reproduced) return &r;
  return nullptr;
}

std::string interval_line(const IntervalResult& r) {
  return "interval " + std::to_string(r.from) + ".." + std::to_string(r.to) + " (rank " + std::to_string(r.rank) +
         (r.share ? ", share " + std::to_string(r.share) : "") + "): " +
         (r.reproduced ? "reproduced bitwise" : "MISMATCH " + r.detail);
}

std::string to_json_line(const IntervalResult& r) { return dump(to_json(r), -1); }

Status from_json_line(const std::string& line, IntervalResult* out) {
  try {
    *out = interval_from(json::parse(line));
  } catch (const std::exception& e) {
    return Status::Internal(std::string("an audit interval record does not parse: ") + e.what());
  }
  return Status::OK();
}

std::string audit_path(const std::string& run_dir) { return (fs::path(run_dir) / "audit.json").string(); }

std::string audit_part_path(const std::string& run_dir, int share, int shares) {
  char name[64];
  std::snprintf(name, sizeof name, "part-%04d-of-%04d.json", share, shares);
  return (fs::path(run_dir) / "audit" / name).string();
}

Status write_audit(const std::string& path, const AuditReport& a) {
  // The shares' parts go to RUN/audit/, a directory of culprit's (never a link); audit.json to RUN.
  const fs::path dir = fs::path(path).parent_path();
  if (dir.filename() == "audit") CULPRIT_RETURN_IF_ERROR(files::ensure_dir(dir.string()));
  return write_file(path, dump(to_json(a), 2) + "\n", /*atomic=*/true);
}

Status read_audit(const std::string& path, AuditReport* out) {
  return read_record(path, "audit", kAuditVersion, audit_from, out);
}

// ---- screen ----

Status write_screen_report(const std::string& path, const ScreenReport& r) {
  return write_file(path, dump(to_json(r), 2) + "\n", /*atomic=*/false);
}

Status read_screen_report(const std::string& path, ScreenReport* out) {
  return read_record(path, "screen", kScreenVersion, screen_from, out);
}

// ---- fields ----

Status field_of(const AuditReport& a, const std::string& name, std::string* out) {
  return field(to_json(a), name, "audit", out);
}
Status field_of(const ScreenReport& s, const std::string& name, std::string* out) {
  return field(to_json(s), name, "screen", out);
}

}  // namespace culprit::records
