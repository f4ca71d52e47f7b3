// culprit bisect: open the run, then a short loop over the transition function (machine.h), each
// state's action (actions.h) filling the Finding; the verdict becomes RUN/diagnosis.json and
// RUN/diagnosis.html.
#include "culprit/bisect.h"

#include <chrono>
#include <cstdio>

#include "actions.h"

namespace culprit::bisect {

void Context::note(const std::string& line) {
  d->evidence.push_back(line);
  if (comm.rank != 0) return;
  std::fprintf(stderr, "culprit bisect: %s\n", line.c_str());
  std::fflush(stderr);
}

bool Context::incident_names(std::int64_t s) const {
  return first && first->step == s && first->rank >= 0 && first->rank < W;
}

void Context::placement(int r, std::string* host, std::string* device) const {
  for (const auto& [key, row] : run.trace.shards)
    if (row.rank == r) {
      *host = row.host;
      *device = row.device;
      return;
    }
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
  // Where to start: the newest valid checkpoint before the first incident; without one, the oldest.
  // The search goes one step past the incident: a fault in the optimizer state shows in the
  // parameters a step later.
  const auto* first = ctx->first;
  const std::int64_t last = ctx->run.trace.last_step;
  ctx->end = first ? std::min(first->step + 1, last) : last;
  // Rotated by one rank: run_step itself recomputes every micro-shard on the rank after the one that
  // recorded it (same world size), so a replayed step costs one step-time.
  CULPRIT_RETURN_IF_ERROR(replay::open_engine_before(ctx->run, comm, first ? first->step : ctx->end,
                                                     first ? ckpt::Pick::kNewest : ckpt::Pick::kOldest, ctx->layer,
                                                     /*rotate=*/1, &ctx->engine, &ctx->checkpoint));
  ctx->schema = replay::schema_of(*ctx->engine, ctx->run.trace);
  ctx->map.rows = {"input"};
  if (ctx->layer) ctx->map.rows.insert(ctx->map.rows.end(), ctx->schema.layers.begin(), ctx->schema.layers.end());
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

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status run(const Options& opt, const Comm& comm, records::Diagnosis* d) {
  const auto t0 = std::chrono::steady_clock::now();
  *d = records::Diagnosis();
  Context ctx(opt, comm, d);
  CULPRIT_RETURN_IF_ERROR(open_context(&ctx));
  d->startup_seconds = since(t0);
  ctx.note(std::string(ctx.first ? "first incident: step " + std::to_string(ctx.first->step) + " (" +
                                       name_of(ctx.first->detector) + ")"
                                 : "no incident: searching the whole trace") +
           "; replaying from " + ctx.checkpoint + " on " + std::to_string(ctx.W) + " rank(s)");
  Finding f;
  State state = State::kFindStep;
  Verdict verdict = Verdict::kNone;
  while (state != State::kDone) {
    Evidence ev;
    CULPRIT_RETURN_IF_ERROR(act(state, ctx, &f, &ev));
    const Transition tr = next(state, ev);
    state = tr.next;
    verdict = tr.verdict;
  }
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
