// Synthetic data (docs/determinism.md, "Randomness"): sample i is a pure function of (seed, i),
// computed when it is read. x is uniform in [-1, 1); the label is the argmax of a fixed random linear
// "teacher" (a learnable task). gpt: sequences t_j = (a + b*j) mod V with a, b from the sample key.
#include <algorithm>
#include <cstring>

#include "culprit/data.h"
#include "culprit/rng.h"

namespace culprit::harness {

namespace {

class SyntheticSource : public DataSource {
 public:
  SyntheticSource(const TrainConfig& cfg, const Dataset& d) : seed_(cfg.seed), gpt_(cfg.model.kind == ModelKind::kGpt) {
    if (gpt_) {
      t_ = d.x_shape[0];
      v_ = d.classes;
      return;
    }
    dim_ = d.x_numel();
    classes_ = d.classes;
    teacher_.resize(static_cast<std::size_t>(classes_ * dim_));
    for (std::int64_t c = 0; c < classes_; ++c)
      for (std::int64_t j = 0; j < dim_; ++j) teacher_[c * dim_ + j] = unit_float(key(seed_, kStreamTeacher, c, j));
  }

  Status read(const std::int64_t* idx, std::size_t count, unsigned char* x, unsigned char* y) override {
    for (std::size_t r = 0; r < count; ++r) {
      if (gpt_) tokens(idx[r], reinterpret_cast<std::int64_t*>(x) + r * t_, reinterpret_cast<std::int64_t*>(y) + r * t_);
      else classified(idx[r], reinterpret_cast<float*>(x) + r * dim_, reinterpret_cast<std::int64_t*>(y) + r);
    }
    return Status::OK();
  }

  SampleLocation locate(std::int64_t, SamplePart) override { return {}; }
  std::vector<std::pair<std::int64_t, std::int64_t>> samples_in(std::uint64_t, std::uint64_t) override { return {}; }

 private:
  void tokens(std::int64_t i, std::int64_t* x, std::int64_t* y) const {
    const std::uint64_t h = key(seed_, kStreamSample, i, 0);
    const std::int64_t a = static_cast<std::int64_t>(h % v_);
    const std::int64_t b = 1 + static_cast<std::int64_t>((h >> 32) % (v_ - 1 > 0 ? v_ - 1 : 1));
    for (std::int64_t j = 0; j < t_; ++j) {
      x[j] = (a + b * j) % v_;
      y[j] = (a + b * (j + 1)) % v_;
    }
  }

  void classified(std::int64_t i, float* x, std::int64_t* y) const {
    for (std::int64_t j = 0; j < dim_; ++j) x[j] = unit_float(key(seed_, kStreamSample, i, j));
    std::int64_t best = 0;
    double best_score = 0;
    for (std::int64_t c = 0; c < classes_; ++c) {
      double s = 0;
      for (std::int64_t j = 0; j < dim_; ++j) s += teacher_[c * dim_ + j] * x[j];
      if (c == 0 || s > best_score) best = c, best_score = s;
    }
    *y = best;
  }

  std::uint64_t seed_;
  bool gpt_;
  std::int64_t t_ = 0, v_ = 0, dim_ = 0, classes_ = 0;
  std::vector<double> teacher_;
};

}  // namespace

Status open_synthetic(const TrainConfig& cfg, Dataset* d) {
  d->source = "synthetic";
  d->n = cfg.samples;
  if (cfg.model.kind == ModelKind::kGpt) {
    d->x_dtype = d->y_dtype = DType::kInt64;
    d->x_shape = d->y_shape = {gpt_seq_len(cfg)};
    d->classes = gpt_vocab(cfg);
  } else {
    d->x_shape = cfg.sample_shape;
    if (d->x_shape.empty())
      d->x_shape = cfg.model.kind == ModelKind::kCnn ? std::vector<std::int64_t>{1, 16, 16} : std::vector<std::int64_t>{32};
    d->x_dtype = DType::kFloat32;
    d->y_dtype = DType::kInt64;
    d->y_shape = {};
    d->classes = cfg.classes ? cfg.classes : 10;
  }
  d->reader = std::make_shared<SyntheticSource>(cfg, *d);
  return Status::OK();
}

}  // namespace culprit::harness
