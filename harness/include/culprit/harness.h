// culprit harness: deterministic, world-size-invariant data-parallel training with libtorch.
// The training contract is in docs/determinism.md; options in docs/cli.md. Every option is declared
// once, in train_options() (harness/config/train_options.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "culprit/command.h"
#include "culprit/mpi_util.h"
#include "culprit/names.h"
#include "culprit/options.h"
#include "culprit/status.h"

namespace culprit::harness {

// ---- the vocabularies of `culprit train`'s options ----

enum class TraceLevel { kOff, kStep, kLayer };
inline constexpr NameRow<TraceLevel> kTraceLevelNames[] = {
    {TraceLevel::kOff, "off"}, {TraceLevel::kStep, "step"}, {TraceLevel::kLayer, "layer"}};
constexpr NameTable<TraceLevel> enum_names(TraceLevel) { return {kTraceLevelNames, std::size(kTraceLevelNames), "level"}; }

enum class OnDetect { kHalt, kWarn, kDiagnose };
inline constexpr NameRow<OnDetect> kOnDetectNames[] = {
    {OnDetect::kHalt, "halt"}, {OnDetect::kWarn, "warn"}, {OnDetect::kDiagnose, "diagnose"}};
constexpr NameTable<OnDetect> enum_names(OnDetect) { return {kOnDetectNames, std::size(kOnDetectNames), "action"}; }

enum class SpikeAction { kWarn, kHalt };
inline constexpr NameRow<SpikeAction> kSpikeActionNames[] = {{SpikeAction::kWarn, "warn"}, {SpikeAction::kHalt, "halt"}};
constexpr NameTable<SpikeAction> enum_names(SpikeAction) {
  return {kSpikeActionNames, std::size(kSpikeActionNames), "action"};
}

// script: the optimizer object of a Python script (the Python package sets it, docs/python.md),
// stepped as the script wrote it; sgd and adamw: culprit's own update.
enum class OptimizerKind { kSgd, kAdamW, kScript };
inline constexpr NameRow<OptimizerKind> kOptimizerNames[] = {
    {OptimizerKind::kSgd, "sgd"}, {OptimizerKind::kAdamW, "adamw"}, {OptimizerKind::kScript, "script"}};
constexpr NameTable<OptimizerKind> enum_names(OptimizerKind) {
  return {kOptimizerNames, std::size(kOptimizerNames), "optimizer"};
}

enum class LrSchedule { kConstant, kCosine };
inline constexpr NameRow<LrSchedule> kLrScheduleNames[] = {{LrSchedule::kConstant, "constant"}, {LrSchedule::kCosine, "cosine"}};
constexpr NameTable<LrSchedule> enum_names(LrSchedule) { return {kLrScheduleNames, std::size(kLrScheduleNames), "schedule"}; }

enum class DeviceKind { kCpu, kCuda };
inline constexpr NameRow<DeviceKind> kDeviceNames[] = {{DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"}};
constexpr NameTable<DeviceKind> enum_names(DeviceKind) { return {kDeviceNames, std::size(kDeviceNames), "device"}; }

// --precision: fp32 everywhere, or bf16 autocast for the forward pass with fp32 master parameters,
// gradients, reduction and optimizer state (docs/determinism.md, "Mixed precision").
enum class Precision { kFp32, kBf16 };
inline constexpr NameRow<Precision> kPrecisionNames[] = {{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}};
constexpr NameTable<Precision> enum_names(Precision) { return {kPrecisionNames, std::size(kPrecisionNames), "precision"}; }

// --weight-decay-params: which parameters weight decay applies to. matrices: weights of 2 or more
// dimensions that are not embeddings (biases and norms excluded as nanoGPT and Megatron do, and
// embeddings too, which both of those decay); all: every parameter, as
// torch.optim.AdamW(model.parameters()) does; ndim2: every parameter of 2 or more dimensions,
// embeddings included (nanoGPT's configure_optimizers); auto: matrices for adamw, all for sgd.
enum class DecayParams { kAuto, kMatrices, kAll, kNdim2 };
inline constexpr NameRow<DecayParams> kDecayParamsNames[] = {{DecayParams::kAuto, "auto"},
                                                             {DecayParams::kMatrices, "matrices"},
                                                             {DecayParams::kAll, "all"},
                                                             {DecayParams::kNdim2, "ndim2"}};
constexpr NameTable<DecayParams> enum_names(DecayParams) {
  return {kDecayParamsNames, std::size(kDecayParamsNames), "parameter set"};
}

// --model mlp | cnn | gpt | torchscript:PATH | python:SCRIPT:FUNCTION. python: a user's PyTorch
// module, built by FUNCTION of SCRIPT (the Python package, docs/python.md); set by the package.
enum class ModelKind { kMlp, kCnn, kGpt, kTorchScript, kPython };
inline constexpr NameRow<ModelKind> kModelNames[] = {{ModelKind::kMlp, "mlp"},
                                                     {ModelKind::kCnn, "cnn"},
                                                     {ModelKind::kGpt, "gpt"},
                                                     {ModelKind::kTorchScript, "torchscript"},
                                                     {ModelKind::kPython, "python"}};
constexpr NameTable<ModelKind> enum_names(ModelKind) { return {kModelNames, std::size(kModelNames), "model"}; }
struct ModelSpec {
  ModelKind kind = ModelKind::kMlp;
  std::string path;  // torchscript: the file; python: SCRIPT:FUNCTION
  bool has_path() const { return kind == ModelKind::kTorchScript || kind == ModelKind::kPython; }
  std::string text() const { return has_path() ? std::string(name_of(kind)) + ":" + path : name_of(kind); }
};

// --data synthetic | hdf5:PATH | tokens:PATH | python (docs/data.md). python: the data set the
// model's script gives (docs/python.md).
enum class DataKind { kSynthetic, kHdf5, kTokens, kPython };
struct DataSpec {
  DataKind kind = DataKind::kSynthetic;
  std::string path;  // hdf5, tokens
  std::string text() const {
    return kind == DataKind::kHdf5     ? "hdf5:" + path
           : kind == DataKind::kTokens ? "tokens:" + path
           : kind == DataKind::kPython ? "python"
                                       : "synthetic";
  }
};

// --token-dtype: the ids of tokens:PATH (auto: from PATH.json).
enum class TokenDType { kAuto, kUint16, kUint32 };
inline constexpr NameRow<TokenDType> kTokenDTypeNames[] = {
    {TokenDType::kAuto, "auto"}, {TokenDType::kUint16, "uint16"}, {TokenDType::kUint32, "uint32"}};
constexpr NameTable<TokenDType> enum_names(TokenDType) { return {kTokenDTypeNames, std::size(kTokenDTypeNames), "token dtype"}; }

// --shuffle: the epoch's sample order (docs/determinism.md, "1. Data order"): torch.randperm of a
// generator seeded with seed + epoch, or a keyed Feistel bijection (O(1) memory per position).
enum class Shuffle { kRandperm, kFeistel };
inline constexpr NameRow<Shuffle> kShuffleNames[] = {{Shuffle::kRandperm, "randperm"}, {Shuffle::kFeistel, "feistel"}};
constexpr NameTable<Shuffle> enum_names(Shuffle) { return {kShuffleNames, std::size(kShuffleNames), "order"}; }

// Checkpoints: when, how many are kept, who writes.
struct CheckpointOptions {
  std::int64_t every = 10;  // 0: only after the last step
  int keep_last = 3;
  std::int64_t keep_every = 0;
  int writers_per_host = 1;  // 0: every rank writes its slice
  bool async = true;
};

// The online detectors (docs/detection.md) and what a detection does.
struct DetectorOptions {
  OnDetect on_detect = OnDetect::kHalt;
  bool nonfinite = true;
  bool comm_check = true;         // fingerprint every reduction message at both ends
  int spike_window = 20;          // 0: no spike detection
  double spike_z = 8.0, spike_ratio = 3.0;
  SpikeAction spike_action = SpikeAction::kWarn;
  std::int64_t replica_check_every = 1;  // 0: off
  double spot_check = 0.0;        // fraction of micro-shards recomputed by another rank each step
  bool invariants = true;         // training invariants
  double collective_timeout = 300;  // seconds a rank waits in a collective before naming the silent rank(s)
  // Whether a detection halts the run: --on-detect halt or diagnose.
  bool halts() const { return on_detect != OnDetect::kWarn; }
};

// The optimizer and its learning-rate schedule.
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  LrSchedule schedule = LrSchedule::kConstant;
  double min_lr = 0;  // the cosine schedule's floor
  std::int64_t warmup_steps = 0;
  DecayParams decay_params = DecayParams::kAuto;
  double clip_grad_norm = 0;  // the reduced gradient's global L2 norm at most this (0: no clipping)
  // --optimizer script: the script optimizer's class, and its per-parameter state as NAME:KIND,...
  // (KIND tensor, int or float), which its checkpoints hold and a resume must find again.
  std::string script_optimizer, script_state;
  // Whether weight decay applies to a parameter of `dims` dimensions (an embedding table or not).
  bool decays(std::int64_t dims, bool embedding) const {
    if (decay_params == DecayParams::kNdim2) return dims >= 2;
    return !decay_matrices_only() || (dims >= 2 && !embedding);
  }
  bool decay_matrices_only() const {
    return decay_params == DecayParams::kMatrices || (decay_params == DecayParams::kAuto && kind == OptimizerKind::kAdamW);
  }
};

// gpt's initialisation: libtorch's module defaults, or GPT-2's (weights N(0, 0.02), the residual
// projections N(0, 0.02 / sqrt(2 x layers)), biases 0, norms 1).
enum class GptInit { kTorch, kGpt2 };
inline constexpr NameRow<GptInit> kGptInitNames[] = {{GptInit::kTorch, "torch"}, {GptInit::kGpt2, "gpt2"}};
constexpr NameTable<GptInit> enum_names(GptInit) { return {kGptInitNames, std::size(kGptInitNames), "initialisation"}; }

// The built-in gpt's shape (docs/models.md): pre-LN decoder blocks with a GELU MLP.
struct GptOptions {
  int layers = 2;
  std::int64_t width = 32;  // d_model; the MLP is 4 x width
  int heads = 2;            // must divide width
  std::int64_t seq_len = 0;  // 0: synthetic data: 16; hdf5 data: the data's sequence length
  std::int64_t vocab = 0;    // 0: synthetic data: 32; hdf5 data: the largest token id + 1
  bool tie_head = false;     // the output head shares tok_emb's weight (GPT-2)
  GptInit init = GptInit::kTorch;
};

// The most steps any step-valued option may name (--steps, --checkpoint-every, replay's --step,
// ...): 10^9 steps is thirty years at one step a second, so a larger value is a slip of the keyboard.
inline constexpr std::int64_t kMaxSteps = 1'000'000'000;
// The widest classifier output (--classes, or the largest label + 1 of HDF5 data): 2^20, twenty
// times the largest vocabularies in use; a label beyond it is damaged data, not a class.
inline constexpr int kMaxClasses = 1 << 20;

struct TrainConfig {
  std::string run_dir;
  // The run's identity (RUN/run.json "run_id", in every checkpoint and trace it writes): set by
  // train and by loading a run, never an option; empty for a run from before identities.
  std::string run_id;
  bool resume = false;             // continue from the newest valid checkpoint of run_dir
  std::string resume_from;         // continue from this checkpoint file
  CheckpointOptions checkpoint;
  TraceLevel trace = TraceLevel::kLayer;  // layer: a silent fault is localised to its layer by default
  // Keep at least the newest N steps of the trace (files roll at checkpoints, older ones are
  // deleted unless the run has had an incident); 0: the whole trace.
  std::int64_t trace_keep = 0;
  std::vector<std::string> inject;  // fault specs (culprit/fault_spec.h)
  DetectorOptions detect;
  std::int64_t steps = 20;
  std::int64_t global_batch = 32;
  int micro_shards = 8;
  std::uint64_t seed = 1234;
  ModelSpec model;
  // --model python: the fingerprint of SCRIPT's bytes when the run was trained (set by the Python
  // package): a replay of an edited script is refused.
  std::string script_fingerprint;
  DataSpec data;
  TokenDType token_dtype = TokenDType::kAuto;
  Shuffle shuffle = Shuffle::kRandperm;
  bool shard_optimizer = false;    // each rank keeps the optimizer state of its slice (docs/determinism.md)
  bool shard_params = false;       // ... and only its slice of the parameters, gathered layer by layer (ZeRO-3)
  bool keep_gathered = false;      // --shard-params: a gathered layer stays for the step's local micro-shards
  bool memory_metrics = false;     // metrics.jsonl: each step's peak resident memory and the parameters' resident bytes
  bool sharded() const { return shard_optimizer || shard_params; }  // the optimizer state in slices
  // --tp-chunks C > 0: gpt's tensor-parallel form, every cross-shard sum cut into C chunks summed in a
  // fixed tree (docs/determinism.md, "Tensor parallelism"); --tensor-parallel T ranks share each
  // micro-shard, each computing C / T of the chunks. The chunks define the bits; T is a layout.
  int tp_chunks = 0;
  int tensor_parallel = 1;
  bool chunked() const { return tp_chunks > 0; }
  // The data-parallel ranks: world / T.
  int data_parallel(int world) const { return chunked() ? world / tensor_parallel : world; }
  std::int64_t samples = 2048;     // synthetic data set size
  std::int64_t hidden = 64;        // mlp: hidden width
  std::vector<std::int64_t> sample_shape;  // synthetic sample shape; empty: the model's default
  int classes = 0;                 // output width for integer labels; 0: the model's default
                                   // (synthetic) or the largest label + 1 (hdf5); gpt: gpt.vocab
  GptOptions gpt;
  Precision precision = Precision::kFp32;
  OptimizerOptions optim;
  int threads = 1;
  double bucket_mb = 4;  // the reduction overlapped with the backward pass, in buckets of this size; 0: after it
  DeviceKind device = DeviceKind::kCpu;  // cuda: one GPU per rank, by local rank
  bool quiet = false;
  bool tracing() const { return trace != TraceLevel::kOff; }
};

// gpt's sequence length and vocabulary for synthetic data (--seq-len, --vocab; 0: the defaults).
inline std::int64_t gpt_seq_len(const TrainConfig& c) { return c.gpt.seq_len ? c.gpt.seq_len : 16; }
inline std::int64_t gpt_vocab(const TrainConfig& c) { return c.gpt.vocab ? c.gpt.vocab : 32; }

// Every `culprit train` option, once: parsing, help, INI text, checks, the determinism-critical list.
const opts::Table<TrainConfig>& train_options();

// Parses the arguments that follow `culprit train` (and --config FILE; the command line wins; with
// --resume the run's own configuration fills the rest). Sets *help when --help was given. Errors
// name the option and the problem.
Status parse_train_options(const std::vector<std::string>& args, TrainConfig* cfg, bool* help);
// The configuration a run recorded in RUN/run.json, injected faults included (replays simulate the
// same faulty devices).
Status load_run_config(const std::string& run_dir, TrainConfig* cfg);
// A configuration as a run recorded it (run.json's or a checkpoint's INI text) into *cfg, read as
// load_run_config reads it (options a run from before them lacks mean what culprit did then).
Status parse_recorded_config(const std::string& ini, TrainConfig* cfg);
// The first determinism-critical option whose value differs between two configurations ("" when
// none does): its name, and each side's value as the INI text writes it.
std::string first_critical_difference(const TrainConfig& a, const TrainConfig& b, std::string* a_value,
                                      std::string* b_value);
// RUN/run.json's "run_id" ("" for a run from before run identities).
Status stored_run_id(const std::string& run_dir, std::string* id);
// The fully resolved configuration as INI text (key = value per line), loadable with --config: what
// run.json and every checkpoint record. A model culprit does not build (torchscript, python) records
// only the options that apply to it and to its data; built-in models record every option.
std::string to_ini(const TrainConfig& cfg);
// Checks the configuration (every option's own checks, then how they combine, and the world size);
// no I/O.
Status validate(const TrainConfig& cfg, int world_size);

// The learning rate of 1-based step `step` (docs/determinism.md, "Learning rate").
double learning_rate(const TrainConfig& cfg, std::int64_t step);

// A shape for messages: "[4,3,32,32]".
std::string shape_str(const std::vector<std::int64_t>& shape);

}  // namespace culprit::harness
