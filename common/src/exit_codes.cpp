#include "culprit/exit_codes.h"

#include <string>

namespace culprit {

namespace {
struct CodeRow {
  StatusCode code;
  const char* name;
  int exit;
};
// One row per category: its name and its exit code (README.md's table).
constexpr CodeRow kRows[] = {
    {StatusCode::kOk, "ok", kExitOk},
    {StatusCode::kBadInput, "bad-input", kExitUsage},
    {StatusCode::kIo, "io", kExitIo},
    {StatusCode::kDamaged, "damaged", kExitDamaged},
    {StatusCode::kDiffers, "differs", kExitDiffers},
    {StatusCode::kMpi, "mpi", kExitMpi},
    {StatusCode::kInternal, "internal", kExitFailure},
    {StatusCode::kHardware, "hardware", kExitHardware},
    {StatusCode::kNumerical, "numerical", kExitNumerical},
    {StatusCode::kInvariant, "invariant", kExitInvariant},
    {StatusCode::kSilentRank, "silent-rank", kExitSilentRank},
};
const CodeRow& row(StatusCode code) {
  for (const auto& r : kRows)
    if (r.code == code) return r;
  return row(StatusCode::kInternal);  // not reached: every category has its row
}
}  // namespace

int exit_code(StatusCode code) { return row(code).exit; }
const char* status_code_name(StatusCode code) { return row(code).name; }

namespace {
// The codes that report a finding and what each says (README.md's table). The verdicts' names are
// records.h's (kVerdictNames; checkpoint/tests/test_records.cpp holds the two together).
struct Finding {
  int code;
  const char* what;
};
constexpr Finding kVerdicts[] = {{kExitHardwareTransient, "hardware-transient"},
                                 {kExitHardwarePersistent, "hardware-persistent"},
                                 {kExitSoftwareNondeterminism, "software-nondeterminism"},
                                 {kExitNumericalInstability, "numerical-instability"},
                                 {kExitData, "data"},
                                 {kExitInconclusive, "inconclusive"},
                                 {kExitHardwareUnconfirmed, "hardware-unconfirmed"}};
constexpr Finding kHalts[] = {{kExitHardware, "hardware suspected"},
                              {kExitNumerical, "numerical: NaN or Inf"},
                              {kExitInvariant, "a training invariant was violated"},
                              {kExitSilentRank, "a rank stopped responding"}};
}  // namespace

std::string exit_note(int code, const std::string& run_dir) {
  const std::string in = run_dir.empty() ? "the run's " : run_dir + "/";
  for (const auto& v : kVerdicts)
    if (v.code == code)
      return "culprit: verdict " + std::string(v.what) + " (exit " + std::to_string(code) +
             "): this is a diagnosis, not a failure; see " + in + "diagnosis.json";
  for (const auto& h : kHalts)
    if (h.code == code)
      return "culprit: exit " + std::to_string(code) + " (" + h.what +
             "): this is a finding, not a crash; the line above says what was found" +
             (run_dir.empty() ? std::string() : "; see " + in + "incidents.jsonl");
  if (code == kExitDiffers)
    return "culprit: exit 5 (differs): what was compared differs, as said above; this is a finding, not a failure";
  return "";
}

}  // namespace culprit
