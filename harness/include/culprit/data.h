// Training data: what a data set is (Dataset) and where its samples come from (DataSource). A rank
// never holds the data set: it reads the samples of the micro-shards it computes (loader.h).
// Sources: synthetic (each sample a pure function of the seed and its index), hdf5:PATH (datasets x
// and y, read with hyperslab selections), tokens:PATH (a flat binary file of token ids, memory
// mapped; docs/data.md). No libtorch.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "culprit/command.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/status.h"

namespace culprit::harness {

// Where a sample's bytes lie in its file, for messages and diagnoses.
struct SampleLocation {
  std::string file;          // empty: the sample is not stored (synthetic data)
  std::uint64_t offset = 0;  // of the sample's first byte (an HDF5 chunk: the chunk's)
  std::uint64_t bytes = 0;   // its length in the file
  std::string detail;        // "token window", "dataset y row 12", "dataset x row 12, in the ...-byte chunk"
  std::string text() const;  // "file 'F' offset 123 (dataset x row 12)"
};

// Which part of a sample: its input (x) or its target (y). An HDF5 file stores them in two
// datasets, so a bad label lies in y's bytes, not x's; other sources store both in one place.
enum class SamplePart { kX, kY };

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Reads samples idx[0..count) into x and y, each row-major in idx's order (x: count x x_bytes,
  // y: count x y_bytes), checking each sample as it arrives (labels, token ids, finite values).
  virtual Status read(const std::int64_t* idx, std::size_t count, unsigned char* x, unsigned char* y) = 0;
  // Where sample i's `part` is stored.
  virtual SampleLocation locate(std::int64_t i, SamplePart part) = 0;
  // The samples [first, last] whose stored bytes meet the file's bytes [lo, hi) (several runs for
  // an HDF5 file: x's and y's). None: the bytes hold no sample (HDF5's own metadata, say).
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> samples_in(std::uint64_t lo, std::uint64_t hi) = 0;
  // Whether read() and locate() call HDF5: they must then run where every HDF5 call of the process
  // runs (the I/O thread while training; HDF5 is not thread-safe here).
  virtual bool uses_hdf5() const { return false; }
};

struct Dataset {
  std::string source;  // "synthetic", "hdf5:PATH" or "tokens:PATH"
  std::int64_t n = 0;
  DType x_dtype = DType::kFloat32;     // float32, or int64 token ids
  std::vector<std::int64_t> x_shape;   // one sample
  DType y_dtype = DType::kInt64;       // int64: class labels (cross entropy); float32: targets (MSE)
  std::vector<std::int64_t> y_shape;   // one sample's target
  std::int64_t classes = 0;            // int64 labels: --classes (--vocab), or the largest label + 1
  std::int64_t max_label = -1;         // stored int64 labels: the largest, and its element of y
  std::int64_t max_label_at = -1;
  std::int64_t max_token = -1;         // int64 x (token ids): the largest
  int token_bytes = 0;                 // tokens:PATH: the stored ids' size (2: uint16, 4: uint32)
  std::shared_ptr<DataSource> reader;  // one thread at a time
  bool classification() const { return y_dtype == DType::kInt64; }
  std::int64_t x_numel() const;        // elements of one sample
  std::int64_t y_numel() const;
  std::size_t x_bytes() const { return static_cast<std::size_t>(x_numel()) * dtype_size(x_dtype); }
  std::size_t y_bytes() const { return static_cast<std::size_t>(y_numel()) * dtype_size(y_dtype); }
};

// How a data file is opened: `culprit train` takes the defaults; prepare-data and verify-data do not.
struct OpenOptions {
  // > 0: a tokens file is cut into windows of this many tokens, whatever --seq-len or PATH.json's
  // seq_len say (prepare-data: 1, so that every token of the file is in a window it checks).
  std::int64_t token_window = 0;
  bool scan = false;  // scan even where a data record vouches for the file (prepare-data makes the record)
};

// Opens the run's data (--data): its shape, its checks (every label, token and value once, at
// open, streamed through a small buffer — unless `culprit prepare-data` recorded them for this very
// file, docs/data.md), and a reader. Nothing of the data stays in memory.
Status load_dataset(const TrainConfig& cfg, Dataset* out, const OpenOptions& how = {});

// ---- --data python: the data set a Python script opens (culprit/external.h registers it) ----
using OpenExternalData = std::function<Status(const TrainConfig& cfg, Dataset* out)>;
void set_external_data(OpenExternalData open);  // an empty function: none
const OpenExternalData& external_data();
// The refusal of a model or data set a Python script builds, in a process where none registered it.
Status no_external_source(const std::string& what);

// `culprit prepare-data` and `culprit verify-data`: a data file's record (docs/data.md).
cli::Command prepare_data_command();
cli::Command verify_data_command();

// ---- shared by the sources (dataset.cpp) ----

// The checks every sample passes, the same at open and at every read: labels in [0, classes),
// token ids in [0, token_limit), float values finite. `first`: the data set index of samples[0]
// when they are consecutive (-1: use idx).
struct SampleChecks {
  std::string data;               // "data 'PATH'" for messages
  std::int64_t classes = 0;       // labels: [0, classes); 0: any non-negative label up to kMaxClasses
  const char* class_option = "classes";
  bool classes_given = true;      // classes is the option's (false: the width found at open)
  std::int64_t token_limit = 0;   // int64 x: [0, token_limit); 0: not checked
  std::string token_prefix;       // "model gpt: " when the model asks for the tokens' range
  const char* token_option = "vocab";
  bool token_option_given = false;
  DataSource* source = nullptr;   // names a bad sample's place in its file
  bool token_windows = false;     // tokens data: a sample is one window of T + 1 tokens (x its first T,
                                  // y its last T); a bad token is named by its place in the window
};
Status check_samples(const Dataset& d, const SampleChecks& checks, const std::int64_t* idx, std::int64_t first,
                     std::size_t count, const unsigned char* x, const unsigned char* y, Dataset* stats = nullptr);

// The scan at open alone: every sample of opened data checked once, its largest label and token
// found (prepare-data's; load_dataset runs it unless a record stands for it).
Status scan_dataset(const TrainConfig& cfg, Dataset* d);

// The checks of every later read of the run's opened data: the limits it was opened with.
SampleChecks run_checks(const TrainConfig& cfg, const Dataset& d);

// The sources (data_synthetic.cpp, data_hdf5.cpp, data_tokens.cpp). Each fills `out`'s shape and
// reader; the scan at open is load_dataset's.
Status open_synthetic(const TrainConfig& cfg, Dataset* out);
Status open_hdf5(const TrainConfig& cfg, const std::string& path, Dataset* out);
// window: the sequence length whatever the options and PATH.json say (prepare-data reads every
// token, in windows of one); 0: theirs.
Status open_tokens(const TrainConfig& cfg, const std::string& path, Dataset* out, std::int64_t window = 0);

}  // namespace culprit::harness
