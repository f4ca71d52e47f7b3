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

// Keeps the lines of metrics.jsonl up to step `keep` (a resumed run rewrites what follows). Each
// line is a JSON object with an integer "step"; only the last line may fail that, torn by a crash
// or a full disk mid-append (with or without its newline), and is cut. Any other line that fails it
// is damage, named, and nothing is cut: the lines after it are the run's record. Read line by line
// (a long run's file is never held whole); the rewrite copies the kept prefix to a temporary file
// and renames it, so a crash during it leaves the old file whole.
Status truncate_metrics(const std::string& path, std::int64_t keep) {
  int fd = -1;
  std::uint64_t size = 0;
  CULPRIT_RETURN_IF_ERROR(files::open_regular(path, UINT64_MAX, "metrics lines", &fd, &size));
  if (fd < 0) return Status::OK();
  files::LineReader lines(fd, path, files::kMaxRecordLine);
  std::string line;
  bool whole = false;
  std::uint64_t cut = size;  // the kept prefix: the lines before the first after `keep`, or a torn one
  std::int64_t bad_line = 0;
  std::string bad_why;
  while (lines.next(&line, &whole)) {
    if (bad_line) {  // a line follows the bad one: that one was not a torn tail
      return Status::Damaged("'" + path + "' line " + std::to_string(bad_line) + " " + bad_why +
                             ", and lines follow it: only the last line may be torn (a crash or a full disk); "
                             "a line in the middle is damage, and --resume deletes nothing of it (repair or "
                             "remove that line, then resume)");
    }
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      bad_line = lines.line_number();
      bad_why = j.is_discarded() ? "is not JSON" : "is not a metrics line (a JSON object with an integer \"step\")";
      if (cut == size) cut = lines.offset();
      continue;
    }
    if (j["step"].get<std::int64_t>() > keep && cut == size) cut = lines.offset();
  }
  CULPRIT_RETURN_IF_ERROR(lines.status());
  // A link there (read through: reading writes nothing) is replaced by the file it showed, so the
  // appends that follow never write through it (run_files.h).
  const bool link = !files::refuse_link(path).ok();
  return cut == size && !link ? Status::OK() : files::keep_prefix(path, cut);
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
  std::string text;
  bool absent = false;
  CULPRIT_RETURN_IF_ERROR(files::read_regular(path, files::kMaxJsonRecordBytes, "a culprit run.json", &text, &absent));
  if (absent) return Status::BadInput("'" + run_dir + "' holds no run (no run.json)");
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
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

// A checkpoint holds the configuration its run trained with, written with its state and checked
// with it; run.json is a text file anyone may edit. A checkpoint of this run (its run identity is
// run.json's, checked first) whose determinism-critical options differ from run.json's means
// run.json no longer says what the run did: resuming would train on with the edited value and a
// replay would compute other bits than the run did (a bisection would call that
// software-nondeterminism). Damaged, naming the option and both values. The injected faults are not
// compared (not critical: each invocation names its own) nor are options a run may change on
// --resume (--steps, the detectors, checkpoint and trace retention).
Status same_configuration(const TrainConfig& cfg, const ckpt::Checkpoint& c, const std::string& from) {
  const auto it = c.meta.find("config");
  if (it == c.meta.end() || it->second.empty()) return Status::OK();  // a checkpoint that does not say
  TrainConfig theirs;
  const Status st = parse_recorded_config(it->second, &theirs);
  if (!st.ok()) return Status::Damaged("checkpoint '" + from + "' holds a configuration this culprit cannot read: " + st.message());
  std::string ours_value, theirs_value;
  const std::string key = first_critical_difference(cfg, theirs, &ours_value, &theirs_value);
  if (key.empty()) return Status::OK();
  return Status::Damaged("'" + (fs::path(cfg.run_dir) / "run.json").string() + "' says --" + key + " " + ours_value +
                         " but checkpoint '" + from + "' of the same run was written with --" + key + " " +
                         theirs_value + ": run.json was edited or replaced, and no longer says what the run computed "
                         "(put back its --" + key + " " + theirs_value + "; a resumed run cannot change it)");
}

Status check_compatible(const TrainConfig& cfg, const Dataset& data, const ckpt::Checkpoint& c, const std::string& from) {
  CULPRIT_RETURN_IF_ERROR(ckpt::belongs(from, c, cfg.run_id));
  CULPRIT_RETURN_IF_ERROR(same_configuration(cfg, c, from));
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
