// Re-executing recorded steps: the engine under `culprit replay` and the bisection. It trains exactly
// as `culprit train` does (docs/determinism.md), from a verified checkpoint, with the run's own
// configuration, and hands back every fingerprint instead of writing a trace. Injected faults fire as
// in a replay: transient ones stay in the original run, persistent ones fire again on their rank,
// intermittent ones draw again.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "culprit/checkpoint.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/status.h"
#include "culprit/trace.h"

namespace culprit::harness {

// One micro-shard as computed on one rank.
struct ShardResult {
  std::int64_t step = 0;
  int shard = 0;
  int rank = 0;
  float loss = 0;
  Fingerprint grad_fp = 0;          // the gradient leaf (as in the trace)
  Fingerprint input_fp = 0;         // the input samples as loaded
  std::vector<Fingerprint> sample_fps;  // each input sample as loaded
  std::vector<Fingerprint> fwd, bwd;  // per layer, with layer tracing
  std::vector<Fingerprint> param_grad;  // per parameter's gradient, with layer tracing
  std::vector<float> grad;          // the gradient leaf's values (compute_shard only)
};

// A micro-shard as the trace recorded it (no gradient values).
ShardResult shard_result(const trace::ShardRow& row);

// One step as seen by one rank.
struct StepResult {
  std::int64_t step = 0;
  float loss = 0;
  Fingerprint grad_fp = 0;              // the reduced gradient
  std::vector<Fingerprint> param_fps;   // every parameter after the update
  std::vector<Fingerprint> opt_fps;     // every parameter's optimizer state after the update
  std::vector<ShardResult> shards;      // the micro-shards this rank computed
  // Reduction messages that arrived unlike they were sent in this replayed step (sender, receiver),
  // as ranks of the engine's communicator; the same on every rank.
  std::vector<std::pair<int, int>> comm_faults;
};

// A sample whose stored bytes changed since `culprit prepare-data` recorded its file (docs/data.md).
struct ChangedSample {
  std::int64_t sample = -1;
  std::string file;
  std::uint64_t offset = 0;                    // the sample's first byte (an HDF5 chunk's)
  std::uint64_t block_offset = 0, block_bytes = 0;  // the recorded block that no longer matches
  std::string where;                           // for people: "file 'F' offset N (tokens ...)"
};

class Engine {
 public:
  // Collective. Restores `start`, a checkpoint every rank has read and verified (ckpt::find_valid),
  // into a trainer for `cfg` (normally load_run_config's result; detectors, checkpoints and the
  // trace are off); `path` names it in messages. layer_trace: per-layer fingerprints.
  // rotate: run_step gives rank r the micro-shards the usual layout gives rank (r - rotate) mod W,
  // so that with the original world every micro-shard is recomputed `rotate` ranks further on (the
  // result is the same: the tree order does not depend on who computes a leaf). Faults and the rank
  // in every result stay those of the process's own rank.
  static Status open(const TrainConfig& cfg, const Comm& comm, const ckpt::Checkpoint& start, const std::string& path,
                     bool layer_trace, std::unique_ptr<Engine>* out, int rotate = 0);
  // Whether `culprit prepare-data` recorded the run's data file (docs/data.md).
  static bool has_data_record(const TrainConfig& cfg);
  // The rank whose run_step computes micro-shard k (depends on the world size and `rotate` only).
  static int replay_rank(int k, int micro_shards, int world, int rotate);
  virtual ~Engine() = default;
  // Steps completed so far (the checkpoint's step, then one more per run_step).
  virtual std::int64_t step() const = 0;
  // Collective: the next step, as the original run computed it, the micro-shards spread over this
  // world. `round` as for compute_shard (0: the first replay; compute_shard(k, round) then draws
  // as this step's micro-shard k did).
  virtual Status run_step(StepResult* out, int round = 0) = 0;
  // Local: micro-shard k of the next step computed on this rank; nothing is updated. `round` makes
  // an intermittent fault draw anew on each rerun.
  virtual Status compute_shard(int k, int round, ShardResult* out) = 0;
  // Local. Micro-shard k of the next step once more in float64 (parameters, buffers and the input
  // as loaded widened; no layer hooks, no faults but the input's): the gradient (P values, then the
  // loss). The bisection's arbiter between two devices that each repeat their own result.
  virtual Status compute_shard_f64(int k, int round, std::vector<double>* out) = 0;
  // Local. The last run_step's update recomputed in float64 from the marked state (mark()), with
  // that step's reduced gradient and learning rate and no faults. *now: this rank's state after the
  // step; *wide: the float64 one; each the P parameter values, then P values of each parameter's
  // primary optimizer state (SGD's momentum, AdamW's first moment; 0 where there is none yet).
  virtual Status update_f64(std::vector<float>* now, std::vector<double>* wide) = 0;
  // The same update re-executed element by element in float32, in libtorch's own operation order
  // (optim/exact_update.h: bit for bit libtorch's, where its test passes): *exact, laid out as *now.
  // *why non-empty: no exact re-execution here, and why (a replay holds the whole state, also of a
  // --shard-optimizer run, so the bisection always has one).
  virtual Status update_exact(std::vector<float>* now, std::vector<float>* exact, std::string* why) = 0;
  // Collective: the layout of the following run_steps (see open's `rotate`). With rotate 0 every rank
  // sends the reduction's messages the original run's rank of that number sent (same world size): a
  // faulty link reappears there.
  virtual Status set_rotation(int rotate) = 0;
  // Local: the last run_step's reduced gradient cut into the chunks `world` ranks reduce (the
  // original run's world may differ from this one), fingerprinted (trace::StepRow::chunk_fp).
  virtual std::vector<Fingerprint> reduced_chunk_fps(int world) const = 0;
  // Local: the next step computed by this process alone (every micro-shard here, the tree summed
  // with no message): a reduced gradient no link touched. The layout is restored afterwards.
  virtual Status run_step_alone(StepResult* out, int round) = 0;
  // Local: the last run_step's reduced gradient, per parameter, fingerprinted.
  virtual std::vector<Fingerprint> reduced_param_fps() const = 0;
  // Local: the state after the last run_step as a --shard-optimizer rank holding flat elements
  // [lo, hi) records it (trace::StepRow::shard): {lo, hi, its parameters' fingerprint, its
  // optimizer state's}. A replay holds the whole state, so any slice of any world can be checked.
  virtual trace::SliceRecord slice_record(std::int64_t lo, std::int64_t hi) const = 0;
  // Local: the data set indices of micro-shard k's samples in the next step.
  virtual std::vector<std::int64_t> shard_samples(int k) = 0;
  // Local: the data set indices of micro-shard k of any 1-based step (the run's sample order).
  virtual std::vector<std::int64_t> shard_samples_of(std::int64_t step, int k) = 0;
  // Local: the samples `idx` as the data source gives them, read afresh outside any step (no batch
  // assembly, no device, no injected fault), each one's fingerprint as a loaded sample's
  // (ShardResult::sample_fps); *source: what gave them, for people. The bisection's third opinion
  // on a load two ranks disagree about (bisect/src/localize.cpp: witness_load).
  virtual Status source_samples(const std::vector<std::int64_t>& idx, std::vector<Fingerprint>* out,
                                std::string* source) = 0;
  // Local: those of `samples` whose stored bytes changed since prepare-data recorded the data file
  // (none without a record, or with synthetic data).
  // *skipped: why the record was not compared (of another file), or empty.
  virtual Status changed_samples(const std::vector<std::int64_t>& samples, std::vector<ChangedSample>* out,
                                 std::string* skipped) = 0;
  // Local: where sample i is stored, for people ("" for synthetic data); *file, *offset: its file
  // and first byte.
  virtual std::string sample_location(std::int64_t i, std::string* file = nullptr, std::int64_t* offset = nullptr) = 0;
  // Keeps the current state in memory; rewind() returns to it (local, no I/O).
  virtual Status mark() = 0;
  virtual Status rewind() = 0;
  virtual std::vector<std::string> params() const = 0;
  // Each optimizer group's learning rate at step s as the schedule gives it now (a Python script's
  // schedule, re-entered; trace::StepRow::lrs_fp recorded the run's).
  virtual Status learning_rates(std::int64_t step, std::vector<double>* out) = 0;
  virtual std::vector<std::string> layers() const = 0;
};

}  // namespace culprit::harness
