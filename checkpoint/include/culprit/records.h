// The run directory's records, with one owner: the vocabularies (detector, class, phase, what,
// verdict, decision) with one name table each, and the one reader and writer of every JSON record
// culprit and its job scripts exchange: RUN/incidents.jsonl (with its companion RUN/incidents.log),
// RUN/diagnosis.json, RUN/audit.json and its parts, and culprit screen's report. Schemas, with their
// version fields: docs/records.md. No reader anywhere parses a record's `message`: it is for people.
#pragma once
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "culprit/names.h"
#include "culprit/status.h"

namespace culprit {

// ---- vocabularies ----

// Where a fault lands and where a diagnosis places it (--inject's phase=; diagnosis.json's phase).
enum class Phase { kForward, kBackward, kGrad, kComm, kParam, kOptimizer, kData, kLr, kRng, kGather, kGatherLink, kTpLink };
inline constexpr NameRow<Phase> kPhaseNames[] = {
    {Phase::kForward, "forward"}, {Phase::kBackward, "backward"}, {Phase::kGrad, "grad"},
    {Phase::kComm, "comm"},       {Phase::kParam, "param"},       {Phase::kOptimizer, "optimizer"},
    {Phase::kData, "data"},       {Phase::kLr, "lr"},             {Phase::kRng, "rng"},
    {Phase::kGather, "gather"},   {Phase::kGatherLink, "gather-link"}, {Phase::kTpLink, "tp-link"}};
constexpr NameTable<Phase> enum_names(Phase) { return {kPhaseNames, std::size(kPhaseNames), "phase"}; }

// Who wrote an incident record: an online detector, the collective watchdog, or a jobs/ script.
enum class Detector { kNonfinite, kSpike, kComm, kReplicaDivergence, kSpotCheck, kInvariant, kCollectiveTimeout, kJobs,
                      kGatherCheck };
inline constexpr NameRow<Detector> kDetectorNames[] = {
    {Detector::kNonfinite, "nonfinite"},     {Detector::kSpike, "spike"},
    {Detector::kComm, "comm"},               {Detector::kReplicaDivergence, "replica-divergence"},
    {Detector::kSpotCheck, "spot-check"},    {Detector::kInvariant, "invariant"},
    {Detector::kCollectiveTimeout, "collective-timeout"}, {Detector::kJobs, "jobs"},
    {Detector::kGatherCheck, "gather-check"}};
constexpr NameTable<Detector> enum_names(Detector) { return {kDetectorNames, std::size(kDetectorNames), "detector"}; }

// What an incident suspects (its exit code with --on-detect halt: docs/detection.md). jobs: the
// record is a job script's decision, not a detection.
enum class IncidentClass { kHardware, kNumerical, kInvariant, kJobs };
inline constexpr NameRow<IncidentClass> kIncidentClassNames[] = {{IncidentClass::kHardware, "hardware"},
                                                                  {IncidentClass::kNumerical, "numerical"},
                                                                  {IncidentClass::kInvariant, "invariant"},
                                                                  {IncidentClass::kJobs, "jobs"}};
constexpr NameTable<IncidentClass> enum_names(IncidentClass) {
  return {kIncidentClassNames, std::size(kIncidentClassNames), "incident class"};
}
// The category of a halt for a class (its exit code: culprit/exit_codes.h).
StatusCode status_code_for(IncidentClass c);

// What an incident found wrong.
enum class Subject { kNone, kParameter, kOptimizerState, kGradient, kMessage };
inline constexpr NameRow<Subject> kSubjectNames[] = {{Subject::kNone, ""},
                                                      {Subject::kParameter, "parameter"},
                                                      {Subject::kOptimizerState, "optimizer-state"},
                                                      {Subject::kGradient, "gradient"},
                                                      {Subject::kMessage, "message"}};
constexpr NameTable<Subject> enum_names(Subject) { return {kSubjectNames, std::size(kSubjectNames), "subject"}; }

// culprit bisect's verdict (docs/bisect.md); its exit code: verdict_exit_code.
//   inconclusive: nothing found in what was examined, but part of the run could not be examined
//   hardware-unconfirmed: the record shows a rank computed wrongly, but its device was not rerun
//     (it is not part of the bisection's world), so transient and persistent cannot be told apart
//   damaged-record: a trace or incident record the bisection needs is damaged (never hardware)
enum class Verdict {
  kNone,
  kHardwareTransient,
  kHardwarePersistent,
  kSoftwareNondeterminism,
  kNumericalInstability,
  kData,
  kInconclusive,
  kHardwareUnconfirmed,
  kDamagedRecord,
};
inline constexpr NameRow<Verdict> kVerdictNames[] = {{Verdict::kNone, "none"},
                                                      {Verdict::kHardwareTransient, "hardware-transient"},
                                                      {Verdict::kHardwarePersistent, "hardware-persistent"},
                                                      {Verdict::kSoftwareNondeterminism, "software-nondeterminism"},
                                                      {Verdict::kNumericalInstability, "numerical-instability"},
                                                      {Verdict::kData, "data"},
                                                      {Verdict::kInconclusive, "inconclusive"},
                                                      {Verdict::kHardwareUnconfirmed, "hardware-unconfirmed"},
                                                      {Verdict::kDamagedRecord, "damaged-record"}};
constexpr NameTable<Verdict> enum_names(Verdict) { return {kVerdictNames, std::size(kVerdictNames), "verdict"}; }
int verdict_exit_code(Verdict v);  // README's table: 0 for none, 20..26, 4 for damaged-record
inline bool is_hardware(Verdict v) {
  return v == Verdict::kHardwareTransient || v == Verdict::kHardwarePersistent || v == Verdict::kHardwareUnconfirmed;
}

// A jobs/ script's decision after culprit train exited.
enum class Decision { kDone, kStop, kRequeue, kPostmortem };
inline constexpr NameRow<Decision> kDecisionNames[] = {{Decision::kDone, "done"},
                                                        {Decision::kStop, "stop"},
                                                        {Decision::kRequeue, "requeue"},
                                                        {Decision::kPostmortem, "postmortem"}};
constexpr NameTable<Decision> enum_names(Decision) { return {kDecisionNames, std::size(kDecisionNames), "decision"}; }

// culprit screen's verdict on one device.
enum class DeviceVerdict { kPass, kFail, kUnresolved };
inline constexpr NameRow<DeviceVerdict> kDeviceVerdictNames[] = {
    {DeviceVerdict::kPass, "pass"}, {DeviceVerdict::kFail, "fail"}, {DeviceVerdict::kUnresolved, "unresolved"}};
constexpr NameTable<DeviceVerdict> enum_names(DeviceVerdict) {
  return {kDeviceVerdictNames, std::size(kDeviceVerdictNames), "device verdict"};
}

namespace records {

// Schema versions (docs/records.md): a reader refuses a record of a newer version.
constexpr int kIncidentVersion = 1;
constexpr int kDiagnosisVersion = 2;
constexpr int kAuditVersion = 1;
constexpr int kScreenVersion = 1;

// ---- RUN/incidents.jsonl (one record per line) and RUN/incidents.log (key=value, for people) ----

struct JobDecision {  // detector jobs only
  Decision decision = Decision::kStop;
  int restart = 0;
  int exit_code = 0;  // culprit's exit code the decision is about
  std::string exclude, resume_from, next_job;  // requeue: the follow-up job
};

struct Incident {
  std::string time;  // UTC, "2026-11-30T14:40:02Z"; set by append_incident when empty
  std::int64_t step = -1;
  Detector detector = Detector::kNonfinite;
  IncidentClass cls = IncidentClass::kNumerical;
  int rank = -1;           // the rank blamed (-1: none)
  std::vector<int> ranks;  // every rank the detector named (odd replicas, silent ranks, ...)
  int micro_shard = -1;
  std::string tensor;      // a parameter's name
  Subject what = Subject::kNone;
  int sender = -1, receiver = -1;  // comm: the first message that arrived unlike it was sent
  std::string host, device;        // of `rank`
  std::string slurm_job_id;        // set by append_incident from SLURM_JOB_ID when empty
  std::optional<JobDecision> job;
  std::string message;             // for people
};

// Appends one record to RUN/incidents.jsonl and its line to RUN/incidents.log (one process).
Status append_incident(const std::string& run_dir, Incident inc);
// Every record of RUN/incidents.jsonl, in order (none when the file does not exist). A line that is
// not a record of a known version is an error naming the file and the line number.
Status read_incidents(const std::string& run_dir, std::vector<Incident>* out);
// Whether a fault shows in the incident: every detector's but a silent rank's (the rank may be healthy
// and only slow) and a job decision's (a record of what the job did, not of what it computed). The one
// rule the bisection's starting point, the detectors' saw_fault and the trace's pinning share.
bool shows_a_fault(const Incident& i);
// The first incident where a fault shows, or null.
const Incident* first_fault(const std::vector<Incident>& all);

// ---- RUN/diagnosis.json: culprit bisect's result ----

// Which steps a bisection replayed, and which it could not, with the reason (the verdict "none"
// speaks only for `examined`).
struct StepRange {
  std::int64_t from = 0, to = 0;  // inclusive
  std::string reason;             // not examined: why (for people)
};
struct Coverage {
  std::int64_t first_step = 0, last_step = 0;  // the run's recorded steps
  std::vector<StepRange> examined;             // sorted, merged
  std::vector<StepRange> not_examined;
};

// A replay that disagreed with another replay of the same computation: the replaying rank's device
// computed wrongly during the bisection itself (it is suspect too; the step was redone).
struct ReplayFault {
  std::int64_t step = -1;
  int rank = -1;
  std::string host, device;
  std::string what;  // for people
};

struct Diagnosis {
  Verdict verdict = Verdict::kNone;
  std::int64_t step = -1;
  std::string layer;
  std::optional<Phase> phase;
  int rank = -1;
  // A tensor-parallel run's blamed rank: its shard, the coordinate in its group of T ranks
  // (rank mod T; it computes chunks [shard C/T, (shard + 1) C/T)); -1: not tensor-parallel or none.
  // Optional in version 2 (a record without it reads -1).
  int shard = -1;
  std::string host, device;
  std::vector<int> candidates;  // ranks one of which is at fault when `rank` cannot be told (-1)
  std::int64_t sample = -1;     // data: the first differing sample's index in the data set
  std::string sample_file;      // data: the file that stores it ("" for synthetic data)
  std::int64_t sample_offset = -1;  // data: its first byte's offset in that file (an HDF5 chunk's)
  int reruns = 0, reproduced = 0;
  Coverage coverage;
  std::vector<ReplayFault> replay_faults;
  std::vector<std::string> evidence;  // for people, in the order found
  std::int64_t steps_replayed = 0;
  double seconds = 0;
  double startup_seconds = 0;  // of `seconds`: reading the run and opening the replay engine
  // SLURM_JOB_ID of the job that wrote it ("" outside Slurm): a job script uses a diagnosis only
  // when it is its own job's (jobs/train.sbatch), never an older job's left in the run directory.
  std::string slurm_job_id;
};

std::string diagnosis_path(const std::string& run_dir);
// Writes RUN/diagnosis.json atomically; an empty slurm_job_id is taken from SLURM_JOB_ID, as for an
// incident.
Status write_diagnosis(const std::string& run_dir, const Diagnosis& d);
Status read_diagnosis(const std::string& run_dir, Diagnosis* out);

// ---- RUN/audit.json (a whole audit or a merge) and RUN/audit/part-IIII-of-NNNN.json (a share) ----

enum class IntervalVerdict { kReproduced, kMismatch };
inline constexpr NameRow<IntervalVerdict> kIntervalVerdictNames[] = {{IntervalVerdict::kReproduced, "reproduced"},
                                                                      {IntervalVerdict::kMismatch, "mismatch"}};
constexpr NameTable<IntervalVerdict> enum_names(IntervalVerdict) {
  return {kIntervalVerdictNames, std::size(kIntervalVerdictNames), "interval verdict"};
}

struct IntervalResult {
  std::int64_t from = 0, to = 0;  // checkpoint steps
  int rank = 0, share = 0;        // who audited it
  bool reproduced = true;
  std::string detail;             // for people: where the replay first differs
};

struct AuditReport {
  std::string run_dir;
  int share = 0, shares = 1;
  bool merged = false;  // written by --merge (no share, no world size)
  int world_size = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> all_intervals;  // every interval of the run
  std::vector<IntervalResult> intervals;                             // those audited here, by `from`
  std::vector<std::string> damaged;                                  // checkpoints skipped
  double seconds = 0;
  int mismatches() const;
  const IntervalResult* first_bad() const;
};

// One interval's line of the printed report ("interval 3..6 (rank 1): reproduced bitwise").
std::string interval_line(const IntervalResult& r);
// The record as one line of JSON (an interval travels between ranks so) and back.
std::string to_json_line(const IntervalResult& r);
Status from_json_line(const std::string& line, IntervalResult* out);
std::string audit_path(const std::string& run_dir);
std::string audit_part_path(const std::string& run_dir, int share, int shares);
// Written atomically (a temporary name, then rename).
Status write_audit(const std::string& path, const AuditReport& a);
Status read_audit(const std::string& path, AuditReport* out);

// ---- culprit screen --report FILE ----

struct ScreenDevice {
  int rank = 0;
  std::string host, device;
  DeviceVerdict verdict = DeviceVerdict::kPass;
  std::vector<int> failures;  // per test, in ScreenReport::tests order
  std::int64_t first_failure = 0;  // repetition (0: none)
};

struct ScreenReport {
  std::vector<std::string> tests;
  int size = 0;
  std::int64_t repetitions = 0;
  double seconds = 0;
  std::vector<ScreenDevice> devices;
  std::vector<std::string> exclude;  // hosts with a device that did not pass
};

Status write_screen_report(const std::string& path, const ScreenReport& r);
Status read_screen_report(const std::string& path, ScreenReport* out);

// ---- fields, for job scripts (culprit report --field) ----

// The value of one named field of a record as text ("" when unset), or an error naming the valid
// fields. Fields are those of the JSON record (docs/records.md).
Status field_of(const Diagnosis& d, const std::string& name, std::string* out);
Status field_of(const Incident& i, const std::string& name, std::string* out);
Status field_of(const AuditReport& a, const std::string& name, std::string* out);
Status field_of(const ScreenReport& s, const std::string& name, std::string* out);

}  // namespace records
}  // namespace culprit
