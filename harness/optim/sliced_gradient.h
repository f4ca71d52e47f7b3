// --shard-params (docs/determinism.md, "Sharded gradients"): what every rank learns of a reduced
// gradient that it holds only a slice of, with the same bits an unsharded run computes from the
// whole of it: grad_norm (its 1024-value chunks' sums, culprit/finite.h), the NaN/Inf scan, the
// fingerprint of the flat gradient and of each parameter's part, and the loss. No libtorch.
//
// Each rank first fetches, from the ranks after it, the few values past its slice that its share of
// the work needs: the rest of the last 4 KiB chunk that starts in its slice (the norm's and the flat
// fingerprint's chunks are the flat buffer's), the rest of its `report` range, and with `whole` the
// rest of every parameter that starts in its slice (clipping's per-parameter norms need a parameter
// whole). Then each computes what starts in its slice and the ranks gather the results (8 or 16
// bytes per 4 KiB).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/mpi_util.h"
#include "optim/shard_layout.h"

namespace culprit::harness {

struct SlicedGradient {
  double norm = 0;                     // l2_norm of the P values
  bool finite = true;                  // the P values and the loss
  Fingerprint grad_fp = 0;             // fingerprint_bytes of the P values
  std::vector<Fingerprint> param_fps;  // per parameter (with fps)
  Fingerprint report_fp = 0;           // this rank's `report` range
};

// Collective. g: the flat gradient (P + 1 values: the loss last), of which this rank holds
// [layout.lo(rank), layout.hi(rank)) and, on the last rank, the loss at P; the rest of g is memory
// nobody reads. Afterwards g also holds what was fetched (see above) and every rank's g[P] is the
// loss. report[c]: the range rank c fingerprints into report_fp (each within [0, P)).
// whole: fetch every parameter starting in the slice whole (offsets, sizes: the parameters').
SlicedGradient sliced_gradient(const Comm& comm, const ShardLayout& layout, const std::vector<std::int64_t>& offsets,
                               const std::vector<std::int64_t>& sizes, float* g, std::int64_t P, bool fps, bool whole,
                               const std::vector<std::pair<std::int64_t, std::int64_t>>& report);

// What rank c holds afterwards: its slice, widened to its chunks' ends, its report range and with
// `whole` its parameters' ends.
std::pair<std::int64_t, std::int64_t> sliced_range(const ShardLayout& layout, int c, const std::vector<std::int64_t>& offsets,
                                                   const std::vector<std::int64_t>& sizes, std::int64_t P, bool whole,
                                                   const std::pair<std::int64_t, std::int64_t>& report);

}  // namespace culprit::harness
