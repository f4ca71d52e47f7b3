// The vote's summary: what every decision of a clean step needs, combinable across ranks, so the
// common case is a reduction (of O(M + T) words, flat in W) instead of an all-gather of every rank's
// record (O(W (W + M + T)) received per rank). Only when the agreed summary shows something — a bad
// micro-shard, bad parameters, a broken invariant, a reduction message that arrived unlike it was
// sent, replicas that differ — do the ranks gather the full records in a second round
// (exchange_votes, vote.h), so every decision that names a rank is taken from exactly the data it
// was before. No libtorch here.
#pragma once
#include <cstddef>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/mpi_util.h"
#include "culprit/tree_reduce.h"
#include "detect/vote.h"

namespace culprit::harness {

// Words: [n_or, n_sum, n_minmax | n_or words OR-ed | n_sum words added mod 2^64 | n_minmax words
// min-ed | n_minmax words max-ed]. The three counts make a summary self-describing, so the combine
// needs no other context (an MPI_Op gets none). The sections:
//   OR   flags (kBadShard, kBadParams, kViolated, kGather: exact), then the 4M micro-shard facts (each slot
//        written by its owner only; the records' OR, bit for bit)
//   SUM  with the comm check: its digest, 0 when every message arrived as it was sent (comm_digest)
//   MIN/MAX every replica fingerprint: all ranks hold the same iff min == max (exact)
struct VoteSummary {
  static constexpr Fingerprint kBadShard = 1, kBadParams = 2, kViolated = 4, kGather = 8;
  std::vector<Fingerprint> words;

  std::size_t or_words() const { return words[0]; }
  std::size_t sum_words() const { return words[1]; }
  std::size_t replica() const { return words[2]; }
  Fingerprint flags() const { return words[3]; }
  const Fingerprint* facts() const { return words.data() + 4; }  // or_words() - 1 of them
  Fingerprint comm_digest() const { return sum_words() ? words[3 + or_words()] : 0; }
  const Fingerprint* replica_min() const { return words.data() + 3 + or_words() + sum_words(); }
  const Fingerprint* replica_max() const { return replica_min() + replica(); }
  // Whether the full records must be gathered: a flag, a comm digest that is not 0, or a replica
  // fingerprint whose min and max differ. Conservative: a clean step never shows anything, and a
  // step the records would decide on always does, but for the comm digest's chance of 2^-64 that
  // two or more mismatched messages cancel (one alone cannot: comm_digest).
  bool shows_something() const;
};

// The words of a summary of this layout.
std::size_t summary_words(const VoteLayout& layout);
// One rank's summary (rank: its place in the comm check's pairs).
VoteSummary summarize(const VoteRecord& r, const VoteLayout& layout, int rank);
// Combines the summary at `in` into the one at `inout` (both of inout's layout): commutative and
// associative, bit for bit, so every reduction order agrees. The vote's MPI_Op is this.
void combine(const Fingerprint* in, Fingerprint* inout);

// The comm check as one word per rank: rank r adds, for each pair (from r to j) of its own sends,
// H(phase 1, r, j, sent[j]) + H(phase 2, r, j, chunks[r]), and subtracts, for each pair (from i to r)
// it received, H(phase 1, i, r, received[i]) + H(phase 2, i, r, chunks[i]); the world's sum (mod
// 2^64) is 0 when every message arrived as sent. H is a bijection of the fingerprint for each pair,
// so a single mismatched message always leaves a nonzero sum; several cancel with chance ~2^-64.
Fingerprint comm_digest(const CommCheck& c, int rank, int world);

// Collective over comm: s combined over every rank (node_topology.h's hierarchy), the same bits on
// every rank.
void agree_summary(const Comm& comm, VoteSummary* s, const char* what);

}  // namespace culprit::harness
