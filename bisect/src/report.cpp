// The bisection's outputs: the diagnosis a verdict makes of the finding, RUN/diagnosis.html (one
// self-contained page: inline SVG, no scripts, no external files) and the summary rank 0 prints.
// RUN/diagnosis.json itself is records::write_diagnosis's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "actions.h"
#include "culprit/run_files.h"

namespace culprit::bisect {

namespace fs = std::filesystem;
using records::Diagnosis;

namespace {

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

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

void summary_table(std::ostringstream& h, const Diagnosis& d) {
  const std::string phase = d.phase ? name_of(*d.phase) : "";
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"verdict", name_of(d.verdict)}, {"step", d.step >= 0 ? std::to_string(d.step) : "-"},
      {"phase", phase.empty() ? "-" : phase}, {"layer", d.layer.empty() ? "-" : d.layer},
      {"rank", d.rank >= 0 ? std::to_string(d.rank) : "-"}, {"host", d.host.empty() ? "-" : d.host},
      {"device", d.device.empty() ? "-" : d.device},
      {"candidates", d.candidates.empty() ? "-" : "one of ranks " + rank_list(d.candidates) + " (nobody excluded)"},
      {"sample", d.sample >= 0 ? std::to_string(d.sample) : "-"},
      {"reruns", std::to_string(d.reproduced) + " of " + std::to_string(d.reruns) + " differ from the healthy result"},
      {"replayed", std::to_string(d.steps_replayed) + " step(s) in " + num(d.seconds) + " s"}};
  h << "<h1>culprit diagnosis</h1>\n<table id=\"summary\">";
  for (const auto& [k, v] : fields) h << "<tr><th>" << k << "</th><td id=\"" << k << "\">" << esc(v) << "</td></tr>";
  h << "</table>\n";
}

// Loss per rank: the mean loss of the micro-shards each rank recorded, per step. The legend sits
// in its own band under the axis labels, so it overlaps nothing however many ranks there are.
void loss_plot(std::ostringstream& h, const Diagnosis& d, const trace::RunTrace& rec) {
  std::map<int, std::map<std::int64_t, std::pair<double, int>>> per_rank;
  for (const auto& [key, row] : rec.shards) {
    auto& acc = per_rank[row.rank][row.step];
    if (std::isfinite(row.loss)) acc.first += row.loss, acc.second += 1;
  }
  double lo = 1e300, hi = -1e300;
  const std::int64_t s0 = 1, s1 = std::max<std::int64_t>(2, rec.last_step);
  for (const auto& [r, series] : per_rank)
    for (const auto& [st, acc] : series)
      if (acc.second) lo = std::min(lo, acc.first / acc.second), hi = std::max(hi, acc.first / acc.second);
  if (!(hi > lo)) lo = 0, hi = std::max(1.0, hi);
  const int per_row = 8, legend_rows = static_cast<int>((per_rank.size() + per_row - 1) / per_row);
  const double Wd = 720, Hp = 240, L = 50, R = 20, T = 20, B = 30, Ht = Hp + 16.0 * legend_rows + 6;
  auto X = [&](double st) { return L + (st - s0) / static_cast<double>(s1 - s0) * (Wd - L - R); };
  auto Y = [&](double v) { return T + (hi - v) / (hi - lo) * (Hp - T - B); };
  static const char* colors[] = {"#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  h << "<h2>Loss per rank</h2>\n<svg id=\"loss-plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << Wd
    << "\" height=\"" << Ht << "\" role=\"img\" aria-label=\"loss per rank\">";
  h << "<line x1=\"" << L << "\" y1=\"" << Hp - B << "\" x2=\"" << Wd - R << "\" y2=\"" << Hp - B << "\" stroke=\"#000\"/>";
  h << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << Hp - B << "\" stroke=\"#000\"/>";
  h << "<text x=\"" << L << "\" y=\"" << Hp - 12 << "\" font-size=\"11\">step " << s0 << "</text><text x=\"" << Wd - R
    << "\" y=\"" << Hp - 12 << "\" font-size=\"11\" text-anchor=\"end\">step " << s1 << "</text>";
  h << "<text x=\"" << L - 4 << "\" y=\"" << T + 4 << "\" font-size=\"11\" text-anchor=\"end\">" << num(hi)
    << "</text><text x=\"" << L - 4 << "\" y=\"" << Hp - B << "\" font-size=\"11\" text-anchor=\"end\">" << num(lo)
    << "</text>";
  int ci = 0;
  for (const auto& [r, series] : per_rank) {
    std::string pts;
    for (const auto& [st, acc] : series)
      if (acc.second) pts += num(X(static_cast<double>(st))) + "," + num(Y(acc.first / acc.second)) + " ";
    const char* c = colors[ci % 8];
    const double lx = L + 80.0 * (ci % per_row), ly = Hp + 16.0 * (ci / per_row) + 4;
    h << "<polyline class=\"rank\" data-rank=\"" << r << "\" fill=\"none\" stroke=\"" << c << "\" points=\"" << pts
      << "\"/><g class=\"legend\"><rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"10\" height=\"10\" fill=\"" << c
      << "\"/><text x=\"" << lx + 14 << "\" y=\"" << ly + 9 << "\" font-size=\"11\">rank " << r << "</text></g>";
    ++ci;
  }
  if (d.step > 0) {
    const double x = X(static_cast<double>(d.step));
    const bool right = x > Wd / 2;  // the label reads away from the edge
    h << "<line id=\"faulty-step-marker\" data-step=\"" << d.step << "\" x1=\"" << num(x) << "\" y1=\"" << T
      << "\" x2=\"" << num(x) << "\" y2=\"" << Hp - B << "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/><text x=\""
      << num(right ? x - 3 : x + 3) << "\" y=\"" << T + 10 << "\" font-size=\"11\" fill=\"#d62728\" text-anchor=\""
      << (right ? "end" : "start") << "\">faulty step " << d.step << "</text>";
  }
  h << "</svg>\n";
}

// The replay's step x layer map, rows in execution order.
void layer_map(std::ostringstream& h, const Diagnosis& d, const LayerMap& map) {
  const auto& rows = map.rows;
  const auto& steps = map.steps;
  const auto& cells = map.cells;
  const double cw = 26, rh = 16, lw = 200;
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
  h << "</svg>\n<p>Green: the replay matches the record; red: it differs. Rows top to bottom as executed: the "
       "micro-shards' input, each layer's forward output, each layer's backward gradient (last layer first), the "
       "gradient leaf and loss, the step's update; the first red cell of a column is where the fault entered.</p>\n";
}

// What was examined and what not (the verdict speaks for the former only), replay faults, evidence.
void coverage_and_evidence(std::ostringstream& h, const Diagnosis& d) {
  h << "<h2>Coverage</h2>\n<table id=\"coverage\"><tr><th>steps</th><th>examined</th><th>why not</th></tr>";
  for (const auto& r : d.coverage.examined)
    h << "<tr class=\"examined\"><td>" << r.from << "&ndash;" << r.to << "</td><td>yes</td><td></td></tr>";
  for (const auto& r : d.coverage.not_examined)
    h << "<tr class=\"not-examined\"><td>" << r.from << "&ndash;" << r.to << "</td><td>no</td><td>" << esc(r.reason)
      << "</td></tr>";
  h << "</table>\n";
  if (!d.replay_faults.empty()) {
    h << "<h2>Faults during the bisection's own replay</h2>\n<ul id=\"replay-faults\">";
    for (const auto& f : d.replay_faults)
      h << "<li>step " << f.step << ", rank " << f.rank << " (host " << esc(f.host) << "): " << esc(f.what) << "</li>";
    h << "</ul>\n";
  }
  h << "<h2>Evidence</h2>\n<ol id=\"evidence\">";
  for (const auto& e : d.evidence) h << "<li>" << esc(e) << "</li>";
  h << "</ol>\n";
}

// RUN/diagnosis.html: one self-contained page (inline SVG, no scripts, no external files): the
// verdict, the loss each rank recorded per step with the faulty step marked, the step x layer map
// of the replay (match / differ), the coverage and the evidence.
Status write_page(const std::string& run_dir, const Diagnosis& d, const trace::RunTrace& rec, const LayerMap& map) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>culprit diagnosis: "
    << esc(name_of(d.verdict))
    << "</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:72em}table{border-collapse:collapse}"
       "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}.differ{fill:#d62728}.match{fill:#2ca02c}"
       "svg{border:1px solid #ddd;margin:.5em 0}</style></head><body>\n";
  summary_table(h, d);
  loss_plot(h, d, rec);
  layer_map(h, d, map);
  coverage_and_evidence(h, d);
  h << "</body></html>\n";
  const auto path = fs::path(run_dir) / "diagnosis.html";
  return files::write_atomic(path.string(), h.str());
}

}  // namespace

namespace {

// The older checkpoints that were there but damaged: ": checkpoint ... is damaged (why)" for each.
std::string damage_of_older(const Context& ctx) {
  std::string out;
  for (const auto& why : ctx.damaged_before) out += (out.empty() ? ": " : "; ") + why;
  return out;
}

}  // namespace

records::Coverage coverage(const Context& ctx, std::int64_t found) {
  records::Coverage c;
  // The run's steps, from its first: a trace whose older rows were retired covers only its tail.
  c.first_step = std::min<std::int64_t>(1, ctx.run.trace.first_step);
  c.last_step = ctx.run.trace.last_step;
  auto ex = ctx.examined;
  std::sort(ex.begin(), ex.end(), [](const auto& a, const auto& b) { return a.from < b.from; });
  for (const auto& r : ex) {
    if (!c.examined.empty() && c.examined.back().to + 1 >= r.from) c.examined.back().to = std::max(c.examined.back().to, r.to);
    else c.examined.push_back(r);
  }
  // The gaps, each with its reason.
  auto why = [&](std::int64_t from) -> std::string {
    if (!recorded(ctx, from))
      return ctx.run.cfg.trace_keep > 0 && from < ctx.run.trace.first_step
                 ? "no trace rows: retired by --trace-keep " + std::to_string(ctx.run.cfg.trace_keep) +
                       " (the trace keeps the newest steps until the run has an incident)"
                 : "no whole trace record of these steps (retired by --trace-keep, or not traced then)";
    if (found >= 0 && from > found) return "after the faulty step " + std::to_string(found) + ": the search stops at the first";
    if (ctx.stopped_at >= 0 && from >= ctx.stopped_at) return "the bisection's own replays of step " + std::to_string(ctx.stopped_at) + " kept disagreeing";
    if (ctx.oldest >= 0 && from <= ctx.oldest)
      return ctx.reached_oldest ? "no valid checkpoint before step " + std::to_string(ctx.oldest + 1) + " to replay from" +
                                      damage_of_older(ctx)
                                : "before the checkpoint the search started from (step " + std::to_string(ctx.oldest) +
                                      "): not searched, the fault was found after it";
    return "not replayed";
  };
  // A gap is cut where the trace's record of its steps starts or stops: each part has its reason.
  auto gap = [&](std::int64_t from, std::int64_t to) {
    bool rec = recorded(ctx, from);
    for (std::int64_t t = from + 1; t <= to; ++t) {
      if (recorded(ctx, t) == rec) continue;
      c.not_examined.push_back({from, t - 1, why(from)});
      from = t;
      rec = !rec;
    }
    c.not_examined.push_back({from, to, why(from)});
  };
  std::int64_t next = c.first_step;
  for (const auto& r : c.examined) {
    if (r.from > next) gap(next, r.from - 1);
    next = std::max(next, r.to + 1);
  }
  if (next <= c.last_step) gap(next, c.last_step);
  // Steps after the faulty one are not needed for the verdict; they stay listed, but only the others
  // make a search without a finding inconclusive.
  return c;
}

void conclude(const Context& ctx, const Finding& f, Verdict v, Diagnosis* d) {
  d->verdict = v;
  const bool found = v != Verdict::kNone && v != Verdict::kInconclusive;
  d->coverage = coverage(ctx, found ? f.step : -1);
  d->candidates = f.candidates;
  if (v == Verdict::kData) {
    d->sample = f.sample;
    d->sample_file = f.sample_file;
    d->sample_offset = f.sample_offset;
  }
  if (found) d->step = f.step;
  if (is_hardware(v) || v == Verdict::kData) {
    d->rank = f.blamed;
    d->phase = f.phase;
    d->layer = f.layer;
  } else if (v == Verdict::kSoftwareNondeterminism) {
    d->phase = f.phase;
    d->layer = f.layer;
  }
  if (v == Verdict::kData) d->phase = Phase::kData;
  if (f.blamed >= 0) ctx.placement(f.blamed, &d->host, &d->device);
}

Status write_html(const Context& ctx, const Diagnosis& d) {
  return write_page(ctx.opt.run_dir, d, ctx.run.trace, ctx.map);
}

void print_summary(const Diagnosis& d, const std::string& run_dir) {
  std::printf("verdict: %s\n", name_of(d.verdict));
  if (d.step >= 0) std::printf("step:    %lld\n", static_cast<long long>(d.step));
  if (d.phase) std::printf("phase:   %s\n", name_of(*d.phase));
  if (!d.layer.empty()) std::printf("layer:   %s\n", d.layer.c_str());
  if (d.sample >= 0) std::printf("sample:  %lld\n", static_cast<long long>(d.sample));
  if (!d.sample_file.empty())
    std::printf("stored:  file '%s' offset %lld\n", d.sample_file.c_str(), static_cast<long long>(d.sample_offset));
  if (d.rank >= 0) std::printf("rank:    %d (host %s, device %s)\n", d.rank, d.host.c_str(), d.device.c_str());
  if (!d.candidates.empty()) {
    std::string c;
    for (int r : d.candidates) c += (c.empty() ? "" : ", ") + std::to_string(r);
    std::printf("one of:  ranks %s (nobody is excluded)\n", c.c_str());
  }
  if (d.reruns) std::printf("reruns:  %d, %d differ from the healthy result\n", d.reruns, d.reproduced);
  for (const auto& f : d.replay_faults)
    std::printf("replay fault: rank %d (host %s) at step %lld: %s\n", f.rank, f.host.c_str(),
                static_cast<long long>(f.step), f.what.c_str());
  for (const auto& r : d.coverage.examined)
    std::printf("examined:     steps %lld..%lld\n", static_cast<long long>(r.from), static_cast<long long>(r.to));
  for (const auto& r : d.coverage.not_examined)
    std::printf("not examined: steps %lld..%lld (%s)\n", static_cast<long long>(r.from), static_cast<long long>(r.to),
                r.reason.c_str());
  std::printf("replayed %lld step(s) in %.2f s; %s\n", static_cast<long long>(d.steps_replayed), d.seconds,
              records::diagnosis_path(run_dir).c_str());
  std::fflush(stdout);
}

}  // namespace culprit::bisect
