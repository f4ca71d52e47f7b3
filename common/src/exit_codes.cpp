#include "culprit/exit_codes.h"

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

}  // namespace culprit
