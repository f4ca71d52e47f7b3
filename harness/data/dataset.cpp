// What every data source shares: the checks each sample passes, and opening the run's data with one
// scan of every sample (unless prepare-data recorded it for this file). The sources themselves:
// data_synthetic.cpp, data_hdf5.cpp, data_tokens.cpp.
#include "culprit/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "data/data_prepare.h"
#include "culprit/finite.h"

namespace culprit::harness {

namespace {

std::int64_t prod(const std::vector<std::int64_t>& v) {
  std::int64_t p = 1;
  for (auto d : v) p *= d;
  return p;
}

// The samples the scan at open reads at once: about 4 MiB of them, so memory stays flat whatever
// the data set's size.
constexpr std::size_t kScanBytes = 4u << 20;

}  // namespace

std::int64_t Dataset::x_numel() const { return prod(x_shape); }
std::int64_t Dataset::y_numel() const { return prod(y_shape); }

std::string SampleLocation::text() const {
  if (file.empty()) return "not stored (synthetic data)";
  return "file '" + file + "' offset " + std::to_string(offset) + (detail.empty() ? "" : " (" + detail + ")");
}

namespace {

// " (file 'F' offset N ...)" for the part of a sample that holds the bad value (an HDF5 file's x or
// y dataset), nothing for synthetic data.
std::string stored_at(const SampleChecks& k, std::int64_t sample, SamplePart part) {
  if (!k.source) return "";
  const SampleLocation loc = k.source->locate(sample, part);
  return loc.file.empty() ? "" : " (" + loc.text() + ")";
}

std::string where_in(std::int64_t sample, std::int64_t element, std::int64_t per_sample, const char* unit) {
  return " at sample " + std::to_string(sample) +
         (per_sample > 1 ? " (" + std::string(unit) + " " + std::to_string(element) + ")" : "");
}

// A NaN or Inf in the data would reach every replica the same way and look like the model's own
// instability; it is the data's, and said so, with the sample that holds it.
Status check_finite(const SampleChecks& k, SamplePart part, const float* v, std::int64_t per_sample,
                    std::int64_t sample_of_row0, const std::int64_t* idx, std::size_t rows) {
  if (all_finite(v, rows * static_cast<std::size_t>(per_sample))) return Status::OK();
  std::size_t i = 0;
  while (std::isfinite(v[i])) ++i;
  const std::size_t row = i / static_cast<std::size_t>(per_sample);
  const std::int64_t sample = idx ? idx[row] : sample_of_row0 + static_cast<std::int64_t>(row);
  const char* name = part == SamplePart::kY ? "y" : "x";
  return Status::BadInput(k.data + ": " + name + " holds a non-finite value (" + std::to_string(v[i]) + ") in sample " +
                          std::to_string(sample) + " (element " +
                          std::to_string(static_cast<std::int64_t>(i) % per_sample) + ")" +
                          stored_at(k, sample, part));
}

// Integer labels are class indices: each must be in [0, classes), where classes is --classes, or
// (--classes 0) the largest label + 1, itself at most kMaxClasses. A label past the output width
// would otherwise widen the model silently (or ask for an impossible allocation).
Status check_labels(const SampleChecks& k, const std::int64_t* lab, std::int64_t per_sample,
                    std::int64_t sample_of_row0, const std::int64_t* idx, std::size_t rows, Dataset* stats) {
  const std::int64_t limit = k.classes > 0 ? k.classes : kMaxClasses;
  const std::int64_t m = static_cast<std::int64_t>(rows) * per_sample;
  for (std::int64_t i = 0; i < m; ++i) {
    if (lab[i] >= 0 && lab[i] < limit) {
      if (stats && lab[i] > stats->max_label) {
        const std::int64_t row = i / per_sample;
        stats->max_label = lab[i];
        stats->max_label_at = (idx ? idx[row] : sample_of_row0 + row) * per_sample + i % per_sample;
      }
      continue;
    }
    const std::int64_t row = i / per_sample, sample = idx ? idx[row] : sample_of_row0 + row;
    const std::string where = where_in(sample, i % per_sample, per_sample, "element");
    const std::string valid = "valid class labels are [0, " + std::to_string(limit) + ")";
    if (lab[i] < 0)
      return Status::BadInput(k.data + ": y holds a negative class label (" + std::to_string(lab[i]) + ")" + where + "; " + valid +
                              stored_at(k, sample, SamplePart::kY));
    return Status::BadInput(k.data + ": y holds class label " + std::to_string(lab[i]) + where + "; " + valid +
                            (k.classes > 0 && !k.classes_given ? std::string(" (the width the data had when the run started)")
                             : k.classes > 0 ? " with --" + std::string(k.class_option) + " " + std::to_string(k.classes)
                                           : " (give --" + std::string(k.class_option) + " C if the data has C classes; at most " +
                                                 std::to_string(kMaxClasses) + ")") +
                            stored_at(k, sample, SamplePart::kY));
  }
  return Status::OK();
}

Status check_tokens(const SampleChecks& k, const std::int64_t* tok, std::int64_t per_sample, std::int64_t sample_of_row0,
                    const std::int64_t* idx, std::size_t rows, Dataset* stats) {
  const std::int64_t m = static_cast<std::int64_t>(rows) * per_sample;
  for (std::int64_t i = 0; i < m; ++i) {
    if (tok[i] >= 0 && tok[i] < k.token_limit) {
      if (stats) stats->max_token = std::max(stats->max_token, tok[i]);
      continue;
    }
    const std::int64_t row = i / per_sample, sample = idx ? idx[row] : sample_of_row0 + row;
    return Status::BadInput(k.token_prefix + k.data + ": x holds token id " + std::to_string(tok[i]) + " at sample " +
                            std::to_string(sample) + " (position " + std::to_string(i % per_sample) +
                            "); valid token ids are [0, " + std::to_string(k.token_limit) + ")" +
                            (k.token_option_given ? " with --" + std::string(k.token_option) + " " + std::to_string(k.token_limit) : "") +
                            stored_at(k, sample, SamplePart::kX));
  }
  return Status::OK();
}

// Tokens data: sample i is the window of tokens [i*T, i*T + T] of its file, x its first T and y its
// last T, so a token out of range shows in both. It is named once, as what it is: a token of the
// window at its position, and its own place in the file (the window's offset plus its position).
Status check_windows(const SampleChecks& k, std::int64_t t, std::int64_t sample_of_row0, const std::int64_t* idx,
                     std::size_t rows, const std::int64_t* x, const std::int64_t* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::int64_t p = 0; p <= t; ++p) {
      const std::int64_t tok = p < t ? x[static_cast<std::int64_t>(r) * t + p] : y[static_cast<std::int64_t>(r) * t + t - 1];
      if (tok >= 0 && tok < k.token_limit) continue;
      const std::int64_t sample = idx ? idx[r] : sample_of_row0 + static_cast<std::int64_t>(r);
      std::string where;
      if (k.source) {
        const SampleLocation loc = k.source->locate(sample, SamplePart::kX);
        if (!loc.file.empty())
          where = " (file '" + loc.file + "' offset " +
                  std::to_string(loc.offset + static_cast<std::uint64_t>(p) * (loc.bytes / static_cast<std::uint64_t>(t + 1))) +
                  ", token " + std::to_string(sample * t + p) + " of the file)";
      }
      return Status::BadInput(k.data + ": token id " + std::to_string(tok) + " at sample " + std::to_string(sample) +
                              " (position " + std::to_string(p) + " of its window of " + std::to_string(t + 1) +
                              " tokens: " + (p < t ? "x[" + std::to_string(p) + "]" : std::string()) +
                              (p > 0 && p < t ? ", " : "") + (p > 0 ? "y[" + std::to_string(p - 1) + "]" : std::string()) +
                              "); valid token ids are [0, " + std::to_string(k.token_limit) + ")" +
                              (k.token_option_given ? " (vocab " + std::to_string(k.token_limit) + ")" : "") + where);
    }
  }
  return Status::OK();
}

Status check_all(const Dataset& d, const SampleChecks& k, const std::int64_t* idx, std::int64_t first,
                 std::size_t count, const unsigned char* x, const unsigned char* y, Dataset* stats) {
  const std::int64_t xn = std::max<std::int64_t>(1, d.x_numel()), yn = std::max<std::int64_t>(1, d.y_numel());
  if (d.x_dtype == DType::kFloat32)
    CULPRIT_RETURN_IF_ERROR(check_finite(k, SamplePart::kX, reinterpret_cast<const float*>(x), xn, first, idx, count));
  if (!d.classification())
    CULPRIT_RETURN_IF_ERROR(check_finite(k, SamplePart::kY, reinterpret_cast<const float*>(y), yn, first, idx, count));
  else
    CULPRIT_RETURN_IF_ERROR(check_labels(k, reinterpret_cast<const std::int64_t*>(y), yn, first, idx, count, stats));
  if (d.x_dtype == DType::kInt64 && k.token_limit > 0)
    return check_tokens(k, reinterpret_cast<const std::int64_t*>(x), xn, first, idx, count, stats);
  return Status::OK();
}

}  // namespace

Status check_samples(const Dataset& d, const SampleChecks& k, const std::int64_t* idx, std::int64_t first,
                     std::size_t count, const unsigned char* x, const unsigned char* y, Dataset* stats) {
  if (first >= 0) idx = nullptr;
  Status st = check_all(d, k, idx, first, count, x, y, stats);
  // The checks above pass over x and y as two arrays; a token file's refusal is worded by the window
  // (only on failure: the good path costs nothing more).
  if (!st.ok() && k.token_windows && k.token_limit > 0 && d.x_dtype == DType::kInt64 && d.y_dtype == DType::kInt64 &&
      d.x_shape.size() == 1 && d.x_shape == d.y_shape) {
    Status w = check_windows(k, d.x_shape[0], first, idx, count, reinterpret_cast<const std::int64_t*>(x),
                             reinterpret_cast<const std::int64_t*>(y));
    if (!w.ok()) return w;
  }
  return st;
}

namespace {

// The checks of the run's data: its labels against --classes (gpt: --vocab), gpt's tokens against
// --vocab; with neither given, against kMaxClasses, and the scan finds the width.
SampleChecks checks_for(const TrainConfig& cfg, const Dataset& d) {
  SampleChecks k;
  k.data = "data '" + d.source.substr(d.source.find(':') + 1) + "'";
  k.source = d.reader.get();
  if (cfg.data.kind == DataKind::kTokens) {  // the vocabulary: --vocab or PATH.json (open_tokens)
    k.classes = d.classes;
    k.class_option = "vocab";
    k.token_limit = d.classes > 0 ? d.classes : kMaxClasses;
    k.token_option_given = d.classes > 0;
    k.token_windows = true;
    return k;
  }
  const bool gpt = cfg.model.kind == ModelKind::kGpt;
  k.classes = gpt ? cfg.gpt.vocab : cfg.classes;
  k.class_option = gpt ? "vocab" : "classes";
  if (d.x_dtype == DType::kInt64 && gpt) {
    k.token_limit = cfg.gpt.vocab > 0 ? cfg.gpt.vocab : kMaxClasses;
    k.token_option_given = cfg.gpt.vocab > 0;
    k.token_prefix = "model gpt: ";
  }
  return k;
}

// Every sample once, through a buffer of about kScanBytes: the checks and the largest label and token.
Status scan(const SampleChecks& k, Dataset* d) {
  const std::size_t per = d->x_bytes() + d->y_bytes();
  const std::int64_t rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(kScanBytes / std::max<std::size_t>(1, per)));
  std::vector<unsigned char> x, y;
  std::vector<std::int64_t> idx;
  for (std::int64_t lo = 0; lo < d->n; lo += rows) {
    const std::int64_t m = std::min(rows, d->n - lo);
    idx.resize(static_cast<std::size_t>(m));
    for (std::int64_t i = 0; i < m; ++i) idx[static_cast<std::size_t>(i)] = lo + i;
    x.resize(static_cast<std::size_t>(m) * d->x_bytes());
    y.resize(static_cast<std::size_t>(m) * d->y_bytes());
    CULPRIT_RETURN_IF_ERROR(d->reader->read(idx.data(), idx.size(), x.data(), y.data()));
    CULPRIT_RETURN_IF_ERROR(check_samples(*d, k, nullptr, lo, idx.size(), x.data(), y.data(), d));
  }
  return Status::OK();
}

}  // namespace

Status scan_dataset(const TrainConfig& cfg, Dataset* d) { return scan(checks_for(cfg, *d), d); }

SampleChecks run_checks(const TrainConfig& cfg, const Dataset& d) {
  SampleChecks k = checks_for(cfg, d);
  if (d.classification() && k.classes == 0) {
    k.classes = d.classes;
    k.classes_given = false;
  }
  if (k.token_limit > 0) k.token_limit = d.classes;
  return k;
}

Status load_dataset(const TrainConfig& cfg, Dataset* out, const OpenOptions& how) {
  *out = Dataset();
  if (cfg.data.kind == DataKind::kSynthetic) return open_synthetic(cfg, out);
  const OpenExternalData& ext = external_data();
  Status st = cfg.data.kind == DataKind::kHdf5     ? open_hdf5(cfg, cfg.data.path, out)
              : cfg.data.kind == DataKind::kTokens ? open_tokens(cfg, cfg.data.path, out, how.token_window)
              : ext                                ? ext(cfg, out)
                                                   : no_external_source("data python");
  SampleChecks k;
  if (st.ok()) {
    k = checks_for(cfg, *out);
    // prepare-data's record of this very file stands for the scan (docs/data.md); otherwise every
    // sample is read once now, so a bad label or value is one line before any training.
    PreparedFacts facts;
    if (!how.scan && cfg.data.kind != DataKind::kPython && find_prepared(cfg.data, *out, &facts) && facts.checked(k.classes, k.token_limit)) {
      out->max_label = facts.max_label;
      out->max_label_at = facts.max_label_at;
      out->max_token = facts.max_token;
    } else {
      st = scan(k, out);
    }
  }
  // The data file is the user's input: a file the HDF5 layer finds malformed is bad input here.
  if (!st.ok()) return st.code() == StatusCode::kDamaged ? Status::BadInput(st.message()) : st;
  if (out->classification()) out->classes = k.classes > 0 ? k.classes : std::max(out->max_label, out->max_token) + 1;
  return Status::OK();
}

}  // namespace culprit::harness
