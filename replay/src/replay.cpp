#include "culprit/replay.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "culprit/checkpoint.h"
#include "culprit/engine.h"
#include "culprit/exit_codes.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/trace.h"

namespace culprit::replay {

namespace fs = std::filesystem;

namespace {

using harness::ShardResult;
using harness::StepResult;

using Recorded = trace::RunTrace;

std::string fbits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(v), u);
  return buf;
}

std::string xor_bits(float a, float b) {
  std::uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%08x", x ^ y);
  return buf;
}

bool same_float(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// The first place, in execution order, where a replayed micro-shard differs from its record:
// forward outputs layer by layer, the gradients flowing back (in backward order), the gradient leaf,
// the loss. Empty when they match.
std::string first_difference(const ShardResult& got, const trace::ShardRow& want, const std::vector<std::string>& layers,
                             const std::vector<std::string>& params, bool compare_layers) {
  if (got.input_fp != want.input_fp)
    return "first in the input samples as loaded (fingerprint " + fingerprint_hex(got.input_fp) + ", recorded " +
           fingerprint_hex(want.input_fp) + ")";
  if (compare_layers && got.fwd.size() == want.fwd.size() && got.fwd.size() == layers.size()) {
    for (std::size_t i = 0; i < layers.size(); ++i)
      if (got.fwd[i] != want.fwd[i]) return "first in the forward output of layer " + layers[i];
    for (std::size_t i = layers.size(); i-- > 0;)
      if (got.bwd[i] != want.bwd[i]) return "first in the gradient flowing back into layer " + layers[i];
  }
  if (compare_layers && got.param_grad.size() == want.param_grad.size())
    for (std::size_t i = 0; i < got.param_grad.size() && i < params.size(); ++i)
      if (got.param_grad[i] != want.param_grad[i]) return "first in the gradient of parameter '" + params[i] + "'";
  if (got.grad_fp != want.grad_fp)
    return "in the micro-shard gradient (fingerprint " + fingerprint_hex(got.grad_fp) + ", recorded " +
           fingerprint_hex(want.grad_fp) + ")";
  if (!same_float(got.loss, want.loss))
    return "in the loss: replayed " + fbits(got.loss) + ", recorded " + fbits(want.loss) + ", bits " +
           xor_bits(got.loss, want.loss) + " differ";
  return "";
}

std::string step_difference(const StepResult& got, const trace::StepRow& want, const std::vector<std::string>& params) {
  if (got.grad_fp != want.grad_fp)
    return "the reduced gradient differs (fingerprint " + fingerprint_hex(got.grad_fp) + ", recorded " +
           fingerprint_hex(want.grad_fp) + ")";
  for (std::size_t i = 0; i < params.size() && i < got.param_fps.size() && i < want.param_fps.size(); ++i)
    if (got.param_fps[i] != want.param_fps[i]) return "parameter '" + params[i] + "' differs after the update";
  if (!same_float(got.loss, want.loss))
    return "the step's loss differs: replayed " + fbits(got.loss) + ", recorded " + fbits(want.loss);
  return "";
}

// Every rank's lines, on rank 0, in rank order.
std::vector<std::string> gather_lines(const Comm& comm, const std::vector<std::string>& mine) {
  std::string joined;
  for (const auto& l : mine) joined += l + '\n';
  int n = static_cast<int>(joined.size());
  std::vector<int> counts(comm.size), displs(comm.size);
  CULPRIT_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm.comm));
  int total = 0;
  for (int r = 0; r < comm.size; ++r) displs[r] = total, total += counts[r];
  std::string all(comm.rank == 0 ? static_cast<std::size_t>(total) : 0, '\0');
  CULPRIT_MPI_CHECK(MPI_Gatherv(joined.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, 0,
                                comm.comm));
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < all.size()) {
    const auto end = all.find('\n', pos);
    out.push_back(all.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// The newest checkpoint before `step` that verifies; damaged ones are reported and skipped.
Status pick_checkpoint(const Comm& comm, const std::string& run_dir, std::int64_t step, std::string* path) {
  const auto all = ckpt::list(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->first >= step) continue;
    ckpt::Checkpoint c;
    Status st = agree(comm, ckpt::read(it->second, &c, /*verify=*/true));
    if (st.ok()) {
      *path = it->second;
      return Status::OK();
    }
    if (comm.rank == 0) std::fprintf(stderr, "culprit: warning: skipping damaged checkpoint: %s\n", st.message().c_str());
  }
  return Status::Error("no valid checkpoint of '" + run_dir + "' precedes step " + std::to_string(step));
}

}  // namespace

Status run(const Options& opt, const Comm& comm) {
  harness::TrainConfig cfg;
  CULPRIT_RETURN_IF_ERROR(agree(comm, harness::load_run_config(opt.run_dir, &cfg)));
  Recorded rec;
  CULPRIT_RETURN_IF_ERROR(agree(comm, trace::read_run(opt.run_dir, &rec)));
  if (opt.step < 1 || !rec.step(opt.step))
    return agree(comm, Status::Error("--step " + std::to_string(opt.step) + " is not in the trace of '" + opt.run_dir +
                                     "' (steps " + (rec.steps.empty() ? std::string("none") :
                                     std::to_string(rec.first_step) + ".." + std::to_string(rec.last_step)) + ")"));
  for (int r : opt.ranks)
    if (r < 0 || r >= comm.size)
      return agree(comm, Status::Error("--ranks: rank " + std::to_string(r) + " does not exist (world size " +
                                       std::to_string(comm.size) + ")"));
  if (opt.micro_shard >= cfg.micro_shards)
    return agree(comm, Status::Error("--micro-shard " + std::to_string(opt.micro_shard) + " does not exist (the run has " +
                                     std::to_string(cfg.micro_shards) + " micro-shards)"));
  std::string ckpt_path;
  CULPRIT_RETURN_IF_ERROR(pick_checkpoint(comm, opt.run_dir, opt.step, &ckpt_path));
  const bool layer = opt.layer || rec.header.level == "layer";
  std::unique_ptr<harness::Engine> engine;
  CULPRIT_RETURN_IF_ERROR(harness::Engine::open(cfg, comm, ckpt_path, layer, &engine));
  const auto layers = engine->layers();
  const auto params = engine->params();
  const bool layers_recorded = rec.header.level == "layer" && rec.header.layers == layers;
  int mismatches = 0;
  auto say = [&](const std::string& line) {
    if (comm.rank == 0) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  };
  say("culprit replay: " + opt.run_dir + " step " + std::to_string(opt.step) + " from " + ckpt_path + " on " +
      std::to_string(comm.size) + " rank(s)" + (layers_recorded ? ", per-layer fingerprints" : ""));

  // Up to the step: every step as the original run computed it, compared with its record.
  while (engine->step() + 1 < opt.step) {
    StepResult sr;
    CULPRIT_RETURN_IF_ERROR(engine->run_step(&sr));
    std::vector<std::string> mine;
    for (const auto& r : sr.shards) {
      auto it = rec.shards.find({r.step, r.shard});
      if (it == rec.shards.end()) continue;
      const std::string d = first_difference(r, it->second, layers, params, layers_recorded);
      if (!d.empty())
        mine.push_back("step " + std::to_string(sr.step) + " micro-shard " + std::to_string(r.shard) + " on rank " +
                       std::to_string(comm.rank) + ": MISMATCH " + d + " (recorded by rank " +
                       std::to_string(it->second.rank) + " on " + it->second.host + ")");
    }
    const auto lines = gather_lines(comm, mine);
    const trace::StepRow* row = rec.step(sr.step);
    const std::string d = row ? step_difference(sr, *row, params) : std::string();
    for (const auto& l : lines) say(l);
    if (!d.empty()) say("step " + std::to_string(sr.step) + " update: MISMATCH " + d);
    const int bad = static_cast<int>(lines.size()) + (d.empty() ? 0 : 1);
    if (bad == 0) say("step " + std::to_string(sr.step) + ": every micro-shard and the update match");
    mismatches += bad;
  }

  // The step itself: its micro-shards recomputed on the chosen ranks.
  const std::int64_t s = opt.step;
  const bool chosen = opt.ranks.empty() || std::find(opt.ranks.begin(), opt.ranks.end(), comm.rank) != opt.ranks.end();
  std::vector<int> shards;
  for (int k = 0; k < cfg.micro_shards; ++k)
    if (opt.micro_shard < 0 || k == opt.micro_shard) shards.push_back(k);
  std::vector<std::string> mine;
  std::vector<Fingerprint> fps(shards.size() * comm.size, 0), all_fps(shards.size() * comm.size, 0);
  std::vector<ShardResult> results(shards.size());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (!chosen) continue;
    CULPRIT_RETURN_IF_ERROR(engine->compute_shard(shards[i], 0, &results[i]));
    fps[i * comm.size + comm.rank] = results[i].grad_fp;
    auto it = rec.shards.find({s, shards[i]});
    std::string d = it == rec.shards.end() ? "not in the trace"
                                           : first_difference(results[i], it->second, layers, params, layers_recorded);
    mine.push_back("step " + std::to_string(s) + " micro-shard " + std::to_string(shards[i]) + " on rank " +
                   std::to_string(comm.rank) + " (" + comm.host + "): " + (d.empty() ? "match" : "MISMATCH " + d));
  }
  CULPRIT_MPI_CHECK(MPI_Allreduce(fps.data(), all_fps.data(), static_cast<int>(fps.size()), MPI_UINT64_T, MPI_BOR,
                                  comm.comm));
  const auto lines = gather_lines(comm, mine);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    auto it = rec.shards.find({s, shards[i]});
    if (it != rec.shards.end())
      say("step " + std::to_string(s) + " micro-shard " + std::to_string(shards[i]) + ", recorded by rank " +
          std::to_string(it->second.rank) + " on " + it->second.host + ": loss " + fbits(it->second.loss) +
          ", gradient " + fingerprint_hex(it->second.grad_fp));
    const std::string key = " micro-shard " + std::to_string(shards[i]) + " on rank ";
    std::vector<int> same, differ;
    for (const auto& l : lines) {
      const auto at = l.find(key);
      if (at == std::string::npos) continue;
      say("  " + l);
      const int r = std::stoi(l.substr(at + key.size()));
      (l.find("MISMATCH") != std::string::npos ? differ : same).push_back(r);
    }
    mismatches += static_cast<int>(differ.size());
    // What the replays say together.
    auto list = [](const std::vector<int>& v) {
      std::string out;
      for (int r : v) out += (out.empty() ? "" : ",") + std::to_string(r);
      return out;
    };
    const std::string who = it == rec.shards.end() ? "?" : std::to_string(it->second.rank);
    std::set<Fingerprint> replays;
    for (int r = 0; r < comm.size; ++r)
      if (all_fps[i * comm.size + r]) replays.insert(all_fps[i * comm.size + r]);
    if (!differ.empty() && same.empty() && replays.size() == 1)
      say("  => every replay (ranks " + list(differ) + ") agrees with the others and not with the record of rank " + who);
    else if (!differ.empty() && !same.empty())
      say("  => rank(s) " + list(same) + " reproduce the record of rank " + who + "; rank(s) " + list(differ) + " do not");
  }
  // Replays that disagree among themselves: the first differing element of the first two.
  for (std::size_t i = 0; i < shards.size(); ++i) {
    int a = -1, b = -1;
    for (int r = 0; r < comm.size; ++r) {
      const Fingerprint f = all_fps[i * comm.size + r];
      if (!f) continue;
      if (a < 0) a = r;
      else if (f != all_fps[i * comm.size + a] && b < 0) b = r;
    }
    if (b < 0) continue;
    // Rank b sends its gradient to rank a, which compares.
    const int tag = 9000 + static_cast<int>(i);
    if (comm.rank == b) {
      CULPRIT_MPI_CHECK(MPI_Send(results[i].grad.data(), static_cast<int>(results[i].grad.size()), MPI_FLOAT, a, tag,
                                 comm.comm));
    }
    std::string line;
    if (comm.rank == a) {
      std::vector<float> other(results[i].grad.size());
      CULPRIT_MPI_CHECK(MPI_Recv(other.data(), static_cast<int>(other.size()), MPI_FLOAT, b, tag, comm.comm,
                                 MPI_STATUS_IGNORE));
      for (std::size_t j = 0; j < other.size(); ++j)
        if (!same_float(other[j], results[i].grad[j])) {
          line = "  replays disagree: micro-shard " + std::to_string(shards[i]) + " gradient element " +
                 std::to_string(j) + ": rank " + std::to_string(a) + " " + fbits(results[i].grad[j]) + ", rank " +
                 std::to_string(b) + " " + fbits(other[j]) + ", bits " + xor_bits(results[i].grad[j], other[j]) +
                 " differ";
          break;
        }
    }
    for (const auto& l : gather_lines(comm, line.empty() ? std::vector<std::string>{} : std::vector<std::string>{line}))
      say(l);
  }
  // And the step's update, computed as the original run did.
  StepResult sr;
  CULPRIT_RETURN_IF_ERROR(engine->run_step(&sr));
  const std::string d = step_difference(sr, *rec.step(s), params);
  say("step " + std::to_string(s) + " update: " + (d.empty() ? "match" : "MISMATCH " + d));
  if (!d.empty()) ++mismatches;
  if (mismatches == 0) {
    say("replay of step " + std::to_string(s) + ": everything matches the trace");
    return Status::OK();
  }
  return Status::Error("replay of step " + std::to_string(s) + ": " + std::to_string(mismatches) +
                           " mismatch(es) with the trace",
                       kExitDiffers);
}

namespace {

// One interval's outcome; travels between ranks as one line "from to rank ok detail".
struct IntervalResult {
  std::int64_t from = 0, to = 0;
  int rank = 0, share = 0;
  bool ok = true;
  std::string detail;
};

std::string encode(const IntervalResult& r) {
  return std::to_string(r.from) + " " + std::to_string(r.to) + " " + std::to_string(r.rank) + " " +
         std::to_string(r.share) + " " + (r.ok ? "1" : "0") + " " + r.detail;
}

IntervalResult decode(const std::string& line) {
  IntervalResult r;
  char* end = nullptr;
  const char* p = line.c_str();
  r.from = std::strtoll(p, &end, 10);
  r.to = std::strtoll(end, &end, 10);
  r.rank = static_cast<int>(std::strtol(end, &end, 10));
  r.share = static_cast<int>(std::strtol(end, &end, 10));
  r.ok = std::strtol(end, &end, 10) != 0;
  if (*end == ' ') ++end;
  r.detail = end;
  return r;
}

std::string line_of(const IntervalResult& r) {
  return "interval " + std::to_string(r.from) + ".." + std::to_string(r.to) + " (rank " + std::to_string(r.rank) +
         (r.share ? ", share " + std::to_string(r.share) : "") + "): " +
         (r.ok ? "reproduced bitwise" : "MISMATCH " + r.detail);
}

nlohmann::ordered_json report_json(const std::string& run_dir, const std::vector<std::pair<std::int64_t, std::int64_t>>& all,
                                   const std::vector<IntervalResult>& results, const std::vector<std::string>& damaged,
                                   int share, int shares, int world) {
  nlohmann::ordered_json j;
  j["run_dir"] = run_dir;
  j["share"] = share;
  j["shares"] = shares;
  j["world_size"] = world;
  j["all_intervals"] = nlohmann::ordered_json::array();
  for (const auto& [from, to] : all) j["all_intervals"].push_back({from, to});
  j["intervals"] = nlohmann::ordered_json::array();
  int bad = 0;
  for (const auto& r : results) {
    j["intervals"].push_back({{"from", r.from}, {"to", r.to}, {"rank", r.rank}, {"share", r.share},
                              {"verdict", r.ok ? "reproduced" : "mismatch"}, {"detail", r.detail}});
    if (!r.ok && bad++ == 0) j["first_bad"] = line_of(r);
  }
  if (!bad) j["first_bad"] = nullptr;
  j["mismatches"] = bad;
  j["damaged"] = damaged;
  return j;
}

Status write_json(const fs::path& path, const nlohmann::ordered_json& j) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    if (!out) return Status::Error("cannot write '" + tmp.string() + "'");
  }
  fs::rename(tmp, path, ec);
  if (ec) return Status::Error("cannot write '" + path.string() + "': " + ec.message());
  return Status::OK();
}

// Prints the report and returns its verdict: OK, or kExitDiffers naming the first bad interval.
Status print_report(const std::string& run_dir, const std::vector<IntervalResult>& results,
                    const std::vector<std::string>& damaged, const std::string& how, const std::string& report) {
  std::printf("culprit audit: %s, %zu interval(s) %s\n", run_dir.c_str(), results.size(), how.c_str());
  for (const auto& d : damaged) std::printf("damaged checkpoint skipped: %s\n", d.c_str());
  int bad = 0;
  std::string first_bad;
  for (const auto& r : results) {
    std::printf("%s\n", line_of(r).c_str());
    if (!r.ok && bad++ == 0) first_bad = line_of(r);
  }
  if (!report.empty()) std::printf("report: %s\n", report.c_str());
  std::fflush(stdout);
  if (!bad) return Status::OK();
  return Status::Error(std::to_string(bad) + " interval(s) do not reproduce; first: " + first_bad, kExitDiffers);
}

}  // namespace

std::string audit_part_path(const std::string& run_dir, int share, int shares) {
  char name[64];
  std::snprintf(name, sizeof name, "part-%04d-of-%04d.json", share, shares);
  return (fs::path(run_dir) / "audit" / name).string();
}

Status audit(const std::string& run_dir, const Comm& comm, const AuditOptions& opt) {
  if (opt.shares < 1 || opt.share < 0 || opt.share >= opt.shares)
    return agree(comm, Status::Error("option '--share': " + std::to_string(opt.share) + "/" +
                                     std::to_string(opt.shares) + " is not I/N with 0 <= I < N"));
  harness::TrainConfig cfg;
  CULPRIT_RETURN_IF_ERROR(agree(comm, harness::load_run_config(run_dir, &cfg)));
  Recorded rec;
  CULPRIT_RETURN_IF_ERROR(agree(comm, trace::read_run(run_dir, &rec)));
  const auto t0 = MPI_Wtime();
  // The valid checkpoints, in order; every consecutive pair is an interval. Each rank verifies
  // every W-th checkpoint; the ranks then agree on which are valid.
  const auto all = ckpt::list(run_dir);
  std::vector<int> valid(all.size(), 1);
  std::vector<std::string> my_damaged;
  for (std::size_t j = 0; j < all.size(); ++j) {
    if (static_cast<int>(j % comm.size) != comm.rank) continue;
    ckpt::Checkpoint c;
    Status st = ckpt::read(all[j].second, &c, /*verify=*/true);
    if (!st.ok()) {
      valid[j] = 0;
      my_damaged.push_back(st.message());
    }
  }
  CULPRIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, valid.data(), static_cast<int>(valid.size()), MPI_INT, MPI_MIN,
                                  comm.comm));
  const std::vector<std::string> damaged = gather_lines(comm, my_damaged);
  std::vector<std::pair<std::int64_t, std::string>> ckpts;
  for (std::size_t j = 0; j < all.size(); ++j)
    if (valid[j]) ckpts.push_back(all[j]);
  if (ckpts.size() < 2)
    return agree(comm, Status::Error("'" + run_dir + "' holds " + std::to_string(ckpts.size()) +
                                     " valid checkpoint(s): an audit needs two (an interval)"));
  std::vector<std::pair<std::int64_t, std::int64_t>> intervals;
  for (std::size_t i = 0; i + 1 < ckpts.size(); ++i) intervals.push_back({ckpts[i].first, ckpts[i + 1].first});
  // This share's intervals (i mod shares), spread over the ranks; each rank audits alone (the
  // results do not depend on the world size).
  std::vector<std::size_t> share_intervals;
  for (std::size_t i = 0; i < intervals.size(); ++i)
    if (static_cast<int>(i % opt.shares) == opt.share) share_intervals.push_back(i);
  MPI_Comm solo_comm;
  CULPRIT_MPI_CHECK(MPI_Comm_split(comm.comm, comm.rank, 0, &solo_comm));
  Comm solo{solo_comm, 0, 1, comm.host};
  std::vector<std::string> mine;
  Status failure;
  for (std::size_t n = 0; n < share_intervals.size() && failure.ok(); ++n) {
    if (static_cast<int>(n % comm.size) != comm.rank) continue;
    const std::size_t i = share_intervals[n];
    const std::int64_t to = ckpts[i + 1].first;
    std::unique_ptr<harness::Engine> engine;
    failure = harness::Engine::open(cfg, solo, ckpts[i].second, rec.header.level == "layer", &engine);
    if (!failure.ok()) break;
    const auto layers = engine->layers(), params = engine->params();
    const bool layers_recorded = rec.header.level == "layer" && rec.header.layers == layers;
    std::string verdict;
    StepResult sr;
    while (engine->step() < to && verdict.empty()) {
      failure = engine->run_step(&sr);
      if (!failure.ok()) break;
      for (const auto& r : sr.shards) {
        auto it = rec.shards.find({r.step, r.shard});
        if (it == rec.shards.end()) continue;
        const std::string d = first_difference(r, it->second, layers, params, layers_recorded);
        if (!d.empty()) {
          verdict = "step " + std::to_string(sr.step) + " micro-shard " + std::to_string(r.shard) + " (recorded by rank " +
                    std::to_string(it->second.rank) + " on " + it->second.host + ") differs " + d;
          break;
        }
      }
      const trace::StepRow* row = rec.step(sr.step);
      if (verdict.empty() && row) {
        const std::string d = step_difference(sr, *row, params);
        if (!d.empty()) verdict = "step " + std::to_string(sr.step) + ": " + d;
      }
    }
    if (!failure.ok()) break;
    if (verdict.empty()) {
      // The interval must end in the next checkpoint's state (verified above).
      ckpt::Checkpoint c;
      failure = ckpt::read(ckpts[i + 1].second, &c, /*verify=*/false);
      if (!failure.ok()) break;
      for (std::size_t p = 0; p < params.size() && p < sr.param_fps.size(); ++p)
        for (const auto& t : c.model)
          if (t.name == params[p] && fingerprint_bytes(t.bytes.data(), t.bytes.size()) != sr.param_fps[p] && verdict.empty())
            verdict = "the replay does not end in " + ckpts[i + 1].second + " ('" + params[p] + "' differs)";
    }
    IntervalResult r;
    r.from = intervals[i].first;
    r.to = intervals[i].second;
    r.rank = comm.rank;
    r.share = opt.share;
    r.ok = verdict.empty();
    r.detail = verdict;
    mine.push_back(encode(r));
  }
  MPI_Comm_free(&solo_comm);
  CULPRIT_RETURN_IF_ERROR(agree(comm, failure));
  std::vector<IntervalResult> results;
  for (const auto& l : gather_lines(comm, mine)) results.push_back(decode(l));
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.from < b.from; });
  Status verdict;
  if (comm.rank == 0) {
    // A share writes its part for `--merge`; a whole audit writes RUN/audit.json.
    const std::string path = opt.shares > 1 ? audit_part_path(run_dir, opt.share, opt.shares)
                                            : (fs::path(run_dir) / "audit.json").string();
    auto j = report_json(run_dir, intervals, results, damaged, opt.share, opt.shares, comm.size);
    j["seconds"] = MPI_Wtime() - t0;
    Status written = write_json(path, j);
    const std::string how = "on " + std::to_string(comm.size) + " rank(s)" +
                            (opt.shares > 1 ? ", share " + std::to_string(opt.share) + " of " +
                                                  std::to_string(opt.shares) + " (" +
                                                  std::to_string(intervals.size()) + " in the run)"
                                            : "");
    verdict = print_report(run_dir, results, damaged, how, written.ok() ? path : "");
    std::printf("audited in %.2f s\n", MPI_Wtime() - t0);
    std::fflush(stdout);
    if (!written.ok()) verdict = written;
  }
  const std::string msg = broadcast_string(comm, verdict.ok() ? std::string() : verdict.message());
  const int code = verdict.code();
  int agreed = code;
  CULPRIT_MPI_CHECK(MPI_Bcast(&agreed, 1, MPI_INT, 0, comm.comm));
  return msg.empty() ? Status::OK() : Status::Error(msg, agreed);
}

Status audit(const std::string& run_dir, const Comm& comm) { return audit(run_dir, comm, AuditOptions()); }

Status merge_audit(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "audit";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::Error("'" + dir.string() + "' does not exist: no audit share has written its part");
  // The parts, by their N; exactly one N may be present.
  std::map<int, std::map<int, fs::path>> parts;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int i = -1, n = -1;
    const std::string name = e.path().filename().string();
    if (std::sscanf(name.c_str(), "part-%d-of-%d.json", &i, &n) == 2 && name.size() == 22 && i >= 0 && i < n)
      parts[n][i] = e.path();
  }
  if (parts.empty()) return Status::Error("'" + dir.string() + "' holds no part-I-of-N.json");
  if (parts.size() > 1)
    return Status::Error("'" + dir.string() + "' holds parts of audits with different share counts (" +
                         std::to_string(parts.begin()->first) + " and " + std::to_string(parts.rbegin()->first) + ")");
  const int shares = parts.begin()->first;
  const auto& files = parts.begin()->second;
  std::string missing;
  for (int i = 0; i < shares; ++i)
    if (!files.count(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
  if (!missing.empty())
    return Status::Error("the audit of '" + run_dir + "' in " + std::to_string(shares) + " shares lacks share(s) " +
                         missing + " (did every array task finish?)");
  nlohmann::json first_all;
  std::vector<IntervalResult> results;
  std::set<std::string> damaged;
  for (const auto& [i, path] : files) {
    nlohmann::json j;
    try {
      std::ifstream in(path);
      j = nlohmann::json::parse(in);
      if (first_all.is_null()) first_all = j.at("all_intervals");
      if (j.at("all_intervals") != first_all)
        return Status::Error("'" + path.string() + "' audited other intervals than share 0 (checkpoints changed "
                             "between the array's tasks?)");
      for (const auto& d : j.at("damaged")) damaged.insert(d.get<std::string>());
      for (const auto& r : j.at("intervals")) {
        IntervalResult x;
        x.from = r.at("from").get<std::int64_t>();
        x.to = r.at("to").get<std::int64_t>();
        x.rank = r.at("rank").get<int>();
        x.share = r.at("share").get<int>();
        x.ok = r.at("verdict").get<std::string>() == "reproduced";
        x.detail = r.at("detail").get<std::string>();
        results.push_back(x);
      }
    } catch (const std::exception& e) {
      return Status::Error("'" + path.string() + "' is not an audit part: " + e.what());
    }
  }
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.from < b.from; });
  std::vector<std::pair<std::int64_t, std::int64_t>> all;
  for (const auto& v : first_all) all.push_back({v.at(0).get<std::int64_t>(), v.at(1).get<std::int64_t>()});
  std::vector<std::pair<std::int64_t, std::int64_t>> got;
  for (const auto& r : results) got.push_back({r.from, r.to});
  if (got != all)
    return Status::Error("the parts of the audit of '" + run_dir + "' cover " + std::to_string(got.size()) + " of " +
                         std::to_string(all.size()) + " intervals");
  const std::vector<std::string> dmg(damaged.begin(), damaged.end());
  const std::string path = (fs::path(run_dir) / "audit.json").string();
  auto j = report_json(run_dir, all, results, dmg, 0, shares, 0);
  j.erase("share");
  j.erase("world_size");
  CULPRIT_RETURN_IF_ERROR(write_json(path, j));
  return print_report(run_dir, results, dmg, "merged from " + std::to_string(shares) + " share(s)", path);
}

}  // namespace culprit::replay
