// One background thread per rank that performs all HDF5 work while training runs (HDF5 is not
// thread-safe here, so no other thread may call it meanwhile). Jobs run in submission order; with
// inline jobs, on the caller's thread.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "culprit/status.h"

namespace culprit::harness {

class IoWorker {
 public:
  // inline_jobs: no thread; submit runs each job at once on the caller's thread (MPI below
  // MPI_THREAD_MULTIPLE: a job's MPI calls must come from the thread that calls MPI otherwise, and
  // none may overlap another thread's, not even a watchdog's polling while a drain waits).
  explicit IoWorker(bool inline_jobs = false) : inline_(inline_jobs) {
    if (!inline_) thread_ = std::thread([this] { loop(); });
  }
  ~IoWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  IoWorker(const IoWorker&) = delete;
  IoWorker& operator=(const IoWorker&) = delete;

  void submit(std::function<Status()> job) {
    if (inline_) {
      Status s = job();
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }

  // Whether every submitted job has run (drain() would not wait).
  bool idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_.empty() && !busy_;
  }

  // The first error since the last drain, without waiting.
  Status error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  // Waits until every submitted job has run; returns the first error since the last drain.
  Status drain() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return jobs_.empty() && !busy_; });
    Status s = error_;
    error_ = Status::OK();
    return s;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty() && stop_) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
      lock.unlock();
      Status s = job();
      lock.lock();
      busy_ = false;
      if (!s.ok() && error_.ok()) error_ = s;
      if (jobs_.empty()) done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<Status()>> jobs_;
  bool busy_ = false, stop_ = false;
  const bool inline_;
  Status error_;
  std::thread thread_;
};

}  // namespace culprit::harness
