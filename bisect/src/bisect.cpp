#include "culprit/bisect.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "culprit/checkpoint.h"
#include "culprit/engine.h"
#include "culprit/exit_codes.h"
#include "culprit/fingerprint.h"
#include "culprit/harness.h"
#include "culprit/trace.h"
#include "machine.h"

namespace culprit::bisect {

namespace {

using harness::ShardResult;
using harness::StepResult;
namespace fs = std::filesystem;

struct Incident {
  std::int64_t step = -1;
  std::string detector, message;
  int rank = -1;
};

// What the original run recorded: every rank's trace and its first incident.
struct Record : trace::RunTrace {
  Incident first;
};

Status load_record(const std::string& run_dir, Record* rec) {
  CULPRIT_RETURN_IF_ERROR(trace::read_run(run_dir, rec));
  std::ifstream in(fs::path(run_dir) / "incidents.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      // A rank that stopped answering, or a jobs/ script's decision, is not where a fault shows.
      const auto detector = j.at("detector").get<std::string>();
      if (detector == "collective-timeout" || detector == "jobs") continue;
      rec->first = {j.at("step").get<std::int64_t>(), j.at("detector").get<std::string>(),
                    j.at("message").get<std::string>(), j.at("rank").get<int>()};
      break;
    } catch (const std::exception&) {
      return Status::Error("'" + run_dir + "/incidents.jsonl' holds a line that is not an incident record");
    }
  }
  return Status::OK();
}

bool same_float(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

std::string module_of(const std::string& param) {
  const auto dot = param.rfind('.');
  return dot == std::string::npos ? param : param.substr(0, dot);
}

// Where a computation differs from a reference, in execution order: (phase, layer), or empty phase.
std::pair<std::string, std::string> first_difference(const ShardResult& a, const ShardResult& b,
                                                     const std::vector<std::string>& layers,
                                                     const std::vector<std::string>& params) {
  if (a.input_fp != b.input_fp) return {"data", ""};
  if (a.fwd.size() == b.fwd.size() && a.fwd.size() == layers.size()) {
    for (std::size_t i = 0; i < layers.size(); ++i)
      if (a.fwd[i] != b.fwd[i]) return {"forward", layers[i]};
    for (std::size_t i = layers.size(); i-- > 0;)
      if (a.bwd[i] != b.bwd[i]) return {"backward", layers[i]};
  }
  if (a.param_grad.size() == b.param_grad.size())
    for (std::size_t i = 0; i < a.param_grad.size() && i < params.size(); ++i)
      if (a.param_grad[i] != b.param_grad[i]) return {"grad", module_of(params[i])};
  if (a.grad_fp != b.grad_fp || !same_float(a.loss, b.loss)) return {"grad", ""};
  return {"", ""};
}


// Two computations of a micro-shard agree: input, every layer's forward and backward, every
// parameter's gradient (where recorded), the leaf and the loss. A fault can change a layer's
// gradient yet be absorbed before the leaf, so the layers count too.
bool same_result(const ShardResult& a, const ShardResult& b) {
  return a.grad_fp == b.grad_fp && same_float(a.loss, b.loss) && a.input_fp == b.input_fp && a.fwd == b.fwd &&
         a.bwd == b.bwd && a.param_grad == b.param_grad;
}

// Every rank's ShardResult fingerprints, on every rank (one all-gather of fixed-size records).
std::vector<ShardResult> allgather(const Comm& comm, const ShardResult& mine, std::size_t nl, std::size_t np) {
  const std::size_t len = 4 + 2 * nl + np;
  std::vector<std::uint64_t> rec(len, 0), all(len * comm.size, 0);
  std::uint32_t lb;
  std::memcpy(&lb, &mine.loss, 4);
  rec[0] = mine.grad_fp, rec[1] = mine.input_fp, rec[2] = lb, rec[3] = static_cast<std::uint64_t>(mine.rank);
  for (std::size_t i = 0; i < nl && i < mine.fwd.size(); ++i) rec[4 + i] = mine.fwd[i], rec[4 + nl + i] = mine.bwd[i];
  for (std::size_t i = 0; i < np && i < mine.param_grad.size(); ++i) rec[4 + 2 * nl + i] = mine.param_grad[i];
  CULPRIT_MPI_CHECK(MPI_Allgather(rec.data(), static_cast<int>(len), MPI_UINT64_T, all.data(), static_cast<int>(len),
                                  MPI_UINT64_T, comm.comm));
  std::vector<ShardResult> out(comm.size);
  for (int r = 0; r < comm.size; ++r) {
    const std::uint64_t* p = all.data() + static_cast<std::size_t>(r) * len;
    auto& s = out[r];
    s.grad_fp = p[0], s.input_fp = p[1];
    const std::uint32_t b = static_cast<std::uint32_t>(p[2]);
    std::memcpy(&s.loss, &b, 4);
    s.rank = r;
    if (!mine.fwd.empty()) {
      s.fwd.assign(p + 4, p + 4 + nl);
      s.bwd.assign(p + 4 + nl, p + 4 + 2 * nl);
    }
    if (!mine.param_grad.empty()) s.param_grad.assign(p + 4 + 2 * nl, p + 4 + 2 * nl + np);
  }
  return out;
}

Status pick_checkpoint(const Comm& comm, const std::string& run_dir, std::int64_t before, bool newest,
                       std::string* path) {
  auto all = ckpt::list(run_dir);
  if (newest) std::reverse(all.begin(), all.end());
  for (const auto& [step, p] : all) {
    if (step >= before) continue;
    ckpt::Checkpoint c;
    Status st = agree(comm, ckpt::read(p, &c, /*verify=*/true));
    if (st.ok()) {
      *path = p;
      return Status::OK();
    }
    if (comm.rank == 0) std::fprintf(stderr, "culprit: warning: skipping damaged checkpoint: %s\n", st.message().c_str());
  }
  return Status::Error("no valid checkpoint of '" + run_dir + "' precedes step " + std::to_string(before));
}

void progress(const Comm& comm, const std::string& line) {
  if (comm.rank != 0) return;
  std::fprintf(stderr, "culprit bisect: %s\n", line.c_str());
  std::fflush(stderr);
}

Status write_diagnosis(const std::string& run_dir, const Diagnosis& d) {
  nlohmann::ordered_json j = {{"verdict", d.verdict}, {"step", d.step},   {"layer", d.layer},
                              {"phase", d.phase},     {"rank", d.rank},   {"host", d.host},
                              {"device", d.device},   {"reruns", d.reruns}, {"reproduced", d.reproduced},
                              {"evidence", d.evidence}, {"steps_replayed", d.steps_replayed},
                              {"seconds", d.seconds}, {"startup_seconds", d.startup_seconds}};
  const auto path = fs::path(run_dir) / "diagnosis.json";
  std::ofstream out(path);
  out << j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  if (!out) return Status::Error("cannot write '" + path.string() + "'");
  return Status::OK();
}

std::string esc(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// RUN/diagnosis.html: one self-contained page (inline SVG, no scripts, no external files): the
// verdict, the loss each rank recorded per step with the faulty step marked, and the step x layer
// map of the replay (match / differ), and the evidence.
Status write_html(const std::string& run_dir, const Diagnosis& d, const Record& rec,
                  const std::vector<std::string>& rows, const std::vector<std::int64_t>& steps,
                  const std::vector<std::vector<int>>& cells) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>culprit diagnosis: " << esc(d.verdict)
    << "</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:72em}table{border-collapse:collapse}"
       "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}.differ{fill:#d62728}.match{fill:#2ca02c}"
       "svg{border:1px solid #ddd;margin:.5em 0}</style></head><body>\n";
  h << "<h1>culprit diagnosis</h1>\n<table id=\"summary\">";
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"verdict", d.verdict}, {"step", d.step >= 0 ? std::to_string(d.step) : "-"}, {"phase", d.phase.empty() ? "-" : d.phase},
      {"layer", d.layer.empty() ? "-" : d.layer}, {"rank", d.rank >= 0 ? std::to_string(d.rank) : "-"},
      {"host", d.host.empty() ? "-" : d.host}, {"device", d.device.empty() ? "-" : d.device},
      {"reruns", std::to_string(d.reproduced) + " of " + std::to_string(d.reruns) + " reproduced"},
      {"replayed", std::to_string(d.steps_replayed) + " step(s) in " + num(d.seconds) + " s"}};
  for (const auto& [k, v] : fields) h << "<tr><th>" << k << "</th><td id=\"" << k << "\">" << esc(v) << "</td></tr>";
  h << "</table>\n";
  // Loss per rank: the mean loss of the micro-shards each rank recorded, per step.
  std::map<int, std::map<std::int64_t, std::pair<double, int>>> per_rank;
  for (const auto& [key, row] : rec.shards) {
    auto& acc = per_rank[row.rank][row.step];
    if (std::isfinite(row.loss)) acc.first += row.loss, acc.second += 1;
  }
  double lo = 1e300, hi = -1e300;
  std::int64_t s0 = 1, s1 = std::max<std::int64_t>(2, rec.last_step);
  for (const auto& [r, series] : per_rank)
    for (const auto& [st, acc] : series)
      if (acc.second) lo = std::min(lo, acc.first / acc.second), hi = std::max(hi, acc.first / acc.second);
  if (!(hi > lo)) lo = 0, hi = std::max(1.0, hi);
  const double Wd = 720, Ht = 240, L = 50, R = 110, T = 20, B = 30;
  auto X = [&](double st) { return L + (st - s0) / static_cast<double>(s1 - s0) * (Wd - L - R); };
  auto Y = [&](double v) { return T + (hi - v) / (hi - lo) * (Ht - T - B); };
  static const char* colors[] = {"#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  h << "<h2>Loss per rank</h2>\n<svg id=\"loss-plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << Wd
    << "\" height=\"" << Ht << "\" role=\"img\" aria-label=\"loss per rank\">";
  h << "<line x1=\"" << L << "\" y1=\"" << Ht - B << "\" x2=\"" << Wd - R << "\" y2=\"" << Ht - B << "\" stroke=\"#000\"/>";
  h << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << Ht - B << "\" stroke=\"#000\"/>";
  h << "<text x=\"" << L << "\" y=\"" << Ht - 8 << "\" font-size=\"11\">step " << s0 << "</text><text x=\"" << Wd - R - 40
    << "\" y=\"" << Ht - 8 << "\" font-size=\"11\">step " << s1 << "</text>";
  h << "<text x=\"2\" y=\"" << T + 10 << "\" font-size=\"11\">" << num(hi) << "</text><text x=\"2\" y=\"" << Ht - B
    << "\" font-size=\"11\">" << num(lo) << "</text>";
  int ci = 0;
  for (const auto& [r, series] : per_rank) {
    std::string pts;
    for (const auto& [st, acc] : series)
      if (acc.second) pts += num(X(static_cast<double>(st))) + "," + num(Y(acc.first / acc.second)) + " ";
    const char* c = colors[ci++ % 8];
    h << "<polyline class=\"rank\" data-rank=\"" << r << "\" fill=\"none\" stroke=\"" << c << "\" points=\"" << pts
      << "\"/><text x=\"" << Wd - R + 8 << "\" y=\"" << T + 14 * ci << "\" font-size=\"11\" fill=\"" << c << "\">rank "
      << r << "</text>";
  }
  if (d.step > 0)
    h << "<line id=\"faulty-step-marker\" data-step=\"" << d.step << "\" x1=\"" << num(X(static_cast<double>(d.step)))
      << "\" y1=\"" << T << "\" x2=\"" << num(X(static_cast<double>(d.step))) << "\" y2=\"" << Ht - B
      << "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/><text x=\"" << num(X(static_cast<double>(d.step)) + 3) << "\" y=\""
      << T + 10 << "\" font-size=\"11\" fill=\"#d62728\">faulty step " << d.step << "</text>";
  h << "</svg>\n";
  // The replay's step x layer map.
  const double cw = 26, rh = 16, lw = 170;
  const double mw = lw + cw * std::max<std::size_t>(1, steps.size()) + 10, mh = 24 + rh * rows.size() + 10;
  h << "<h2>Replay: step &times; layer</h2>\n<svg id=\"layer-map\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << mw
    << "\" height=\"" << mh << "\" role=\"img\" aria-label=\"step by layer map\">";
  for (std::size_t j = 0; j < rows.size(); ++j)
    h << "<text x=\"4\" y=\"" << 24 + rh * j + 12 << "\" font-size=\"11\">" << esc(rows[j]) << "</text>";
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const double x = lw + cw * i;
    h << "<text x=\"" << x + 2 << "\" y=\"14\" font-size=\"10\">" << steps[i] << "</text>";
    if (steps[i] == d.step)
      h << "<rect id=\"faulty-step-column\" data-step=\"" << d.step << "\" x=\"" << x - 1 << "\" y=\"18\" width=\"" << cw
        << "\" height=\"" << rh * rows.size() + 8 << "\" fill=\"none\" stroke=\"#000\" stroke-width=\"2\"/>";
    for (std::size_t j = 0; j < rows.size() && j < cells[i].size(); ++j)
      h << "<rect class=\"" << (cells[i][j] ? "differ" : "match") << "\" data-step=\"" << steps[i] << "\" data-row=\""
        << esc(rows[j]) << "\" x=\"" << x + 2 << "\" y=\"" << 24 + rh * j << "\" width=\"" << cw - 4 << "\" height=\"" << rh - 3
        << "\"/>";
  }
  h << "</svg>\n<p>Green: the replay matches the record; red: it differs. Rows: the micro-shards' input, each layer "
       "(forward output or backward gradient), the gradient leaf and loss, the step's update.</p>\n";
  h << "<h2>Evidence</h2>\n<ol id=\"evidence\">";
  for (const auto& e : d.evidence) h << "<li>" << esc(e) << "</li>";
  h << "</ol>\n</body></html>\n";
  const auto path = fs::path(run_dir) / "diagnosis.html";
  std::ofstream out(path);
  out << h.str();
  if (!out) return Status::Error("cannot write '" + path.string() + "'");
  return Status::OK();
}

}  // namespace

int exit_code(const std::string& v) {
  if (v == "hardware-transient") return kExitHardwareTransient;
  if (v == "hardware-persistent") return kExitHardwarePersistent;
  if (v == "software-nondeterminism") return kExitSoftwareNondeterminism;
  if (v == "numerical-instability") return kExitNumericalInstability;
  if (v == "data") return kExitData;
  return kExitOk;
}

Status run(const Options& opt, const Comm& comm, Diagnosis* d) {
  const auto t0 = std::chrono::steady_clock::now();
  *d = Diagnosis();
  harness::TrainConfig cfg;
  CULPRIT_RETURN_IF_ERROR(agree(comm, harness::load_run_config(opt.run_dir, &cfg)));
  Record rec;
  CULPRIT_RETURN_IF_ERROR(agree(comm, load_record(opt.run_dir, &rec)));
  const int W = comm.size, M = cfg.micro_shards;
  if (opt.reruns < 1) return agree(comm, Status::Error("option '--reruns' must be at least 1"));
  // Where to start: the newest valid checkpoint before the first incident; without one, the oldest.
  const bool incident = rec.first.step > 0;
  // One step past the incident: a fault in the optimizer state shows in the parameters a step later.
  const std::int64_t end = incident ? std::min(rec.first.step + 1, rec.last_step) : rec.last_step;
  std::string ckpt_path;
  CULPRIT_RETURN_IF_ERROR(
      pick_checkpoint(comm, opt.run_dir, incident ? rec.first.step : end, /*newest=*/incident, &ckpt_path));
  const bool layer = rec.header.level == "layer";
  std::unique_ptr<harness::Engine> engine;
  // Rotated by one rank: run_step itself recomputes every micro-shard on the rank after the one that
  // recorded it (same world size), so a replayed step costs one step-time.
  CULPRIT_RETURN_IF_ERROR(harness::Engine::open(cfg, comm, ckpt_path, layer, &engine, /*rotate=*/1));
  d->startup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto layers = engine->layers(), params = engine->params();
  // The step x layer map of the report: rows input, layers (forward and backward), leaf, update.
  std::vector<std::string> map_rows{"input"};
  if (layer) map_rows.insert(map_rows.end(), layers.begin(), layers.end());
  map_rows.push_back("gradient leaf");
  map_rows.push_back("update");
  std::vector<std::int64_t> map_steps;
  std::vector<std::vector<int>> map_cells;
  auto note = [&](const std::string& s) {
    d->evidence.push_back(s);
    progress(comm, s);
  };
  note(std::string(incident ? "first incident: step " + std::to_string(rec.first.step) + " (" + rec.first.detector + ")"
                            : "no incident: searching the whole trace") +
       "; replaying from " + ckpt_path + " on " + std::to_string(W) + " rank(s)");

  State state = State::kFindStep;
  Evidence ev;
  Verdict verdict = Verdict::kNone;
  std::int64_t s = -1;
  int bad_shard = -1;          // the first differing micro-shard of the faulty step
  std::string update_diff;     // or the update's difference
  std::string update_param;    // and its first differing parameter
  int blamed = -1;             // the blamed rank
  std::string phase, where;    // --inject's phase and layer
  ShardResult reference;       // the faulty computation as recorded (kRerun compares with it)
  while (state != State::kDone) {
    ev = Evidence();
    if (state == State::kFindStep) {
      // Each step: every micro-shard recomputed on a rank other than the one that recorded it (a
      // persistent fault would otherwise reproduce itself), then the update as the run did it. The
      // rotated engine does both in one run_step; only where a different world size puts a
      // micro-shard back on its recording rank is it computed once more, on the next rank.
      while (engine->step() < end) {
        const std::int64_t t = engine->step() + 1;
        CULPRIT_RETURN_IF_ERROR(agree(comm, engine->mark()));
        int first_bad = M;
        // For the report's map: which rows (input, each layer, the leaf; the update below) differ.
        std::vector<int> rows(map_rows.size(), 0);
        auto compare = [&](const ShardResult& r, const trace::ShardRow& row) {
          const ShardResult want = harness::shard_result(row);
          if (!first_difference(r, want, layers, params).first.empty()) first_bad = std::min(first_bad, r.shard);
          rows[0] |= r.input_fp != want.input_fp;
          for (std::size_t i = 0; layer && i < layers.size() && i < r.fwd.size() && i < want.fwd.size(); ++i)
            rows[1 + i] |= r.fwd[i] != want.fwd[i] || r.bwd[i] != want.bwd[i];
          rows[map_rows.size() - 2] |= r.grad_fp != want.grad_fp || !same_float(r.loss, want.loss);
        };
        for (int k = 0; k < M; ++k) {
          auto it = rec.shards.find({t, k});
          if (it == rec.shards.end()) continue;
          const int rr = it->second.rank;
          if (harness::Engine::replay_rank(k, M, W, 1) != rr || (rr + 1) % W != comm.rank) continue;
          ShardResult r;
          CULPRIT_RETURN_IF_ERROR(engine->compute_shard(k, 0, &r));
          compare(r, it->second);
        }
        StepResult sr;
        CULPRIT_RETURN_IF_ERROR(engine->run_step(&sr));
        for (const auto& r : sr.shards) {
          auto it = rec.shards.find({t, r.shard});
          if (it != rec.shards.end() && it->second.rank != comm.rank) compare(r, it->second);
        }
        int fb = M;
        CULPRIT_MPI_CHECK(MPI_Allreduce(&first_bad, &fb, 1, MPI_INT, MPI_MIN, comm.comm));
        ++d->steps_replayed;
        // The update against every rank's record of it.
        std::string diff, diff_param;
        for (int r : rec.ranks) {
          auto it = rec.steps.find({r, t});
          if (it == rec.steps.end()) continue;
          if (it->second.grad_fp != sr.grad_fp && diff.empty()) diff = "reduced gradient";
          for (std::size_t i = 0; i < params.size() && i < it->second.param_fps.size(); ++i)
            if (it->second.param_fps[i] != sr.param_fps[i]) {
              if (diff.empty() || diff == "reduced gradient") {
                diff = (diff.empty() ? "" : "reduced gradient, ") + std::string("parameter ") + params[i] +
                       " of rank " + std::to_string(r);
                diff_param = params[i];
              }
              break;
            }
        }
        rows.back() = !diff.empty();
        CULPRIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, rows.data(), static_cast<int>(rows.size()), MPI_INT, MPI_MAX,
                                        comm.comm));
        // A rank's own replayed update can differ from the others' (a fault at rest reappearing
        // there): every rank takes the lowest differing rank's account, so all decide alike.
        if (rows.back()) {
          int from = diff.empty() ? W : comm.rank;
          CULPRIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &from, 1, MPI_INT, MPI_MIN, comm.comm));
          diff = broadcast_string(comm, diff, from);
          diff_param = broadcast_string(comm, diff_param, from);
        }
        map_steps.push_back(t);
        map_cells.push_back(rows);
        if (fb < M || !diff.empty()) {
          s = t;
          bad_shard = fb < M ? fb : -1;
          update_diff = diff;
          update_param = diff_param;
          ev.step_found = true;
          note("step " + std::to_string(t) + " does not reproduce: " +
               (fb < M ? "micro-shard " + std::to_string(fb) + " differs" : "its update differs (" + diff + ")"));
          CULPRIT_RETURN_IF_ERROR(agree(comm, engine->rewind()));
          break;
        }
      }
      if (!ev.step_found) {
        // Everything reproduced. A recorded NaN/Inf or spike that reproduced is the model's own.
        std::int64_t bad = -1;
        for (const auto& [key, row] : rec.steps)
          if (key.second <= end && !std::isfinite(row.loss) && (bad < 0 || key.second < bad)) bad = key.second;
        if (bad < 0 && incident && (rec.first.detector == "nonfinite" || rec.first.detector == "spike"))
          bad = rec.first.step;
        if (bad > 0) {
          ev.nonfinite_reproduced = true;
          s = bad;
          note("every replayed step reproduced the record bitwise, including the " +
               std::string(incident ? rec.first.detector : "nonfinite") + " at step " + std::to_string(bad));
        } else {
          note("every replayed step reproduced the record bitwise (" + std::to_string(d->steps_replayed) + " steps)" +
               (incident ? "; the " + rec.first.detector + " incident of step " + std::to_string(rec.first.step) +
                               " left no trace in the results"
                         : ""));
        }
      }
    } else if (state == State::kLocalize) {
      if (bad_shard >= 0) {
        // Every rank recomputes the differing micro-shard; the record and the replays are compared.
        const trace::ShardRow& row = rec.shards.at({s, bad_shard});
        ShardResult mine;
        CULPRIT_RETURN_IF_ERROR(agree(comm, engine->compute_shard(bad_shard, 0, &mine)));
        mine.rank = comm.rank;
        const auto all = allgather(comm, mine, layer ? layers.size() : 0, layer ? params.size() : 0);
        reference = harness::shard_result(row);
        // Group the replays.
        std::vector<int> group(W, -1);
        std::vector<std::vector<int>> groups;
        for (int r = 0; r < W; ++r) {
          for (std::size_t g = 0; g < groups.size() && group[r] < 0; ++g)
            if (same_result(all[groups[g][0]], all[r])) group[r] = static_cast<int>(g), groups[g].push_back(r);
          if (group[r] < 0) group[r] = static_cast<int>(groups.size()), groups.push_back({r});
        }
        std::size_t major = 0;
        for (std::size_t g = 1; g < groups.size(); ++g)
          if (groups[g].size() > groups[major].size()) major = g;
        const ShardResult& good = all[groups[major][0]];
        const int orig = row.rank;
        if (groups.size() == 1) {
          // Every replay agrees, and not with the record: the recording rank was wrong there.
          blamed = orig;
          note("micro-shard " + std::to_string(bad_shard) + ": every replay agrees with the others and not with the "
               "record of rank " + std::to_string(orig));
        } else if (W == 2 && groups.size() == 2 && orig < W && same_result(all[orig], reference) &&
                   !(incident && rec.first.step == s && rec.first.rank >= 0 && rec.first.rank < W)) {
          // Two ranks, each reproducing its own result: the recording rank its record, the other
          // something else. Either the recording rank is persistently faulty or the other one is;
          // two opinions cannot tell which (an online incident naming a rank would).
          ev.ambiguous_pair = true;
          const int other = 1 - orig;
          auto [ph, lay] = first_difference(all[orig], all[other], layers, params);
          phase = ph.empty() ? "grad" : ph;
          where = lay;
          ev.input_differs = phase == "data";
          note("micro-shard " + std::to_string(bad_shard) + ": rank " + std::to_string(orig) +
               " reproduces its record, rank " + std::to_string(other) + " computes it differently (" + phase +
               (where.empty() ? "" : " of " + where) + "): a persistent fault on one of ranks 0 and 1; bisect "
               "with 3 or more ranks to tell which");
        } else if (groups.size() == 2 && (groups[major].size() >= 2 || W == 2)) {
          // One rank is the odd one out (with two: the recording one, or the one an incident named).
          const auto& odd = groups[1 - major];
          const bool named = incident && rec.first.step == s && rec.first.rank >= 0 && rec.first.rank < W;
          const int x = W == 2 ? (named ? rec.first.rank : orig) : odd[0];
          const bool x_is_record = same_result(all[x], reference);
          if (odd.size() == 1 || W == 2) {
            blamed = x;
            if (!x_is_record) reference = all[x];
            note("micro-shard " + std::to_string(bad_shard) + ": rank " + std::to_string(x) +
                 (x_is_record ? " reproduces the record; the other ranks agree among themselves"
                              : "'s replay differs from the other ranks'"));
          } else {
            ev.healthy_disagree = true;
          }
        } else {
          ev.healthy_disagree = true;
          note("micro-shard " + std::to_string(bad_shard) + ": the replays on " + std::to_string(W) +
               " ranks fall into " + std::to_string(groups.size()) + " groups");
        }
        if (blamed >= 0) {
          ev.blamed = true;
          ev.rerunnable = true;
          auto [ph, lay] = first_difference(reference, good, layers, params);
          phase = ph.empty() ? "grad" : ph;
          where = lay;
          ev.input_differs = phase == "data";
        }
      } else {
        // The micro-shards reproduce; the update does not.
        int odd_rank = -1;
        std::string first_param;
        // Ranks whose recorded parameters after the step differ from the replayed update.
        // In the original layout: a faulty link is exercised as in the run (same world size).
        StepResult sr;
        CULPRIT_RETURN_IF_ERROR(agree(comm, engine->set_rotation(0)));
        CULPRIT_RETURN_IF_ERROR(agree(comm, engine->mark()));
        CULPRIT_RETURN_IF_ERROR(engine->run_step(&sr));
        // Every rank's replayed parameters: a fault at rest may reappear on its own rank, so the
        // healthy update is the one most ranks replayed (with a tie, the lowest rank's that no
        // incident at this step names). Every rank decides from the same data.
        const std::size_t np = sr.param_fps.size();
        std::vector<std::uint64_t> mine(sr.param_fps.begin(), sr.param_fps.end()), all(np * W);
        CULPRIT_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(np), MPI_UINT64_T, all.data(),
                                        static_cast<int>(np), MPI_UINT64_T, comm.comm));
        auto replay_of = [&](int r) { return all.begin() + static_cast<std::ptrdiff_t>(r * np); };
        auto same_replay = [&](int a, int b) { return std::equal(replay_of(a), replay_of(a) + np, replay_of(b)); };
        const int suspect = incident && rec.first.step >= s - 1 && rec.first.rank >= 0 ? rec.first.rank : -1;
        int good = -1, good_votes = 0;
        for (int r = 0; r < W; ++r) {
          int votes = 0;
          for (int q = 0; q < W; ++q) votes += same_replay(r, q);
          if (votes > good_votes || (votes == good_votes && good == suspect)) good = r, good_votes = votes;
        }
        const std::vector<std::uint64_t> healthy(replay_of(good), replay_of(good) + np);
        int odd_now = 0;
        for (int r = 0; r < W; ++r) odd_now |= !same_replay(r, good);
        // Ranks whose recorded parameters after the step differ from the healthy replayed update.
        std::vector<int> differ;
        for (int r : rec.ranks) {
          auto it = rec.steps.find({r, s});
          if (it == rec.steps.end()) continue;
          for (std::size_t i = 0; i < params.size() && i < it->second.param_fps.size() && i < np; ++i)
            if (it->second.param_fps[i] != healthy[i]) {
              differ.push_back(r);
              if (first_param.empty()) first_param = params[i];
              break;
            }
        }
        // A reduction fault: the replay's comm check sees a message change on its way (the link's fault
        // reappeared), or the reduced gradient differs from the record.
        const bool comm_now = !sr.comm_faults.empty();
        const bool reduced = comm_now || (rec.steps.count({rec.ranks[0], s}) &&
                                          rec.steps.at({rec.ranks[0], s}).grad_fp != sr.grad_fp);
        if (reduced) {
          // The replay's own comm check names a sender whose fault reappeared; otherwise the
          // online comm check's incident does.
          phase = "comm";
          odd_rank = comm_now ? sr.comm_faults[0].first
                     : rec.first.step == s && rec.first.detector == "comm" ? rec.first.rank : -1;
        } else if (differ.size() == 1) {
          const bool opt_state = incident && rec.first.message.find("(optimizer state)") != std::string::npos &&
                                 rec.first.rank == differ[0];
          phase = opt_state ? "optimizer" : "param";
          odd_rank = differ[0];
          if (opt_state && rec.first.step > 0) s = rec.first.step;
        } else if (incident && rec.first.rank >= 0) {
          odd_rank = rec.first.rank;
          phase = "param";
        }
        where = module_of(first_param.empty() ? update_param : first_param);
        if (reduced) odd_now = comm_now;
        ev.update_reproduced = odd_now != 0;
        d->reruns = 1;
        d->reproduced = odd_now;
        note("step " + std::to_string(s) + ": the micro-shards reproduce, the update does not (" + update_diff +
             "): phase " + phase + (odd_rank >= 0 ? ", rank " + std::to_string(odd_rank) : ""));
        blamed = odd_rank;
        ev.blamed = odd_rank >= 0;
        ev.healthy_disagree = odd_rank < 0 && !reduced;
        if (odd_rank >= 0) {
          for (const auto& [key, row] : rec.shards)
            if (row.rank == odd_rank) {
              d->host = row.host;
              d->device = row.device;
              break;
            }
        }
      }
    } else if (state == State::kRerun) {
      // The blamed rank recomputes the micro-shard again and again (intermittent faults draw anew).
      int reproduced = 0;
      if (blamed >= W)
        note("rank " + std::to_string(blamed) + " is not part of this bisection's " + std::to_string(W) +
             " ranks and cannot rerun; with at least " + std::to_string(blamed + 1) +
             " ranks the reruns tell persistent from transient");
      if (comm.rank == blamed) {
        for (int i = 1; i <= opt.reruns; ++i) {
          ShardResult r;
          CULPRIT_RETURN_IF_ERROR(engine->compute_shard(bad_shard, i, &r));
          if (same_result(r, reference)) ++reproduced;
        }
      }
      int total = 0;
      CULPRIT_MPI_CHECK(MPI_Allreduce(&reproduced, &total, 1, MPI_INT, MPI_SUM, comm.comm));
      ev.reproduced = total;
      d->reruns = blamed < W ? opt.reruns : 0;
      d->reproduced = total;
      if (blamed < W)
        note("rank " + std::to_string(blamed) + " recomputed micro-shard " + std::to_string(bad_shard) + " " +
             std::to_string(opt.reruns) + " times: the fault reproduced " + std::to_string(total) + " time(s)");
    }
    const Transition tr = next(state, ev);
    state = tr.next;
    verdict = tr.verdict;
  }
  d->verdict = verdict_name(verdict);
  if (d->host.empty() && blamed >= 0)
    for (const auto& [key, row] : rec.shards)
      if (row.rank == blamed) {
        d->host = row.host;
        d->device = row.device;
        break;
      }
  if (verdict != Verdict::kNone) d->step = s;
  if (verdict == Verdict::kHardwareTransient || verdict == Verdict::kHardwarePersistent || verdict == Verdict::kData) {
    d->rank = blamed;
    d->phase = phase;
    d->layer = where;
  } else if (verdict == Verdict::kSoftwareNondeterminism) {
    d->phase = phase;
    d->layer = where;
  }
  if (verdict == Verdict::kData) d->phase = "data";
  d->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Status st;
  if (comm.rank == 0) {
    st = write_diagnosis(opt.run_dir, *d);
    if (st.ok()) st = write_html(opt.run_dir, *d, rec, map_rows, map_steps, map_cells);
    std::printf("verdict: %s\n", d->verdict.c_str());
    if (d->step >= 0) std::printf("step:    %lld\n", static_cast<long long>(d->step));
    if (!d->phase.empty()) std::printf("phase:   %s\n", d->phase.c_str());
    if (!d->layer.empty()) std::printf("layer:   %s\n", d->layer.c_str());
    if (d->rank >= 0)
      std::printf("rank:    %d (host %s, device %s)\n", d->rank, d->host.c_str(), d->device.c_str());
    if (d->reruns) std::printf("reruns:  %d, the fault reproduced %d time(s)\n", d->reruns, d->reproduced);
    std::printf("replayed %lld step(s) in %.2f s; %s/diagnosis.json\n", static_cast<long long>(d->steps_replayed),
                d->seconds, opt.run_dir.c_str());
    std::fflush(stdout);
  }
  return agree(comm, st);
}

}  // namespace culprit::bisect
