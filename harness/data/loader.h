// The samples of the micro-shards a rank computes, read ahead: while step s computes, the samples of
// its micro-shards of step s + 1 are read in the background, so resident data is two steps of this
// rank's micro-shards, whatever the data set's size (docs/data.md). No libtorch.
#pragma once
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "culprit/status.h"
#include "culprit/data.h"
#include "culprit/io_worker.h"

namespace culprit::harness {

// One micro-shard's samples as read: x and y, row-major, in the order of `idx`.
struct ShardSamples {
  std::vector<std::int64_t> idx;
  std::vector<unsigned char> x, y;
  Status status;
  double seconds = 0;  // the read's own time
};

class SampleLoader {
 public:
  // Runs a job where the data source may run (an HDF5 source: where the process's HDF5 calls run).
  using Executor = std::function<void(std::function<Status()>)>;
  // hdf5_executor: for a source that uses HDF5 (null: run such reads on the calling thread, which
  // must then be the only one calling HDF5). Other sources read ahead on a thread of the loader's.
  // Waits until ready() for what the loader waits for; the trainer's bounds the wait by the
  // collective watchdog (an HDF5 read queued behind a stuck checkpoint write must not hang the job).
  using Waiter = std::function<void(const std::function<bool()>& ready, const char* what)>;
  SampleLoader(const Dataset& data, SampleChecks checks, Executor hdf5_executor = nullptr, Waiter waiter = nullptr);
  ~SampleLoader();
  SampleLoader(const SampleLoader&) = delete;
  SampleLoader& operator=(const SampleLoader&) = delete;

  // Starts reading micro-shard k of `step` (its samples `idx`) in the background.
  void prefetch(std::int64_t step, int k, std::vector<std::int64_t> idx);
  // The samples `idx` of micro-shard k of `step`: the read-ahead's when it read these very samples
  // (waiting for it), else read now. Forgets every read-ahead of earlier steps.
  std::shared_ptr<const ShardSamples> fetch(std::int64_t step, int k, const std::int64_t* idx, std::size_t count);
  // The samples `idx` read now by the data source alone, after every read ahead has finished (so
  // nothing else uses the source meanwhile), on the thread an HDF5 source must use: the sample as
  // stored, outside any step's batch (the bisection's witness of a load, bisect/src/localize.cpp).
  std::shared_ptr<const ShardSamples> read_alone(const std::vector<std::int64_t>& idx);
  // Seconds fetch() waited for reads since the last call (the read stall of a step).
  double take_wait_seconds();
  // Seconds the reads themselves took since the last call (hidden behind compute when ahead).
  double take_read_seconds();

 private:
  struct Pending {
    std::shared_ptr<ShardSamples> samples;
    std::shared_future<void> done;
  };
  std::shared_ptr<ShardSamples> start(std::vector<std::int64_t> idx, std::shared_future<void>* done, bool ahead);
  void wait(const std::shared_future<void>& done);
  Status read_into(ShardSamples* s);

  const Dataset& data_;
  SampleChecks checks_;
  Executor hdf5_;
  Waiter waiter_;
  std::unique_ptr<IoWorker> thread_;  // read-ahead of sources that do not use HDF5
  std::map<std::pair<std::int64_t, int>, Pending> ahead_;
  double wait_ = 0, read_ = 0;
  std::mutex read_mu_;  // read_ (the jobs add their times)
};

}  // namespace culprit::harness
