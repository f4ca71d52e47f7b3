// The data record (docs/data.md): `culprit prepare-data` reads a data file once and writes
// PATH.culprit.json beside it — what the scan at open would find (the largest label and token, every
// value finite) and a fingerprint of every block of the file's bytes. `culprit train` then skips its
// scan of that very file (same size and modification time), `culprit verify-data` finds the blocks
// that changed since and names their samples, and the bisection tells a damaged data file from a
// model's instability. One writer and one reader: this unit. No libtorch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/command.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/status.h"
#include "culprit/data.h"

namespace culprit::harness {

inline constexpr const char* kDataRecordSuffix = ".culprit.json";
inline constexpr const char* kDataRecordSchema = "culprit-data";
inline constexpr int kDataRecordVersion = 1;

struct DataRecord {
  std::string data;               // the --data it was made for: "tokens:PATH" or "hdf5:PATH"
  std::uint64_t file_bytes = 0;   // the file as it was read
  std::int64_t mtime_ns = 0;
  std::int64_t samples = 0;       // hdf5: rows; tokens: token ids
  int token_bytes = 0;            // tokens: the ids' size it was read with (2, 4); hdf5: 0
  std::int64_t max_label = -1, max_label_at = -1, max_token = -1;
  std::uint64_t block_bytes = 0;  // the file's bytes cut into blocks of this size (the last shorter)
  std::vector<Fingerprint> blocks;  // fp1 of each block
};

// What the record vouches for, when it is the record of the data file as it is now.
struct PreparedFacts {
  std::int64_t max_label = -1, max_label_at = -1, max_token = -1;
  // Whether every label is below `classes` and every token below `token_limit` (0: unchecked).
  bool checked(std::int64_t classes, std::int64_t token_limit) const {
    return (classes <= 0 || max_label < classes) && (token_limit <= 0 || max_token < token_limit);
  }
};
// The facts of data's record when it exists and matches the file's size and modification time and
// the token size the data was opened with (d.token_bytes).
bool find_prepared(const DataSpec& data, const Dataset& d, PreparedFacts* out);

Status read_data_record(const std::string& path, DataRecord* out);
Status write_data_record(const std::string& path, const DataRecord& r);

// A sample whose stored bytes lie in a block that no longer matches the record.
struct DamagedSample {
  std::int64_t sample = 0;
  SampleLocation where;         // the sample's bytes
  std::uint64_t block_offset = 0, block_bytes = 0;  // the changed block
};
// The samples of `samples` whose bytes changed since prepare-data (none: no record, or none
// changed). A record of another kind or size is not compared: *skipped says so.
Status changed_samples(const TrainConfig& cfg, const std::vector<std::int64_t>& samples, std::vector<DamagedSample>* out,
                       std::string* skipped = nullptr);

}  // namespace culprit::harness
