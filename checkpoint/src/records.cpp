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
  i.step = integer_at<std::int64_t>(j, "step");
  i.detector = named<Detector>(j, "detector");
  Decision legacy{};
  if (version == 0 && i.detector == Detector::kJobs && parse_name(j.at("class").get<std::string>(), &legacy)) {
    i.cls = IncidentClass::kJobs;
    i.job = JobDecision{legacy, integer_or(j, "restart", 0), integer_or(j, "exit_code", 0),
                        field_or(j, "exclude", std::string()), field_or(j, "resume_from", std::string()),
                        field_or(j, "next_job", std::string())};
  } else {
    i.cls = named<IncidentClass>(j, "class");
  }
  i.rank = integer_at<int>(j, "rank");
  i.ranks = integers_or(j, "ranks", i.rank >= 0 ? std::vector<int>{i.rank} : std::vector<int>());
  i.micro_shard = integer_or(j, "micro_shard", -1);
  i.tensor = field_or(j, "tensor", std::string());
  if (j.contains("what")) i.what = named<Subject>(j, "what");
  i.sender = integer_or(j, "sender", -1);
  i.receiver = integer_or(j, "receiver", -1);
  i.host = j.at("host").get<std::string>();
  i.device = j.at("device").get<std::string>();
  i.slurm_job_id = j.at("slurm_job_id").get<std::string>();
  if (j.contains("decision")) {
    JobDecision d;
    d.decision = named<Decision>(j, "decision");
    d.restart = integer_at<int>(j, "restart");
    d.exit_code = integer_at<int>(j, "exit_code");
    d.exclude = j.at("exclude").get<std::string>();
    d.resume_from = j.at("resume_from").get<std::string>();
    d.next_job = j.at("next_job").get<std::string>();
    i.job = d;
  }
  i.message = j.at("message").get<std::string>();
  // A step is 1-based (-1: none; 0: before the first, as a silent rank at start-up is): a fault
  // shown at step 0 or before is no record culprit writes, and would send a bisection nowhere.
  if (i.step < -1 || (i.step < 1 && shows_a_fault(i)))
    throw std::runtime_error("'step' is " + std::to_string(i.step) + ", not a step " +
                             (shows_a_fault(i) ? "(1-based) a detector fired at" : "(1-based, 0 or -1)"));
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
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';  // one line, no terminal escapes
  return line + " message=\"" + msg + "\"";
}

// ---- diagnosis ----

json to_json(const StepRange& r) {
  json j = {{"from", r.from}, {"to", r.to}};
  if (!r.reason.empty()) j["reason"] = r.reason;
  return j;
}
StepRange range_from(const json& j) { return {integer_at<std::int64_t>(j, "from"), integer_at<std::int64_t>(j, "to"), field_or<std::string>(j, "reason", "")}; }

json to_json(const Diagnosis& d) {
  json j = header("diagnosis", kDiagnosisVersion);
  j["verdict"] = name_of(d.verdict);
  j["step"] = d.step;
  j["layer"] = d.layer;
  j["phase"] = d.phase ? name_of(*d.phase) : "";
  j["rank"] = d.rank;
  j["shard"] = d.shard;
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
  d.step = integer_at<std::int64_t>(j, "step");
  d.layer = j.at("layer").get<std::string>();
  if (!j.at("phase").get<std::string>().empty()) d.phase = named<Phase>(j, "phase");
  d.rank = integer_at<int>(j, "rank");
  d.shard = integer_or<int>(j, "shard", -1);
  d.host = j.at("host").get<std::string>();
  d.device = j.at("device").get<std::string>();
  // Version 2's fields; a version 0 or 1 record has none of them.
  d.candidates = integers_or<int>(j, "candidates", {});
  d.sample = integer_or<std::int64_t>(j, "sample", -1);
  d.sample_file = field_or(j, "sample_file", std::string());
  d.sample_offset = integer_or<std::int64_t>(j, "sample_offset", -1);
  d.reruns = integer_at<int>(j, "reruns");
  d.reproduced = integer_at<int>(j, "reproduced");
  if (j.contains("coverage")) {
    const json& c = j.at("coverage");
    d.coverage.first_step = integer_at<std::int64_t>(c, "first_step");
    d.coverage.last_step = integer_at<std::int64_t>(c, "last_step");
    for (const auto& r : c.at("examined")) d.coverage.examined.push_back(range_from(r));
    for (const auto& r : c.at("not_examined")) d.coverage.not_examined.push_back(range_from(r));
  }
  if (j.contains("replay_faults"))
    for (const auto& f : j.at("replay_faults"))
      d.replay_faults.push_back({integer_at<std::int64_t>(f, "step"), integer_at<int>(f, "rank"), f.at("host").get<std::string>(),
                                 f.at("device").get<std::string>(), f.at("what").get<std::string>()});
  d.evidence = j.at("evidence").get<std::vector<std::string>>();
  d.steps_replayed = integer_at<std::int64_t>(j, "steps_replayed");
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
  int fd = -1;
  CULPRIT_RETURN_IF_ERROR(files::open_regular(path, files::kMaxIncidentFileBytes, "incident records", &fd));
  if (fd < 0) return Status::OK();
  // Line by line, each line bounded: neither a huge file nor one endless line is read whole.
  files::LineReader lines(fd, path, files::kMaxRecordLine);
  std::string line;
  bool whole = false;
  while (lines.next(&line, &whole)) {
    try {
      const json j = json::parse(line);
      out->push_back(incident_from(j, check_header(j, "incident", kIncidentVersion)));
    } catch (const std::exception& e) {
      // A last line without its newline is an append a crash (or a full disk) cut short: not a record.
      if (!whole) break;
      return Status::Damaged("'" + path + "' line " + std::to_string(lines.line_number()) +
                             " is not an incident record: " + e.what());
    }
  }
  return lines.status();
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
