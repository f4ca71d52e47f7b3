#include "arbiter.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "culprit/fingerprint.h"
#include "opinions.h"

namespace culprit::bisect {

namespace {

// ||g - g64|| / ||g64|| over the first n elements where the two ranks' float32 results differ
// (bitwise); infinite when g is not finite there, NaN when the float64 gradient is not finite.
double distance(const std::vector<float>& g, const std::vector<float>& g0, const std::vector<float>& g1,
                const std::vector<double>& g64, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(&g0[i], &g1[i], sizeof(float)) == 0) continue;
    if (!std::isfinite(g[i]))  // beyond float32's range in float64 too: float32 cannot be told wrong
      return std::abs(g64[i]) > std::numeric_limits<float>::max() ? std::numeric_limits<double>::quiet_NaN()
                                                                   : std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(g[i]) - g64[i];
    num += d * d;
    den += g64[i] * g64[i];
  }
  if (!std::isfinite(den)) return std::numeric_limits<double>::quiet_NaN();
  // Every differing element is exactly zero in float64: a result that is too is exact (0), one
  // that is not is off by more than any relative measure (infinite).
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

}  // namespace

namespace {

// Whether the two ranks' recomputations are bitwise equal (`bytes` bytes at `data`). Collective.
bool same_on_both(const Context& ctx, const void* data, std::size_t bytes) {
  const std::uint64_t fp = fingerprint_bytes(data, bytes);
  std::uint64_t fps[2] = {0, 0};
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallgather(&fp, 1, MPI_UINT64_T, fps, 1, MPI_UINT64_T, ctx.comm.comm, &_culprit_req));
  return fps[0] == fps[1];
}

// Both ranks' float32 values (n of them) against the float64 ones the ranks computed alike.
// Collective.
Status measure(Context& ctx, const std::vector<float>& mine, const std::vector<double>& wide, std::size_t n,
               Arbitration* out) {
  // Both ranks must get the same float64 bits: a fault that reaches float64 too, or a rank that
  // loads the input differently, leaves two float64 opinions, which decide nothing.
  if (!same_on_both(ctx, wide.data(), wide.size() * sizeof(double))) {
    out->why = "the float64 recomputations differ between the ranks too";
    return Status::OK();
  }
  int have = mine.size() >= n && wide.size() >= n;
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, ctx.comm.comm, &_culprit_req));
  if (!have) {
    out->why = "a rank has no float32 values of it to measure";
    return Status::OK();
  }
  // Each rank's float32 values to the other (a tie of two only: n values once), so both measure
  // over the same differing elements; rank 0's measurement is the one acted on.
  std::vector<float> theirs(n);
  const int other = 1 - ctx.comm.rank;
  MPI_Request sent = MPI_REQUEST_NULL;
  CULPRIT_MPI_CHECK(MPI_Isend(mine.data(), static_cast<int>(n), MPI_FLOAT, other, 0, ctx.comm.comm, &sent));
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection",
                     MPI_Irecv(theirs.data(), static_cast<int>(n), MPI_FLOAT, other, 0, ctx.comm.comm, &_culprit_req));
  complete(ctx.comm, &sent, "the bisection");
  const std::vector<float> own(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(n));
  const auto& g0 = ctx.comm.rank == 0 ? own : theirs;
  const auto& g1 = ctx.comm.rank == 0 ? theirs : own;
  if (std::memcmp(g0.data(), g1.data(), n * sizeof(float)) == 0) {
    out->why = "their values are bitwise equal here (the difference lies elsewhere), so the float64 recomputation has "
               "nothing to measure";
    return Status::OK();
  }
  out->distance[0] = distance(g0, g0, g1, wide, n);
  out->distance[1] = distance(g1, g0, g1, wide, n);
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Ibcast(out->distance, 2, MPI_DOUBLE, 0, ctx.comm.comm, &_culprit_req));
  out->healthy = arbitrate(out->distance[0], out->distance[1]);
  const std::string both = "relative distances of ranks 0 and 1 to it where they differ: " + sci(out->distance[0]) + ", " +
                           sci(out->distance[1]);
  if (out->healthy < 0)
    out->why = "the float64 recomputation (the same bits on both ranks) cannot tell them apart (" + both + ")";
  else
    out->why = "recomputed in float64 (the same bits on both ranks), rank " + std::to_string(out->healthy) +
               "'s result lies within float32 rounding of it and rank " + std::to_string(1 - out->healthy) +
               "'s does not (" + both + ")";
  return Status::OK();
}

}  // namespace

Status arbitrate_shard(Context& ctx, int k, const ShardResult& mine, Arbitration* out) {
  *out = Arbitration{};
  out->tried = true;
  // A healthy bfloat16 forward pass is itself ~2^-8 from float64, far past the rounding bound: the
  // arbiter could only abstain, so it is not run (the update, float32 in every run, still is).
  if (ctx.run.cfg.precision == harness::Precision::kBf16) {
    out->why = "the float64 recomputation cannot judge a --precision bf16 micro-shard (bfloat16 rounding alone "
               "is far outside float32's)";
    return Status::OK();
  }
  std::vector<double> wide;
  const Status st = agree(ctx.comm, ctx.engine->compute_shard_f64(k, ctx.round, &wide));
  if (!st.ok()) {
    out->why = "the float64 recomputation failed (" + st.message() + ")";
    return Status::OK();
  }
  return measure(ctx, mine.grad, wide, wide.empty() ? 0 : wide.size() - 1, out);  // the gradient, not the loss
}

Status arbitrate_update(Context& ctx, Arbitration* out) {
  *out = Arbitration{};
  out->tried = true;
  std::vector<float> now;
  std::vector<double> wide;
  const Status st = agree(ctx.comm, ctx.engine->update_f64(&now, &wide));
  if (!st.ok()) {
    out->why = "the float64 recomputation failed (" + st.message() + ")";
    return Status::OK();
  }
  return measure(ctx, now, wide, wide.size(), out);
}

Status referee_update(Context& ctx, Arbitration* out) {
  *out = Arbitration{};
  out->tried = true;
  std::vector<float> now, exact;
  std::string why;
  const Status st = agree(ctx.comm, ctx.engine->update_exact(&now, &exact, &why));
  if (!st.ok() || !why.empty()) {  // why is the configuration's: the same on every rank
    out->why = "no exact re-execution of the update (" + (st.ok() ? why : st.message()) + ")";
    return Status::OK();
  }
  if (!same_on_both(ctx, exact.data(), exact.size() * sizeof(float))) {
    out->why = "the update re-executed element by element differs between the ranks too: no exact opinion";
    return Status::OK();
  }
  int mine = now.size() == exact.size() && std::memcmp(now.data(), exact.data(), now.size() * sizeof(float)) == 0;
  int equal[2] = {0, 0};
  CULPRIT_COLLECTIVE(ctx.comm, "the bisection", MPI_Iallgather(&mine, 1, MPI_INT, equal, 1, MPI_INT, ctx.comm.comm, &_culprit_req));
  if (equal[0] != equal[1]) {
    out->healthy = equal[0] ? 0 : 1;
    out->why = "the update re-executed element by element in float32 in libtorch's operation order (the same bits "
               "on both ranks) equals rank " + std::to_string(out->healthy) + "'s bit for bit and not rank " +
               std::to_string(1 - out->healthy) + "'s: the exact referee";
  } else {
    out->why = std::string("the update re-executed element by element in float32 equals ") +
               (equal[0] ? "both ranks' (the difference lies elsewhere)" : "neither rank's") + ": no exact opinion";
  }
  return Status::OK();
}

}  // namespace culprit::bisect
