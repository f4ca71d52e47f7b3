// The run directory: preparing it, finding the checkpoint to resume from, checking that it belongs
// to this run, rewinding metrics.jsonl (rundir.h). No libtorch.
#include "rundir.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

namespace culprit::harness {

namespace fs = std::filesystem;

// Keeps the lines of metrics.jsonl up to step `keep` (a resumed run rewrites what follows).
Status truncate_metrics(const std::string& path, std::int64_t keep) {
  std::ifstream in(path);
  if (!in) return Status::OK();
  std::string line, kept;
  while (std::getline(in, line)) {
    const auto pos = line.find("\"step\": ");
    if (pos == std::string::npos) continue;
    if (std::stoll(line.substr(pos + 8)) > keep) break;
    kept += line + "\n";
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << kept;
  return out ? Status::OK() : Status::Error("cannot rewrite '" + path + "'");
}

Status prepare_run_dir(const TrainConfig& cfg) {
  std::error_code ec;
  if (resuming(cfg)) {
    if (!fs::exists(fs::path(cfg.run_dir) / "run.json"))
      return Status::Error("cannot resume: '" + cfg.run_dir + "' holds no run (no run.json)");
    return Status::OK();
  }
  fs::create_directories(cfg.run_dir, ec);
  if (ec) return Status::Error("cannot create run directory '" + cfg.run_dir + "': " + ec.message());
  for (const char* f : {"run.json", "metrics.jsonl"}) {
    if (fs::exists(fs::path(cfg.run_dir) / f))
      return Status::Error("run directory '" + cfg.run_dir + "' already holds a run (" + f +
                           "); pass --resume to continue it or choose another --run-dir");
  }
  return Status::OK();
}

// The checkpoint to resume from: --resume-from, or the newest one that verifies. Damaged ones are
// reported (file, dataset, fingerprints) and skipped, never used.
Status find_checkpoint(const TrainConfig& cfg, const Comm& comm, ckpt::Checkpoint* c, std::string* from) {
  std::vector<std::string> candidates;
  if (!cfg.resume_from.empty()) {
    candidates.push_back(cfg.resume_from);
  } else {
    auto all = ckpt::list(cfg.run_dir);
    for (auto it = all.rbegin(); it != all.rend(); ++it) candidates.push_back(it->second);
    if (candidates.empty())
      return Status::Error("cannot resume: no checkpoint in '" + (fs::path(cfg.run_dir) / "checkpoints").string() + "'");
  }
  for (const auto& path : candidates) {
    Status st = agree(comm, ckpt::read(path, c, /*verify=*/true));
    if (st.ok()) {
      *from = path;
      return Status::OK();
    }
    if (!cfg.resume_from.empty()) return st;
    if (comm.rank == 0) {
      std::fprintf(stderr, "culprit: warning: skipping damaged checkpoint: %s\n", st.message().c_str());
      std::fflush(stderr);
    }
  }
  return Status::Error("cannot resume: none of the " + std::to_string(candidates.size()) + " checkpoint(s) in '" +
                       cfg.run_dir + "' is valid");
}

Status check_compatible(const TrainConfig& cfg, const Dataset& data, const ckpt::Checkpoint& c, const std::string& from) {
  auto want = c.meta_int.find("seed");
  if (want == c.meta_int.end() || static_cast<std::uint64_t>(want->second) != cfg.seed)
    return Status::Error("checkpoint '" + from + "' belongs to another run (seed differs)");
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"model", cfg.model}, {"optimizer", cfg.optimizer}})
    if (!c.meta.count(key) || c.meta.at(key) != value)
      return Status::Error("checkpoint '" + from + "' belongs to another run (" + key + " " +
                           (c.meta.count(key) ? c.meta.at(key) : "?") + ", not " + value + ")");
  auto mi = c.meta_int.find("micro_shards"), gb = c.meta_int.find("global_batch");
  if (mi == c.meta_int.end() || mi->second != cfg.micro_shards || gb == c.meta_int.end() || gb->second != cfg.global_batch)
    return Status::Error("checkpoint '" + from + "' belongs to another run (global batch or micro-shards differ)");
  const std::int64_t spe = data.n / cfg.global_batch;
  if (c.epoch != c.step / spe || c.cursor != (c.step % spe) * cfg.global_batch)
    return Status::Error("checkpoint '" + from + "': data position (epoch " + std::to_string(c.epoch) + ", cursor " +
                         std::to_string(c.cursor) + ") does not match step " + std::to_string(c.step));
  return Status::OK();
}

}  // namespace culprit::harness
