// `culprit train`'s run as a whole: the watchdog reporting to the run, the run directory, the data,
// the model, the trainer's setup and the checks every rank must pass together, then resume or start
// (the step and the loop: trainer.cpp).
#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "culprit/math_libraries.h"
#include "culprit/run_files.h"
#include "culprit/watchdog.h"
#include "train/run_directory.h"
#include "config/sizes.h"
#include "culprit/train.h"
#include "train/trainer.h"

namespace culprit::harness {

// What the watchdog says goes to the run: a silent rank becomes a collective-timeout incident; a
// writer stuck on a full disk is an I/O failure, not a silent rank.
void report_to_the_run(Watchdog* w, const TrainConfig& cfg, std::int64_t step) {
  // A writer stuck past the deadline on a full disk is an I/O failure, not a silent rank: MPI-IO
  // can hang in a collective once a write failed for lack of space (docs/checkpoint-format.md).
  w->on_stuck([&cfg](const SilentReport& rep) {
    const Status why = stuck_cause(rep, cfg.device == DeviceKind::kCpu);
    if (!why.ok()) return why;
    std::uint64_t free = 0;
    if (!files::free_bytes(cfg.run_dir, &free).ok() || free >= (1u << 20)) return Status::OK();
    return Status::IoError("the filesystem of run directory '" + cfg.run_dir + "' is full (" + std::to_string(free) +
                           " bytes free): " + std::strerror(ENOSPC));
  });
  w->on_silence([&cfg, step](const SilentReport& rep) {
    if (!rep.cause.ok()) return;  // not a hardware incident
    records::Incident inc;
    inc.step = step >= 0 ? step : rep.step;
    inc.detector = Detector::kCollectiveTimeout;
    inc.cls = IncidentClass::kHardware;
    inc.rank = rep.silent.empty() ? -1 : rep.silent[0];
    inc.ranks = rep.silent;
    inc.message = rep.message;
    if (inc.rank >= 0) {
      inc.host = rep.hosts[inc.rank];
      inc.device = name_of(cfg.device);  // the kind: this rank cannot ask the silent one which device it is
    }
    Status st = records::append_incident(cfg.run_dir, inc);
    if (!st.ok()) std::fprintf(stderr, "culprit: warning: %s\n", st.message().c_str());
  });
}


Status train(const TrainConfig& given, const Comm& world, Env* env) {
  CULPRIT_RETURN_IF_ERROR(agree(world, validate(given, world.size)));
  TrainConfig cfg = given;
  // From here on, every collective of the main thread is bounded by --collective-timeout.
  Watchdog watchdog(world, cfg.detect.collective_timeout);
  Comm comm = world;
  comm.watchdog = &watchdog;
  report_to_the_run(&watchdog, cfg);
  setup_determinism(cfg.threads);
  CULPRIT_RETURN_IF_ERROR(agree(comm, check_math_pinned()));
  CULPRIT_RETURN_IF_ERROR(agree(comm, comm.rank == 0 ? prepare_run_dir(cfg) : Status::OK()));
  CULPRIT_RETURN_IF_ERROR(establish_run_id(cfg, comm, &cfg.run_id));
  Dataset data;
  CULPRIT_RETURN_IF_ERROR(agree(comm, load_dataset(cfg, &data)));
  CULPRIT_RETURN_IF_ERROR(agree(comm, check_order_size(cfg, data.n)));
  if (cfg.global_batch > data.n)
    return agree(comm, Status::BadInput("--global-batch " + std::to_string(cfg.global_batch) + " exceeds the " +
                                     std::to_string(data.n) + " samples of the data"));
  std::unique_ptr<Model> model;
  CULPRIT_RETURN_IF_ERROR(agree(comm, guarded(StatusCode::kInternal, "model " + cfg.model.text(), [&] { return make_model(cfg, data, &model, comm.size); })));
  Trainer trainer(cfg, comm, data, *model, env);
  CULPRIT_RETURN_IF_ERROR(agree(comm, guarded(StatusCode::kInternal, "setup", [&] { return trainer.init(StepMode::kTrain); })));
  CULPRIT_RETURN_IF_ERROR(trainer.check_ranks_agree());
  std::int64_t start = 0;
  std::string from;
  if (resuming(cfg)) {
    CULPRIT_RETURN_IF_ERROR(agree(comm, check_math_libraries(cfg.run_dir, "resuming it")));
    ckpt::Checkpoint c;
    CULPRIT_RETURN_IF_ERROR(find_checkpoint(cfg, comm, &c, &from));
    // A checkpoint the user names is an input, not part of the run: another run's (or one renamed)
    // is a bad option (exit 2); found in the run directory it is damage (4, check_compatible).
    if (!cfg.resume_from.empty()) {
      const Status mine = ckpt::belongs(from, c, cfg.run_id);
      CULPRIT_RETURN_IF_ERROR(agree(comm, mine.ok() ? mine : Status::BadInput(mine.message())));
    }
    CULPRIT_RETURN_IF_ERROR(agree(comm, check_compatible(cfg, data, c, from)));
    CULPRIT_RETURN_IF_ERROR(agree(comm, guarded(StatusCode::kInternal, "restoring " + from, [&] { return trainer.restore(c); })));
    start = c.step;
    if (start >= cfg.steps) {
      if (comm.rank == 0 && !cfg.quiet)
        std::printf("culprit train: the run is complete: %s holds step %lld of --steps %lld\n", from.c_str(),
                    static_cast<long long>(start), static_cast<long long>(cfg.steps));
      return Status::OK();
    }
  }
  return trainer.run(start, from);
}

}  // namespace culprit::harness
