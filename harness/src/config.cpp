// `culprit train` options: parsing (Boost.Program_options), INI config files, validation.
#include <boost/program_options.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <cmath>
#include <fstream>
#include <sstream>

#include "culprit/harness.h"

namespace po = boost::program_options;

namespace culprit::harness {

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

po::options_description describe(TrainConfig* c) {
  po::options_description d("culprit train options");
  // clang-format off
  d.add_options()
    ("help,h", "print this help")
    ("config", po::value(&c->config_file), "INI file with any of these options as key = value (the command line wins)")
    ("run-dir", po::value(&c->run_dir), "run directory (required; created)")
    ("resume", po::value(&c->resume)->default_value(c->resume)->implicit_value(true), "continue the run in --run-dir from its newest valid checkpoint (its configuration is the default)")
    ("resume-from", po::value(&c->resume_from)->default_value(""), "continue the run in --run-dir from this checkpoint file")
    ("checkpoint-every", po::value(&c->checkpoint_every)->default_value(c->checkpoint_every), "checkpoint every K steps (0: only after the last step, which is always checkpointed)")
    ("keep-last", po::value(&c->keep_last)->default_value(c->keep_last), "keep the newest N checkpoints")
    ("keep-every", po::value(&c->keep_every)->default_value(c->keep_every), "also keep every checkpoint whose step is a multiple of E (0: none)")
    ("checkpoint-writers-per-host", po::value(&c->checkpoint_writers_per_host)->default_value(c->checkpoint_writers_per_host), "ranks per host that write checkpoint data, each a slice of every large tensor (0: every rank); the ranks of a host share its I/O path")
    ("async-checkpoint", po::value(&c->async_checkpoint)->default_value(c->async_checkpoint)->implicit_value(true), "write checkpoints in a background thread, which also copies the state to host memory while the next step's forward and backward passes run (training waits at most for what is left of that copy)")
    ("inject", po::value(&c->inject)->composing(), "inject a fault (repeatable): step=S,rank=R,layer=NAME,phase=P,kind=K[,index=I,bit=B,factor=F,mode=M,p=P] (docs/detection.md)")
    ("on-detect", po::value(&c->on_detect)->default_value(c->on_detect), "halt | warn | diagnose: what a detection does (halt: every rank exits with the class's code; diagnose: culprit bisect runs in the job and its verdict is the exit code)")
    ("detect-nonfinite", po::value(&c->detect_nonfinite)->default_value(c->detect_nonfinite)->implicit_value(true), "detect NaN/Inf in micro-shard losses and gradients and in the parameters")
    ("spike-window", po::value(&c->spike_window)->default_value(c->spike_window), "loss and gradient-norm spike detection over the last N steps (0: off)")
    ("spike-z", po::value(&c->spike_z)->default_value(c->spike_z, num(c->spike_z)), "spike: robust z-score (median/MAD) above this ...")
    ("spike-ratio", po::value(&c->spike_ratio)->default_value(c->spike_ratio, num(c->spike_ratio)), "... and more than this times the window's maximum")
    ("spike-action", po::value(&c->spike_action)->default_value(c->spike_action), "warn | halt: a spike is logged as a warning unless halt")
    ("comm-check", po::value(&c->comm_check)->default_value(c->comm_check)->implicit_value(true), "fingerprint every reduction message as sent and as received; a mismatch names sender and receiver")
    ("replica-check-every", po::value(&c->replica_check_every)->default_value(c->replica_check_every), "compare parameter and optimizer-state fingerprints across ranks every N steps (0: off)")
    ("spot-check", po::value(&c->spot_check)->default_value(c->spot_check, num(c->spot_check)), "recompute this fraction of micro-shards per step on another rank and compare bitwise (redundant computation; 0: off, 1: every micro-shard)")
    ("check-invariants", po::value(&c->check_invariants)->default_value(c->check_invariants)->implicit_value(true), "check training invariants: parameters change, gradients start at zero, each sample once per epoch, learning rate as scheduled, dropout masks differ")
    ("collective-timeout", po::value(&c->collective_timeout)->default_value(c->collective_timeout, num(c->collective_timeout)), "seconds a rank waits in a collective (or for its checkpoint writer) before it names the silent rank(s) and ends the job (0: wait forever)")
    ("trace", po::value(&c->trace)->default_value(c->trace), "off | step | layer: per-step fingerprint trace in RUN/trace/ (layer: also every layer's forward output and backward gradient)")
    ("steps", po::value(&c->steps)->default_value(c->steps), "optimizer steps to run")
    ("global-batch", po::value(&c->global_batch)->default_value(c->global_batch), "samples per step (B)")
    ("micro-shards", po::value(&c->micro_shards)->default_value(c->micro_shards), "micro-shards per step (M: a power of two, B divisible by M, world size <= M)")
    ("seed", po::value(&c->seed)->default_value(c->seed), "seed of data order, initialisation, dropout and synthetic data")
    ("model", po::value(&c->model)->default_value(c->model), "mlp | cnn | gpt | torchscript:PATH")
    ("data", po::value(&c->data)->default_value(c->data), "synthetic | hdf5:PATH (datasets x and y)")
    ("hidden", po::value(&c->hidden)->default_value(c->hidden), "mlp: hidden units per layer")
    ("samples", po::value(&c->samples)->default_value(c->samples), "synthetic data: number of samples")
    ("sample-shape", po::value<std::string>()->default_value("", "auto"), "synthetic data: sample shape, e.g. 1,16,16 (empty: the model's default)")
    ("classes", po::value(&c->classes)->default_value(c->classes), "synthetic data: classes (gpt: vocabulary); 0: the model's default")
    ("optimizer", po::value(&c->optimizer)->default_value(c->optimizer), "sgd | adamw")
    ("lr", po::value(&c->lr)->default_value(c->lr, num(c->lr)), "peak learning rate")
    ("momentum", po::value(&c->momentum)->default_value(c->momentum, num(c->momentum)), "sgd: momentum")
    ("nesterov", po::value(&c->nesterov)->default_value(c->nesterov)->implicit_value(true), "sgd: Nesterov momentum")
    ("weight-decay", po::value(&c->weight_decay)->default_value(c->weight_decay, num(c->weight_decay)), "weight decay (adamw: decoupled)")
    ("betas", po::value<std::string>()->default_value("0.9,0.999"), "adamw: beta1,beta2")
    ("eps", po::value(&c->eps)->default_value(c->eps, num(c->eps)), "adamw: epsilon")
    ("lr-schedule", po::value(&c->lr_schedule)->default_value(c->lr_schedule), "constant | cosine (over --steps)")
    ("warmup-steps", po::value(&c->warmup_steps)->default_value(c->warmup_steps), "linear warm-up steps")
    ("threads", po::value(&c->threads)->default_value(c->threads), "intra-op threads per rank")
    ("device", po::value(&c->device)->default_value(c->device), "cpu | cuda: where each rank computes (cuda: the GPU of index local rank mod GPUs on the host; needs culprit built against a CUDA-enabled libtorch, docs/cuda.md)")
    ("quiet", po::value(&c->quiet)->default_value(c->quiet)->implicit_value(true), "no per-step line on stdout");
  // clang-format on
  return d;
}

Status parse_list(const std::string& opt, const std::string& text, std::vector<double>* out) {
  out->clear();
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      double v = std::stod(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      out->push_back(v);
    } catch (const std::exception&) {
      return Status::Error("option '--" + opt + "': '" + text + "' is not a comma-separated list of numbers");
    }
  }
  return Status::OK();
}

// The resolved configuration a run recorded in RUN/run.json.
Status stored_config(const std::string& run_dir, std::string* ini) {
  const auto path = std::filesystem::path(run_dir) / "run.json";
  std::ifstream in(path);
  if (!in) return Status::Error("cannot resume: '" + run_dir + "' holds no run (no run.json)");
  try {
    auto j = nlohmann::json::parse(in);
    *ini = j.at("config").get<std::string>();
  } catch (const std::exception& e) {
    return Status::Error("cannot resume: '" + path.string() + "' is not a culprit run.json");
  }
  return Status::OK();
}

std::string join(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

Status finish_options(const po::variables_map& vm, TrainConfig* cfg);

std::string train_options_help() {
  TrainConfig c;
  std::ostringstream os;
  os << describe(&c);
  return os.str();
}

Status parse_train_options(const std::vector<std::string>& args, TrainConfig* cfg, bool* help) {
  *cfg = TrainConfig();
  *help = false;
  auto desc = describe(cfg);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    if (vm.count("help")) {
      *help = true;
      return Status::OK();
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream in(path);
      if (!in) return Status::Error("config file '" + path + "' cannot be read");
      // Values already given on the command line are kept: store() never overwrites.
      po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
    }
    const bool resuming = (vm.count("resume") && vm["resume"].as<bool>()) ||
                          (vm.count("resume-from") && !vm["resume-from"].as<std::string>().empty());
    if (resuming) {
      // The run's own configuration fills every option not given here.
      if (!vm.count("run-dir")) return Status::Error("option '--run-dir' is required");
      std::string stored;
      CULPRIT_RETURN_IF_ERROR(stored_config(vm["run-dir"].as<std::string>(), &stored));
      // Injected faults belong to the invocation that names them: a resumed run does not repeat them.
      {
        std::istringstream lines(stored);
        std::string line, kept;
        while (std::getline(lines, line))
          if (line.rfind("inject", 0) != 0) kept += line + "\n";
        stored = kept;
      }
      std::istringstream in(stored);
      po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/true), vm);
      TrainConfig orig;
      auto odesc = describe(&orig);
      po::variables_map ovm;
      std::istringstream in2(stored);
      po::store(po::parse_config_file(in2, odesc, true), ovm);
      po::notify(ovm);
      po::notify(vm);
      for (const auto& key : determinism_critical_options()) {
        auto text = [&](const po::variables_map& m) {
          if (!m.count(key)) return std::string();
          const auto& v = m[key].value();
          if (auto* p = boost::any_cast<std::string>(&v)) return *p;
          if (auto* p = boost::any_cast<std::int64_t>(&v)) return std::to_string(*p);
          if (auto* p = boost::any_cast<int>(&v)) return std::to_string(*p);
          if (auto* p = boost::any_cast<std::uint64_t>(&v)) return std::to_string(*p);
          if (auto* p = boost::any_cast<bool>(&v)) return std::string(*p ? "true" : "false");
          if (auto* p = boost::any_cast<double>(&v)) return num(*p);
          return std::string("?");
        };
        if (text(vm) != text(ovm))
          return Status::Error("option '--" + key + "' is " + text(vm) + " but the run in '" +
                               vm["run-dir"].as<std::string>() + "' was trained with " + text(ovm) +
                               "; a resumed run must keep it");
      }
    } else {
      po::notify(vm);
    }
  } catch (const po::error& e) {
    return Status::Error(e.what());
  }
  return finish_options(vm, cfg);
}

Status finish_options(const po::variables_map& vm, TrainConfig* cfg) {
  std::vector<double> v;
  CULPRIT_RETURN_IF_ERROR(parse_list("betas", vm["betas"].as<std::string>(), &v));
  if (v.size() != 2) return Status::Error("option '--betas' needs two numbers, beta1,beta2");
  cfg->beta1 = v[0];
  cfg->beta2 = v[1];
  CULPRIT_RETURN_IF_ERROR(parse_list("sample-shape", vm["sample-shape"].as<std::string>(), &v));
  cfg->sample_shape.clear();
  for (double d : v) {
    if (d < 1 || d != std::floor(d))
      return Status::Error("option '--sample-shape': dimensions must be positive integers");
    cfg->sample_shape.push_back(static_cast<std::int64_t>(d));
  }
  return Status::OK();
}

Status load_run_config(const std::string& run_dir, TrainConfig* cfg) {
  *cfg = TrainConfig();
  std::string stored;
  if (Status st = stored_config(run_dir, &stored); !st.ok()) {
    std::string m = st.message();
    const std::string prefix = "cannot resume: ";
    if (m.rfind(prefix, 0) == 0) m = m.substr(prefix.size());
    return Status::Error(m, st.code());
  }
  auto desc = describe(cfg);
  po::variables_map vm;
  try {
    std::istringstream in(stored);
    po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/true), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return Status::Error("'" + run_dir + "/run.json': " + e.what());
  }
  CULPRIT_RETURN_IF_ERROR(finish_options(vm, cfg));
  cfg->run_dir = run_dir;
  return Status::OK();
}

std::vector<std::string> determinism_critical_options() {
  return {"global-batch", "micro-shards", "seed", "model", "hidden", "data", "samples", "sample-shape", "classes",
          "optimizer", "lr", "momentum", "nesterov", "weight-decay", "betas", "eps", "lr-schedule",
          "warmup-steps", "threads", "trace"};
}

std::string to_ini(const TrainConfig& c) {
  std::ostringstream os;
  os.precision(17);
  os << "run-dir = " << c.run_dir << "\n"
     << "steps = " << c.steps << "\n"
     << "global-batch = " << c.global_batch << "\n"
     << "micro-shards = " << c.micro_shards << "\n"
     << "seed = " << c.seed << "\n"
     << "model = " << c.model << "\n"
     << "data = " << c.data << "\n"
     << "hidden = " << c.hidden << "\n"
     << "samples = " << c.samples << "\n"
     << "sample-shape = " << join(c.sample_shape) << "\n"
     << "classes = " << c.classes << "\n"
     << "optimizer = " << c.optimizer << "\n"
     << "lr = " << c.lr << "\n"
     << "momentum = " << c.momentum << "\n"
     << "nesterov = " << (c.nesterov ? "true" : "false") << "\n"
     << "weight-decay = " << c.weight_decay << "\n"
     << "betas = " << c.beta1 << "," << c.beta2 << "\n"
     << "eps = " << c.eps << "\n"
     << "lr-schedule = " << c.lr_schedule << "\n"
     << "warmup-steps = " << c.warmup_steps << "\n"
     << "threads = " << c.threads << "\n"
     << "device = " << c.device << "\n"
     << "checkpoint-every = " << c.checkpoint_every << "\n"
     << "keep-last = " << c.keep_last << "\n"
     << "keep-every = " << c.keep_every << "\n"
     << "checkpoint-writers-per-host = " << c.checkpoint_writers_per_host << "\n"
     << "async-checkpoint = " << (c.async_checkpoint ? "true" : "false") << "\n"
     << "trace = " << c.trace << "\n"
     << "on-detect = " << c.on_detect << "\n"
     << "detect-nonfinite = " << (c.detect_nonfinite ? "true" : "false") << "\n"
     << "comm-check = " << (c.comm_check ? "true" : "false") << "\n"
     << "spike-window = " << c.spike_window << "\n"
     << "spike-z = " << c.spike_z << "\n"
     << "spike-ratio = " << c.spike_ratio << "\n"
     << "spike-action = " << c.spike_action << "\n"
     << "replica-check-every = " << c.replica_check_every << "\n"
     << "spot-check = " << c.spot_check << "\n"
     << "check-invariants = " << (c.check_invariants ? "true" : "false") << "\n"
     << "collective-timeout = " << c.collective_timeout << "\n";
  for (const auto& spec : c.inject) os << "inject = " << spec << "\n";
  return os.str();
}

Status validate(const TrainConfig& c, int world) {
  if (c.run_dir.empty()) return Status::Error("option '--run-dir' is required");
  if (c.steps < 1) return Status::Error("option '--steps' must be at least 1");
  if (c.global_batch < 1) return Status::Error("option '--global-batch' must be at least 1");
  const int m = c.micro_shards;
  if (m < 1 || (m & (m - 1)) != 0)
    return Status::Error("option '--micro-shards' must be a power of two, got " + std::to_string(m));
  if (c.global_batch % m != 0)
    return Status::Error("--global-batch " + std::to_string(c.global_batch) +
                         " is not divisible by --micro-shards " + std::to_string(m));
  if (world > m)
    return Status::Error("world size " + std::to_string(world) + " exceeds --micro-shards " +
                         std::to_string(m) + ": every rank needs at least one micro-shard");
  const std::string& mo = c.model;
  if (mo != "mlp" && mo != "cnn" && mo != "gpt" && mo.rfind("torchscript:", 0) != 0)
    return Status::Error("option '--model': unknown model '" + mo +
                         "' (valid: mlp, cnn, gpt, torchscript:PATH)");
  if (mo == "torchscript:") return Status::Error("option '--model': torchscript: needs a path");
  if (c.data != "synthetic" && c.data.rfind("hdf5:", 0) != 0)
    return Status::Error("option '--data': unknown data source '" + c.data +
                         "' (valid: synthetic, hdf5:PATH)");
  if (c.data == "hdf5:") return Status::Error("option '--data': hdf5: needs a path");
  if (c.samples < 1) return Status::Error("option '--samples' must be at least 1");
  if (c.hidden < 1) return Status::Error("option '--hidden' must be at least 1");
  if (c.classes < 0) return Status::Error("option '--classes' must not be negative");
  if (c.optimizer != "sgd" && c.optimizer != "adamw")
    return Status::Error("option '--optimizer': unknown optimizer '" + c.optimizer + "' (valid: sgd, adamw)");
  if (!(c.lr >= 0) || !std::isfinite(c.lr)) return Status::Error("option '--lr' must be a finite number >= 0");
  if (!(c.momentum >= 0)) return Status::Error("option '--momentum' must be >= 0");
  if (c.nesterov && c.momentum <= 0) return Status::Error("option '--nesterov' needs --momentum > 0");
  if (!(c.weight_decay >= 0)) return Status::Error("option '--weight-decay' must be >= 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1))
    return Status::Error("option '--betas': each beta must be in [0, 1)");
  if (!(c.eps > 0)) return Status::Error("option '--eps' must be > 0");
  if (c.lr_schedule != "constant" && c.lr_schedule != "cosine")
    return Status::Error("option '--lr-schedule': unknown schedule '" + c.lr_schedule + "' (valid: constant, cosine)");
  if (c.warmup_steps < 0) return Status::Error("option '--warmup-steps' must not be negative");
  if (c.threads < 1) return Status::Error("option '--threads' must be at least 1");
  if (c.device != "cpu" && c.device != "cuda")
    return Status::Error("option '--device': unknown device '" + c.device + "' (valid: cpu, cuda)");
  if (c.checkpoint_every < 0) return Status::Error("option '--checkpoint-every' must not be negative");
  if (c.keep_last < 1) return Status::Error("option '--keep-last' must be at least 1");
  if (c.keep_every < 0) return Status::Error("option '--keep-every' must not be negative");
  if (c.checkpoint_writers_per_host < 0)
    return Status::Error("option '--checkpoint-writers-per-host' must not be negative");
  if (c.on_detect != "halt" && c.on_detect != "warn" && c.on_detect != "diagnose")
    return Status::Error("option '--on-detect': unknown action '" + c.on_detect + "' (valid: halt, warn, diagnose)");
  if (c.on_detect == "diagnose" && c.trace == "off")
    return Status::Error("option '--on-detect diagnose' needs the trace: --trace step or layer");
  if (c.spike_window < 0) return Status::Error("option '--spike-window' must not be negative");
  if (c.spike_action != "warn" && c.spike_action != "halt")
    return Status::Error("option '--spike-action': unknown action '" + c.spike_action + "' (valid: warn, halt)");
  if (c.replica_check_every < 0) return Status::Error("option '--replica-check-every' must not be negative");
  if (!(c.spot_check >= 0 && c.spot_check <= 1)) return Status::Error("option '--spot-check' must be in [0, 1]");
  if (!(c.collective_timeout >= 0) || !std::isfinite(c.collective_timeout))
    return Status::Error("option '--collective-timeout' must be a number of seconds >= 0");
  if (c.trace != "off" && c.trace != "step" && c.trace != "layer")
    return Status::Error("option '--trace': unknown level '" + c.trace + "' (valid: off, step, layer)");
  return Status::OK();
}

double learning_rate(const TrainConfig& c, std::int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps)
    return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  if (c.lr_schedule == "cosine") {
    const double span = static_cast<double>(std::max<std::int64_t>(1, c.steps - c.warmup_steps));
    const double progress = static_cast<double>(step - c.warmup_steps) / span;
    return c.lr * (0.5 * (1.0 + std::cos(M_PI * progress)));
  }
  return c.lr;
}

}  // namespace culprit::harness
