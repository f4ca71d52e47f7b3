// culprit harness: deterministic, world-size-invariant data-parallel training with libtorch.
// The training contract is in docs/determinism.md; options in docs/cli.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/mpi_util.h"
#include "culprit/status.h"

namespace culprit::harness {

struct TrainConfig {
  std::string run_dir;
  bool resume = false;             // continue from the newest valid checkpoint of run_dir
  std::string resume_from;         // continue from this checkpoint file
  std::int64_t checkpoint_every = 10;  // 0: only after the last step
  int keep_last = 3;
  std::int64_t keep_every = 0;
  int checkpoint_writers_per_host = 1;  // 0: every rank writes its slice
  bool async_checkpoint = true;
  std::string trace = "step";      // off | step | layer
  std::vector<std::string> inject;  // fault specs (culprit/inject.h)
  std::string on_detect = "halt";  // halt | warn
  bool detect_nonfinite = true;
  bool comm_check = true;          // fingerprint every reduction message at both ends
  int spike_window = 20;           // 0: no spike detection
  double spike_z = 8.0, spike_ratio = 3.0;
  std::string spike_action = "warn";  // warn | halt
  std::int64_t replica_check_every = 1;  // 0: off
  double spot_check = 0.0;         // fraction of micro-shards recomputed by another rank each step
  bool check_invariants = true;    // training invariants (docs/detection.md)
  double collective_timeout = 300;  // seconds a rank waits in a collective before naming the silent rank(s)
  std::int64_t steps = 20;
  std::int64_t global_batch = 32;
  int micro_shards = 8;
  std::uint64_t seed = 1234;
  std::string model = "mlp";       // mlp | cnn | gpt | torchscript:PATH
  std::string data = "synthetic";  // synthetic | hdf5:PATH
  std::int64_t samples = 2048;     // synthetic data set size
  std::int64_t hidden = 64;        // mlp: hidden width
  std::vector<std::int64_t> sample_shape;  // synthetic sample shape; empty: the model's default
  int classes = 0;                 // synthetic classes (vocabulary for gpt); 0: model's default
  std::string optimizer = "sgd";   // sgd | adamw
  double lr = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  std::string lr_schedule = "constant";  // constant | cosine
  std::int64_t warmup_steps = 0;
  int threads = 1;
  std::string device = "cpu";  // cpu | cuda (one GPU per rank, by local rank)
  bool quiet = false;
  std::string config_file;
};

// Parses the arguments that follow `culprit train` (and --config FILE; the command line wins).
// Sets *help when --help was given. Errors name the option and the problem.
Status parse_train_options(const std::vector<std::string>& args, TrainConfig* cfg, bool* help);
// The configuration a run recorded in RUN/run.json, injected faults included (replays simulate the
// same faulty devices).
Status load_run_config(const std::string& run_dir, TrainConfig* cfg);
// Every `culprit train` option with its default.
std::string train_options_help();
// The fully resolved configuration as INI text (key = value per line), loadable with --config.
std::string to_ini(const TrainConfig& cfg);
// Options that fix a run's results: a resumed run must keep them.
std::vector<std::string> determinism_critical_options();
// Checks the configuration against the world size; no I/O.
Status validate(const TrainConfig& cfg, int world_size);

// The learning rate of 1-based step `step` (docs/determinism.md, "Learning rate").
double learning_rate(const TrainConfig& cfg, std::int64_t step);

// Trains. Collective over comm: every rank returns the same Status.
Status train(const TrainConfig& cfg, const Comm& comm);

}  // namespace culprit::harness
