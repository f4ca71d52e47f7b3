// The run directory's records (culprit/records.h): every record written and read back whole, the
// vocabularies' tables, version and damage refusals, and the fields job scripts read.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "culprit/exit_codes.h"
#include "culprit/records.h"

namespace r = culprit::records;
namespace fs = std::filesystem;
using culprit::Detector;
using culprit::IncidentClass;
using culprit::Phase;
using culprit::Subject;
using culprit::Verdict;

namespace {

struct Records : ::testing::Test {
  void SetUp() override {
    dir = fs::path(testing::TempDir()) / ("culprit_records_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string run() const { return dir.string(); }
  fs::path dir;
};

r::Incident replica_incident() {
  r::Incident i;
  i.step = 7;
  i.detector = Detector::kReplicaDivergence;
  i.cls = IncidentClass::kHardware;
  i.rank = 2;
  i.ranks = {2, 3};
  i.tensor = "blocks.0.attn.qkv.weight";
  i.what = Subject::kOptimizerState;
  i.host = "node17";
  i.device = "cuda:1 (H200)";
  i.message = "rank(s) 2,3 differ \"quoted\"\nsecond line";
  return i;
}

}  // namespace

TEST(Vocabularies, EveryNameParsesBackToItsValue) {
  auto round_trip = [](auto table) {
    for (const auto& row : table) {
      decltype(row.value) v{};
      EXPECT_TRUE(culprit::parse_name(row.name, &v)) << row.name;
      EXPECT_EQ(v, row.value) << row.name;
      EXPECT_STREQ(culprit::name_of(row.value), row.name);
    }
  };
  round_trip(enum_names(Phase{}));
  round_trip(enum_names(Detector{}));
  round_trip(enum_names(IncidentClass{}));
  round_trip(enum_names(Subject{}));
  round_trip(enum_names(Verdict{}));
  round_trip(enum_names(culprit::Decision{}));
  round_trip(enum_names(culprit::DeviceVerdict{}));
  Verdict v{};
  EXPECT_FALSE(culprit::parse_name("hardware", &v));
  EXPECT_EQ(culprit::names_list<Phase>(), "forward, backward, grad, comm, param, optimizer, data, lr, rng, gather, gather-link, tp-link");
  EXPECT_EQ(culprit::verdict_exit_code(Verdict::kNone), 0);
  EXPECT_EQ(culprit::verdict_exit_code(Verdict::kHardwareTransient), 20);
  EXPECT_EQ(culprit::verdict_exit_code(Verdict::kData), 24);
  EXPECT_EQ(culprit::verdict_exit_code(Verdict::kInconclusive), 25);
  EXPECT_EQ(culprit::verdict_exit_code(Verdict::kHardwareUnconfirmed), 26);
  EXPECT_EQ(culprit::verdict_exit_code(Verdict::kDamagedRecord), 4);  // damaged, never hardware
  EXPECT_FALSE(culprit::is_hardware(Verdict::kDamagedRecord));
  EXPECT_TRUE(culprit::is_hardware(Verdict::kHardwareUnconfirmed));
  EXPECT_EQ(culprit::status_code_for(IncidentClass::kHardware), culprit::StatusCode::kHardware);
}

// The last line of a verdict exit names the verdict of its code, as records.h names it; codes that
// report no finding get no line.
TEST_F(Records, EveryVerdictExitSaysItsVerdict) {
  for (const auto& row : culprit::kVerdictNames) {
    const int code = culprit::verdict_exit_code(row.value);
    const std::string note = culprit::exit_note(code, "RUN");
    if (row.value == Verdict::kNone || row.value == Verdict::kDamagedRecord) {
      EXPECT_EQ(note.find("verdict"), std::string::npos) << row.name;
      continue;
    }
    EXPECT_EQ(note, "culprit: verdict " + std::string(row.name) + " (exit " + std::to_string(code) +
                        "): this is a diagnosis, not a failure; see RUN/diagnosis.json");
  }
  EXPECT_EQ(culprit::exit_note(0, "RUN"), "");
  EXPECT_EQ(culprit::exit_note(2, "RUN"), "");
  EXPECT_NE(culprit::exit_note(11, "RUN").find("(numerical: NaN or Inf)"), std::string::npos);
  EXPECT_NE(culprit::exit_note(5, "").find("a finding, not a failure"), std::string::npos);
}

TEST_F(Records, IncidentsRoundTripWithEveryField) {
  r::Incident job;
  job.step = 5;
  job.detector = Detector::kJobs;
  job.cls = IncidentClass::kJobs;
  job.host = "node3";
  job.job = r::JobDecision{culprit::Decision::kRequeue, 1, 21, "node3,node9", "/r/checkpoints/step-00000004.h5", "4711"};
  job.message = "hardware on node3";
  ASSERT_TRUE(r::append_incident(run(), replica_incident()).ok());
  ASSERT_TRUE(r::append_incident(run(), job).ok());
  std::vector<r::Incident> got;
  ASSERT_TRUE(r::read_incidents(run(), &got).ok());
  ASSERT_EQ(got.size(), 2u);
  const auto want = replica_incident();
  EXPECT_FALSE(got[0].time.empty());  // stamped on append
  EXPECT_EQ(got[0].step, want.step);
  EXPECT_EQ(got[0].detector, want.detector);
  EXPECT_EQ(got[0].cls, want.cls);
  EXPECT_EQ(got[0].rank, want.rank);
  EXPECT_EQ(got[0].ranks, want.ranks);
  EXPECT_EQ(got[0].tensor, want.tensor);
  EXPECT_EQ(got[0].what, want.what);
  EXPECT_EQ(got[0].host, want.host);
  EXPECT_EQ(got[0].device, want.device);
  EXPECT_EQ(got[0].message, want.message);
  EXPECT_FALSE(got[0].job);
  ASSERT_TRUE(got[1].job);
  EXPECT_EQ(got[1].job->decision, culprit::Decision::kRequeue);
  EXPECT_EQ(got[1].job->restart, 1);
  EXPECT_EQ(got[1].job->exit_code, 21);
  EXPECT_EQ(got[1].job->exclude, "node3,node9");
  EXPECT_EQ(got[1].job->resume_from, "/r/checkpoints/step-00000004.h5");
  EXPECT_EQ(got[1].job->next_job, "4711");
  // The first incident where a fault shows skips silent ranks and job decisions.
  EXPECT_EQ(r::first_fault(got), &got[0]);
  EXPECT_EQ(r::first_fault({job}), nullptr);
  EXPECT_TRUE(r::shows_a_fault(got[0]));
  EXPECT_FALSE(r::shows_a_fault(job));
  auto silent = got[0];
  silent.detector = decltype(silent.detector)::kCollectiveTimeout;
  EXPECT_FALSE(r::shows_a_fault(silent));
  // incidents.log: one line per record, the message last, quoted, on one line.
  std::ifstream log(dir / "incidents.log");
  std::string line;
  ASSERT_TRUE(std::getline(log, line));
  EXPECT_NE(line.find("step=7 detector=replica-divergence class=hardware rank=2 host=node17"), std::string::npos) << line;
  EXPECT_NE(line.find("message=\"rank(s) 2,3 differ 'quoted''second line\""), std::string::npos) << line;
  ASSERT_TRUE(std::getline(log, line));
  EXPECT_NE(line.find("decision=requeue restart=1 exit_code=21 exclude=node3,node9"), std::string::npos) << line;
}

TEST_F(Records, AMissingLogIsEmptyAndADamagedLineIsNamed) {
  std::vector<r::Incident> got{replica_incident()};
  ASSERT_TRUE(r::read_incidents(run(), &got).ok());
  EXPECT_TRUE(got.empty());
  ASSERT_TRUE(r::append_incident(run(), replica_incident()).ok());
  std::ofstream(dir / "incidents.jsonl", std::ios::app) << "{\"step\": \n";
  auto st = r::read_incidents(run(), &got);
  EXPECT_EQ(st.code(), culprit::StatusCode::kDamaged);
  EXPECT_NE(st.message().find("line 2 is not an incident record"), std::string::npos) << st.message();
  // A record of a newer version is refused, not misread.
  std::ofstream(dir / "incidents.jsonl") << "{\"record\":\"incident\",\"version\":99}\n";
  st = r::read_incidents(run(), &got);
  EXPECT_NE(st.message().find("version 99; this culprit reads incident records up to 1"), std::string::npos)
      << st.message();
  // An unknown vocabulary value is damage, with the valid names.
  ASSERT_TRUE(r::append_incident(run(), replica_incident()).ok());
  std::string text;
  {
    std::ifstream in(dir / "incidents.jsonl");
    std::getline(in, text);
    std::getline(in, text);
  }
  text.replace(text.find("replica-divergence"), 18, "telepathy");
  std::ofstream(dir / "incidents.jsonl") << text << "\n";
  st = r::read_incidents(run(), &got);
  EXPECT_NE(st.message().find("'detector' is 'telepathy', not a detector"), std::string::npos) << st.message();
}

TEST_F(Records, VersionZeroLinesAndATornTailAreRead) {
  // culprit 0.1 wrote records without "record" and "version" (and with a job decision as the class).
  std::ofstream(dir / "incidents.jsonl")
      << R"({"time":"t","step":3,"detector":"replica-divergence","class":"hardware","rank":1,"host":"h","device":"cpu",)"
      << R"("slurm_job_id":"","message":"m"})" << "\n"
      << R"({"time":"t","step":3,"detector":"jobs","class":"requeue","rank":-1,"host":"h","device":"","slurm_job_id":"7",)"
      << R"("restart":0,"exit_code":21,"exclude":"h","resume_from":"x","next_job":"8","message":"m"})" << "\n"
      << R"({"record":"incident","version":1,"time":"t","st)";  // an append cut short by a crash
  std::vector<r::Incident> got;
  const auto st = r::read_incidents(run(), &got);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].ranks, std::vector<int>{1});
  EXPECT_EQ(got[0].what, Subject::kNone);
  EXPECT_EQ(got[0].micro_shard, -1);
  EXPECT_EQ(got[1].cls, IncidentClass::kJobs);
  ASSERT_TRUE(got[1].job);
  EXPECT_EQ(got[1].job->decision, culprit::Decision::kRequeue);
  EXPECT_EQ(got[1].job->next_job, "8");
}

TEST_F(Records, DiagnosisRoundTripsAndItsFieldsReadForScripts) {
  r::Diagnosis d;
  d.verdict = Verdict::kHardwarePersistent;
  d.step = 5;
  d.layer = "fc2";
  d.phase = Phase::kComm;
  d.rank = 1;
  d.shard = 1;
  d.host = "node2";
  d.device = "cpu";
  d.reruns = 8;
  d.reproduced = 3;
  d.evidence = {"first", "second"};
  d.steps_replayed = 4;
  d.seconds = 1.5;
  d.startup_seconds = 0.25;
  d.candidates = {0, 1};
  d.sample = 17;
  d.coverage.first_step = 1;
  d.coverage.last_step = 9;
  d.coverage.examined = {{3, 5, ""}};
  d.coverage.not_examined = {{1, 2, "no valid checkpoint before step 3 to replay from"}, {6, 9, "after"}};
  d.replay_faults = {{4, 1, "node2", "cpu", "recomputed micro-shard 2 unlike the record"}};
  ASSERT_TRUE(r::write_diagnosis(run(), d).ok());
  EXPECT_FALSE(fs::exists(dir / "diagnosis.json.tmp"));  // written under a temporary name, then renamed
  r::Diagnosis got;
  ASSERT_TRUE(r::read_diagnosis(run(), &got).ok());
  EXPECT_EQ(got.verdict, d.verdict);
  EXPECT_EQ(got.step, 5);
  EXPECT_EQ(got.layer, "fc2");
  ASSERT_TRUE(got.phase);
  EXPECT_EQ(*got.phase, Phase::kComm);
  EXPECT_EQ(got.evidence, d.evidence);
  EXPECT_DOUBLE_EQ(got.startup_seconds, 0.25);
  EXPECT_EQ(got.candidates, d.candidates);
  EXPECT_EQ(got.sample, 17);
  EXPECT_EQ(got.shard, 1);
  ASSERT_EQ(got.coverage.examined.size(), 1u);
  EXPECT_EQ(got.coverage.examined[0].from, 3);
  EXPECT_EQ(got.coverage.examined[0].to, 5);
  ASSERT_EQ(got.coverage.not_examined.size(), 2u);
  EXPECT_EQ(got.coverage.not_examined[0].reason, d.coverage.not_examined[0].reason);
  EXPECT_EQ(got.coverage.last_step, 9);
  ASSERT_EQ(got.replay_faults.size(), 1u);
  EXPECT_EQ(got.replay_faults[0].rank, 1);
  EXPECT_EQ(got.replay_faults[0].host, "node2");
  std::string v;
  ASSERT_TRUE(r::field_of(got, "host", &v).ok());
  EXPECT_EQ(v, "node2");
  ASSERT_TRUE(r::field_of(got, "step", &v).ok());
  EXPECT_EQ(v, "5");
  ASSERT_TRUE(r::field_of(got, "evidence", &v).ok());
  EXPECT_EQ(v, "first,second");
  const auto bad = r::field_of(got, "hostname", &v);
  EXPECT_EQ(bad.code(), culprit::StatusCode::kBadInput);
  EXPECT_NE(bad.message().find("valid: verdict, step"), std::string::npos) << bad.message();
  // No phase: "" in the record, unset when read.
  d.phase.reset();
  ASSERT_TRUE(r::write_diagnosis(run(), d).ok());
  ASSERT_TRUE(r::read_diagnosis(run(), &got).ok());
  EXPECT_FALSE(got.phase);
  ASSERT_TRUE(r::field_of(got, "phase", &v).ok());
  EXPECT_EQ(v, "");
  // The writing job: SLURM_JOB_ID when the diagnosis names none, "" outside Slurm; a record from
  // before the field reads as "" (old readers ignore it: readers skip fields they do not know).
  ::setenv("SLURM_JOB_ID", "4812", 1);
  ASSERT_TRUE(r::write_diagnosis(run(), d).ok());
  ::unsetenv("SLURM_JOB_ID");
  ASSERT_TRUE(r::read_diagnosis(run(), &got).ok());
  EXPECT_EQ(got.slurm_job_id, "4812");
  ASSERT_TRUE(r::field_of(got, "slurm_job_id", &v).ok());
  EXPECT_EQ(v, "4812");
  ASSERT_TRUE(r::write_diagnosis(run(), d).ok());
  ASSERT_TRUE(r::read_diagnosis(run(), &got).ok());
  EXPECT_EQ(got.slurm_job_id, "");
  {
    std::ifstream in(r::diagnosis_path(run()));
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(in);
    ASSERT_EQ(j.erase("slurm_job_id"), 1u);
    std::ofstream(r::diagnosis_path(run())) << j.dump(2) << "\n";
  }
  ASSERT_TRUE(r::read_diagnosis(run(), &got).ok());
  EXPECT_EQ(got.slurm_job_id, "");
  // Another record kind under the name is refused.
  std::ofstream(r::diagnosis_path(run())) << "{\"record\":\"audit\",\"version\":1}\n";
  EXPECT_EQ(r::read_diagnosis(run(), &got).code(), culprit::StatusCode::kDamaged);
  fs::remove(r::diagnosis_path(run()));
  EXPECT_EQ(r::read_diagnosis(run(), &got).code(), culprit::StatusCode::kBadInput);
}

TEST_F(Records, AuditReportsRoundTripAsPartsAndMerged) {
  r::AuditReport a;
  a.run_dir = run();
  a.share = 1;
  a.shares = 3;
  a.world_size = 2;
  a.all_intervals = {{0, 3}, {3, 6}, {6, 9}};
  a.intervals = {{3, 6, 1, 1, false, "step 5 micro-shard 2 differs"}};
  a.damaged = {"checkpoint 'x' damaged"};
  a.seconds = 2.5;
  EXPECT_EQ(a.mismatches(), 1);
  ASSERT_NE(a.first_bad(), nullptr);
  const std::string part = r::audit_part_path(run(), 1, 3);
  EXPECT_EQ(fs::path(part).filename(), "part-0001-of-0003.json");
  ASSERT_TRUE(r::write_audit(part, a).ok());
  r::AuditReport got;
  ASSERT_TRUE(r::read_audit(part, &got).ok());
  EXPECT_FALSE(got.merged);
  EXPECT_EQ(got.share, 1);
  EXPECT_EQ(got.shares, 3);
  EXPECT_EQ(got.world_size, 2);
  EXPECT_EQ(got.all_intervals, a.all_intervals);
  ASSERT_EQ(got.intervals.size(), 1u);
  EXPECT_FALSE(got.intervals[0].reproduced);
  EXPECT_EQ(got.intervals[0].detail, "step 5 micro-shard 2 differs");
  EXPECT_EQ(got.damaged, a.damaged);
  std::string v;
  ASSERT_TRUE(r::field_of(got, "mismatches", &v).ok());
  EXPECT_EQ(v, "1");
  ASSERT_TRUE(r::field_of(got, "first_bad", &v).ok());
  EXPECT_EQ(v, "interval 3..6 (rank 1, share 1): MISMATCH step 5 micro-shard 2 differs");
  a.merged = true;
  ASSERT_TRUE(r::write_audit(r::audit_path(run()), a).ok());
  ASSERT_TRUE(r::read_audit(r::audit_path(run()), &got).ok());
  EXPECT_TRUE(got.merged);
  EXPECT_EQ(r::field_of(got, "world_size", &v).code(), culprit::StatusCode::kBadInput);  // not in a merge
  // An interval travels between ranks as its record's JSON.
  r::IntervalResult back;
  ASSERT_TRUE(r::from_json_line(r::to_json_line(a.intervals[0]), &back).ok());
  EXPECT_EQ(r::interval_line(back), r::interval_line(a.intervals[0]));
  EXPECT_FALSE(r::from_json_line("{\"from\": 1}", &back).ok());
}

TEST_F(Records, ScreenReportRoundTripsWithItsExcludeList) {
  r::ScreenReport s;
  s.tests = {"matmul", "reduce", "pointwise"};
  s.size = 64;
  s.repetitions = 10;
  s.seconds = 1;
  s.devices = {{0, "a", "cpu", culprit::DeviceVerdict::kPass, {0, 0, 0}, 0},
               {1, "b", "cpu", culprit::DeviceVerdict::kFail, {1, 0, 2}, 3}};
  s.exclude = {"b"};
  const std::string path = (dir / "screen.json").string();
  ASSERT_TRUE(r::write_screen_report(path, s).ok());
  r::ScreenReport got;
  ASSERT_TRUE(r::read_screen_report(path, &got).ok());
  ASSERT_EQ(got.devices.size(), 2u);
  EXPECT_EQ(got.devices[1].failures, (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(got.devices[1].first_failure, 3);
  EXPECT_EQ(got.devices[0].first_failure, 0);
  EXPECT_EQ(got.exclude, std::vector<std::string>{"b"});
  std::string v;
  ASSERT_TRUE(r::field_of(got, "exclude", &v).ok());
  EXPECT_EQ(v, "b");
  got.exclude.clear();
  ASSERT_TRUE(r::field_of(got, "exclude", &v).ok());
  EXPECT_EQ(v, "");
}
