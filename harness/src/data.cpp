#include "data.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "culprit/h5.h"
#include "finite.h"
#include "rng.h"

namespace culprit::harness {

namespace {
std::int64_t prod(const std::vector<std::int64_t>& v) {
  std::int64_t p = 1;
  for (auto d : v) p *= d;
  return p;
}

// Synthetic samples: x is uniform in [-1, 1); the label is the argmax of a fixed random linear
// "teacher" (a learnable task). gpt: sequences t_j = (a + b*j) mod V with a, b from the sample key.
void make_synthetic(const TrainConfig& cfg, Dataset* d) {
  const ModelKind kind = cfg.model.kind;
  d->source = "synthetic";
  d->n = cfg.samples;
  if (kind == ModelKind::kGpt) {
    const std::int64_t T = gpt_seq_len(cfg), V = gpt_vocab(cfg);
    d->x_dtype = d->y_dtype = DType::kInt64;
    d->x_shape = d->y_shape = {T};
    d->classes = V;
    d->x.resize(d->n * T * 8);
    d->y.resize(d->n * T * 8);
    auto* x = reinterpret_cast<std::int64_t*>(d->x.data());
    auto* y = reinterpret_cast<std::int64_t*>(d->y.data());
    for (std::int64_t i = 0; i < d->n; ++i) {
      const std::uint64_t h = key(cfg.seed, kStreamSample, i, 0);
      const std::int64_t a = static_cast<std::int64_t>(h % V);
      const std::int64_t b = 1 + static_cast<std::int64_t>((h >> 32) % (V - 1 > 0 ? V - 1 : 1));
      for (std::int64_t j = 0; j < T; ++j) {
        x[i * T + j] = (a + b * j) % V;
        y[i * T + j] = (a + b * (j + 1)) % V;
      }
    }
    return;
  }
  std::vector<std::int64_t> shape = cfg.sample_shape;
  if (shape.empty()) shape = kind == ModelKind::kCnn ? std::vector<std::int64_t>{1, 16, 16} : std::vector<std::int64_t>{32};
  const std::int64_t C = cfg.classes ? cfg.classes : 10;
  const std::int64_t D = prod(shape);
  d->x_dtype = DType::kFloat32;
  d->y_dtype = DType::kInt64;
  d->x_shape = shape;
  d->y_shape = {};
  d->classes = C;
  d->x.resize(d->n * D * 4);
  d->y.resize(d->n * 8);
  auto* x = reinterpret_cast<float*>(d->x.data());
  auto* y = reinterpret_cast<std::int64_t*>(d->y.data());
  std::vector<double> w(C * D);
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t j = 0; j < D; ++j) w[c * D + j] = unit_float(key(cfg.seed, kStreamTeacher, c, j));
  for (std::int64_t i = 0; i < d->n; ++i) {
    float* xi = x + i * D;
    for (std::int64_t j = 0; j < D; ++j) xi[j] = unit_float(key(cfg.seed, kStreamSample, i, j));
    std::int64_t best = 0;
    double best_score = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (std::int64_t j = 0; j < D; ++j) s += w[c * D + j] * xi[j];
      if (c == 0 || s > best_score) best = c, best_score = s;
    }
    y[i] = best;
  }
}

// A NaN or Inf in the data would reach every replica the same way and look like the model's own
// instability; it is the data's, and said so at load, with the sample that holds it.
Status check_finite(const std::string& path, const char* name, DType dtype, const ByteBuffer& b, std::int64_t per_sample) {
  if (dtype != DType::kFloat32 || per_sample <= 0) return Status::OK();
  const auto* v = reinterpret_cast<const float*>(b.data());
  const std::size_t n = b.size() / sizeof(float);
  if (all_finite(v, n)) return Status::OK();
  std::size_t i = 0;
  while (i < n && std::isfinite(v[i])) ++i;
  return Status::BadInput("data '" + path + "': " + name + " holds a non-finite value (" + std::to_string(v[i]) +
                          ") in sample " + std::to_string(static_cast<std::int64_t>(i) / per_sample) + " (element " +
                          std::to_string(static_cast<std::int64_t>(i) % per_sample) + ")");
}

// Integer labels are class indices: each must be in [0, classes), where classes is --classes, or
// (--classes 0) the largest label + 1, itself at most kMaxClasses. A label past the output width
// would otherwise widen the model silently (or ask for an impossible allocation); the message names
// the range and the first label outside it.
Status check_labels(const std::string& path, std::int64_t classes, const char* option, Dataset* d) {
  const auto* lab = reinterpret_cast<const std::int64_t*>(d->y.data());
  const std::int64_t m = d->n * d->y_numel(), per_sample = std::max<std::int64_t>(1, d->y_numel());
  const std::int64_t limit = classes > 0 ? classes : kMaxClasses;
  for (std::int64_t i = 0; i < m; ++i) {
    if (lab[i] >= 0 && lab[i] < limit) {
      if (lab[i] > d->max_label) d->max_label = lab[i], d->max_label_at = i;
      continue;
    }
    const std::string where = " at sample " + std::to_string(i / per_sample) +
                              (per_sample > 1 ? " (element " + std::to_string(i % per_sample) + ")" : "");
    const std::string valid = "valid class labels are [0, " + std::to_string(limit) + ")";
    if (lab[i] < 0) return Status::BadInput("data '" + path + "': y holds a negative class label (" + std::to_string(lab[i]) + ")" + where + "; " + valid);
    return Status::BadInput("data '" + path + "': y holds class label " + std::to_string(lab[i]) + where + "; " + valid +
                            (classes > 0 ? " with --" + std::string(option) + " " + std::to_string(classes)
                                         : " (give --" + std::string(option) + " C if the data has C classes; at most " + std::to_string(kMaxClasses) + ")"));
  }
  d->classes = classes > 0 ? classes : d->max_label + 1;
  return Status::OK();
}

Status read_hdf5(const std::string& path, std::int64_t classes, const char* option, Dataset* d) {
  d->source = "hdf5:" + path;
  h5::Handle file;
  CULPRIT_RETURN_IF_ERROR(h5::open_read(path, &file));
  h5::Array x, y;
  CULPRIT_RETURN_IF_ERROR(h5::read_array(file, path, "x", &x));
  CULPRIT_RETURN_IF_ERROR(h5::read_array(file, path, "y", &y));
  if (x.shape.empty()) return Status::BadInput("data '" + path + "': dataset 'x' must have a sample dimension, got a scalar");
  if (y.shape.empty()) return Status::BadInput("data '" + path + "': dataset 'y' must have a sample dimension, got a scalar");
  if (x.shape[0] != y.shape[0])
    return Status::BadInput("data '" + path + "': x has " + std::to_string(x.shape[0]) + " samples but y has " +
                         std::to_string(y.shape[0]));
  if (x.shape[0] < 1) return Status::BadInput("data '" + path + "': x and y hold no samples");
  d->n = x.shape[0];
  d->x_dtype = x.dtype;
  d->x_shape.assign(x.shape.begin() + 1, x.shape.end());
  d->x = std::move(x.bytes);
  d->y_dtype = y.dtype;
  d->y_shape.assign(y.shape.begin() + 1, y.shape.end());
  d->y = std::move(y.bytes);
  CULPRIT_RETURN_IF_ERROR(check_finite(path, "x", d->x_dtype, d->x, d->x_numel()));
  if (!d->classification()) return check_finite(path, "y", d->y_dtype, d->y, d->y_numel());
  return check_labels(path, classes, option, d);
}
}  // namespace

std::int64_t Dataset::x_numel() const { return prod(x_shape); }
std::int64_t Dataset::y_numel() const { return prod(y_shape); }

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

Status load_dataset(const TrainConfig& cfg, Dataset* out) {
  *out = Dataset();
  if (cfg.data.kind == DataKind::kSynthetic) {
    make_synthetic(cfg, out);
    return Status::OK();
  }
  // The data file is the user's input: a file the HDF5 layer finds malformed is bad input here.
  const bool gpt = cfg.model.kind == ModelKind::kGpt;
  Status st = read_hdf5(cfg.data.path, gpt ? cfg.gpt.vocab : cfg.classes, gpt ? "vocab" : "classes", out);
  return st.code() == StatusCode::kDamaged ? Status::BadInput(st.message()) : st;
}

}  // namespace culprit::harness
