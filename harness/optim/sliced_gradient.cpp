// What every rank learns of a gradient held in slices: see optim/sliced_gradient.h.
#include "optim/sliced_gradient.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "culprit/finite.h"
#include "culprit/watchdog.h"

namespace culprit::harness {

namespace {

constexpr auto K = static_cast<std::int64_t>(kNormChunk);

// The norm's and flat fingerprint's chunks rank c computes: those starting in its slice, [first, end).
std::pair<std::int64_t, std::int64_t> own_chunks(const ShardLayout& layout, int c, std::int64_t P) {
  const std::int64_t first = (layout.lo(c) + K - 1) / K, end = (std::min(layout.hi(c), P) + K - 1) / K;
  return {first, std::max(first, end)};
}

}  // namespace

std::pair<std::int64_t, std::int64_t> sliced_range(const ShardLayout& layout, int c, const std::vector<std::int64_t>& offsets,
                                                   const std::vector<std::int64_t>& sizes, std::int64_t P, bool whole,
                                                   const std::pair<std::int64_t, std::int64_t>& report) {
  const std::int64_t lo = layout.lo(c), hi = layout.hi(c);
  std::int64_t a = lo, b = hi;
  const auto [first, end] = own_chunks(layout, c, P);
  if (end > first) b = std::max(b, std::min(P, end * K));
  if (report.first < report.second) {
    a = std::min(a, report.first);
    b = std::max(b, report.second);
  }
  if (whole)
    for (std::size_t i = 0; i < offsets.size(); ++i)
      if (offsets[i] >= lo && offsets[i] < hi) b = std::max(b, offsets[i] + sizes[i]);
  return {a, b};
}

SlicedGradient sliced_gradient(const Comm& comm, const ShardLayout& layout, const std::vector<std::int64_t>& offsets,
                               const std::vector<std::int64_t>& sizes, float* g, std::int64_t P, bool fps, bool whole,
                               const std::vector<std::pair<std::int64_t, std::int64_t>>& report) {
  const int W = comm.size, me = comm.rank;
  const std::int64_t lo = layout.lo(me), hi = layout.hi(me);
  SlicedGradient out;
  // 1. The values past the slice that this rank's share needs, from their owners, in place.
  std::vector<std::pair<std::int64_t, std::int64_t>> want(static_cast<std::size_t>(W));
  for (int c = 0; c < W; ++c) want[c] = sliced_range(layout, c, offsets, sizes, P, whole, report[c]);
  std::vector<int> scount(W, 0), sdispl(W, 0), rcount(W, 0), rdispl(W, 0);
  for (int c = 0; c < W; ++c) {
    if (c == me) continue;
    std::int64_t x = std::max(lo, want[c].first), y = std::min(hi, want[c].second);
    if (x < y) {
      scount[c] = static_cast<int>(y - x);
      sdispl[c] = static_cast<int>(x - lo);
    }
    x = std::max(layout.lo(c), want[me].first);
    y = std::min(layout.hi(c), want[me].second);
    if (x < y) rcount[c] = static_cast<int>(y - x);
  }
  // Received apart and copied into place: libnbc takes a receive buffer equal to the send buffer
  // (rank 0's, whose range starts where its slice does) for MPI_IN_PLACE.
  int total = 0;
  for (int c = 0; c < W; ++c) {
    rdispl[c] = total;
    total += rcount[c];
  }
  std::vector<float> got(static_cast<std::size_t>(total));
  if (W > 1)
    CULPRIT_COLLECTIVE(comm, "the reduced gradient's neighbours (--shard-params)",
                       MPI_Ialltoallv(g + lo, scount.data(), sdispl.data(), MPI_FLOAT, got.data(), rcount.data(),
                                      rdispl.data(), MPI_FLOAT, comm.comm, &_culprit_req));
  for (int c = 0; c < W; ++c)
    if (rcount[c] > 0)
      std::copy_n(got.data() + rdispl[c], rcount[c], g + std::max(layout.lo(c), want[me].first));
  // 2. The loss, from the last rank (it owns element P).
  if (W > 1)
    CULPRIT_COLLECTIVE(comm, "the reduced loss (--shard-params)", MPI_Ibcast(g + P, 1, MPI_FLOAT, W - 1, comm.comm, &_culprit_req));
  // 3. NaN/Inf anywhere.
  int finite = all_finite(g + lo, static_cast<std::size_t>(hi - lo)) && std::isfinite(g[P]) ? 1 : 0;
  if (W > 1)
    CULPRIT_COLLECTIVE(comm, "the reduced gradient's NaN/Inf scan (--shard-params)",
                       MPI_Iallreduce(MPI_IN_PLACE, &finite, 1, MPI_INT, MPI_MIN, comm.comm, &_culprit_req));
  out.finite = finite != 0;
  // 4. The flat buffer's chunks: each one's sum of squares and hash, by the rank it starts on.
  const std::int64_t nchunks = (P + K - 1) / K;
  std::vector<double> sums(static_cast<std::size_t>(nchunks));
  std::vector<std::uint64_t> hashes(static_cast<std::size_t>(nchunks));
  const auto [first, end] = own_chunks(layout, me, P);
  for (std::int64_t j = first; j < end; ++j) {
    const auto n = static_cast<std::size_t>(std::min(K, P - j * K));
    sums[j] = chunk_sum_of_squares(g + j * K, n);
    hashes[j] = chunk_hash(g + j * K, n * sizeof(float));
  }
  if (W > 1) {
    std::vector<int> count(W), displ(W);
    for (int c = 0; c < W; ++c) {
      const auto [f, e] = own_chunks(layout, c, P);
      displ[c] = static_cast<int>(f);
      count[c] = static_cast<int>(e - f);
    }
    CULPRIT_COLLECTIVE(comm, "the reduced gradient's norm (--shard-params)",
                       MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sums.data(), count.data(), displ.data(),
                                       MPI_DOUBLE, comm.comm, &_culprit_req));
    CULPRIT_COLLECTIVE(comm, "the reduced gradient's fingerprint (--shard-params)",
                       MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, hashes.data(), count.data(), displ.data(),
                                       MPI_UINT64_T, comm.comm, &_culprit_req));
  }
  double s = 0;
  for (double v : sums) s += v;  // in chunk order, as l2_norm
  out.norm = std::sqrt(s);
  out.grad_fp = combine_chunk_hashes(hashes.data(), hashes.size());
  // 5. Each parameter's fingerprint from its chunks' hashes (the layout's, as the parameters').
  if (fps) {
    std::vector<std::uint64_t> mine;
    for (std::size_t k = layout.first_chunk(me); k < layout.first_chunk(me + 1); ++k) {
      const ParamChunk& ch = layout.chunks()[k];
      mine.push_back(chunk_hash(g + ch.begin, static_cast<std::size_t>(ch.end - ch.begin) * sizeof(float)));
    }
    const std::vector<std::uint64_t> all = gather_chunk_hashes(comm, layout, mine, "the reduced gradient's fingerprints");
    for (std::size_t i = 0; i < offsets.size(); ++i) out.param_fps.push_back(layout.param_fp(all, i));
  }
  const auto& r = report[static_cast<std::size_t>(me)];
  out.report_fp = fingerprint_bytes(g + r.first, static_cast<std::size_t>(std::max<std::int64_t>(0, r.second - r.first)) * sizeof(float));
  return out;
}

}  // namespace culprit::harness
