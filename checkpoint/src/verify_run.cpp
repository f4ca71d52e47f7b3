// `culprit verify RUN`: the run as a whole (verify_run.h). The files' own checks (fingerprints,
// row checksums) are tools.cpp's verify(); these are the checks between files.
#include "verify_run.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "culprit/checkpoint_format.h"
#include "culprit/run_files.h"

namespace culprit::ckpt {

namespace fs = std::filesystem;

Status read_run_facts(const std::string& run_dir, RunFacts* out) {
  *out = RunFacts();
  const fs::path path = fs::path(run_dir) / "run.json";
  std::string text;
  bool absent = false;
  CULPRIT_RETURN_IF_ERROR(files::read_regular(path.string(), files::kMaxJsonRecordBytes, "a culprit run.json", &text, &absent));
  if (absent) return Status::OK();
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::Damaged("'" + path.string() + "' is not a culprit run.json");
  out->has_run_json = true;
  if (j.contains("run_id") && j["run_id"].is_string()) out->run_id = j["run_id"].get<std::string>();
  if (j.contains("world_size") && j["world_size"].is_number_integer()) out->world_size = j["world_size"].get<int>();
  if (j.contains("config") && j["config"].is_string()) {
    std::istringstream ini(j["config"].get<std::string>());
    for (std::string line; std::getline(ini, line);)
      if (line == "trace = off") out->traced = false;
      else if (line.rfind("trace-keep = ", 0) == 0) out->trace_keep = std::atoll(line.c_str() + 13);
  }
  return Status::OK();
}

namespace {

void fail(std::ostringstream& os, bool* clean, const std::string& line) {
  os << "FAIL  " << line << "\n";
  *clean = false;
}

// metrics.jsonl: one line per step, in order, each step once; losses as the lowest rank's trace recorded.
void check_metrics(const std::string& run_dir, const std::map<int, trace::TraceFile>& traces,
                   std::int64_t newest_checkpoint, std::ostringstream& os, bool* clean) {
  const std::string path = (fs::path(run_dir) / "metrics.jsonl").string();
  int fd = -1;
  const Status opened = files::open_regular(path, UINT64_MAX, "metrics lines", &fd);
  if (!opened.ok()) return fail(os, clean, opened.message());
  if (fd < 0) return fail(os, clean, "'" + path + "' is missing");
  files::LineReader lines(fd, path, files::kMaxRecordLine);
  std::map<std::int64_t, float> trace_loss;
  if (!traces.empty())
    for (const auto& row : traces.begin()->second.steps) trace_loss[row.step] = row.loss;
  std::int64_t last = -1, torn = 0;
  std::string line;
  bool whole = false;
  // Only the last line may be torn (what --resume cuts); a bad line with lines after it is damage.
  while (lines.next(&line, &whole)) {
    if (torn)
      return fail(os, clean, "'" + path + "' line " + std::to_string(torn) +
                                 " is not a metrics line, and lines follow it (only the last line may be torn)");
    const std::int64_t lineno = lines.line_number();
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      torn = lineno;
      continue;
    }
    const std::int64_t step = j["step"].get<std::int64_t>();
    if (last >= 0 && step != last + 1)
      return fail(os, clean, "'" + path + "' line " + std::to_string(lineno) + ": step " + std::to_string(step) +
                                 " follows step " + std::to_string(last) + " (a step repeated or missing: two jobs wrote the run?)");
    last = step;
    const auto t = trace_loss.find(step);
    if (t != trace_loss.end() && j.contains("loss") && j["loss"].is_number() &&
        static_cast<float>(j["loss"].get<double>()) != t->second && !(std::isnan(t->second)))
      return fail(os, clean, "'" + path + "' step " + std::to_string(step) + ": loss " + j["loss"].dump() +
                                 ", the lowest rank's trace records " + std::to_string(t->second) + " (not the same run?)");
  }
  if (!lines.status().ok()) return fail(os, clean, lines.status().message());
  if (torn) os << "note  " << path << " line " << torn << " is torn (a crash or full disk; --resume cuts it)\n";
  if (newest_checkpoint > 0 && last < newest_checkpoint)
    fail(os, clean, "'" + path + "' ends at step " + std::to_string(last) + ", before the newest checkpoint (step " +
                        std::to_string(newest_checkpoint) + ")");
}

// Every rank's rows are there: a resume that found a rank's trace unopenable moved it aside
// (rank-RRRRR.h5.damaged-N) and started the rank's record over, so its rows before the resume are
// not in the run's record; a file deleted or replaced by hand loses them the same way.
void check_trace_rows(const std::string& run_dir, const RunFacts& facts, const std::map<std::int64_t, int>& worlds,
                      const std::map<int, trace::TraceFile>& traces, std::int64_t newest_checkpoint,
                      std::ostringstream& os, bool* clean) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / format::kTraceDir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(format::kTracePrefix, 0) == 0 && name.find(".damaged-") != std::string::npos)
      fail(os, clean, "'" + e.path().string() + "' is a trace a resume found damaged and moved aside: the rows it " +
                          "held are not in the run's record (bisect cannot examine those steps of that rank)");
  }
  if (!facts.traced || traces.empty()) return;
  std::int64_t first = INT64_MAX;  // the earliest row of any rank
  for (const auto& [rank, tf] : traces)
    if (!tf.steps.empty()) first = std::min(first, tf.steps.front().step);
  for (const auto& [rank, tf] : traces) {
    if (rank >= facts.world_size || tf.steps.empty()) continue;
    const std::int64_t from = tf.steps.front().step, to = tf.steps.back().step;
    const std::string who = "the trace of rank " + std::to_string(rank) + " ('" + trace::path_for(run_dir, rank) + "')";
    // Every rank syncs its trace before a checkpoint commits (rows of a torn tail count: they are
    // there, only their counts were not raised).
    if (to + tf.torn_steps < newest_checkpoint)
      fail(os, clean, who + " ends at step " + std::to_string(to) + ", before the newest checkpoint (step " +
                          std::to_string(newest_checkpoint) + "): rows of committed steps are missing");
    // A rank's rows start after another rank's only where it joined the run: at a resume from a
    // checkpoint that a smaller world wrote. With --trace-keep the files roll and retire per rank,
    // so their starts can differ by a roll.
    if (facts.trace_keep > 0 || from <= first) continue;
    const auto w = worlds.find(from - 1);
    if (w != worlds.end() && w->second > rank)
      fail(os, clean, who + " starts at step " + std::to_string(from) + ", though rank " + std::to_string(rank) +
                          " was part of the run before (checkpoint step " + std::to_string(from - 1) + " was written by " +
                          std::to_string(w->second) + " ranks) and the earliest rank's trace starts at step " +
                          std::to_string(first) + ": its rows of steps " + std::to_string(first) + ".." +
                          std::to_string(from - 1) + " are missing");
  }
}

}  // namespace

void verify_run_whole(const std::string& run_dir, const RunFacts& facts,
                      const std::map<std::string, std::string>& file_run_ids,
                      const std::map<std::int64_t, int>& checkpoint_worlds,
                      const std::map<int, trace::TraceFile>& traces, std::ostringstream& os, bool* clean) {
  for (const auto& [path, id] : file_run_ids) {
    const Status st = files::same_run(path, id, facts.run_id);
    if (!st.ok()) fail(os, clean, st.message());
  }
  const auto ckpts = list(run_dir);
  if (ckpts.empty())
    fail(os, clean, "'" + run_dir + "' holds no checkpoint (a run always keeps its first: was checkpoints/ deleted?)");
  if (facts.traced)
    for (int r = 0; r < facts.world_size; ++r)
      if (trace::list_rank(run_dir, r).empty())  // a crash while a file rolled can leave only sealed ones
        fail(os, clean, "the trace of rank " + std::to_string(r) + " is missing ('" + trace::path_for(run_dir, r) +
                            "'; run.json: world size " + std::to_string(facts.world_size) + ")");
  check_trace_rows(run_dir, facts, checkpoint_worlds, traces, ckpts.empty() ? 0 : ckpts.back().first, os, clean);
  check_metrics(run_dir, traces, ckpts.empty() ? 0 : ckpts.back().first, os, clean);
}

}  // namespace culprit::ckpt
