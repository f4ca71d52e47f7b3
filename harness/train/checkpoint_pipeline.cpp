#include "train/checkpoint_pipeline.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <map>
#include <set>
#include <thread>

#include "culprit/checkpoint_format.h"
#include "culprit/records.h"
#include "culprit/run_files.h"
#include "culprit/watchdog.h"

namespace culprit::harness {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

CheckpointPipeline::~CheckpointPipeline() {
  io_.reset();
  if (io_comm_ != MPI_COMM_NULL) MPI_Comm_free(&io_comm_);
}

Status CheckpointPipeline::open(std::int64_t start_step, const trace::Header* header,
                                const std::vector<std::string>& hosts, const std::string& mpi_thread_level) {
  std::map<std::string, int> per_host;
  for (int r = 0; r < comm_.size; ++r)
    if (cfg_.checkpoint.writers_per_host == 0 || per_host[hosts[r]]++ < cfg_.checkpoint.writers_per_host)
      writers_.push_back(r);
  if (header) CULPRIT_RETURN_IF_ERROR(open_trace(start_step, *header));
  CULPRIT_MPI_CHECK(MPI_Comm_dup(comm_.comm, &io_comm_));
  // The I/O thread calls MPI while the main thread does: that needs MPI_THREAD_MULTIPLE. With less,
  // every I/O job runs at once on the main thread (no other thread ever calls MPI: with a thread
  // that waited, the watchdog's polling during a drain raced the job's collectives and crashed
  // Open MPI's nonblocking-collective progress).
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  serial_ = level < MPI_THREAD_MULTIPLE;
  io_ = std::make_unique<IoWorker>(/*inline_jobs=*/serial_);
  if (serial_ && comm_.rank == 0)
    std::fprintf(stderr, "culprit: warning: MPI provides thread level %s, not multiple: checkpoints and trace are "
                 "written synchronously\n", mpi_thread_level.c_str());
  return Status::OK();
}

Status CheckpointPipeline::open_trace(std::int64_t start_step, const trace::Header& h) {
  tracing_ = true;
  std::string warning;
  // Every rank's refusal before any rank changes its files (a resume refused changes nothing).
  CULPRIT_RETURN_IF_ERROR(agree(comm_, trace::Writer::check(trace::path_for(cfg_.run_dir, comm_.rank), h)));
  Status st = trace_.open(trace::path_for(cfg_.run_dir, comm_.rank), h, start_step, &warning);
  if (!warning.empty()) {
    std::fprintf(stderr, "culprit: warning: rank %d: %s\n", comm_.rank, printable(warning).c_str());
    std::fflush(stderr);
  }
  // Files of ranks beyond this world keep only what precedes the resume point.
  if (st.ok() && comm_.rank == 0) {
    std::set<int> beyond;
    for (const auto& path : trace::list(cfg_.run_dir)) {
      trace::FileName n;
      if (trace::parse_file_name(fs::path(path).filename().string(), &n) && n.rank >= comm_.size) beyond.insert(n.rank);
    }
    for (int r : beyond) {
      // Another run's file: said, untouched.
      Status t = trace::rewind(cfg_.run_dir, r, start_step, h.run_id);
      const std::string live = trace::path_for(cfg_.run_dir, r);
      std::error_code ec;
      if (t.ok() && fs::exists(fs::symlink_status(live, ec))) t = trace::truncate(live, start_step, h.run_id);
      if (!t.ok()) std::fprintf(stderr, "culprit: warning: %s\n", printable(t.message()).c_str());
    }
  }
  CULPRIT_RETURN_IF_ERROR(agree(comm_, st));
  // Every rank rolls at the same checkpoints: from the newest seal of any rank (a rank new to the
  // run has none; a crash can have stopped some ranks' seal).
  std::int64_t sealed = trace_.sealed_through();
  CULPRIT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sealed, 1, MPI_INT64_T, MPI_MAX, comm_.comm));
  sealed_through_ = sealed;
  for (const auto& path : trace::list(cfg_.run_dir)) {
    trace::FileName n;
    if (trace::parse_file_name(fs::path(path).filename().string(), &n) && n.rank >= comm_.size &&
        (beyond_.empty() || beyond_.back() != n.rank))
      beyond_.push_back(n.rank);
  }
  // A run that has had an incident keeps every trace file from now on (--trace-keep).
  if (cfg_.trace_keep > 0) {
    int pinned = 0;
    if (comm_.rank == 0) {
      std::vector<records::Incident> incidents;
      const Status r = records::read_incidents(cfg_.run_dir, &incidents);
      pinned = !r.ok() || records::first_fault(incidents) != nullptr;  // unreadable: keep everything
    }
    CULPRIT_MPI_CHECK(MPI_Bcast(&pinned, 1, MPI_INT, 0, comm_.comm));
    trace_pinned_ = pinned != 0;
  }
  return Status::OK();
}

Status CheckpointPipeline::drain() {
  if (comm_.watchdog) comm_.watchdog->wait_until([this] { return io_->idle(); }, "the checkpoint and trace writer");
  return io_->drain();
}

// Training waits for: the previous checkpoint's write if still running, and whatever is left of the
// state copy at the fence. Synchronous: everything, on the spot.
Status CheckpointPipeline::save(std::int64_t step, std::function<void(ckpt::Checkpoint*)> copy) {
  const auto t0 = Clock::now();
  if (in_flight_) {
    CULPRIT_RETURN_IF_ERROR(agree(comm_, drain()));
    in_flight_ = false;
    log_checkpoint();
  }
  const auto t1 = Clock::now();
  // The previous checkpoint is written (drained above): its buffers are free for this one.
  if (!snap_) snap_ = std::make_shared<ckpt::Checkpoint>();
  auto c = snap_;
  cost_ = Cost();
  cost_.step = step;
  cost_.wait = std::chrono::duration<double>(t1 - t0).count();
  copied_ = false;
  const std::string path = ckpt::path_for(cfg_.run_dir, step);
  const bool pinned = trace_pinned_;
  io_->submit([this, c, copy = std::move(copy), path, step, pinned] {
    const auto w0 = Clock::now();
    env_->copy_state([&] { copy(c.get()); });
    cost_.copy = std::chrono::duration<double>(Clock::now() - w0).count();
    copied_ = true;
    ckpt::compute_fingerprints(c.get());
    Comm io{io_comm_, comm_.rank, comm_.size, comm_.host};
    ckpt::WriteStats stats;
    // The trace through this step is durable before the checkpoint commits (its rows were queued
    // before this job); a failure is agreed inside write's first agreement.
    const Status synced = tracing_ ? trace_.sync() : Status::OK();
    Status st = ckpt::write(io, path, *c, &stats, writers_, synced);
    if (st.ok() && comm_.rank == 0) st = ckpt::apply_retention(cfg_.run_dir, step, cfg_.checkpoint.keep_last, cfg_.checkpoint.keep_every);
    if (st.ok()) st = roll_trace(step, pinned);
    cost_.bytes = stats.bytes;
    cost_.write = stats.seconds;
    cost_.total_io = std::chrono::duration<double>(Clock::now() - w0).count();
    return st;
  });
  in_flight_ = true;
  if (!cfg_.checkpoint.async || serial_) {
    Status st = agree(comm_, drain());
    in_flight_ = false;
    cost_.stall = std::chrono::duration<double>(Clock::now() - t0).count();
    log_checkpoint();
    return st;
  }
  cost_.stall = std::chrono::duration<double>(Clock::now() - t0).count();
  return Status::OK();
}

void CheckpointPipeline::fence() {
  if (copied_) return;
  // The copy takes milliseconds: spin for it (a sleeping wait would add its wake-up latency to the
  // stall); past a second, wait where the watchdog can answer the other ranks.
  const auto t0 = Clock::now();
  auto waited = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  while (!copied_ && waited() < 1.0) std::this_thread::yield();
  if (!copied_ && comm_.watchdog)
    comm_.watchdog->wait_until([this] { return copied_.load(); }, "the checkpoint's copy of the state");
  else
    while (!copied_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  cost_.fence += waited();
  cost_.stall += waited();
}

// Every trace row through `step` is written (appended before this checkpoint was queued). The live
// file is sealed once it holds a quarter of the kept steps N, and at least one HDF5 chunk of step
// rows (a file costs a chunk per column however few rows it holds: smaller files would make the
// trace bigger, not smaller). The trace then holds from N to about N + max(N/4, 64) + one
// checkpoint interval steps; files older than the newest N steps are deleted.
Status CheckpointPipeline::roll_trace(std::int64_t step, bool pinned) {
  if (!tracing_ || cfg_.trace_keep <= 0) return Status::OK();
  const std::int64_t every = std::max<std::int64_t>(format::kTraceChunkRows, cfg_.trace_keep / 4);
  if (step - sealed_through_ >= every) {
    CULPRIT_RETURN_IF_ERROR(trace_.seal(step));
    sealed_through_ = step;
  }
  if (pinned) return Status::OK();
  const std::int64_t first_kept = step - cfg_.trace_keep + 1;
  CULPRIT_RETURN_IF_ERROR(trace_.retire(first_kept));
  // The files of ranks beyond this world age like the others (rank 0 keeps them).
  if (comm_.rank == 0)
    for (int r : beyond_) CULPRIT_RETURN_IF_ERROR(trace::retire(cfg_.run_dir, r, first_kept, cfg_.run_id));
  return Status::OK();
}

void CheckpointPipeline::append_trace(trace::StepRow row, std::vector<trace::ShardRow> shards) {
  if (!tracing_ || !io_) return;
  io_->submit([this, row = std::move(row), shards = std::move(shards)] { return trace_.append(row, shards); });
  if (serial_) {
    Status st = drain();
    if (!st.ok()) serial_error_ = st;
  }
}

// One line per checkpoint: what it cost (docs/performance.md).
void CheckpointPipeline::log_checkpoint() {
  if (comm_.rank != 0 || cost_.step < 0) return;
  std::ostringstream line;
  line << "{\"step\": " << cost_.step << ", \"bytes\": " << cost_.bytes << ", \"writers\": " << writers_.size()
       << ", \"wait_seconds\": " << cost_.wait << ", \"copy_seconds\": " << cost_.copy
       << ", \"fence_seconds\": " << cost_.fence << ", \"stall_seconds\": " << cost_.stall
       << ", \"write_seconds\": " << cost_.write << ", \"total_io_seconds\": " << cost_.total_io
       << ", \"async\": " << (cfg_.checkpoint.async && !serial_ ? "true" : "false") << "}\n";
  // A cost log only: a failure to append it is said, never fatal.
  const Status st = files::append((fs::path(cfg_.run_dir) / "checkpoints.jsonl").string(), line.str());
  if (!st.ok()) std::fprintf(stderr, "culprit: warning: %s\n", printable(st.message()).c_str());
  cost_.step = -1;
}

Status CheckpointPipeline::close() {
  Status st = io_ ? drain() : Status::OK();
  if (in_flight_ && st.ok()) log_checkpoint();
  in_flight_ = false;
  if (st.ok()) st = serial_error_;
  st = agree(comm_, st);
  io_.reset();
  trace_.close();
  if (io_comm_ != MPI_COMM_NULL) MPI_Comm_free(&io_comm_);
  return st;
}

}  // namespace culprit::harness
