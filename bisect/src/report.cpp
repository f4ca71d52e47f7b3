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
      {"rank", d.rank >= 0 ? std::to_string(d.rank) : "-"}, {"shard", d.shard >= 0 ? std::to_string(d.shard) : "-"},
      {"host", d.host.empty() ? "-" : d.host},
      {"device", d.device.empty() ? "-" : d.device},
      {"candidates", d.candidates.empty() ? "-" : "one of ranks " + rank_list(d.candidates) + " (nobody excluded)"},
      {"sample", d.sample >= 0 ? std::to_string(d.sample) : "-"},
      {"reruns", std::to_string(d.reproduced) + " of " + std::to_string(d.reruns) + " differ from the healthy result"},
      {"replayed", std::to_string(d.steps_replayed) + " step(s) in " + num(d.seconds) + " s"}};
  h << "<h1>culprit diagnosis</h1>\n<table id=\"summary\">";
  for (const auto& [k, v] : fields) h << "<tr><th>" << k << "</th><td id=\"" << k << "\">" << esc(v) << "</td></tr>";
  h << "</table>\n";
}

// Text width at font-size 11: monospace advances are 0.6 em (DejaVu Sans Mono 0.602: 6.62 px), so
// a label column sized from its longest name holds it exactly; proportional text is estimated wider.
constexpr double kMonoChar = 6.7, kSansChar = 6.5;

// "1", "2", "5" x 10^k: the smallest such step that gives at most `most` intervals over `span`.
std::int64_t tick_step(std::int64_t span, int most) {
  for (std::int64_t p = 1;; p *= 10)
    for (std::int64_t m : {1, 2, 5})
      if (span <= m * p * most) return m * p;
}

std::string float_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);  // a float32 value, exactly
  return buf;
}

// The loss per step: the step's loss as culprit printed it (metrics.jsonl and the per-step line:
// the lowest rank's trace row, the sum over every micro-shard of its loss, each micro-shard's loss
// its share of the batch mean), and each rank's share of it (the sum of its own micro-shards'
// losses): the shares add up to the step's loss, and a rank whose share alone jumps stands out. Each
// printed value is a point with its step and value (data-step, data-loss). The legend flows in its
// own band under the axis, so it overlaps nothing however many ranks there are.
void loss_plot(std::ostringstream& h, const Diagnosis& d, const trace::RunTrace& rec) {
  std::map<std::int64_t, double> printed;
  for (const auto& [key, row] : rec.steps)
    if (!printed.count(key.second))
      if (const trace::StepRow* r = rec.step(key.second)) printed[key.second] = r->loss;
  std::map<int, std::map<std::int64_t, std::pair<double, int>>> share;
  for (const auto& [key, row] : rec.shards) {
    auto& acc = share[row.rank][row.step];
    if (std::isfinite(row.loss)) acc.first += row.loss, acc.second += 1;
  }
  double lo = 1e300, hi = -1e300;
  for (const auto& [st, v] : printed)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  for (const auto& [r, series] : share)
    for (const auto& [st, acc] : series)
      if (acc.second) lo = std::min(lo, acc.first), hi = std::max(hi, acc.first);
  if (!(hi > lo)) {  // one value (or none): a unit band around it
    const double mid = hi > -1e300 ? hi : 0.5;
    lo = mid - 0.5;
    hi = mid + 0.5;
  }
  const std::int64_t s0 = 1, s1 = std::max<std::int64_t>(2, rec.last_step);
  static const char* colors[] = {"#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  const double Wd = 760, Hp = 260, L = 64, R = 20, T = 20, B = 44;
  // The legend: "step loss" first, then each rank's share, placed left to right and wrapped.
  struct Item { std::string label, color; bool total; int rank; double x, y; };
  std::vector<Item> items = {{"step loss (as printed)", "#000", true, -1, 0, 0}};
  int ci = 0;
  for (const auto& [r, series] : share) items.push_back({"rank " + std::to_string(r) + "'s share", colors[ci++ % 8], false, r, 0, 0});
  double lx = L, ly = Hp + 4;
  for (auto& it : items) {
    const double w = 14 + kSansChar * it.label.size() + 16;
    if (lx > L && lx + w > Wd - R) lx = L, ly += 16;
    it.x = lx, it.y = ly;
    lx += w;
  }
  const double Ht = ly + 16 + 6;
  auto X = [&](double st) { return L + (st - s0) / static_cast<double>(s1 - s0) * (Wd - L - R); };
  auto Y = [&](double v) { return T + (hi - v) / (hi - lo) * (Hp - T - B); };
  h << "<h2>Loss per step</h2>\n<svg id=\"loss-plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << Wd
    << "\" height=\"" << Ht << "\" role=\"img\" aria-label=\"loss per step\">";
  h << "<line x1=\"" << L << "\" y1=\"" << Hp - B << "\" x2=\"" << Wd - R << "\" y2=\"" << Hp - B << "\" stroke=\"#000\"/>";
  h << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << Hp - B << "\" stroke=\"#000\"/>";
  // x: integer steps, 1-2-5 spaced, at most 10 intervals, the first and last step always labelled.
  const std::int64_t every = tick_step(s1 - s0, 10), gap = std::max<std::int64_t>(1, every / 2);
  std::vector<std::int64_t> ticks = {s0};
  for (std::int64_t t = (s0 / every + 1) * every; t < s1; t += every)
    if (t - ticks.back() >= gap) ticks.push_back(t);
  if (s1 - ticks.back() < gap && ticks.size() > 1) ticks.pop_back();
  ticks.push_back(s1);
  for (std::int64_t t : ticks)
    h << "<g class=\"x-tick\" data-step=\"" << t << "\"><line x1=\"" << num(X(t)) << "\" y1=\"" << Hp - B << "\" x2=\""
      << num(X(t)) << "\" y2=\"" << Hp - B + 4 << "\" stroke=\"#000\"/><text x=\"" << num(X(t)) << "\" y=\"" << Hp - B + 16
      << "\" font-size=\"11\" text-anchor=\"middle\">" << t << "</text></g>";
  h << "<text x=\"" << (L + Wd - R) / 2 << "\" y=\"" << Hp - B + 32 << "\" font-size=\"11\" text-anchor=\"middle\">step</text>";
  // y: five values, with faint grid lines.
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4.0, y = Y(v);
    h << "<line x1=\"" << L << "\" y1=\"" << num(y) << "\" x2=\"" << Wd - R << "\" y2=\"" << num(y)
      << "\" stroke=\"#eee\"/><text x=\"" << L - 4 << "\" y=\"" << num(y + 4) << "\" font-size=\"11\" text-anchor=\"end\">"
      << num(v) << "</text>";
  }
  for (const auto& it : items) {
    std::string pts, marks;
    if (it.total) {
      // A dot per step while they stay apart; past that the points keep their data, undrawn.
      const char* radius = printed.size() <= 100 ? "2.5" : "0";
      for (const auto& [st, v] : printed) {
        if (!std::isfinite(v)) continue;
        const std::string px = num(X(static_cast<double>(st))), py = num(Y(v));
        pts += px + "," + py + " ";
        marks += "<circle class=\"step-loss\" data-step=\"" + std::to_string(st) + "\" data-loss=\"" + float_text(v) +
                 "\" cx=\"" + px + "\" cy=\"" + py + "\" r=\"" + radius + "\" fill=\"#000\"><title>step " + std::to_string(st) +
                 ": loss " + float_text(v) + "</title></circle>";
      }
      h << "<polyline id=\"step-loss\" fill=\"none\" stroke=\"#000\" stroke-width=\"2\" points=\"" << pts
        << "\"><title>the step's loss as culprit printed it</title></polyline>" << marks;
    } else {
      for (const auto& [st, acc] : share.at(it.rank))
        if (acc.second) pts += num(X(static_cast<double>(st))) + "," + num(Y(acc.first)) + " ";
      h << "<polyline class=\"rank\" data-rank=\"" << it.rank << "\" fill=\"none\" stroke=\"" << it.color
        << "\" stroke-dasharray=\"5 2\" points=\"" << pts << "\"><title>rank " << it.rank
        << "'s share (sum of its micro-shards' losses)</title></polyline>";
    }
    h << "<g class=\"legend\"><rect x=\"" << num(it.x) << "\" y=\"" << num(it.y) << "\" width=\"10\" height=\"10\" fill=\""
      << it.color << "\"/><text x=\"" << num(it.x + 14) << "\" y=\"" << num(it.y + 9) << "\" font-size=\"11\">"
      << esc(it.label) << "</text></g>";
  }
  if (d.step > 0) {
    const double x = X(static_cast<double>(d.step));
    const bool right = x > Wd / 2;  // the label reads away from the edge
    h << "<line id=\"faulty-step-marker\" data-step=\"" << d.step << "\" x1=\"" << num(x) << "\" y1=\"" << T
      << "\" x2=\"" << num(x) << "\" y2=\"" << Hp - B << "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/><text x=\""
      << num(right ? x - 3 : x + 3) << "\" y=\"" << T + 10 << "\" font-size=\"11\" fill=\"#d62728\" text-anchor=\""
      << (right ? "end" : "start") << "\">faulty step " << d.step << "</text>";
  }
  h << "</svg>\n<p>Black: each step's loss as culprit printed it (the per-step line, metrics.jsonl): the sum of every "
       "micro-shard's loss, each micro-shard's loss being its share of the batch mean. Dashed: each rank's share of "
       "it, the sum of the losses of the micro-shards that rank computed; the shares add up to the step's loss.</p>\n";
}

// The replay's step x layer map, rows in execution order. The label column is as wide as the longest
// row name (monospace: exact); step labels that would not fit a column's width stand upright.
void layer_map(std::ostringstream& h, const Diagnosis& d, const LayerMap& map) {
  const auto& rows = map.rows;
  const auto& steps = map.steps;
  const auto& cells = map.cells;
  std::size_t longest = 0, widest_step = 1;
  for (const auto& r : rows) longest = std::max(longest, r.size());
  for (auto s : steps) widest_step = std::max(widest_step, std::to_string(s).size());
  const double cw = 26, rh = 16, lw = 4 + kMonoChar * static_cast<double>(longest) + 12;
  const bool upright = kMonoChar * static_cast<double>(widest_step) > cw - 4;
  const double top = upright ? 10 + kMonoChar * static_cast<double>(widest_step) : 24;
  const double mw = lw + cw * std::max<std::size_t>(1, steps.size()) + 10, mh = top + rh * rows.size() + 10;
  h << "<h2>Replay: step &times; layer</h2>\n<svg id=\"layer-map\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << mw
    << "\" height=\"" << mh << "\" data-label-width=\"" << lw << "\" role=\"img\" aria-label=\"step by layer map\">";
  for (std::size_t j = 0; j < rows.size(); ++j)
    h << "<text class=\"row-label\" x=\"4\" y=\"" << top + rh * j + 12 << "\" font-size=\"11\" font-family=\"monospace\">"
      << esc(rows[j]) << "</text>";
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const double x = lw + cw * i;
    if (upright)
      h << "<text class=\"step-label\" x=\"" << x + cw / 2 + 4 << "\" y=\"" << top - 6 << "\" font-size=\"11\" "
        << "font-family=\"monospace\" transform=\"rotate(-90 " << x + cw / 2 + 4 << " " << top - 6 << ")\">" << steps[i]
        << "</text>";
    else
      h << "<text class=\"step-label\" x=\"" << x + cw / 2 << "\" y=\"14\" font-size=\"11\" font-family=\"monospace\" "
        << "text-anchor=\"middle\">" << steps[i] << "</text>";
    if (steps[i] == d.step)
      h << "<rect id=\"faulty-step-column\" data-step=\"" << d.step << "\" x=\"" << x - 1 << "\" y=\"" << top - 6
        << "\" width=\"" << cw << "\" height=\"" << rh * rows.size() + 8 << "\" fill=\"none\" stroke=\"#000\" stroke-width=\"2\"/>";
    for (std::size_t j = 0; j < rows.size() && j < cells[i].size(); ++j)
      h << "<rect class=\"" << (cells[i][j] ? "differ" : "match") << "\" data-step=\"" << steps[i] << "\" data-row=\""
        << esc(rows[j]) << "\" x=\"" << x + 2 << "\" y=\"" << top + rh * j << "\" width=\"" << cw - 4 << "\" height=\"" << rh - 3
        << "\"/>";
  }
  h << "</svg>\n<p>Green: the replay matches the record; red: it differs. Rows top to bottom as executed: the "
       "micro-shards' input, each layer's forward output, each layer's backward gradient (last layer first), the "
       "gradient leaf and loss, the step's update; the first red cell of a column is where the fault entered.</p>\n";
}

// The replay's faults, each once: a fault that fired on every replay of its step is one line, with
// how often it was seen.
std::vector<std::pair<const records::ReplayFault*, int>> distinct_faults(const Diagnosis& d) {
  std::vector<std::pair<const records::ReplayFault*, int>> out;
  for (const auto& f : d.replay_faults) {
    auto same = std::find_if(out.begin(), out.end(), [&](const auto& o) {
      return o.first->step == f.step && o.first->rank == f.rank && o.first->host == f.host && o.first->what == f.what;
    });
    if (same != out.end()) ++same->second;
    else out.push_back({&f, 1});
  }
  return out;
}

std::string times(int n) { return n > 1 ? " (" + std::to_string(n) + " times)" : ""; }

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
    for (const auto& [f, n] : distinct_faults(d))
      h << "<li>step " << f->step << ", rank " << f->rank << " (host " << esc(f->host) << "): " << esc(f->what) << times(n)
        << "</li>";
    h << "</ul>\n";
  }
  h << "<h2>Evidence</h2>\n<ol id=\"evidence\">";
  for (const auto& e : d.evidence) h << "<li>" << esc(e) << "</li>";
  h << "</ol>\n";
}

// RUN/diagnosis.html: one self-contained page (inline SVG, no scripts, no external files): the
// verdict, the loss per step as printed and each rank's share of it with the faulty step marked, the step x layer map
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
  if (f.blamed >= 0) ctx.placement(f.blamed, f.step, &d->host, &d->device);
  const int T = f.step >= 0 ? ctx.tensor_parallel_at(f.step) : 1;
  if (T > 1 && d->rank >= 0) d->shard = d->rank % T;
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
  if (d.shard >= 0) std::printf("shard:   %d (the rank's tensor-parallel coordinate)\n", d.shard);
  if (!d.candidates.empty()) {
    std::string c;
    for (int r : d.candidates) c += (c.empty() ? "" : ", ") + std::to_string(r);
    std::printf("one of:  ranks %s (nobody is excluded)\n", c.c_str());
  }
  if (d.reruns) std::printf("reruns:  %d, %d differ from the healthy result\n", d.reruns, d.reproduced);
  for (const auto& [f, n] : distinct_faults(d))
    std::printf("replay fault: rank %d (host %s) at step %lld: %s%s\n", f->rank, f->host.c_str(),
                static_cast<long long>(f->step), f->what.c_str(), times(n).c_str());
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
