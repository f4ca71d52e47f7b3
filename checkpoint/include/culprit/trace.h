// The per-step fingerprint trace: RUN/trace/rank-RRRRR.h5, one live file per rank, appended every
// step. Rows are written first and the committed counts last, so a reader can tell a torn tail.
// With --trace-keep the live file rolls at checkpoints: it is renamed to a sealed file
// rank-RRRRR.to-SSSSSSSS.h5 (its rows run through step S) and a new live file starts; sealed files
// older than the kept steps are deleted (docs/checkpoint-format.md, "Rolled traces").
#pragma once
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/h5.h"
#include "culprit/names.h"
#include "culprit/status.h"

namespace culprit::trace {

// What a trace records per micro-shard: step (the leaf, loss and input) or layer (also every layer's
// forward output and backward gradient and every parameter's gradient).
enum class Level { kStep, kLayer };
inline constexpr NameRow<Level> kLevelNames[] = {{Level::kStep, "step"}, {Level::kLayer, "layer"}};
constexpr NameTable<Level> enum_names(Level) { return {kLevelNames, std::size(kLevelNames), "level"}; }
// Whether the layers are the model's own (per-layer) or one opaque TorchScript forward (per-model).
enum class ForwardDetail { kPerLayer, kPerModel };
inline constexpr NameRow<ForwardDetail> kForwardDetailNames[] = {{ForwardDetail::kPerLayer, "per-layer"},
                                                                  {ForwardDetail::kPerModel, "per-model"}};
constexpr NameTable<ForwardDetail> enum_names(ForwardDetail) {
  return {kForwardDetailNames, std::size(kForwardDetailNames), "forward detail"};
}

struct Header {
  int rank = 0;
  int world_size = 1;
  Level level = Level::kStep;
  ForwardDetail forward_detail = ForwardDetail::kPerLayer;
  std::vector<std::string> params;  // parameter names, state-dict order
  std::vector<std::string> layers;  // layer names in execution order (level "layer")
  std::vector<std::string> faults;  // --inject specs of every run that wrote the file (kept on resume)
  int samples_per_shard = 0;        // width of ShardRow::sample_fps (format 3)
  std::int64_t format_version = 0;  // as read (written: the current one)
  std::string run_id;               // the run that wrote the file (empty: written before identities)
};

// One optimizer step as seen by one rank.
// --shard-optimizer (format 5, column "shard"): a rank's slice of the flat parameters as it
// updated it — flat elements [lo, hi), XXH3 over the fp1 chunk hashes of its parameters after the
// update and of its optimizer state's primary tensor (harness shard.h, docs/determinism.md).
struct SliceRecord {
  std::int64_t lo = 0, hi = 0;
  Fingerprint params = 0, optimizer = 0;
  bool operator==(const SliceRecord& o) const {
    return lo == o.lo && hi == o.hi && params == o.params && optimizer == o.optimizer;
  }
  bool operator!=(const SliceRecord& o) const { return !(*this == o); }
  // As stored and sent: four uint64.
  std::array<std::uint64_t, 4> words() const {
    return {static_cast<std::uint64_t>(lo), static_cast<std::uint64_t>(hi), params, optimizer};
  }
  static SliceRecord of(const std::uint64_t* w) {
    return {static_cast<std::int64_t>(w[0]), static_cast<std::int64_t>(w[1]), w[2], w[3]};
  }
};

struct StepRow {
  std::int64_t step = 0;
  float loss = 0;
  double lr = 0;
  Fingerprint grad_fp = 0;              // the reduced gradient
  std::vector<Fingerprint> param_fps;   // every parameter after the update
  // Format 3 (0 / empty in older files):
  std::int32_t world = 0;               // the writer's world size at this step
  Fingerprint chunk_fp = 0;             // the chunk of the reduced gradient this rank reduced
                                        // (chunk_offset(P, world, rank)..; W = 1: the whole)
  std::vector<Fingerprint> opt_fps;     // every parameter's optimizer state after the update (0: none)
  // Format 4 (empty in older files):
  std::vector<Fingerprint> reduced_fps;  // per parameter: its slice of the reduced gradient, as this
                                         // rank holds it (names the layer a reduction fault hit)
  // Format 5 (none in older files and unsharded runs): this rank's slice.
  std::optional<SliceRecord> shard;
  // Format 6 (0 in older files): the fingerprint of every optimizer group's learning rate at this
  // step (fingerprint_bytes of the doubles; `lr` is group 0's): a replay refuses a schedule that
  // now gives other rates.
  Fingerprint lrs_fp = 0;
};

// One micro-shard as computed by one rank.
struct ShardRow {
  std::int64_t step = 0;
  std::int32_t shard = 0;
  std::int32_t rank = 0;
  std::string host, device;
  float loss = 0;
  Fingerprint grad_fp = 0;          // the micro-shard's gradient leaf
  Fingerprint input_fp = 0;         // the micro-shard's input samples as loaded
  std::vector<Fingerprint> fwd;     // per layer: its forward output (level "layer")
  std::vector<Fingerprint> bwd;     // per layer: the gradient flowing back into its output
  std::vector<Fingerprint> param_grad;  // per parameter: its slice of the leaf (level "layer")
  std::vector<Fingerprint> sample_fps;  // per sample of the micro-shard, as loaded (format 3)
  // Not in the file. A tensor-parallel micro-shard (--tensor-parallel T > 1) is recorded by each of
  // its group's T ranks, each row holding the layers that rank computed (its chunks', and the
  // replicated ones; 0 for the others' chunks). The reader keeps every rank's row here and shows
  // one merged view (merged_view): that of one rank, its zero entries filled from the others.
  std::vector<ShardRow> group;
};

// The merged view of a tensor-parallel micro-shard's rows (ShardRow::group): row `who` (its rank,
// host, device and every entry it recorded), each layer entry it left 0 taken from the lowest
// other rank that recorded it. The view keeps `group`.
ShardRow merged_view(const std::vector<ShardRow>& group, std::size_t who);

// A row's checksum (checkpoint_format.h: kRowCheckSeed): `rank` the file's, `index` the row's.
Fingerprint row_check(const StepRow& r, int rank, std::int64_t index);
Fingerprint row_check(const ShardRow& r, int rank, std::int64_t index);

// The live file of `rank`.
std::string path_for(const std::string& run_dir, int rank);
// The sealed file of `rank` whose rows run through step `through`.
std::string sealed_path_for(const std::string& run_dir, int rank, std::int64_t through);
// What a trace file's name says: its rank, and the step its rows run through (sealed) or -1 (live).
struct FileName {
  int rank = -1;
  std::int64_t through = -1;
};
bool parse_file_name(const std::string& filename, FileName* out);

class Writer {
 public:
  // Creates the file, or reopens it and drops (logically) every row after `keep_through_step`.
  // A file that cannot be reopened (a crash inside an HDF5 flush can leave one) is renamed to
  // PATH.damaged-N and a new one started; *warning then says so.
  Status open(const std::string& path, const Header& h, std::int64_t keep_through_step, std::string* warning);
  // What open() refuses, found without changing anything (a link, another run's, format's or
  // model's file), so that every rank can agree before any rank rewinds its files.
  static Status check(const std::string& path, const Header& h);
  // After a failed append the file's state past its committed rows is unknown (a full disk can
  // leave a chunk allocated but never written): every later append and seal returns that error
  // without touching the file, so no count is ever raised over rows that are not there.
  Status append(const StepRow& step, const std::vector<ShardRow>& shards);
  // Makes every row appended so far durable (fsync): called before a checkpoint commits, so that a
  // committed checkpoint's steps are in the trace after a crash of the node too.
  Status sync();
  // Seals the live file as the one running through `through` (every row appended so far) and
  // starts a new live file with the same header.
  Status seal(std::int64_t through);
  // Deletes this rank's sealed files whose rows all precede step `first_kept`.
  Status retire(std::int64_t first_kept);
  // The step the newest sealed file runs through (0: none): where the live file's rows begin.
  std::int64_t sealed_through() const { return sealed_through_; }
  void close() { file_.reset(); }
  bool is_open() const { return file_.valid(); }

 private:
  // The new file's header, groups and columns (open() removes the file when this fails).
  Status create(const std::string& path, const Header& h, const std::string& where);
  Status append_rows(const StepRow& step, const std::vector<ShardRow>& shards);
  // Whether the next append stays under the file size limit (ulimit -f): IoError (EFBIG) before
  // anything is written when it may not.
  Status room_for_rows() const;
  h5::Handle file_;
  std::string path_;
  Header header_;
  std::int64_t steps_ = 0, shards_ = 0;
  std::int64_t sealed_through_ = 0;
  Status failed_;  // the first failed append or seal
  std::uint64_t growth_ = 0;  // the most one append has grown the file (a new chunk of every column)
};

struct TraceFile {
  Header header;
  std::vector<StepRow> steps;
  std::vector<ShardRow> shards;
  std::int64_t torn_steps = 0, torn_shards = 0;  // rows present beyond the committed counts
  bool verified = false;  // every row passed its checksum (format 3; older files have none)
};

// Reads one rank's trace; rows beyond the committed counts are counted in torn_*, not returned. A
// committed row that fails its checksum is damage (kDamaged, naming the file, group, row and step).
Status read(const std::string& path, TraceFile* out);
// The same from an open file (`name` for messages): the fuzz target's entry point.
Status read_open(const h5::Handle& file, const std::string& name, TraceFile* out);
// Every trace file of a run (live and sealed), by rank, each rank's sealed files oldest first and
// its live file last.
std::vector<std::string> list(const std::string& run_dir);
// The same for one rank.
std::vector<std::string> list_rank(const std::string& run_dir, int rank);
// Every rank's trace of a run, merged: what culprit replay, bisect and audit compare against.
struct RunTrace {
  Header header;  // the lowest rank's
  std::map<std::pair<int, std::int64_t>, StepRow> steps;    // (rank, step)
  std::map<std::pair<std::int64_t, int>, ShardRow> shards;  // (step, micro-shard)
  std::vector<int> ranks;                                   // the ranks with a trace file
  std::int64_t first_step = 0, last_step = 0;               // the recorded steps' range (0: none)
  bool verified = true;                                     // every file's rows passed their checksums
  // The lowest rank's record of step s, or null.
  const StepRow* step(std::int64_t s) const;
};
// Reads every rank's trace of `run_dir`; an error when there is none, one is damaged, or one belongs
// to another run than `run_id` (files::same_run; "" checks nothing).
Status read_run(const std::string& run_dir, RunTrace* out, const std::string& run_id = "");

// Sets the committed counts of an existing file to the rows with step <= keep_through_step. A file
// of another run than `run_id` (files::same_run; "" checks nothing) is refused, untouched.
// *kept (optional): the rows of /steps left.
Status truncate(const std::string& path, std::int64_t keep_through_step, const std::string& run_id = "",
                std::int64_t* kept = nullptr);

// Deletes the sealed files of `rank` whose rows all precede step `first_kept` (each checked to be
// this run's first).
Status retire(const std::string& run_dir, int rank, std::int64_t first_kept, const std::string& run_id);

// Resuming at `keep_through_step`: the sealed files of `rank` whose rows all follow it are
// deleted, and the one that holds it (if any) becomes the live file again (replacing the live
// one, whose rows all follow it). The live file is truncated by Writer::open. Safe to repeat after
// a crash part-way.
Status rewind(const std::string& run_dir, int rank, std::int64_t keep_through_step, const std::string& run_id = "");

}  // namespace culprit::trace
