#include "culprit/fault_spec.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <iterator>
#include <vector>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "culprit/harness.h"
#include "culprit/rng.h"

namespace culprit::harness {

namespace {
template <class E>
Status lookup(const std::string& key, const std::string& value, E* out) {
  if (parse_name(value, out)) return Status::OK();
  return Status::BadInput("--inject: unknown " + key + " '" + value + "' (valid: " + names_list<E>() + ")");
}

Status number(const std::string& key, const std::string& value, double* out) {
  // Decimal only: std::stod would also take 0x3 (hex), inf, nan and leading blanks.
  const bool decimal = !value.empty() && (std::isdigit(static_cast<unsigned char>(value[0])) || value[0] == '-' ||
                                          value[0] == '+' || value[0] == '.') &&
                       value.find_first_not_of("0123456789+-.eE") == std::string::npos;
  if (!decimal) return Status::BadInput("--inject: " + key + "=" + value + " is not a decimal number");
  try {
    std::size_t used = 0;
    *out = std::stod(value, &used);
    if (used == value.size() && std::isfinite(*out)) return Status::OK();
  } catch (const std::exception&) {
  }
  return Status::BadInput("--inject: " + key + "=" + value + " is not a finite number");
}

// A number key's value within [lo, hi] (an integer when integral): every key has a range, said in
// the error, so a step of 1e30 is refused here instead of overflowing the cast to an integer.
Status bounded(const std::string& key, const std::string& value, double lo, double hi, bool integral, double* out) {
  CULPRIT_RETURN_IF_ERROR(number(key, value, out));
  if (*out >= lo && *out <= hi && (!integral || *out == std::floor(*out))) return Status::OK();
  std::ostringstream os;
  os.precision(17);
  os << "--inject: " << key << " must be " << (integral ? "an integer" : "a number") << " in [" << lo << ", " << hi
     << "], got " << value;
  return Status::BadInput(os.str());
}
}  // namespace

bool at_layer_output(Phase p) { return p == Phase::kForward || p == Phase::kBackward; }
bool needs_layer(Phase p) { return p != Phase::kData && p != Phase::kLr && p != Phase::kRng; }
bool takes_stale(Phase p) {
  return p == Phase::kGrad || p == Phase::kParam || p == Phase::kData || p == Phase::kLr || p == Phase::kRng;
}

Status check_fault_text(const std::string& text) {
  static const char* const keys[] = {"step", "rank", "host", "layer", "index", "phase", "kind", "bit", "factor", "seconds", "mode", "p"};
  std::vector<std::string> seen;
  std::size_t at = 0;
  for (;;) {
    const std::size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty())
      return Status::BadInput("--inject: '" + text + "' has an empty item (a leading, trailing or doubled comma)");
    const auto eq = item.find('=');
    if (eq == std::string::npos) return Status::BadInput("--inject: '" + item + "' is not key=value");
    const std::string key = item.substr(0, eq);
    if (std::find(std::begin(keys), std::end(keys), key) == std::end(keys))
      return Status::BadInput("--inject: unknown key '" + key +
                              "' (valid: step, rank, host, layer, index, phase, kind, bit, factor, seconds, mode, p)");
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      return Status::BadInput("--inject: key '" + key + "' is given twice in '" + text.substr(0, 200) +
                              (text.size() > 200 ? "..." : "") + "' (each key once)");
    seen.push_back(key);
    const std::string value = item.substr(eq + 1);
    double ignored = 0;
    if (key != "layer" && key != "phase" && key != "kind" && key != "mode" && key != "host" &&
        !(key == "rank" && value == "all"))
      CULPRIT_RETURN_IF_ERROR(number(key, value, &ignored));  // its range: parse_fault's
    if (comma == std::string::npos) return Status::OK();
    at = comma + 1;
  }
}

Status check_fault_texts(const std::vector<std::string>& texts) {
  std::size_t bytes = 0;
  for (const auto& t : texts) {
    CULPRIT_RETURN_IF_ERROR(check_fault_text(t));
    bytes += t.size();
  }
  if (bytes > kMaxInjectBytes)
    return Status::BadInput("--inject: " + std::to_string(texts.size()) + " fault(s) of " + std::to_string(bytes) +
                            " bytes in all, more than " + std::to_string(kMaxInjectBytes) +
                            " (the run records them in every checkpoint and trace header)");
  return Status::OK();
}

Status parse_fault(const std::string& text, const std::vector<std::string>& layers, FaultSpec* out) {
  *out = FaultSpec();
  CULPRIT_RETURN_IF_ERROR(check_fault_text(text));
  out->text = text;
  bool have_phase = false, have_layer = false, have_rank = false;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) return Status::BadInput("--inject: '" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    double v = 0;
    have_rank = have_rank || key == "rank";
    if (key == "rank" && value == "all") {
      out->rank = -1;
    } else if (key == "host") {
      // A plain host name, as gethostname() returns it: the fault belongs to that node's devices.
      if (value.empty() || value.size() > 255 || !std::isalnum(static_cast<unsigned char>(value[0])) ||
          value.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
              std::string::npos)
        return Status::BadInput("--inject: host '" + value.substr(0, 64) +
                                "' is not a plain host name (letters, digits, '.', '_', '-')");
      out->host = value;
    } else if (key == "step") {
      CULPRIT_RETURN_IF_ERROR(bounded(key, value, 1, static_cast<double>(kMaxSteps), true, &v));
      out->step = static_cast<std::int64_t>(v);
    } else if (key == "rank") {
      CULPRIT_RETURN_IF_ERROR(bounded(key, value, 0, 1 << 30, true, &v));
      out->rank = static_cast<int>(v);
    } else if (key == "index") {
      // 2^53: every integer below it is a double, and no tensor has more elements.
      CULPRIT_RETURN_IF_ERROR(bounded(key, value, 0, 9007199254740992.0, true, &v));
      out->index = static_cast<std::int64_t>(v);
    } else if (key == "bit") {
      CULPRIT_RETURN_IF_ERROR(bounded(key, value, 0, 31, true, &v));
      out->bit = static_cast<int>(v);
    } else if (key == "factor") {
      CULPRIT_RETURN_IF_ERROR(number(key, value, &out->factor));
    } else if (key == "seconds") {
      CULPRIT_RETURN_IF_ERROR(bounded(key, value, 0, 86400, false, &out->seconds));
    } else if (key == "p") {
      CULPRIT_RETURN_IF_ERROR(bounded(key, value, 0, 1, false, &out->p));
    } else if (key == "layer") {
      out->layer = value;
      have_layer = true;
    } else if (key == "phase") {
      CULPRIT_RETURN_IF_ERROR(lookup(key, value, &out->phase));
      have_phase = true;
    } else if (key == "kind") {
      CULPRIT_RETURN_IF_ERROR(lookup(key, value, &out->kind));
    } else if (key == "mode") {
      CULPRIT_RETURN_IF_ERROR(lookup(key, value, &out->mode));
    } else {
      return Status::BadInput("--inject: unknown key '" + key +
                           "' (valid: step, rank, host, layer, index, phase, kind, bit, factor, seconds, mode, p)");
    }
  }
  if (!have_phase) return Status::BadInput("--inject: '" + text + "' needs phase=");
  // host= without rank=: every rank on that host (one device a node in the usual layout).
  if (!out->host.empty() && !have_rank) out->rank = -1;
  if (out->step < 1) return Status::BadInput("--inject: step must be at least 1");
  const Phase ph = out->phase;
  if (out->kind == FaultKind::kStale && !takes_stale(ph))
    return Status::BadInput("--inject: kind stale applies to phases grad, param, data, lr and rng, not " +
                         std::string(name_of(ph)));
  if (ph == Phase::kRng && out->kind != FaultKind::kStale && out->kind != FaultKind::kBitflip &&
      out->kind != FaultKind::kHang)
    return Status::BadInput("--inject: phase rng (the dropout seed) takes kind stale, bitflip or hang");
  if (needs_layer(ph)) {
    std::string valid;
    bool found = false;
    for (const auto& l : layers) {
      valid += (valid.empty() ? "" : ", ") + l;
      found = found || l == out->layer;
    }
    if (!have_layer) return Status::BadInput("--inject: phase " + std::string(name_of(out->phase)) +
                                          " needs layer= (valid: " + valid + ")");
    if (!found) return Status::BadInput("--inject: unknown layer '" + out->layer + "' (valid: " + valid + ")");
  }
  return Status::OK();
}

bool fault_fires(const FaultSpec& s, int rank, std::int64_t step, bool replay, std::uint64_t seed,
                 std::uint64_t occurrence, const std::string& host) {
  if (s.rank >= 0 && rank != s.rank) return false;
  if (!s.host.empty() && host != s.host) return false;
  switch (s.mode) {
    case FaultMode::kTransient: return !replay && step == s.step;
    case FaultMode::kPersistent: return step >= s.step;
    case FaultMode::kIntermittent: {
      if (step < s.step) return false;
      const std::uint64_t h = splitmix64(splitmix64(seed ^ 0x1f1f) + static_cast<std::uint64_t>(step) * 1315423911ULL +
                                         occurrence);
      return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0) < s.p;
    }
  }
  return false;
}

float corrupt_value(const FaultSpec& s, float v) {
  switch (s.kind) {
    case FaultKind::kBitflip: {
      std::uint32_t u;
      std::memcpy(&u, &v, 4);
      u ^= (1u << s.bit);
      std::memcpy(&v, &u, 4);
      return v;
    }
    case FaultKind::kNan: return std::numeric_limits<float>::quiet_NaN();
    case FaultKind::kScale: return static_cast<float>(v * s.factor);
    case FaultKind::kNoise: {
      // Differs every time it runs, like a nondeterministic kernel: a counter and the clock.
      static std::atomic<std::uint64_t> counter{0};
      const std::uint64_t h = splitmix64(counter.fetch_add(1) ^
                                         static_cast<std::uint64_t>(
                                             std::chrono::steady_clock::now().time_since_epoch().count()));
      const float eps = (static_cast<float>(h >> 40) * (1.0f / 16777216.0f) + 0.5f) * 1e-3f;
      return v + (v == 0.0f ? eps : v * eps);
    }
    case FaultKind::kStale:
    case FaultKind::kHang: return v;  // applied by the trainer, not to a value
  }
  return v;
}

}  // namespace culprit::harness
