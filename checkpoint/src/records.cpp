// The run directory's JSON records (culprit/records.h; schemas in docs/records.md): one to_json and
// one from_json per record, so every writer and reader agrees on the fields.
#include "culprit/records.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "culprit/exit_codes.h"

namespace culprit {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

StatusCode status_code_for(IncidentClass c) {
  switch (c) {
    case IncidentClass::kHardware: return StatusCode::kHardware;
    case IncidentClass::kNumerical: return StatusCode::kNumerical;
    case IncidentClass::kInvariant: return StatusCode::kInvariant;
    case IncidentClass::kJobs: break;
  }
  return StatusCode::kInternal;
}

int verdict_exit_code(Verdict v) {
  switch (v) {
    case Verdict::kNone: return kExitOk;
    case Verdict::kHardwareTransient: return kExitHardwareTransient;
    case Verdict::kHardwarePersistent: return kExitHardwarePersistent;
    case Verdict::kSoftwareNondeterminism: return kExitSoftwareNondeterminism;
    case Verdict::kNumericalInstability: return kExitNumericalInstability;
    case Verdict::kData: return kExitData;
  }
  return kExitFailure;
}

namespace records {

namespace {

// A vocabulary value read from a record: an unknown name is a damaged record.
template <class E>
E named(const json& j, const char* key) {
  E v{};
  const auto text = j.at(key).get<std::string>();
  if (!parse_name(text, &v))
    throw std::runtime_error(std::string("'") + key + "' is '" + text + "', not a " + enum_names(E{}).what + " (" +
                             names_list<E>() + ")");
  return v;
}

// The record's kind and version come first; a reader refuses another kind or a newer version.
json header(const char* kind, int version) { return json{{"record", kind}, {"version", version}}; }
void check_header(const json& j, const char* kind, int version) {
  if (!j.is_object()) throw std::runtime_error("not a JSON object");
  const auto got = j.value("record", std::string());
  if (got != kind) throw std::runtime_error("not a culprit " + std::string(kind) + " record");
  const int v = j.at("version").get<int>();
  if (v < 1 || v > version)
    throw std::runtime_error("version " + std::to_string(v) + "; this culprit reads " + kind + " records up to " +
                             std::to_string(version));
}

std::string dump(const json& j, int indent) {
  // Strings from damaged files may not be UTF-8: replaced, never thrown on.
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

Status write_file(const std::string& path, const std::string& text, bool atomic) {
  const std::string target = atomic ? path + ".tmp" : path;
  {
    std::ofstream out(target, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return Status::IoError("cannot write '" + target + "'");
  }
  if (atomic) {
    std::error_code ec;
    fs::rename(target, path, ec);
    if (ec) return Status::IoError("cannot rename '" + target + "' to '" + path + "': " + ec.message());
  }
  return Status::OK();
}

// Reads and parses a whole JSON record file of `kind`.
template <class T, class FromJson>
Status read_record(const std::string& path, const char* kind, int version, FromJson from, T* out) {
  std::ifstream in(path);
  if (!in) return Status::BadInput("'" + path + "' does not exist or cannot be read");
  try {
    const json j = json::parse(in);
    check_header(j, kind, version);
    *out = from(j);
  } catch (const std::exception& e) {
    return Status::Damaged("'" + path + "' is not a culprit " + kind + " record: " + e.what());
  }
  return Status::OK();
}

std::string utc_now() {
  char when[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return when;
}

// ---- incidents ----

json to_json(const Incident& i) {
  json j = header("incident", kIncidentVersion);
  j["time"] = i.time;
  j["step"] = i.step;
  j["detector"] = name_of(i.detector);
  j["class"] = name_of(i.cls);
  j["rank"] = i.rank;
  j["ranks"] = i.ranks;
  j["micro_shard"] = i.micro_shard;
  j["tensor"] = i.tensor;
  j["what"] = name_of(i.what);
  j["sender"] = i.sender;
  j["receiver"] = i.receiver;
  j["host"] = i.host;
  j["device"] = i.device;
  j["slurm_job_id"] = i.slurm_job_id;
  if (i.job) {
    j["decision"] = name_of(i.job->decision);
    j["restart"] = i.job->restart;
    j["exit_code"] = i.job->exit_code;
    j["exclude"] = i.job->exclude;
    j["resume_from"] = i.job->resume_from;
    j["next_job"] = i.job->next_job;
  }
  j["message"] = i.message;
  return j;
}

Incident incident_from(const json& j) {
  Incident i;
  i.time = j.at("time").get<std::string>();
  i.step = j.at("step").get<std::int64_t>();
  i.detector = named<Detector>(j, "detector");
  i.cls = named<IncidentClass>(j, "class");
  i.rank = j.at("rank").get<int>();
  i.ranks = j.at("ranks").get<std::vector<int>>();
  i.micro_shard = j.at("micro_shard").get<int>();
  i.tensor = j.at("tensor").get<std::string>();
  i.what = named<Subject>(j, "what");
  i.sender = j.at("sender").get<int>();
  i.receiver = j.at("receiver").get<int>();
  i.host = j.at("host").get<std::string>();
  i.device = j.at("device").get<std::string>();
  i.slurm_job_id = j.at("slurm_job_id").get<std::string>();
  if (j.contains("decision")) {
    JobDecision d;
    d.decision = named<Decision>(j, "decision");
    d.restart = j.at("restart").get<int>();
    d.exit_code = j.at("exit_code").get<int>();
    d.exclude = j.at("exclude").get<std::string>();
    d.resume_from = j.at("resume_from").get<std::string>();
    d.next_job = j.at("next_job").get<std::string>();
    i.job = d;
  }
  i.message = j.at("message").get<std::string>();
  return i;
}

// incidents.log: key=value, the message last and quoted (for people and grep).
std::string log_line(const Incident& i) {
  auto dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  std::string line = "time=" + i.time + " step=" + std::to_string(i.step) + " detector=" + name_of(i.detector) +
                     " class=" + name_of(i.cls) + " rank=" + std::to_string(i.rank) + " host=" + dash(i.host) +
                     " device=" + dash(i.device) + " slurm_job_id=" + dash(i.slurm_job_id);
  if (i.job)
    line += std::string(" decision=") + name_of(i.job->decision) + " restart=" + std::to_string(i.job->restart) +
            " exit_code=" + std::to_string(i.job->exit_code) + " exclude=" + dash(i.job->exclude) +
            " resume_from=" + dash(i.job->resume_from) + " next_job=" + dash(i.job->next_job);
  std::string msg = i.message;
  for (auto& c : msg)
    if (c == '"' || c == '\n') c = '\'';
  return line + " message=\"" + msg + "\"";
}

// ---- diagnosis ----

json to_json(const Diagnosis& d) {
  json j = header("diagnosis", kDiagnosisVersion);
  j["verdict"] = name_of(d.verdict);
  j["step"] = d.step;
  j["layer"] = d.layer;
  j["phase"] = d.phase ? name_of(*d.phase) : "";
  j["rank"] = d.rank;
  j["host"] = d.host;
  j["device"] = d.device;
  j["reruns"] = d.reruns;
  j["reproduced"] = d.reproduced;
  j["evidence"] = d.evidence;
  j["steps_replayed"] = d.steps_replayed;
  j["seconds"] = d.seconds;
  j["startup_seconds"] = d.startup_seconds;
  return j;
}

Diagnosis diagnosis_from(const json& j) {
  Diagnosis d;
  d.verdict = named<Verdict>(j, "verdict");
  d.step = j.at("step").get<std::int64_t>();
  d.layer = j.at("layer").get<std::string>();
  if (!j.at("phase").get<std::string>().empty()) d.phase = named<Phase>(j, "phase");
  d.rank = j.at("rank").get<int>();
  d.host = j.at("host").get<std::string>();
  d.device = j.at("device").get<std::string>();
  d.reruns = j.at("reruns").get<int>();
  d.reproduced = j.at("reproduced").get<int>();
  d.evidence = j.at("evidence").get<std::vector<std::string>>();
  d.steps_replayed = j.at("steps_replayed").get<std::int64_t>();
  d.seconds = j.at("seconds").get<double>();
  d.startup_seconds = j.at("startup_seconds").get<double>();
  return d;
}

// ---- audit ----

json to_json(const IntervalResult& r) {
  return json{{"from", r.from},     {"to", r.to},
              {"rank", r.rank},     {"share", r.share},
              {"verdict", r.reproduced ? "reproduced" : "mismatch"}, {"detail", r.detail}};
}

IntervalResult interval_from(const json& j) {
  IntervalResult r;
  r.from = j.at("from").get<std::int64_t>();
  r.to = j.at("to").get<std::int64_t>();
  r.rank = j.at("rank").get<int>();
  r.share = j.at("share").get<int>();
  const auto v = j.at("verdict").get<std::string>();
  if (v != "reproduced" && v != "mismatch") throw std::runtime_error("interval verdict '" + v + "'");
  r.reproduced = v == "reproduced";
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
  a.share = a.merged ? 0 : j.at("share").get<int>();
  a.shares = j.at("shares").get<int>();
  a.world_size = a.merged ? 0 : j.at("world_size").get<int>();
  for (const auto& v : j.at("all_intervals")) a.all_intervals.push_back({v.at(0).get<std::int64_t>(), v.at(1).get<std::int64_t>()});
  for (const auto& v : j.at("intervals")) a.intervals.push_back(interval_from(v));
  a.damaged = j.at("damaged").get<std::vector<std::string>>();
  a.seconds = j.at("seconds").get<double>();
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
  r.size = j.at("size").get<int>();
  r.repetitions = j.at("repetitions").get<std::int64_t>();
  r.seconds = j.at("seconds").get<double>();
  for (const auto& dj : j.at("devices")) {
    ScreenDevice d;
    d.rank = dj.at("rank").get<int>();
    d.host = dj.at("host").get<std::string>();
    d.device = dj.at("device").get<std::string>();
    d.verdict = named<DeviceVerdict>(dj, "verdict");
    for (const auto& t : r.tests) d.failures.push_back(dj.at("failures").at(t).get<int>());
    d.first_failure = dj.at("first_failure").is_null() ? 0 : dj.at("first_failure").get<std::int64_t>();
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

// A field of a record's JSON as text: strings as they are, null as "", arrays comma-joined.
Status field(const json& j, const std::string& name, const char* kind, std::string* out) {
  if (name == "record" || name == "version" || !j.contains(name)) {
    std::string valid;
    for (const auto& [k, v] : j.items())
      if (k != "record" && k != "version") valid += (valid.empty() ? "" : ", ") + k;
    return Status::BadInput("a " + std::string(kind) + " record has no field '" + name + "' (valid: " + valid + ")");
  }
  const json& v = j.at(name);
  if (v.is_string()) *out = v.get<std::string>();
  else if (v.is_null()) out->clear();
  else if (v.is_array()) {
    out->clear();
    for (const auto& e : v) *out += (out->empty() ? "" : ",") + (e.is_string() ? e.get<std::string>() : dump(e, -1));
  } else {
    *out = dump(v, -1);
  }
  return Status::OK();
}

}  // namespace

// ---- incidents ----

Status append_incident(const std::string& run_dir, Incident inc) {
  if (inc.time.empty()) inc.time = utc_now();
  if (inc.slurm_job_id.empty()) {
    const char* job = std::getenv("SLURM_JOB_ID");
    inc.slurm_job_id = job ? job : "";
  }
  std::ofstream jl(fs::path(run_dir) / "incidents.jsonl", std::ios::app);
  jl << dump(to_json(inc), -1) << "\n";
  jl.flush();
  std::ofstream log(fs::path(run_dir) / "incidents.log", std::ios::app);
  log << log_line(inc) << "\n";
  log.flush();
  if (!log || !jl) return Status::IoError("cannot append to the incident log in '" + run_dir + "'");
  return Status::OK();
}

Status read_incidents(const std::string& run_dir, std::vector<Incident>* out) {
  out->clear();
  const auto path = (fs::path(run_dir) / "incidents.jsonl").string();
  std::ifstream in(path);
  if (!in) return Status::OK();
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    try {
      const json j = json::parse(line);
      check_header(j, "incident", kIncidentVersion);
      out->push_back(incident_from(j));
    } catch (const std::exception& e) {
      return Status::Damaged("'" + path + "' line " + std::to_string(n) + " is not an incident record: " + e.what());
    }
  }
  return Status::OK();
}

const Incident* first_fault(const std::vector<Incident>& all) {
  for (const auto& i : all)
    if (i.detector != Detector::kCollectiveTimeout && i.detector != Detector::kJobs) return &i;
  return nullptr;
}

// ---- diagnosis ----

std::string diagnosis_path(const std::string& run_dir) { return (fs::path(run_dir) / "diagnosis.json").string(); }

Status write_diagnosis(const std::string& run_dir, const Diagnosis& d) {
  return write_file(diagnosis_path(run_dir), dump(to_json(d), 2) + "\n", /*atomic=*/true);
}

Status read_diagnosis(const std::string& run_dir, Diagnosis* out) {
  return read_record(diagnosis_path(run_dir), "diagnosis", kDiagnosisVersion, diagnosis_from, out);
}

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
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
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

Status field_of(const Diagnosis& d, const std::string& name, std::string* out) {
  return field(to_json(d), name, "diagnosis", out);
}
Status field_of(const Incident& i, const std::string& name, std::string* out) {
  return field(to_json(i), name, "incident", out);
}
Status field_of(const AuditReport& a, const std::string& name, std::string* out) {
  return field(to_json(a), name, "audit", out);
}
Status field_of(const ScreenReport& s, const std::string& name, std::string* out) {
  return field(to_json(s), name, "screen", out);
}

}  // namespace records
}  // namespace culprit
