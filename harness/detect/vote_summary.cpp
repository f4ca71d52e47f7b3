#include "detect/vote_summary.h"

#include <algorithm>
#include <stdexcept>

#include "detect/node_topology.h"

namespace culprit::harness {

namespace {

constexpr std::size_t kHeader = 3;

// splitmix64's finaliser: a bijection of 64-bit words that mixes every bit into every other.
Fingerprint mix(Fingerprint z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// H(phase, from, to, v): for a fixed message (phase, from, to) a bijection of v, so two different
// fingerprints of one message never hash alike; different messages get unrelated hashes (ranks fit
// in 31 bits: the key is one-to-one).
Fingerprint message_hash(Fingerprint phase, int from, int to, Fingerprint v) {
  const Fingerprint key = (phase << 62) | (static_cast<Fingerprint>(from) << 31) | static_cast<Fingerprint>(to);
  return mix(mix(v) + mix(key));
}

std::size_t words_of(const Fingerprint* s) { return kHeader + s[0] + s[1] + 2 * s[2]; }

void combine_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const Fingerprint*>(in);
  auto* b = static_cast<Fingerprint*>(inout);
  for (int e = 0; e < *len; ++e) {
    const std::size_t n = words_of(b);
    // Every rank's summary has the vote's one layout (as every record had one length): a summary
    // of another is a logic error, which must not unwind through MPI's C frames.
    if (a[0] != b[0] || a[1] != b[1] || a[2] != b[2]) mpi_fail(MPI_ERR_OP, "the vote's combine: layouts differ", __FILE__, __LINE__);
    combine(a, b);
    a += n;
    b += n;
  }
}

// One MPI_Op for the process (an MPI_Op is local; MPI frees it at MPI_Finalize).
MPI_Op vote_op() {
  static MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    CULPRIT_MPI_CHECK(MPI_Op_create(combine_op, /*commute=*/1, &o));
    return o;
  }();
  return op;
}

}  // namespace

bool VoteSummary::shows_something() const {
  if (flags() != 0 || comm_digest() != 0) return true;
  const Fingerprint *lo = replica_min(), *hi = replica_max();
  for (std::size_t i = 0; i < replica(); ++i)
    if (lo[i] != hi[i]) return true;
  return false;
}

std::size_t summary_words(const VoteLayout& layout) {
  return kHeader + 1 + 4 * static_cast<std::size_t>(layout.micro_shards) + (layout.comm ? 1 : 0) + 2 * layout.replica;
}

Fingerprint comm_digest(const CommCheck& c, int rank, int world) {
  const std::size_t W = static_cast<std::size_t>(world);
  if (c.sent.size() != W || c.received.size() != W || c.chunks.size() != W)
    throw std::logic_error("vote: the comm check's fingerprints do not fit the world");
  Fingerprint d = 0;
  for (int j = 0; j < world; ++j) {
    // Nothing exchanged with j (0s: a tensor-parallel run's ranks in another data-parallel
    // reduction, TensorLayout::widen); j skips this rank alike, so the sum still cancels.
    if (j == rank || (c.sent[j] == 0 && c.received[j] == 0 && c.chunks[j] == 0)) continue;
    d += message_hash(1, rank, j, c.sent[j]) + message_hash(2, rank, j, c.chunks[rank]);  // as sent to j
    d -= message_hash(1, j, rank, c.received[j]) + message_hash(2, j, rank, c.chunks[j]);  // as j's arrived here
  }
  return d;
}

VoteSummary summarize(const VoteRecord& r, const VoteLayout& layout, int rank) {
  VoteSummary s;
  const std::size_t m4 = 4 * static_cast<std::size_t>(layout.micro_shards);
  s.words.reserve(summary_words(layout));
  s.words = {1 + m4, layout.comm ? 1u : 0u, layout.replica};
  s.words.push_back((r.bad_shard >= 0 ? VoteSummary::kBadShard : 0) | (r.bad_params ? VoteSummary::kBadParams : 0) |
                    (r.violated ? VoteSummary::kViolated : 0) | (r.gather_chunk >= 0 ? VoteSummary::kGather : 0));
  if (layout.micro_shards > 0) {
    if (r.facts.micro_shards() != layout.micro_shards) throw std::logic_error("vote: micro-shard facts");
    const auto f = r.facts.flat();
    s.words.insert(s.words.end(), f.begin(), f.end());
  }
  if (layout.comm) s.words.push_back(comm_digest(r.comm, rank, layout.world));
  if (r.replica.size() != layout.replica) throw std::logic_error("vote: replica count");
  s.words.insert(s.words.end(), r.replica.begin(), r.replica.end());  // min: one rank's own
  s.words.insert(s.words.end(), r.replica.begin(), r.replica.end());  // max
  return s;
}

void combine(const Fingerprint* in, Fingerprint* inout) {
  const std::size_t n_or = inout[0], n_sum = inout[1], n_mm = inout[2];
  if (in[0] != n_or || in[1] != n_sum || in[2] != n_mm) throw std::logic_error("vote: summaries of other layouts");
  const Fingerprint* a = in + kHeader;
  Fingerprint* b = inout + kHeader;
  for (std::size_t i = 0; i < n_or; ++i) b[i] |= a[i];
  a += n_or, b += n_or;
  for (std::size_t i = 0; i < n_sum; ++i) b[i] += a[i];  // unsigned: mod 2^64
  a += n_sum, b += n_sum;
  for (std::size_t i = 0; i < n_mm; ++i) b[i] = std::min(b[i], a[i]);
  a += n_mm, b += n_mm;
  for (std::size_t i = 0; i < n_mm; ++i) b[i] = std::max(b[i], a[i]);
}

void agree_summary(const Comm& comm, VoteSummary* s, const char* what) {
  if (comm.size == 1) return;
  // One element of the whole summary: MPI cannot cut it into segments that lose their header.
  MPI_Datatype type = MPI_DATATYPE_NULL;
  CULPRIT_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(s->words.size()), MPI_UINT64_T, &type));
  CULPRIT_MPI_CHECK(MPI_Type_commit(&type));
  hierarchical_allreduce(comm, s->words.data(), 1, type, vote_op(), what);
  MPI_Type_free(&type);
}

}  // namespace culprit::harness
