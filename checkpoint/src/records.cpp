// The run's incident records and the diagnosis (culprit/records.h; schemas in docs/records.md): one
// to_json and one from_json per record, so every writer and reader agrees on the fields. Audit and
// screen reports: reports.cpp.
#include "culprit/records.h"

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "culprit/exit_codes.h"
#include "record_json.h"
#include "culprit/run_files.h"

namespace culprit {

namespace fs = std::filesystem;
using namespace records::detail;

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
    case Verdict::kInconclusive: return kExitInconclusive;
    case Verdict::kHardwareUnconfirmed: return kExitHardwareUnconfirmed;
    case Verdict::kDamagedRecord: return kExitDamaged;
  }
  return kExitFailure;
}

namespace records {

namespace {

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

// Version 0 (culprit 0.1): no ranks, micro_shard, tensor, what, sender, receiver; a job script's
// decision was its class.
Incident incident_from(const json& j, int version) {
  Incident i;
  i.time = j.at("time").get<std::string>();
  i.step = j.at("step").get<std::int64_t>();
  i.detector = named<Detector>(j, "detector");
  Decision legacy{};
  if (version == 0 && i.detector == Detector::kJobs && parse_name(j.at("class").get<std::string>(), &legacy)) {
    i.cls = IncidentClass::kJobs;
    i.job = JobDecision{legacy, field_or(j, "restart", 0), field_or(j, "exit_code", 0),
                        field_or(j, "exclude", std::string()), field_or(j, "resume_from", std::string()),
                        field_or(j, "next_job", std::string())};
  } else {
    i.cls = named<IncidentClass>(j, "class");
  }
  i.rank = j.at("rank").get<int>();
  i.ranks = field_or(j, "ranks", i.rank >= 0 ? std::vector<int>{i.rank} : std::vector<int>());
  i.micro_shard = field_or(j, "micro_shard", -1);
  i.tensor = field_or(j, "tensor", std::string());
  if (j.contains("what")) i.what = named<Subject>(j, "what");
  i.sender = field_or(j, "sender", -1);
  i.receiver = field_or(j, "receiver", -1);
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

json to_json(const StepRange& r) {
  json j = {{"from", r.from}, {"to", r.to}};
  if (!r.reason.empty()) j["reason"] = r.reason;
  return j;
}
StepRange range_from(const json& j) { return {j.at("from").get<std::int64_t>(), j.at("to").get<std::int64_t>(), field_or<std::string>(j, "reason", "")}; }

json to_json(const Diagnosis& d) {
  json j = header("diagnosis", kDiagnosisVersion);
  j["verdict"] = name_of(d.verdict);
  j["step"] = d.step;
  j["layer"] = d.layer;
  j["phase"] = d.phase ? name_of(*d.phase) : "";
  j["rank"] = d.rank;
  j["host"] = d.host;
  j["device"] = d.device;
  j["candidates"] = d.candidates;
  j["sample"] = d.sample;
  j["sample_file"] = d.sample_file;
  j["sample_offset"] = d.sample_offset;
  j["reruns"] = d.reruns;
  j["reproduced"] = d.reproduced;
  json cov = {{"first_step", d.coverage.first_step}, {"last_step", d.coverage.last_step}};
  cov["examined"] = json::array();
  for (const auto& r : d.coverage.examined) cov["examined"].push_back(to_json(r));
  cov["not_examined"] = json::array();
  for (const auto& r : d.coverage.not_examined) cov["not_examined"].push_back(to_json(r));
  j["coverage"] = cov;
  j["replay_faults"] = json::array();
  for (const auto& f : d.replay_faults)
    j["replay_faults"].push_back({{"step", f.step}, {"rank", f.rank}, {"host", f.host}, {"device", f.device}, {"what", f.what}});
  j["evidence"] = d.evidence;
  j["steps_replayed"] = d.steps_replayed;
  j["seconds"] = d.seconds;
  j["startup_seconds"] = d.startup_seconds;
  j["slurm_job_id"] = d.slurm_job_id;
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
  // Version 2's fields; a version 0 or 1 record has none of them.
  d.candidates = field_or<std::vector<int>>(j, "candidates", {});
  d.sample = field_or<std::int64_t>(j, "sample", -1);
  d.sample_file = field_or(j, "sample_file", std::string());
  d.sample_offset = field_or<std::int64_t>(j, "sample_offset", -1);
  d.reruns = j.at("reruns").get<int>();
  d.reproduced = j.at("reproduced").get<int>();
  if (j.contains("coverage")) {
    const json& c = j.at("coverage");
    d.coverage.first_step = c.at("first_step").get<std::int64_t>();
    d.coverage.last_step = c.at("last_step").get<std::int64_t>();
    for (const auto& r : c.at("examined")) d.coverage.examined.push_back(range_from(r));
    for (const auto& r : c.at("not_examined")) d.coverage.not_examined.push_back(range_from(r));
  }
  if (j.contains("replay_faults"))
    for (const auto& f : j.at("replay_faults"))
      d.replay_faults.push_back({f.at("step").get<std::int64_t>(), f.at("rank").get<int>(), f.at("host").get<std::string>(),
                                 f.at("device").get<std::string>(), f.at("what").get<std::string>()});
  d.evidence = j.at("evidence").get<std::vector<std::string>>();
  d.steps_replayed = j.at("steps_replayed").get<std::int64_t>();
  d.seconds = j.at("seconds").get<double>();
  d.startup_seconds = j.at("startup_seconds").get<double>();
  d.slurm_job_id = field_or(j, "slurm_job_id", std::string());  // added within version 2
  return d;
}

}  // namespace

// ---- incidents ----

Status append_incident(const std::string& run_dir, Incident inc) {
  if (inc.time.empty()) inc.time = utc_now();
  if (inc.slurm_job_id.empty()) {
    const char* job = std::getenv("SLURM_JOB_ID");
    inc.slurm_job_id = job ? job : "";
  }
  // Both appends are tried: the human log should not lose a line because the record did.
  const Status jl = files::append((fs::path(run_dir) / "incidents.jsonl").string(), dump(to_json(inc), -1) + "\n");
  const Status log = files::append((fs::path(run_dir) / "incidents.log").string(), log_line(inc) + "\n");
  if (!jl.ok()) return jl.prefixed("cannot append to the incident log");
  if (!log.ok()) return log.prefixed("cannot append to the incident log");
  return Status::OK();
}

Status read_incidents(const std::string& run_dir, std::vector<Incident>* out) {
  out->clear();
  const auto path = (fs::path(run_dir) / "incidents.jsonl").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::OK();
  std::ifstream in;
  CULPRIT_RETURN_IF_ERROR(open_record(path, &in));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t pos = 0;
  for (int n = 1; pos < text.size(); ++n) {
    const auto end = text.find('\n', pos);
    const std::string line = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    try {
      const json j = json::parse(line);
      out->push_back(incident_from(j, check_header(j, "incident", kIncidentVersion)));
    } catch (const std::exception& e) {
      // A last line without its newline is an append a crash (or a full disk) cut short: not a record.
      if (end == std::string::npos) break;
      return Status::Damaged("'" + path + "' line " + std::to_string(n) + " is not an incident record: " + e.what());
    }
  }
  return Status::OK();
}

bool shows_a_fault(const Incident& i) {
  return i.detector != Detector::kCollectiveTimeout && i.detector != Detector::kJobs;
}

const Incident* first_fault(const std::vector<Incident>& all) {
  for (const auto& i : all)
    if (shows_a_fault(i)) return &i;
  return nullptr;
}

// ---- diagnosis ----

std::string diagnosis_path(const std::string& run_dir) { return (fs::path(run_dir) / "diagnosis.json").string(); }

Status write_diagnosis(const std::string& run_dir, const Diagnosis& diagnosis) {
  Diagnosis d = diagnosis;
  if (d.slurm_job_id.empty()) {
    const char* job = std::getenv("SLURM_JOB_ID");
    d.slurm_job_id = job ? job : "";
  }
  return write_file(diagnosis_path(run_dir), dump(to_json(d), 2) + "\n", /*atomic=*/true);
}

Status read_diagnosis(const std::string& run_dir, Diagnosis* out) {
  return read_record(diagnosis_path(run_dir), "diagnosis", kDiagnosisVersion, diagnosis_from, out);
}

// ---- fields ----

Status field_of(const Diagnosis& d, const std::string& name, std::string* out) {
  return field(to_json(d), name, "diagnosis", out);
}
Status field_of(const Incident& i, const std::string& name, std::string* out) {
  return field(to_json(i), name, "incident", out);
}

}  // namespace records
}  // namespace culprit
