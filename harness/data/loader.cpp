#include "data/loader.h"

#include <chrono>

namespace culprit::harness {

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

SampleLoader::SampleLoader(const Dataset& data, SampleChecks checks, Executor hdf5_executor, Waiter waiter)
    : data_(data), checks_(std::move(checks)), hdf5_(std::move(hdf5_executor)), waiter_(std::move(waiter)) {
  if (!data_.reader->uses_hdf5()) thread_ = std::make_unique<IoWorker>();
}

SampleLoader::~SampleLoader() {
  // Every job of ours finishes before the buffers it writes go.
  for (auto& [key, p] : ahead_) p.done.wait();
  thread_.reset();
}

Status SampleLoader::read_into(ShardSamples* s) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t n = s->idx.size();
  s->x.resize(n * data_.x_bytes());
  s->y.resize(n * data_.y_bytes());
  // A file changed under a running job (a label or token out of range, a NaN) is found here, with
  // the checks of the scan at open.
  Status st = data_.reader->read(s->idx.data(), n, s->x.data(), s->y.data());
  if (st.ok()) st = check_samples(data_, checks_, s->idx.data(), -1, n, s->x.data(), s->y.data());
  s->seconds = since(t0);
  std::lock_guard<std::mutex> lock(read_mu_);
  read_ += s->seconds;
  return st;
}

std::shared_ptr<ShardSamples> SampleLoader::start(std::vector<std::int64_t> idx, std::shared_future<void>* done,
                                                  bool ahead) {
  auto s = std::make_shared<ShardSamples>();
  s->idx = std::move(idx);
  auto promise = std::make_shared<std::promise<void>>();
  *done = promise->get_future().share();
  auto job = [this, s, promise] {
    s->status = read_into(s.get());
    promise->set_value();
    return Status::OK();  // the read's own status travels with its samples
  };
  if (data_.reader->uses_hdf5() && hdf5_) hdf5_(job);
  else if (ahead && thread_) thread_->submit(job);
  else job();
  return s;
}

// A read ahead is normally done or nearly so: a short plain wait first, then the waiter's (which
// polls the watchdog every millisecond).
void SampleLoader::wait(const std::shared_future<void>& done) {
  if (done.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready || !waiter_) return done.wait();
  waiter_([&done] { return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
          "reading the step's samples");
}

void SampleLoader::prefetch(std::int64_t step, int k, std::vector<std::int64_t> idx) {
  Pending p;
  p.samples = start(std::move(idx), &p.done, /*ahead=*/true);
  ahead_[{step, k}] = std::move(p);
}

std::shared_ptr<const ShardSamples> SampleLoader::fetch(std::int64_t step, int k, const std::int64_t* idx,
                                                        std::size_t count) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto it = ahead_.begin(); it != ahead_.end() && it->first.first < step;) {
    wait(it->second.done);
    it = ahead_.erase(it);
  }
  std::shared_ptr<ShardSamples> s;
  auto it = ahead_.find({step, k});
  if (it != ahead_.end() && it->second.samples->idx.size() == count &&
      std::equal(idx, idx + count, it->second.samples->idx.begin())) {
    wait(it->second.done);
    s = it->second.samples;
  } else {
    std::shared_future<void> done;
    s = start(std::vector<std::int64_t>(idx, idx + count), &done, /*ahead=*/false);
    wait(done);
  }
  wait_ += since(t0);
  return s;
}

std::shared_ptr<const ShardSamples> SampleLoader::read_alone(const std::vector<std::int64_t>& idx) {
  for (auto& [key, p] : ahead_) wait(p.done);
  std::shared_future<void> done;
  auto s = start(idx, &done, /*ahead=*/false);
  wait(done);
  return s;
}

double SampleLoader::take_wait_seconds() { return std::exchange(wait_, 0.0); }

double SampleLoader::take_read_seconds() {
  std::lock_guard<std::mutex> lock(read_mu_);
  return std::exchange(read_, 0.0);
}

}  // namespace culprit::harness
