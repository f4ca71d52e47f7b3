// The rank's background I/O: checkpoints and the trace are written by one I/O thread (io_worker.h)
// on a communicator of its own while training runs. A checkpoint is pipelined (like CheckFreq's
// snapshot): the caller's copy function runs on the I/O thread while the next step's forward and
// backward passes only read the state; the next optimizer step first waits for the copy (fence()).
// No libtorch here: the state crosses as a copy function that fills a ckpt::Checkpoint.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "culprit/checkpoint.h"
#include "culprit/env.h"
#include "culprit/harness.h"
#include "culprit/mpi_util.h"
#include "culprit/status.h"
#include "culprit/trace.h"
#include "culprit/io_worker.h"

namespace culprit::harness {

class CheckpointPipeline {
 public:
  // env: where the state copy runs (Env::Default(); a test wraps it to slow the copy down).
  CheckpointPipeline(const TrainConfig& cfg, const Comm& comm, Env* env) : cfg_(cfg), comm_(comm), env_(env) {}
  ~CheckpointPipeline();
  CheckpointPipeline(const CheckpointPipeline&) = delete;
  CheckpointPipeline& operator=(const CheckpointPipeline&) = delete;

  // Collective: opens the trace at start_step (header: null with --trace off), picks the checkpoint
  // writers (the first --checkpoint-writers-per-host ranks of every host), starts the I/O thread.
  Status open(std::int64_t start_step, const trace::Header* header, const std::vector<std::string>& hosts,
              const std::string& mpi_thread_level);
  // Collective: checkpoint `step`. copy(c) fills c with the state; it runs on the I/O thread (or at
  // once when checkpoints are synchronous) and must only read what the next forward/backward reads.
  Status save(std::int64_t step, std::function<void(ckpt::Checkpoint*)> copy);
  // Waits until the checkpoint in flight has its copy of the state: call before the state changes.
  void fence();
  // Runs `job` on the I/O thread after the jobs queued before it (at once when I/O is serialised):
  // the data reads of an HDF5 source, which must not overlap the run's other HDF5 calls. The job's
  // failure is its own to report (its Status is not the pipeline's).
  void submit(std::function<Status()> job) {
    if (io_) io_->submit([job = std::move(job)] {
        job();
        return Status::OK();
      });
    else job();
  }
  // Queues one step's trace rows.
  void append_trace(trace::StepRow row, std::vector<trace::ShardRow> shards);
  // The run has had an incident: from now on no trace file is deleted (its diagnosis needs them).
  void pin_trace() { trace_pinned_ = true; }
  // Local, without waiting: the first failed write so far (a trace append to a full disk).
  Status io_error() { return !serial_error_.ok() ? serial_error_ : io_ ? io_->error() : Status::OK(); }
  // Collective: waits for every write and closes the trace; the first error of any rank.
  Status close();

 private:
  Status drain();       // waits for the I/O thread (bounded by the watchdog); its first error
  void log_checkpoint();  // rank 0: the drained checkpoint's line in RUN/checkpoints.jsonl
  Status open_trace(std::int64_t start_step, const trace::Header& header);
  // I/O thread, after checkpoint `step` is written: --trace-keep's roll and retention.
  Status roll_trace(std::int64_t step, bool pinned);

  const TrainConfig& cfg_;
  const Comm& comm_;
  Env* env_;
  MPI_Comm io_comm_ = MPI_COMM_NULL;
  std::unique_ptr<IoWorker> io_;
  bool serial_ = false;    // MPI below MPI_THREAD_MULTIPLE: every job is waited for at once
  Status serial_error_;    // a trace write that failed while I/O was serialised
  std::vector<int> writers_;  // the ranks that write checkpoint data
  std::shared_ptr<ckpt::Checkpoint> snap_;  // host copy of the state, reused checkpoint to checkpoint
  bool in_flight_ = false;
  // The I/O thread sets copied_ once the state is copied; the other numbers are the checkpoint's
  // cost (written by the I/O thread, read after a drain).
  std::atomic<bool> copied_{true};
  struct Cost {
    std::int64_t step = -1;
    std::uint64_t bytes = 0;
    double wait = 0, copy = 0, fence = 0, stall = 0, write = 0, total_io = 0;
  } cost_;
  trace::Writer trace_;
  bool tracing_ = false;
  bool trace_pinned_ = false;  // set on the main thread; each checkpoint's job takes a copy
  std::int64_t sealed_through_ = 0;  // the newest seal of any rank (agreed at open), then ours
  std::vector<int> beyond_;          // ranks with trace files beyond this world
};

}  // namespace culprit::harness
