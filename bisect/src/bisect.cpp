// culprit bisect: open the run, then a short loop over the transition function (machine.h), each
// state's action (actions.h) filling the Finding; the verdict becomes RUN/diagnosis.json and
// RUN/diagnosis.html.
#include "culprit/bisect.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "actions.h"
#include "culprit/run_files.h"

namespace culprit::bisect {

void Context::note(const std::string& line) {
  d->evidence.push_back(line);
  if (comm.rank != 0) return;
  std::fprintf(stderr, "culprit bisect: %s\n", line.c_str());
  std::fflush(stderr);
}

void Context::replay_fault(std::int64_t s, int r, const std::string& what) {
  records::ReplayFault f;
  f.step = s;
  f.rank = r;
  f.what = what;
  // This bisection's rank r computed it, on this bisection's host; the recorded row's device only
  // when that is the same host (the device name of a rank here is not otherwise known).
  placement(r, s, &f.host, &f.device);
  if (r >= 0 && r < static_cast<int>(hosts_now.size()) && f.host != hosts_now[r]) {
    f.host = hosts_now[r];
    f.device.clear();
  }
  d->replay_faults.push_back(f);
}

void Context::redo(std::int64_t s) {
  ++redone[s];
  round += opt.reruns + 1;  // the redone step draws anew, apart from the reruns' draws
}

void Context::note_outside(int r) {
  note("rank " + std::to_string(r) + " is not part of this bisection's " + std::to_string(W) +
       " ranks: its device was not rerun, so transient and persistent cannot be told apart (bisect with at least " +
       std::to_string(r + 1) + " ranks to rerun it)");
}

bool Context::incident_names(std::int64_t s) const {
  return first && first->step == s && first->rank >= 0 && first->rank < W;
}

int Context::tensor_parallel_at(std::int64_t s) const {
  if (!run.cfg.chunked()) return 1;
  int ranks = 0, world = 0;
  for (int r : run.trace.ranks) {
    auto it = run.trace.steps.find({r, s});
    if (it == run.trace.steps.end()) continue;
    ++ranks;
    world = it->second.world;
  }
  return world > 0 && ranks % world == 0 ? std::max(1, ranks / world) : 1;
}

void Context::placement(int r, std::int64_t s, std::string* host, std::string* device) const {
  // Rank r's host at step s: a run resumed on other nodes (a node excluded, a smaller world) gives
  // its ranks other hosts from the resumed step on, so the rows of that step say where r ran, not
  // the run's first rows (which would name a node r left behind: a healthy one excluded). Rows are
  // ordered by step: the last one of rank r at or before s, else its first after.
  const trace::ShardRow* at = nullptr;
  for (const auto& [key, merged] : run.trace.shards) {
    // A tensor-parallel micro-shard: every rank of its group recorded it (ShardRow::group).
    const trace::ShardRow* row = merged.rank == r ? &merged : nullptr;
    for (const auto& m : merged.group)
      if (m.rank == r) row = &m;
    if (!row) continue;
    if (key.first > s && at) break;
    at = row;
    if (key.first >= s) break;
  }
  if (!at) return;
  *host = at->host;
  *device = at->device;
}

// Context::hosts_now: every rank's host name, through the watchdog.
Status gather_hosts_now(Context* ctx) {
  constexpr int kLen = 256;
  const Comm& comm = ctx->comm;
  std::vector<char> mine(kLen, 0), all(static_cast<std::size_t>(kLen) * comm.size, 0);
  std::snprintf(mine.data(), kLen, "%s", comm.host.c_str());
  CULPRIT_COLLECTIVE(comm, "the bisection",
                     MPI_Iallgather(mine.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm.comm, &_culprit_req));
  for (int r = 0; r < comm.size; ++r) ctx->hosts_now.emplace_back(all.data() + static_cast<std::size_t>(r) * kLen);
  return Status::OK();
}

// The engine from a checkpoint after which every step has a record when there is one (a
// --trace-keep run has retired older rows: replaying them would examine nothing), else from any.
Status open_from(Context* ctx, std::int64_t before, ckpt::Pick pick, std::string* path) {
  const std::int64_t from = replay::first_replayable(ctx->run.trace);
  Status st = replay::open_engine_before(ctx->run, ctx->comm, before, pick, ctx->layer, /*rotate=*/1, &ctx->engine,
                                         path, from);
  if (st.ok() || from == 0 || st.code() != StatusCode::kBadInput) return st;  // bad input: no candidate
  return replay::open_engine_before(ctx->run, ctx->comm, before, pick, ctx->layer, 1, &ctx->engine, path);
}

// After a finding whose device fires again: the engine from the oldest valid checkpoint of the
// steps [ctx->start - back, ctx->start), as the search's part 1 (find_step replays up to where
// part 0 started). *none: no such checkpoint, nothing to search.
Status open_earlier(Context* ctx, std::int64_t back, bool* none) {
  *none = true;
  const std::int64_t lo = std::max<std::int64_t>({0, ctx->start - back, replay::first_replayable(ctx->run.trace)});
  int any = 0;  // rank 0's listing of the shared run directory decides, for every rank
  if (ctx->comm.rank == 0)
    for (const auto& [step, path] : ckpt::list(ctx->opt.run_dir)) any = any || (step >= lo && step < ctx->start);
  CULPRIT_COLLECTIVE(ctx->comm, "the bisection", MPI_Ibcast(&any, 1, MPI_INT, 0, ctx->comm.comm, &_culprit_req));
  if (!any) return Status::OK();
  const Status st = replay::open_engine_before(ctx->run, ctx->comm, ctx->start, ckpt::Pick::kOldest, ctx->layer,
                                               /*rotate=*/1, &ctx->engine, &ctx->checkpoint, lo);
  if (st.code() == StatusCode::kBadInput || st.code() == StatusCode::kDamaged) return Status::OK();
  CULPRIT_RETURN_IF_ERROR(st);
  *none = ctx->engine->step() >= ctx->start;
  if (*none) return Status::OK();
  ctx->segment = 1;
  int older = 0;
  if (ctx->comm.rank == 0)
    for (const auto& [step, path] : ckpt::list(ctx->opt.run_dir)) older = older || step < ctx->engine->step();
  CULPRIT_COLLECTIVE(ctx->comm, "the bisection", MPI_Ibcast(&older, 1, MPI_INT, 0, ctx->comm.comm, &_culprit_req));
  ctx->reached_oldest = !older;
  ctx->oldest = std::min(ctx->oldest, ctx->engine->step());
  return Status::OK();
}

Status open_segment(Context* ctx, bool* none) {
  const auto* first = ctx->first;
  *none = false;
  ctx->engine.reset();
  if (ctx->segment == 0) {
    // The newest valid checkpoint before the first incident; without one, the oldest. Rotated by
    // one rank: run_step itself recomputes every micro-shard on the rank after the one that
    // recorded it (same world size), so a replayed step costs one step-time.
    CULPRIT_RETURN_IF_ERROR(open_from(ctx, first ? first->step : ckpt::kAnyStep,
                                      first ? ckpt::Pick::kNewest : ckpt::Pick::kOldest, &ctx->checkpoint));
    ctx->start = ctx->engine->step();
    ctx->reached_oldest = !first;
  } else if (ctx->segment == 1 && first) {
    // Nothing after the incident's checkpoint: the steps before it, from the oldest checkpoint (a
    // silent fault there can have caused what the incident saw).
    std::string path;
    CULPRIT_RETURN_IF_ERROR(open_from(ctx, ckpt::kAnyStep, ckpt::Pick::kOldest, &path));
    ctx->reached_oldest = true;
    if (ctx->engine->step() >= ctx->start) {
      ctx->engine.reset();
      *none = true;
      return Status::OK();
    }
    ctx->note("nothing differs from step " + std::to_string(ctx->start + 1) + " on; searching the steps before, from " + path);
  } else {
    *none = true;
    return Status::OK();
  }
  ctx->oldest = ctx->oldest < 0 ? ctx->engine->step() : std::min(ctx->oldest, ctx->engine->step());
  return Status::OK();
}

Status open_context(Context* ctx) {
  const Comm& comm = ctx->comm;
  CULPRIT_RETURN_IF_ERROR(replay::load_run(ctx->opt.run_dir, comm, &ctx->run));
  CULPRIT_RETURN_IF_ERROR(agree(comm, records::read_incidents(ctx->opt.run_dir, &ctx->incidents)));
  if (ctx->opt.reruns < 1) return agree(comm, Status::BadInput("option '--reruns' must be at least 1"));
  ctx->first = records::first_fault(ctx->incidents);
  ctx->W = comm.size;
  ctx->M = ctx->run.cfg.micro_shards;
  ctx->layer = ctx->run.trace.header.level == trace::Level::kLayer;
  ctx->opt_recorded = ctx->run.trace.header.format_version >= 3;
  bool none = false;
  CULPRIT_RETURN_IF_ERROR(open_segment(ctx, &none));
  ctx->schema = replay::schema_of(*ctx->engine, ctx->run.trace);
  // The map's rows as executed: the input, every layer's forward output, every layer's backward
  // gradient (last layer first), the leaf; so the first differing cell of a column is the origin.
  ctx->map.rows = {"input"};
  const auto& layers = ctx->schema.layers;
  if (ctx->layer) {
    for (const auto& l : layers) ctx->map.rows.push_back("forward " + l);
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) ctx->map.rows.push_back("backward " + *it);
  }
  ctx->map.rows.push_back("gradient leaf");
  ctx->map.rows.push_back("update");
  return Status::OK();
}

namespace {

// The current state's action.
Status act(State state, Context& ctx, Finding* f, Evidence* ev) {
  switch (state) {
    case State::kFindStep: return find_step(ctx, f, ev);
    case State::kLocalize: return localize(ctx, f, ev);
    case State::kRerun: return rerun(ctx, f, ev);
    case State::kDone: break;
  }
  return Status::OK();
}

// A record the bisection needs is damaged: that is the verdict, never a hardware one. The diagnosis
// says which record; the damage's own category (exit 4) stands.
Status damaged_record(Context& ctx, const Status& why) {
  ctx.d->verdict = Verdict::kDamagedRecord;
  ctx.note(why.message());
  Status st;
  if (ctx.comm.rank == 0) {
    st = records::write_diagnosis(ctx.opt.run_dir, *ctx.d);
    print_summary(*ctx.d, ctx.opt.run_dir);
  }
  CULPRIT_RETURN_IF_ERROR(agree(ctx.comm, st));
  return why;
}

// The state machine from kFindStep to kDone, on the part of the run the engine stands in.
Status search(Context& ctx, Finding* f, Verdict* verdict) {
  State state = State::kFindStep;
  while (state != State::kDone) {
    Evidence ev;
    CULPRIT_RETURN_IF_ERROR(act(state, ctx, f, &ev));
    const Transition tr = next(state, ev);
    state = tr.next;
    *verdict = tr.verdict;
  }
  return Status::OK();
}

// A verdict that names a faulty step (not none, inconclusive or the model's own instability).
bool names_a_step(Verdict v) {
  return v != Verdict::kNone && v != Verdict::kInconclusive && v != Verdict::kNumericalInstability;
}

// A device that fires again and again, found after the checkpoint the search started from (the
// newest before the first incident), may have fired silently before it: the finding names a later
// firing. The steps before that checkpoint are searched too (--search-back), and a firing of the
// same device found there is the finding; else the first one stands (anything else found there is
// evidence only: replaying those steps on a device now broken can make healthy records look odd).
// Optional: an error in it is noted and the first finding stands.
Status search_back(Context& ctx, Finding* f, Verdict* verdict) {
  // A device that loads wrongly (data, a rank blamed) may fire again as a compute fault does: its
  // first firing may have been silent too.
  const bool recurs = *verdict == Verdict::kHardwarePersistent || *verdict == Verdict::kHardwareUnconfirmed ||
                      (*verdict == Verdict::kData && f->blamed >= 0);
  if (!recurs || f->blamed < 0 || ctx.segment != 0 || ctx.reached_oldest || ctx.opt.search_back == 0) return Status::OK();
  const std::int64_t back = ctx.opt.search_back > 0 ? ctx.opt.search_back
                                                    : 2 * std::max<std::int64_t>(1, ctx.run.cfg.checkpoint.every);
  bool none = true;
  const auto reruns = ctx.d->reruns, reproduced = ctx.d->reproduced;
  Status st = open_earlier(&ctx, back, &none);
  if (st.ok() && none) return Status::OK();
  Finding g;
  Verdict v = Verdict::kNone;
  if (st.ok()) {
    ctx.note("rank " + std::to_string(f->blamed) + "'s device fires again: searching the steps before the checkpoint of step " +
             std::to_string(ctx.start) + " for an earlier firing, from " + ctx.checkpoint);
    ctx.searching_back = true;
    st = search(ctx, &g, &v);
    ctx.searching_back = false;
  }
  if (!st.ok()) {
    ctx.note("the search before step " + std::to_string(ctx.start + 1) + " failed (" + st.message() + "); step " +
             std::to_string(f->step) + " stands");
  } else if ((is_hardware(v) || v == *verdict) && g.blamed == f->blamed && g.step < f->step) {
    ctx.note("an earlier firing of rank " + std::to_string(g.blamed) + "'s device: step " + std::to_string(g.step) +
             " (the one at step " + std::to_string(f->step) + " came after it)");
    *f = g;
    *verdict = v;
    return Status::OK();
  } else {
    ctx.note(names_a_step(v) ? "before step " + std::to_string(ctx.start + 1) + ": " + std::string(name_of(v)) + " at step " +
                                   std::to_string(g.step) + ", not a firing of rank " + std::to_string(f->blamed) +
                                   "'s device; step " + std::to_string(f->step) + " stands"
                             : "nothing differs before step " + std::to_string(ctx.start + 1) + ": step " +
                                   std::to_string(f->step) + " is the first firing");
  }
  ctx.d->reruns = reruns, ctx.d->reproduced = reproduced;
  return Status::OK();
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// The run is this job's while it is bisected (no train --resume rewrites its traces meanwhile).
// Without run.json there is no run: open_context says so, and nothing is removed.
// Once locked, the previous diagnosis goes: RUN/diagnosis.json is this bisection's or none, so that
// a bisection that fails (a full disk while writing it, a damaged run, a crash) never leaves an
// older diagnosis to be read as its own (--on-detect diagnose's job script would blame the old
// host). Removed durably (unlinked, the directory synced): after a crash it is the old file or
// nothing, never half of one; the page goes with it, as it shows the same diagnosis.
static Status lock_run(const std::string& run_dir, const char* command) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(run_dir) / "run.json", ec)) return Status::OK();
  CULPRIT_RETURN_IF_ERROR(files::lock_run_dir(run_dir, command));
  CULPRIT_RETURN_IF_ERROR(files::remove_durably(records::diagnosis_path(run_dir))
                              .prefixed("removing the previous diagnosis before bisecting"));
  return files::remove_durably((std::filesystem::path(run_dir) / "diagnosis.html").string())
      .prefixed("removing the previous diagnosis before bisecting");
}

// The checkpoints of steps before `oldest` (the oldest one the search could start from): each one
// failed to verify when the search looked for the oldest valid one, so each is named with its
// damage in the coverage's reason (read again here, on rank 0, only when there are such files).
static std::vector<std::string> damaged_before(const std::string& run_dir, std::int64_t oldest) {
  std::vector<std::string> out;
  for (const auto& [step, path] : ckpt::list(run_dir)) {
    if (step >= oldest) break;
    ckpt::Checkpoint c;
    const Status st = ckpt::read(path, &c, /*verify=*/true);
    std::string why = st.message();
    const std::string named = "checkpoint '" + path + "' ";  // the reader names the file: said once
    if (why.rfind(named, 0) == 0) why = why.substr(named.size());
    out.push_back(st.ok() ? "checkpoint '" + path + "' was not usable" : "checkpoint '" + path + "' is damaged (" + why + ")");
  }
  return out;
}

Status run(const Options& opt, const Comm& given, records::Diagnosis* d) {
  const auto t0 = std::chrono::steady_clock::now();
  const Watched watched(given, opt.collective_timeout);
  const Comm& comm = watched.comm();
  *d = records::Diagnosis();
  CULPRIT_RETURN_IF_ERROR(agree(comm, comm.rank == 0 ? lock_run(opt.run_dir, "bisect") : Status::OK()));
  Context ctx(opt, comm, d);
  CULPRIT_RETURN_IF_ERROR(gather_hosts_now(&ctx));
  const Status opened = open_context(&ctx);
  if (opened.code() == StatusCode::kDamaged) return damaged_record(ctx, opened);
  CULPRIT_RETURN_IF_ERROR(opened);
  d->startup_seconds = since(t0);
  ctx.note(std::string(ctx.first ? "first incident: step " + std::to_string(ctx.first->step) + " (" +
                                       name_of(ctx.first->detector) + ")"
                                 : "no incident: searching the whole trace") +
           "; replaying from " + ctx.checkpoint + " on " + std::to_string(ctx.W) + " rank(s)");
  Finding f;
  Verdict verdict = Verdict::kNone;
  CULPRIT_RETURN_IF_ERROR(search(ctx, &f, &verdict));
  CULPRIT_RETURN_IF_ERROR(search_back(ctx, &f, &verdict));
  if (comm.rank == 0 && ctx.reached_oldest && ctx.oldest > 0) ctx.damaged_before = damaged_before(ctx.opt.run_dir, ctx.oldest);
  conclude(ctx, f, verdict, d);
  d->seconds = since(t0);
  Status st;
  if (comm.rank == 0) {
    st = records::write_diagnosis(opt.run_dir, *d);
    if (st.ok()) st = write_html(ctx, *d);
    print_summary(*d, opt.run_dir);
  }
  return agree(comm, st);
}

}  // namespace culprit::bisect
