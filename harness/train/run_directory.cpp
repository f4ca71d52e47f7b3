// The run directory: preparing it, finding the checkpoint to resume from, checking that it belongs
// to this run, rewinding metrics.jsonl (rundir.h). No libtorch.
#include "train/run_directory.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include <nlohmann/json.hpp>

#include "culprit/checkpoint_format.h"
#include "culprit/run_files.h"

namespace culprit::harness {

namespace fs = std::filesystem;

// Keeps the lines of metrics.jsonl up to step `keep` (a resumed run rewrites what follows). A torn
// tail (a crash or a full disk mid-line: no newline, or a line that is not a JSON object with an
// integer "step") ends what is kept; the rewrite goes through a temporary file and a rename, so a
// crash during it leaves the old file whole.
Status truncate_metrics(const std::string& path, std::int64_t keep) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::OK();
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::string kept;
  for (std::size_t at = 0; at < all.size();) {
    const std::size_t end = all.find('\n', at);
    if (end == std::string::npos) break;  // torn: no newline
    const std::string line = all.substr(at, end - at);
    at = end + 1;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) break;
    if (j["step"].get<std::int64_t>() > keep) break;
    kept += line + "\n";
  }
  return files::write_atomic(path, kept);
}

// Rank 0, before anything is written. The directory becomes this job's (the lock, held until the
// process ends); it is the run it claims to be (--resume: run.json is there) or a new one (nothing
// culprit writes is there: a leftover run's traces or checkpoints are never overwritten or
// deleted by retention); the directories culprit writes into are not links.
Status prepare_run_dir(const TrainConfig& cfg) {
  const fs::path dir(cfg.run_dir);
  std::error_code ec;
  if (resuming(cfg)) {
    if (!fs::exists(dir / "run.json", ec))
      return Status::BadInput("cannot resume: '" + cfg.run_dir + "' holds no run (no run.json)");
  } else {
    fs::create_directories(dir, ec);
    if (ec) return Status::IoError("cannot create run directory '" + cfg.run_dir + "': " + ec.message());
  }
  CULPRIT_RETURN_IF_ERROR(files::lock_run_dir(cfg.run_dir, "train"));
  for (const char* const* name = files::owned_names(); !resuming(cfg) && *name; ++name) {
    if (fs::symlink_status(dir / *name, ec).type() != fs::file_type::not_found)
      return Status::BadInput("run directory '" + cfg.run_dir + "' already holds a run or part of one ('" + *name +
                              "'); pass --resume to continue it, or choose another --run-dir (a new run needs a "
                              "directory holding nothing culprit writes)");
  }
  for (const char* sub : {"checkpoints", "trace", "audit"})
    CULPRIT_RETURN_IF_ERROR(files::refuse_link((dir / sub).string()));
  // What a crash or a full disk left of the records' last lines goes (metrics.jsonl: truncate_metrics).
  for (const char* log : {"incidents.jsonl", "incidents.log", "checkpoints.jsonl"})
    if (resuming(cfg)) CULPRIT_RETURN_IF_ERROR(files::cut_torn_tail((dir / log).string()));
  return Status::OK();
}

Status stored_run_id(const std::string& run_dir, std::string* id) {
  id->clear();
  const std::string path = (fs::path(run_dir) / "run.json").string();
  std::ifstream in(path);
  if (!in) return Status::BadInput("'" + run_dir + "' holds no run (no run.json)");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::Damaged("'" + path + "' is not a culprit run.json");
  if (j.contains("run_id") && j["run_id"].is_string()) *id = j["run_id"].get<std::string>();
  return Status::OK();
}

Status establish_run_id(const TrainConfig& cfg, const Comm& comm, std::string* id) {
  Status st;
  if (comm.rank == 0) {
    if (resuming(cfg)) st = stored_run_id(cfg.run_dir, id);
    if (st.ok() && id->empty()) *id = files::new_run_id();  // new, or a run from before identities
  }
  CULPRIT_RETURN_IF_ERROR(agree(comm, st));
  char buf[64] = {0};
  if (comm.rank == 0) std::snprintf(buf, sizeof buf, "%s", id->c_str());
  CULPRIT_MPI_CHECK(MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, comm.comm));
  *id = buf;
  return Status::OK();
}

// The checkpoint to resume from: --resume-from, or the newest one that verifies. Damaged ones are
// reported (file, dataset, fingerprints) and skipped, never used.
Status find_checkpoint(const TrainConfig& cfg, const Comm& comm, ckpt::Checkpoint* c, std::string* from) {
  if (!cfg.resume_from.empty()) {
    Status st = agree(comm, ckpt::read(cfg.resume_from, c, /*verify=*/true));
    if (st.ok()) *from = cfg.resume_from;
    return st;
  }
  return ckpt::find_valid(comm, cfg.run_dir, ckpt::kAnyStep, ckpt::Pick::kNewest, c, from).prefixed("cannot resume");
}

Status check_compatible(const TrainConfig& cfg, const Dataset& data, const ckpt::Checkpoint& c, const std::string& from) {
  CULPRIT_RETURN_IF_ERROR(ckpt::belongs(from, c, cfg.run_id));
  auto want = c.meta_int.find("seed");
  if (want == c.meta_int.end() || static_cast<std::uint64_t>(want->second) != cfg.seed)
    return Status::BadInput("checkpoint '" + from + "' belongs to another run (seed differs)");
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"model", cfg.model.text()}, {"optimizer", name_of(cfg.optim.kind)}})
    if (!c.meta.count(key) || c.meta.at(key) != value)
      return Status::BadInput("checkpoint '" + from + "' belongs to another run (" + key + " " +
                           (c.meta.count(key) ? c.meta.at(key) : "?") + ", not " + value + ")");
  auto mi = c.meta_int.find("micro_shards"), gb = c.meta_int.find("global_batch");
  if (mi == c.meta_int.end() || mi->second != cfg.micro_shards || gb == c.meta_int.end() || gb->second != cfg.global_batch)
    return Status::BadInput("checkpoint '" + from + "' belongs to another run (global batch or micro-shards differ)");
  // The sample order is a function of N: data that changed its size since (a corpus made again)
  // would give every later step other samples. Older checkpoints do not say their N.
  auto n = c.meta_int.find("data_samples");
  if (n != c.meta_int.end() && n->second != data.n)
    return Status::BadInput("checkpoint '" + from + "' was written for data of " + std::to_string(n->second) +
                            " samples; " + cfg.data.text() + " now holds " + std::to_string(data.n) +
                            ": the sample order would differ (give the data the run trained on)");
  if (data.n < cfg.global_batch)
    return Status::BadInput("data " + cfg.data.text() + " holds " + std::to_string(data.n) +
                            " samples, fewer than the global batch " + std::to_string(cfg.global_batch));
  const std::int64_t spe = data.n / cfg.global_batch;
  if (c.epoch != c.step / spe || c.cursor != (c.step % spe) * cfg.global_batch)
    return Status::BadInput("checkpoint '" + from + "': data position (epoch " + std::to_string(c.epoch) + ", cursor " +
                         std::to_string(c.cursor) + ") does not match step " + std::to_string(c.step));
  return Status::OK();
}

}  // namespace culprit::harness
