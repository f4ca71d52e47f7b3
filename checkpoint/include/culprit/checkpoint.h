// culprit checkpoints: exact, fingerprint-verified, crash-safe HDF5 files, written in parallel.
// No libtorch here: tensors travel as raw bytes with dtype and shape.
#pragma once
#include <cstdint>
#include <climits>
#include <map>
#include <string>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/h5.h"
#include "culprit/mpi_util.h"
#include "culprit/status.h"

namespace culprit::ckpt {

struct RawTensor {
  std::string name;  // path below the group: "fc1.weight", "fc1.weight/exp_avg", "cpu"
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  ByteBuffer bytes;
  Fingerprint fingerprint = 0;  // computed on write; the stored one on read
  // A slice (--shard-optimizer): `bytes` hold the tensor's elements [slice_lo, slice_lo + n) in
  // row-major order, and `fingerprint` is the whole tensor's, set by the caller (the holders'
  // gather). The ranks' slices of a tensor are disjoint and cover it; each rank writes its own.
  // -1: the whole tensor.
  std::int64_t slice_lo = -1;
  bool sliced() const { return slice_lo >= 0; }
  std::int64_t numel() const;
  std::uint64_t full_bytes() const;  // of the whole tensor
};

struct Checkpoint {
  std::int64_t step = 0;  // completed steps
  std::map<std::string, std::string> meta;  // string attributes of /meta
  std::map<std::string, std::int64_t> meta_int;
  std::vector<RawTensor> model;      // state-dict order
  std::vector<RawTensor> optimizer;  // "<param>/<state>"
  std::vector<RawTensor> rng;
  std::int64_t epoch = 0, cursor = 0;
  Fingerprint state_fingerprint = 0;
};

// Fills every tensor's fingerprint (a slice keeps the one it was given) and the state fingerprint
// (docs/checkpoint-format.md).
void compute_fingerprints(Checkpoint* c);

struct WriteStats {
  double seconds = 0;
  std::uint64_t bytes = 0;  // tensor bytes in the file
};

// Collective over comm: writes `c` to final_path atomically (temporary name, fsync, rename, fsync
// of the directory). Every rank lists the same tensors; a whole one is held by every rank and the
// writers (ranks of comm, ascending; empty: all) write disjoint slices of large ones through MPI-IO
// and take the small ones in turn; a sliced one is written by each rank holding a slice of it.
// `local`: this rank's failure before the write (its trace's sync), agreed before the file exists.
Status write(const Comm& comm, const std::string& final_path, const Checkpoint& c, WriteStats* stats = nullptr,
             const std::vector<int>& writers = {}, const Status& local = Status::OK());

// Reads a checkpoint (one process, no MPI). With verify, every dataset's fingerprint and the state
// fingerprint are recomputed; a mismatch names the file, the dataset and both fingerprints.
Status read(const std::string& path, Checkpoint* out, bool verify = true);
// The same from an open file of `size` bytes (`name` for messages): the fuzz target's entry point.
Status read_open(const h5::Handle& file, const std::string& name, std::uint64_t size, Checkpoint* out, bool verify);

// "RUN/checkpoints/step-00000012.h5".
std::string path_for(const std::string& run_dir, std::int64_t step);
// Checkpoints of a run (complete names only), sorted by step.
std::vector<std::pair<std::int64_t, std::string>> list(const std::string& run_dir);

// Collective: the newest (or oldest) checkpoint of `run_dir` before step `before` whose fingerprints
// verify, read and verified once on every rank into *out (replay, bisect and --resume hand it on
// as it is). Damaged ones are named on rank 0's stderr and skipped. None: bad input when there is
// no candidate, damaged when every candidate is. The same result on every rank. Only checkpoints
// of step >= `at_least` are candidates.
enum class Pick { kNewest, kOldest };
constexpr std::int64_t kAnyStep = INT64_MAX;
Status find_valid(const Comm& comm, const std::string& run_dir, std::int64_t before, Pick pick, Checkpoint* out,
                  std::string* path, std::int64_t at_least = 0);
// The same for the files `candidates`, tried in order.
Status first_valid(const Comm& comm, const std::vector<std::string>& candidates, Checkpoint* out, std::string* path);

// Deletes checkpoints beyond retention: keeps the oldest (the run's start: every step stays
// reachable), the newest keep_last, every one whose step is a multiple of keep_every (> 0),
// `keep_step` itself and everything newer than it.
// A checkpoint found in a run directory is the run's: its recorded run identity is `run_id` (or
// either is from before identities) and it holds the step its name says (a name that is not
// step-XXXXXXXX.h5 says none). Damaged naming the file otherwise: a foreign or renamed file is
// refused, never used.
Status belongs(const std::string& path, const Checkpoint& c, const std::string& run_id);

Status apply_retention(const std::string& run_dir, std::int64_t keep_step, int keep_last, std::int64_t keep_every);

}  // namespace culprit::ckpt
