// The detectors' vote: every rank contributes one record per step, and every decision is then taken
// from the same data on every rank (so all ranks act alike). The record's layout lives here, named,
// for training (StepDetectors) and replay (the engine's comm check) alike. The records travel only
// when a step shows something: first the ranks agree on a summary of them (vote_summary.h, reduced
// per node and then across nodes: flat in W), and gather the records in a second round only when
// the summary asks for it. No libtorch here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/mpi_util.h"
#include "culprit/tree_reduce.h"

namespace culprit::harness {

// Per micro-shard facts of one step, indexed by micro-shard k; each slot is written by one rank
// (so a bitwise OR across ranks gathers them).
struct ShardFacts {
  std::vector<Fingerprint> leaf;        // the owner's gradient leaf (spot-checked micro-shards)
  std::vector<Fingerprint> recomputed;  // the spot check's recomputation of that leaf
  std::vector<Fingerprint> rng;         // the dropout generator state it started from
  std::vector<Fingerprint> samples;     // the sample indices it used
  void reset(int micro_shards);         // all zero; micro_shards 0: no facts this step
  bool empty() const { return leaf.empty(); }
  int micro_shards() const { return static_cast<int>(leaf.size()); }
  // The four vectors back to back (leaf, recomputed, rng, samples), and back.
  std::vector<Fingerprint> flat() const;
  void assign(const Fingerprint* flat, int micro_shards);
};

// One rank's record in the vote.
struct VoteRecord {
  int bad_shard = -1;        // first micro-shard of this rank with a non-finite loss or gradient
  bool bad_params = false;   // non-finite parameters after the update
  bool violated = false;     // this rank saw a training invariant broken
  // --shard-params' gather check: the first fp1 chunk (layout order) whose gathered bits differed
  // here from what its owner recorded after the last update; -1: none.
  std::int64_t gather_chunk = -1;
  CommCheck comm;            // the reduction's message fingerprints (sent, received, chunks: W each)
  ShardFacts facts;          // when the spot check did not exchange them already
  std::vector<Fingerprint> replica;  // parameter and optimizer-state fingerprints (replica check)
};

// What the records of one vote hold; the same on every rank.
struct VoteLayout {
  int world = 1;
  bool comm = false;         // the comm check's 3W fingerprints
  int micro_shards = 0;      // 0: no micro-shard facts
  std::size_t replica = 0;   // replica fingerprints
  std::size_t length() const;
};

// [bad micro-shard + 1, bad parameters, invariant broken, gather chunk + 1, sent (W), received (W), chunks (W),
//  facts (4M), replica fingerprints]. A record that does not fit the layout is a logic error.
std::vector<Fingerprint> pack(const VoteRecord& r, const VoteLayout& layout);
VoteRecord unpack(const Fingerprint* rec, const VoteLayout& layout);

// What a vote hands back, the same on every rank.
struct Votes {
  std::vector<Fingerprint> facts;   // the micro-shard facts, OR-ed over every rank (4M; empty: none)
  // Every rank's record, by rank, when the summary showed something (one rank: its own; the
  // CULPRIT_VOTE_GATHER seam: always). Empty: every rank was clean — no flag, no mismatched
  // message, equal replicas — and a decision read from the records would have found nothing.
  std::vector<VoteRecord> records;
};

// Collective over comm (through its watchdog, if any): the summary's agreement, then, when it shows
// something, the all-gather of every rank's record (the vote before the summary, unchanged). One
// rank: its record, no MPI call.
Votes exchange_votes(const Comm& comm, const VoteRecord& mine, const VoteLayout& layout, const char* what);

// The CommChecks of every rank in a vote, for comm_mismatches.
std::vector<CommCheck> comm_checks(const std::vector<VoteRecord>& votes);

}  // namespace culprit::harness
