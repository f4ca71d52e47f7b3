// `culprit train`'s options, declared once (culprit/options.h): the table gives the parser (command
// line, --config INI, the run's own configuration on --resume), the help, the INI text in run.json
// and every checkpoint, each option's checks and the determinism-critical list. How options combine
// is checked in validate(); the learning-rate schedule they describe is learning_rate().
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "culprit/run_files.h"
#include "culprit/fault_spec.h"
#include "culprit/harness.h"
#include "culprit/system.h"
#include "config/sizes.h"

namespace culprit::harness {

namespace {

using opts::kCritical;
using opts::kNotRecorded;
using opts::Range;
using C = TrainConfig;

Status parse_list(const std::string& opt, const std::string& text, std::vector<double>* out) {
  out->clear();
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    double v = 0;
    if (!opts::parse_number(opt, item, &v).ok())
      return Status::BadInput("option '--" + opt + "': '" + text + "' is not a comma-separated list of numbers");
    out->push_back(v);
  }
  return Status::OK();
}

Status set_model(C* c, const std::string& t) {
  const std::string ts = "torchscript:", py = "python:";
  if (t.rfind(ts, 0) == 0) {
    if (t.size() == ts.size()) return Status::BadInput("option '--model': torchscript: needs a path");
    c->model = {ModelKind::kTorchScript, t.substr(ts.size())};
    return Status::OK();
  }
  if (t.rfind(py, 0) == 0) {  // SCRIPT:FUNCTION, as the Python package records it
    const std::size_t colon = t.rfind(':');
    if (colon <= py.size() || colon + 1 == t.size())
      return Status::BadInput("option '--model': '" + t + "' is not python:SCRIPT:FUNCTION");
    c->model = {ModelKind::kPython, t.substr(py.size())};
    return Status::OK();
  }
  ModelKind k{};
  if (!parse_name(t, &k) || k == ModelKind::kTorchScript || k == ModelKind::kPython)
    return Status::BadInput("option '--model': unknown model '" + t +
                            "' (valid: mlp, cnn, gpt, torchscript:PATH, python:SCRIPT:FUNCTION)");
  c->model = {k, ""};
  return Status::OK();
}

Status set_data(C* c, const std::string& t) {
  if (t == "synthetic" || t == "python") {
    c->data = {t == "python" ? DataKind::kPython : DataKind::kSynthetic, ""};
    return Status::OK();
  }
  for (const auto& [prefix, kind] : {std::pair<std::string, DataKind>{"hdf5:", DataKind::kHdf5}, {"tokens:", DataKind::kTokens}}) {
    if (t.rfind(prefix, 0) != 0) continue;
    if (t.size() == prefix.size()) return Status::BadInput("option '--data': " + prefix + " needs a path");
    c->data = {kind, t.substr(prefix.size())};
    return Status::OK();
  }
  return Status::BadInput("option '--data': unknown data source '" + t + "' (valid: synthetic, hdf5:PATH, tokens:PATH, python)");
}

Status set_betas(C* c, const std::string& t) {
  std::vector<double> v;
  CULPRIT_RETURN_IF_ERROR(parse_list("betas", t, &v));
  if (v.size() != 2) return Status::BadInput("option '--betas' needs two numbers, beta1,beta2");
  c->optim.beta1 = v[0];
  c->optim.beta2 = v[1];
  return Status::OK();
}

Status set_sample_shape(C* c, const std::string& t) {
  std::vector<double> v;
  CULPRIT_RETURN_IF_ERROR(parse_list("sample-shape", t, &v));
  c->sample_shape.clear();
  // Each dimension alone is bounded here; whether their product fits memory, validate() asks.
  constexpr double kMaxDim = 1 << 24;
  if (v.size() > 8) return Status::BadInput("option '--sample-shape' must have at most 8 dimensions, got '" + t + "'");
  for (double d : v) {
    if (!(d >= 1 && d <= kMaxDim) || d != std::floor(d))
      return Status::BadInput("option '--sample-shape': every dimension must be an integer in [1, 16777216], got '" + t + "'");
    c->sample_shape.push_back(static_cast<std::int64_t>(d));
  }
  return Status::OK();
}

std::string join(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// The members of the option groups.
template <class T>
opts::Field<C, T> ck(T CheckpointOptions::*m) { return opts::field(&C::checkpoint, m); }
template <class T>
opts::Field<C, T> det(T DetectorOptions::*m) { return opts::field(&C::detect, m); }
template <class T>
opts::Field<C, T> opt(T OptimizerOptions::*m) { return opts::field(&C::optim, m); }
template <class T>
opts::Field<C, T> gpt(T GptOptions::*m) { return opts::field(&C::gpt, m); }

opts::Table<C> make_table() {
  using opts::choice;
  using opts::custom;
  using opts::flag;
  using opts::number;
  using opts::text;
  // Every number has a range (docs/cli.md, "Ranges"): what the option can mean, with room, or what
  // the machine has; sizes that must fit memory together are checked in validate().
  const auto steps_or_off = Range<std::int64_t>{0, kMaxSteps};
  const auto window = Range<int>{0, 1'000'000};
  const auto threshold = Range<double>{0, 1e6};
  const auto rate = Range<double>{0, 1e6};
  // clang-format off
  return opts::Table<C>("culprit train options", {
    text<C>("run-dir", &C::run_dir, "run directory (created)", opts::kRequired),
    flag<C>("resume", &C::resume, "continue the run in --run-dir from its newest valid checkpoint (its configuration is the default)", kNotRecorded),
    text<C>("resume-from", &C::resume_from, "continue the run in --run-dir from this checkpoint file", kNotRecorded),
    number<C>("checkpoint-every", ck(&CheckpointOptions::every), "checkpoint every K steps (0: only after the last step, which is always checkpointed)", steps_or_off),
    number<C>("keep-last", ck(&CheckpointOptions::keep_last), "keep the newest N checkpoints", Range<int>{1, 1'000'000}),
    number<C>("keep-every", ck(&CheckpointOptions::keep_every), "also keep every checkpoint whose step is a multiple of E (0: none)", steps_or_off),
    number<C>("checkpoint-writers-per-host", ck(&CheckpointOptions::writers_per_host), "ranks per host that write checkpoint data, each a slice of every large tensor (0: every rank); the ranks of a host share its I/O path", Range<int>{0, 1024}),
    flag<C>("async-checkpoint", ck(&CheckpointOptions::async), "write checkpoints in a background thread, which also copies the state to host memory while the next step's forward and backward passes run (training waits at most for what is left of that copy)"),
    opts::texts<C>("inject", &C::inject, "inject a fault (repeatable): step=S,rank=R,layer=NAME,phase=P,kind=K[,index=I,bit=B,factor=F,mode=M,p=P] (docs/detection.md)"),
    choice<C>("on-detect", det(&DetectorOptions::on_detect), "halt | warn | diagnose: what a detection does (halt: every rank exits with the class's code; diagnose: culprit bisect runs in the job and its verdict is the exit code)"),
    flag<C>("detect-nonfinite", det(&DetectorOptions::nonfinite), "detect NaN/Inf in micro-shard losses and gradients and in the parameters"),
    number<C>("spike-window", det(&DetectorOptions::spike_window), "loss and gradient-norm spike detection over the last N steps (0: off)", window),
    number<C>("spike-z", det(&DetectorOptions::spike_z), "spike: robust z-score (median/MAD) above this ...", threshold),
    number<C>("spike-ratio", det(&DetectorOptions::spike_ratio), "... and more than this times the window's maximum", threshold),
    choice<C>("spike-action", det(&DetectorOptions::spike_action), "warn | halt: a spike is logged as a warning unless halt"),
    flag<C>("comm-check", det(&DetectorOptions::comm_check), "fingerprint every reduction message as sent and as received; a mismatch names sender and receiver"),
    number<C>("replica-check-every", det(&DetectorOptions::replica_check_every), "compare parameter and optimizer-state fingerprints across ranks every N steps (0: off)", steps_or_off),
    number<C>("spot-check", det(&DetectorOptions::spot_check), "recompute this fraction of micro-shards per step on another rank and compare bitwise (redundant computation; 0: off, 1: every micro-shard)", Range<double>{0, 1}),
    flag<C>("check-invariants", det(&DetectorOptions::invariants), "check training invariants: parameters change, gradients start at zero, each sample once per epoch, learning rate as scheduled, dropout masks differ"),
    // Below a second a busy but healthy rank would be named silent; a week outlasts any collective.
    number<C>("collective-timeout", det(&DetectorOptions::collective_timeout), "seconds a rank waits in a collective (or for its checkpoint writer) before it names the silent rank(s) and ends the job with exit 13 (0: wait forever)", Range<double>{1, 604800}.or_zero("wait forever")),
    choice<C>("trace", &C::trace, "off | step | layer: per-step fingerprint trace in RUN/trace/ (layer: also every layer's forward output and backward gradient)", kCritical),
    number<C>("trace-keep", &C::trace_keep, "keep at least the newest N steps of the trace: its files roll at checkpoints (each of N/4 steps, at least 64) and older files are deleted, except once the run has had an incident (0: keep the whole trace)", steps_or_off),
    number<C>("steps", &C::steps, "optimizer steps to run", Range<std::int64_t>{1, kMaxSteps}),
    number<C>("global-batch", &C::global_batch, "samples per step (B)", Range<std::int64_t>{1, 1 << 30}, kCritical),
    number<C>("micro-shards", &C::micro_shards, "micro-shards per step (M: a power of two, B divisible by M, world size <= M)", Range<int>{1, 1 << 20}, kCritical),
    number<C>("seed", &C::seed, "seed of data order, initialisation, dropout and synthetic data", {}, kCritical),
    custom<C>("model", "mlp | cnn | gpt | torchscript:PATH | python:SCRIPT:FUNCTION (a PyTorch module built by FUNCTION of SCRIPT; set by the Python package, docs/python.md)", set_model, [](const C& c) { return c.model.text(); }, kCritical),
    text<C>("script-fingerprint", &C::script_fingerprint, "--model python: the fingerprint of SCRIPT as trained (set by the Python package; replays of an edited script are refused)", kCritical),
    custom<C>("data", "synthetic | hdf5:PATH (datasets x and y) | tokens:PATH (a flat file of uint16/uint32 token ids; docs/data.md) | python (the data set of the model's script; docs/python.md)", set_data, [](const C& c) { return c.data.text(); }, kCritical),
    choice<C>("token-dtype", &C::token_dtype, "tokens data: auto | uint16 | uint32: the token ids' type (auto: PATH.json's \"dtype\")", kCritical),
    choice<C>("shuffle", &C::shuffle, "randperm | feistel: the epoch's sample order: torch.randperm (8 bytes per sample) or a keyed Feistel bijection (O(1) memory; docs/determinism.md)", kCritical),
    flag<C>("shard-optimizer", &C::shard_optimizer, "each rank keeps the optimizer state of, and updates, one slice of the flat parameters, then the ranks gather the parameters (ZeRO-1); the same bits as without"),
    flag<C>("shard-params", &C::shard_params, "each rank keeps only its slice of the parameters, of their gradient and of their optimizer state, and updates it; a layer's parameters are gathered just before its forward and again before its backward, and released after each, and each micro-shard's gradient goes to the slices' owners during its backward pass (ZeRO-3, FSDP); implies --shard-optimizer's slices; the same bits as without"),
    flag<C>("memory-metrics", &C::memory_metrics, "metrics.jsonl gets rank 0's peak resident memory during each step (peak_rss_bytes) and the resident bytes of its parameter buffer after it (param_resident_bytes), as the kernel reports them; with --shard-params also of its gradient's buffers (grad_resident_bytes)"),
    flag<C>("keep-gathered", &C::keep_gathered, "--shard-params: a layer's parameters, once gathered in a step, stay until the rank's micro-shards of the step are all computed (one gather per layer and step; memory: the whole model during the step)"),
    number<C>("tensor-parallel", &C::tensor_parallel, "gpt: ranks that share each micro-shard, each computing --tp-chunks / T of every layer's chunks (tensor parallelism: attention heads and the MLP's hidden units split, the partial sums exchanged); the world is T x D ranks, D the data-parallel ranks; the same bits at every T (docs/determinism.md, \"Tensor parallelism\")", Range<int>{1, 1024}),
    number<C>("tp-chunks", &C::tp_chunks, "gpt: cut every sum that crosses tensor-parallel shards into C chunks (each heads / C attention heads and 4 x width / C hidden units) summed in a fixed tree, whatever --tensor-parallel is (0: the plain gpt; --tensor-parallel > 1 without it: C = --heads); C must divide --heads and T must divide C", Range<int>{0, 1024}, kCritical),
    number<C>("hidden", &C::hidden, "mlp: hidden units per layer", Range<std::int64_t>{1, 1 << 20}, kCritical),
    number<C>("samples", &C::samples, "synthetic data: number of samples", Range<std::int64_t>{1, std::int64_t{1} << 40}, kCritical),
    custom<C>("sample-shape", "synthetic data: sample shape, e.g. 1,16,16 (empty: the model's default)", set_sample_shape, [](const C& c) { return join(c.sample_shape); }, kCritical),
    number<C>("classes", &C::classes, "the model's output width for integer labels (not gpt: see --vocab); every label of the data must be in [0, classes); 0: synthetic data: the model's default, hdf5 data: the largest label + 1", Range<int>{0, kMaxClasses}, kCritical),
    number<C>("layers", gpt(&GptOptions::layers), "gpt: transformer blocks", Range<int>{1, 1024}, kCritical),
    number<C>("width", gpt(&GptOptions::width), "gpt: model width (d_model; the MLP is 4 x width)", Range<std::int64_t>{1, 1 << 16}, kCritical),
    number<C>("heads", gpt(&GptOptions::heads), "gpt: attention heads (must divide --width)", Range<int>{1, 1024}, kCritical),
    number<C>("seq-len", gpt(&GptOptions::seq_len), "gpt and tokens data: tokens per sample (0: synthetic data: 16, hdf5 data: the data's, tokens data: PATH.json's \"seq_len\"; given, it must equal the data's)", Range<std::int64_t>{0, 1 << 20}, kCritical),
    number<C>("vocab", gpt(&GptOptions::vocab), "gpt and tokens data: vocabulary size; every token id and target must be in [0, vocab) (0: synthetic data: 32, tokens data: PATH.json's \"vocab\", else the largest token id + 1)", Range<std::int64_t>{0, kMaxClasses}, kCritical),
    flag<C>("tie-head", gpt(&GptOptions::tie_head), "gpt: the output head is tok_emb's weight, without a bias (GPT-2); off: a Linear head of its own", kCritical),
    choice<C>("init", gpt(&GptOptions::init), "gpt: torch | gpt2: libtorch's module initialisation, or GPT-2's (weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2 x layers)), biases 0)", kCritical),
    choice<C>("precision", &C::precision, "fp32 | bf16: bf16 runs the forward pass (model and loss) under autocast to bfloat16 with float32 master parameters, gradients, reduction and optimizer state (docs/determinism.md)", kCritical),
    choice<C>("optimizer", opt(&OptimizerOptions::kind), "sgd | adamw | script (script: the optimizer object of a Python script, stepped as written; set by the Python package, docs/python.md)", kCritical),
    text<C>("script-optimizer", opt(&OptimizerOptions::script_optimizer), "--optimizer script: the script optimizer's class (set by the Python package)", kCritical),
    text<C>("optimizer-state", opt(&OptimizerOptions::script_state), "--optimizer script: its per-parameter state as NAME:KIND,... (KIND tensor, int or float; set by the Python package)", kCritical),
    number<C>("lr", opt(&OptimizerOptions::lr), "peak learning rate", rate, kCritical),
    number<C>("momentum", opt(&OptimizerOptions::momentum), "sgd: momentum", Range<double>{0, 1}, kCritical),
    flag<C>("nesterov", opt(&OptimizerOptions::nesterov), "sgd: Nesterov momentum", kCritical),
    number<C>("weight-decay", opt(&OptimizerOptions::weight_decay), "weight decay (adamw: decoupled)", rate, kCritical),
    choice<C>("weight-decay-params", opt(&OptimizerOptions::decay_params), "auto | matrices | all | ndim2: the parameters weight decay applies to (matrices: weights of 2 or more dimensions that are not embeddings; biases, norms and embeddings get none; ndim2: every parameter of 2 or more dimensions, embeddings included, as nanoGPT's configure_optimizers; auto: matrices for adamw, all for sgd)", kCritical),
    number<C>("clip-grad-norm", opt(&OptimizerOptions::clip_grad_norm), "clip the reduced gradient to this global L2 norm before the update, as torch.nn.utils.clip_grad_norm_ (0: no clipping); the detectors and metrics see the norm before clipping", Range<double>{0, 1e12}, kCritical),
    custom<C>("betas", "adamw: beta1,beta2", set_betas, [](const C& c) { return opts::format_number(c.optim.beta1) + "," + opts::format_number(c.optim.beta2); }, kCritical),
    number<C>("eps", opt(&OptimizerOptions::eps), "adamw: epsilon", Range<double>::above(0, 1), kCritical),
    choice<C>("lr-schedule", opt(&OptimizerOptions::schedule), "constant | cosine (over --steps, from --lr down to --min-lr)", kCritical),
    number<C>("min-lr", opt(&OptimizerOptions::min_lr), "--lr-schedule cosine: the floor it decays to at the last step (nanoGPT's min_lr; 0: to zero)", rate, kCritical),
    number<C>("warmup-steps", opt(&OptimizerOptions::warmup_steps), "linear warm-up steps", steps_or_off, kCritical),
    // More intra-op threads than cores only slows a rank (and thousands of threads can hang it).
    number<C>("threads", &C::threads, "intra-op threads per rank (cores: those the system lets the rank run on)", Range<int>{1, system_cores()}.because(cores_reason(), "[1, cores]"), kCritical),
    number<C>("bucket-mb", &C::bucket_mb, "the gradient reduction overlaps the last micro-shard's backward pass, in buckets of at least this many MiB of whole parameters, reduced in the same tree: the same bits (docs/determinism.md); 0: it starts after the backward pass", Range<double>{0, 1 << 20}),
    choice<C>("device", &C::device, "cpu | cuda: where each rank computes (cuda: the GPU of index local rank mod GPUs on the host; needs culprit built against a CUDA-enabled libtorch, docs/cuda.md)"),
    flag<C>("quiet", &C::quiet, "no per-step line on stdout", kNotRecorded),
  });
  // clang-format on
}

// The resolved configuration a run recorded in RUN/run.json.
Status stored_config(const std::string& run_dir, std::string* ini) {
  const auto path = std::filesystem::path(run_dir) / "run.json";
  std::string text;
  bool absent = false;
  CULPRIT_RETURN_IF_ERROR(files::read_regular(path.string(), files::kMaxJsonRecordBytes, "a culprit run.json", &text, &absent));
  if (absent) return Status::BadInput("'" + run_dir + "' holds no run (no run.json)");
  try {
    auto j = nlohmann::json::parse(text);
    *ini = j.at("config").get<std::string>();
  } catch (const std::exception& e) {
    return Status::Damaged("'" + path.string() + "' is not a culprit run.json");
  }
  return Status::OK();
}

// The stored configuration without its injected faults: they belong to the invocation that named
// them, and a resumed run does not repeat them.
std::string without_faults(const std::string& ini) {
  std::istringstream lines(ini);
  std::string line, kept;
  while (std::getline(lines, line))
    if (line.rfind("inject", 0) != 0) kept += line + "\n";
  return kept;
}

// The model options apply to their model only: one given to another model is a mistake.
Status validate_model_options(const C& c) {
  const GptOptions& g = c.gpt;
  const GptOptions d;
  if (c.model.kind != ModelKind::kMlp && c.hidden != TrainConfig().hidden)
    return Status::BadInput("option '--hidden' applies to --model mlp, not " + c.model.text());
  if (!c.script_fingerprint.empty() && c.model.kind != ModelKind::kPython)
    return Status::BadInput("option '--script-fingerprint' applies to --model python:SCRIPT:FUNCTION, not " +
                            c.model.text());
  const bool tokens = c.data.kind == DataKind::kTokens;  // --seq-len and --vocab shape the data for any model
  if (tokens && c.classes != 0)
    return Status::BadInput("option '--classes' does not apply to tokens data: its width is the vocabulary, --vocab " +
                            std::to_string(c.classes));
  if (tokens && !c.sample_shape.empty())
    return Status::BadInput("option '--sample-shape' does not apply to tokens data: its samples are --seq-len tokens");
  if (c.data.kind != DataKind::kTokens && c.token_dtype != TokenDType::kAuto)
    return Status::BadInput("option '--token-dtype' applies to --data tokens:PATH, not " + c.data.text());
  if (c.model.kind != ModelKind::kGpt) {
    for (const auto& [name, differs] : {std::pair<const char*, bool>{"layers", g.layers != d.layers},
                                        {"width", g.width != d.width}, {"heads", g.heads != d.heads},
                                        {"seq-len", !tokens && g.seq_len != d.seq_len}, {"vocab", !tokens && g.vocab != d.vocab},
                                        {"tie-head", g.tie_head != d.tie_head}, {"init", g.init != d.init}})
      if (differs)
        return Status::BadInput(std::string("option '--") + name + "' applies to --model gpt, not " + c.model.text());
    return Status::OK();
  }
  if (g.width % g.heads != 0)
    return Status::BadInput("option '--heads' " + std::to_string(g.heads) + " does not divide --width " +
                            std::to_string(g.width) + ": every head gets width / heads dimensions");
  if (c.classes != 0)
    return Status::BadInput("option '--classes' is the output width of a classifier; gpt's is its vocabulary: --vocab " +
                            std::to_string(c.classes));
  if (!c.sample_shape.empty())
    return Status::BadInput("option '--sample-shape' does not apply to --model gpt: its samples are --seq-len tokens");
  return Status::OK();
}

// --tensor-parallel and --tp-chunks: gpt's chunked form, and what it does not (yet) combine with.
Status validate_tensor_parallel(const C& c, int world) {
  const int T = c.tensor_parallel, C = c.tp_chunks;
  if (T > 1 && C == 0)
    return Status::BadInput("option '--tensor-parallel' splits gpt's chunks (--tp-chunks) across ranks; it applies to "
                            "--model gpt, not " + c.model.text());
  if (!c.chunked()) return Status::OK();
  if (c.model.kind != ModelKind::kGpt)
    return Status::BadInput("option '--tp-chunks' applies to --model gpt, not " + c.model.text());
  if (c.gpt.heads % C != 0)
    return Status::BadInput("option '--tp-chunks' " + std::to_string(C) + " does not divide --heads " +
                            std::to_string(c.gpt.heads) + ": each chunk holds heads / C whole attention heads");
  if (C % T != 0)
    return Status::BadInput("option '--tensor-parallel' " + std::to_string(T) + " does not divide --tp-chunks " +
                            std::to_string(C) + ": every tensor-parallel rank computes C / T of the chunks");
  if (world % T != 0)
    return Status::BadInput("world size " + std::to_string(world) + " is not a multiple of --tensor-parallel " +
                            std::to_string(T) + ": the ranks form groups of T that share each micro-shard");
  const char* other = c.shard_params ? "--shard-params" : c.shard_optimizer ? "--shard-optimizer"
                      : c.detect.spot_check > 0 ? "--spot-check" : c.device == DeviceKind::kCuda ? "--device cuda"
                      : c.precision == Precision::kBf16 ? "--precision bf16" : nullptr;
  if (other)
    return Status::BadInput(std::string("option '") + other + "' does not combine with --tp-chunks (gpt's " +
                            "tensor-parallel form) yet: docs/determinism.md, \"Tensor parallelism\", says what it covers");
  return Status::OK();
}

// A run recorded before an option existed meant what culprit did then: its run.json lacks the key.
bool has_key(const std::string& ini, const std::string& key) {
  std::istringstream lines(ini);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind(key, 0) == 0 && line.size() > key.size() && (line[key.size()] == ' ' || line[key.size()] == '='))
      return true;
  return false;
}

// What a run recorded before the training-recipe options meant: weight decay on every parameter,
// and for gpt --classes as its vocabulary and --sample-shape as its sequence length.
// (Also applied to the options a resumed run is given: a job script repeats the ones it started with.)
void gpt_from_classes(const std::string& ini, C* c) {
  if (c->model.kind != ModelKind::kGpt || has_key(ini, "vocab")) return;
  if (c->classes > 0) c->gpt.vocab = c->classes;
  c->classes = 0;
  std::int64_t t = 1;
  for (auto d : c->sample_shape) t *= d;
  if (!c->sample_shape.empty()) c->gpt.seq_len = t;
  c->sample_shape.clear();
}

// --tensor-parallel > 1 without --tp-chunks: a chunk per attention head.
void default_chunks(C* c) {
  if (c->tensor_parallel > 1 && c->tp_chunks == 0 && c->model.kind == ModelKind::kGpt) c->tp_chunks = c->gpt.heads;
}

void apply_recorded_defaults(const std::string& ini, C* c) {
  if (!has_key(ini, "weight-decay-params")) c->optim.decay_params = DecayParams::kAll;
  gpt_from_classes(ini, c);
}

}  // namespace

const opts::Table<TrainConfig>& train_options() {
  static const opts::Table<TrainConfig> table = make_table();
  return table;
}

Status parse_train_options(const std::vector<std::string>& args, TrainConfig* cfg, bool* help) {
  const auto& table = train_options();
  opts::Parsed p;
  CULPRIT_RETURN_IF_ERROR(table.parse(args, cfg, &p));
  *help = p.help;
  default_chunks(cfg);
  if (p.help || (!cfg->resume && cfg->resume_from.empty())) return Status::OK();
  // Resuming: the run's own configuration fills every option not given here, and the options that
  // fix its results must keep their values.
  std::string stored;
  CULPRIT_RETURN_IF_ERROR(stored_config(cfg->run_dir, &stored).prefixed("cannot resume"));
  TrainConfig orig;
  CULPRIT_RETURN_IF_ERROR(table.parse_ini(without_faults(stored), &orig, /*allow_unknown=*/true)
                              .prefixed("'" + cfg->run_dir + "/run.json'"));
  apply_recorded_defaults(stored, &orig);
  TrainConfig resumed = orig;
  CULPRIT_RETURN_IF_ERROR(table.parse(args, &resumed, &p, &orig));
  gpt_from_classes(stored, &resumed);
  default_chunks(&resumed);
  // The chunks are the model (its sums' order), not a layout: a plain gpt run cannot be resumed
  // tensor-parallel, nor one of C chunks with another C.
  if (resumed.tp_chunks != orig.tp_chunks)
    return Status::BadInput("the run in '" + cfg->run_dir + "' was trained with --tp-chunks " +
                            std::to_string(orig.tp_chunks) + (orig.tp_chunks == 0 ? " (the plain gpt)" : "") +
                            ", and its chunks fix its bits; resume it with --tp-chunks " +
                            std::to_string(orig.tp_chunks) +
                            (orig.tp_chunks == 0 ? " and without --tensor-parallel" : " and a --tensor-parallel that divides it"));
  for (const auto& key : table.critical()) {
    if (std::find(p.given.begin(), p.given.end(), key) == p.given.end()) continue;
    const std::string now = table.value_text(resumed, key), then = table.value_text(orig, key);
    if (now != then)
      return Status::BadInput("option '--" + key + "' is " + now + " but the run in '" + cfg->run_dir +
                              "' was trained with " + then + "; a resumed run must keep it");
  }
  *cfg = resumed;
  return Status::OK();
}

std::string to_ini(const TrainConfig& cfg) {
  const ModelKind m = cfg.model.kind;
  if (m == ModelKind::kMlp || m == ModelKind::kCnn || m == ModelKind::kGpt) return train_options().to_ini(cfg);
  // A model culprit does not build: the options of the built-in models, and those of data it does
  // not read, would only say what the run did not use (validate_model_options refuses them given).
  // Left out, each reads back as its default, as the checkpoints' configuration does: resuming and
  // the edited-run.json check compare the same values.
  const DataKind d = cfg.data.kind;
  return train_options().to_ini(cfg, [d](const std::string& name) {
    static const char* const kBuiltIn[] = {"hidden", "layers", "width", "heads", "tie-head", "init"};
    for (const char* n : kBuiltIn)
      if (name == n) return false;
    if (name == "samples" || name == "sample-shape") return d == DataKind::kSynthetic;
    if (name == "seq-len" || name == "vocab" || name == "token-dtype") return d == DataKind::kTokens;
    if (name == "classes") return d != DataKind::kTokens;
    return true;
  });
}

Status parse_recorded_config(const std::string& ini, TrainConfig* cfg) {
  *cfg = TrainConfig();
  CULPRIT_RETURN_IF_ERROR(train_options().parse_ini(ini, cfg, /*allow_unknown=*/true));
  apply_recorded_defaults(ini, cfg);
  return Status::OK();
}

std::string first_critical_difference(const TrainConfig& a, const TrainConfig& b, std::string* a_value,
                                      std::string* b_value) {
  const auto& table = train_options();
  for (const auto& key : table.critical()) {
    *a_value = table.value_text(a, key);
    *b_value = table.value_text(b, key);
    if (*a_value != *b_value) return key;
  }
  a_value->clear();
  b_value->clear();
  return "";
}

Status load_run_config(const std::string& run_dir, TrainConfig* cfg) {
  std::string stored;
  CULPRIT_RETURN_IF_ERROR(stored_config(run_dir, &stored));
  CULPRIT_RETURN_IF_ERROR(parse_recorded_config(stored, cfg).prefixed("'" + run_dir + "/run.json'"));
  cfg->run_dir = run_dir;
  return Status::OK();
}

Status validate(const TrainConfig& c, int world) {
  if (c.run_dir.empty()) return Status::BadInput("option '--run-dir' is required");
  CULPRIT_RETURN_IF_ERROR(train_options().validate(c));
  // The faults' form and size before anything is written (their layers: once the model exists).
  CULPRIT_RETURN_IF_ERROR(check_fault_texts(c.inject));
  const int m = c.micro_shards;
  if (m < 1 || (m & (m - 1)) != 0)
    return Status::BadInput("option '--micro-shards' must be a power of two in [1, 1048576], got " + std::to_string(m));
  if (c.global_batch % m != 0)
    return Status::BadInput("--global-batch " + std::to_string(c.global_batch) + " is not divisible by --micro-shards " +
                            std::to_string(m));
  CULPRIT_RETURN_IF_ERROR(validate_tensor_parallel(c, world));
  const int dp = c.data_parallel(world);
  if (dp > m)
    return Status::BadInput((c.chunked() ? "data-parallel ranks (world size / --tensor-parallel) " : "world size ") +
                            std::to_string(dp) + " exceeds --micro-shards " + std::to_string(m) +
                            ": every rank needs at least one micro-shard");
  const OptimizerOptions& o = c.optim;
  if (o.nesterov && o.momentum <= 0) return Status::BadInput("option '--nesterov' needs --momentum > 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1))
    return Status::BadInput("option '--betas': each beta must be in [0, 1)");
  if (!(o.eps > 0)) return Status::BadInput("option '--eps' must be > 0");
  if (o.min_lr > 0 && o.schedule != LrSchedule::kCosine)
    return Status::BadInput("option '--min-lr' is the floor of --lr-schedule cosine: give that schedule too");
  if (o.min_lr > o.lr)
    return Status::BadInput("option '--min-lr' exceeds --lr (a Python run's: its optimizer's first group's rate): the "
                            "cosine decays from --lr down to --min-lr");
  const bool script = o.kind == OptimizerKind::kScript;
  if (script && c.model.kind != ModelKind::kPython)
    return Status::BadInput("option '--optimizer script' is the optimizer object of a Python script: it comes with "
                            "--model python:SCRIPT:FUNCTION (the Python package sets both, docs/python.md)");
  if (!script && (!o.script_optimizer.empty() || !o.script_state.empty()))
    return Status::BadInput("options '--script-optimizer' and '--optimizer-state' apply to --optimizer script");
  if (script && c.sharded())
    return Status::BadInput(std::string("option '") + (c.shard_params ? "--shard-params" : "--shard-optimizer") +
                            "' needs culprit's own update (an SGD or AdamW it maps): the script's optimizer " +
                            o.script_optimizer + " steps whole parameters on every rank (docs/python.md, \"Optimizers\")");
  if (c.keep_gathered && !c.shard_params)
    return Status::BadInput("option '--keep-gathered' keeps --shard-params' gathered layers: give --shard-params too");
  if (c.shard_params && c.device == DeviceKind::kCuda)
    return Status::BadInput("option '--shard-params' runs on the host: its released parameters are host pages given "
                            "back to the kernel (docs/determinism.md, \"Sharded parameters\"); train --device cuda "
                            "with --shard-optimizer");
  if (c.shard_params && c.detect.spot_check > 0)
    return Status::BadInput("option '--spot-check' recomputes micro-shards on other ranks, whose parameter gathers "
                            "the other ranks would not make: with --shard-params use the audit (docs/detection.md)");
  CULPRIT_RETURN_IF_ERROR(validate_model_options(c));
  if (c.detect.on_detect == OnDetect::kDiagnose && c.trace == TraceLevel::kOff)
    return Status::BadInput("option '--on-detect diagnose' needs the trace: --trace step or layer");
  // Each size is within its range; together they must still fit the machine (sizes.h).
  return check_synthetic_sizes(c, world);
}

double learning_rate(const TrainConfig& c, std::int64_t step) {
  const OptimizerOptions& o = c.optim;
  if (o.warmup_steps > 0 && step <= o.warmup_steps)
    return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  if (o.schedule == LrSchedule::kCosine) {
    const double span = static_cast<double>(std::max<std::int64_t>(1, c.steps - o.warmup_steps));
    const double progress = static_cast<double>(step - o.warmup_steps) / span;
    return o.min_lr + (o.lr - o.min_lr) * (0.5 * (1.0 + std::cos(M_PI * progress)));
  }
  return o.lr;
}

}  // namespace culprit::harness
