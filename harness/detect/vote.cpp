#include "detect/vote.h"

#include <stdexcept>

#include "culprit/watchdog.h"
#include "detect/node_topology.h"
#include "detect/vote_summary.h"

namespace culprit::harness {

void ShardFacts::reset(int m) {
  for (auto* v : {&leaf, &recomputed, &rng, &samples}) v->assign(static_cast<std::size_t>(m), 0);
}

std::vector<Fingerprint> ShardFacts::flat() const {
  std::vector<Fingerprint> out;
  out.reserve(4 * leaf.size());
  for (const auto* v : {&leaf, &recomputed, &rng, &samples}) out.insert(out.end(), v->begin(), v->end());
  return out;
}

void ShardFacts::assign(const Fingerprint* flat, int m) {
  std::size_t i = 0;
  for (auto* v : {&leaf, &recomputed, &rng, &samples}) {
    v->assign(flat + i, flat + i + m);
    i += static_cast<std::size_t>(m);
  }
}

std::size_t VoteLayout::length() const {
  return 4 + (comm ? 3 * static_cast<std::size_t>(world) : 0) + 4 * static_cast<std::size_t>(micro_shards) + replica;
}

std::vector<Fingerprint> pack(const VoteRecord& r, const VoteLayout& layout) {
  std::vector<Fingerprint> rec;
  rec.reserve(layout.length());
  rec.push_back(static_cast<Fingerprint>(r.bad_shard + 1));
  rec.push_back(r.bad_params);
  rec.push_back(r.violated);
  rec.push_back(static_cast<Fingerprint>(r.gather_chunk + 1));
  if (layout.comm) {
    const std::size_t W = static_cast<std::size_t>(layout.world);
    if (r.comm.sent.size() != W || r.comm.received.size() != W || r.comm.chunks.size() != W)
      throw std::logic_error("vote: the comm check's fingerprints do not fit the world");
    rec.insert(rec.end(), r.comm.sent.begin(), r.comm.sent.end());
    rec.insert(rec.end(), r.comm.received.begin(), r.comm.received.end());
    rec.insert(rec.end(), r.comm.chunks.begin(), r.comm.chunks.end());
  }
  if (layout.micro_shards > 0) {
    if (r.facts.micro_shards() != layout.micro_shards) throw std::logic_error("vote: micro-shard facts");
    const auto f = r.facts.flat();
    rec.insert(rec.end(), f.begin(), f.end());
  }
  rec.insert(rec.end(), r.replica.begin(), r.replica.end());
  if (rec.size() != layout.length()) throw std::logic_error("vote: record length");
  return rec;
}

VoteRecord unpack(const Fingerprint* rec, const VoteLayout& layout) {
  VoteRecord r;
  r.bad_shard = static_cast<int>(rec[0]) - 1;
  r.bad_params = rec[1] != 0;
  r.violated = rec[2] != 0;
  r.gather_chunk = static_cast<std::int64_t>(rec[3]) - 1;
  std::size_t i = 4;
  if (layout.comm) {
    const std::size_t W = static_cast<std::size_t>(layout.world);
    r.comm.sent.assign(rec + i, rec + i + W);
    r.comm.received.assign(rec + i + W, rec + i + 2 * W);
    r.comm.chunks.assign(rec + i + 2 * W, rec + i + 3 * W);
    i += 3 * W;
  }
  if (layout.micro_shards > 0) {
    r.facts.assign(rec + i, layout.micro_shards);
    i += 4 * static_cast<std::size_t>(layout.micro_shards);
  }
  r.replica.assign(rec + i, rec + i + layout.replica);
  return r;
}

namespace {

// Every rank's record, by rank: one all-gather of the packed records.
std::vector<VoteRecord> gather_records(const Comm& comm, const VoteRecord& mine, const VoteLayout& layout,
                                       const char* what) {
  const std::vector<Fingerprint> rec = pack(mine, layout);
  const std::size_t len = rec.size();
  std::vector<Fingerprint> all(len * static_cast<std::size_t>(comm.size));
  if (comm.size == 1) {
    all = rec;
  } else {
    CULPRIT_COLLECTIVE(comm, what,
                       MPI_Iallgather(rec.data(), static_cast<int>(len), MPI_UINT64_T, all.data(),
                                      static_cast<int>(len), MPI_UINT64_T, comm.comm, &_culprit_req));
  }
  std::vector<VoteRecord> out;
  out.reserve(static_cast<std::size_t>(comm.size));
  for (int r = 0; r < comm.size; ++r) out.push_back(unpack(all.data() + static_cast<std::size_t>(r) * len, layout));
  return out;
}

}  // namespace

Votes exchange_votes(const Comm& comm, const VoteRecord& mine, const VoteLayout& layout, const char* what) {
  Votes v;
  VoteSummary s = summarize(mine, layout, comm.rank);
  if (comm.size == 1 || node_topology(comm).gather_always) {
    // The records themselves (one rank: its own; the seam: the old vote, every step), and the
    // summary combined from them here, as the reduction would have.
    v.records = gather_records(comm, mine, layout, what);
    for (int r = 0; r < comm.size; ++r)
      if (r != comm.rank) combine(summarize(v.records[r], layout, r).words.data(), s.words.data());
  } else {
    agree_summary(comm, &s, what);
    // The second round: the decisions that name ranks read the very records they read before.
    if (s.shows_something()) v.records = gather_records(comm, mine, layout, what);
  }
  v.facts.assign(s.facts(), s.facts() + 4 * static_cast<std::size_t>(layout.micro_shards));
  return v;
}

std::vector<CommCheck> comm_checks(const std::vector<VoteRecord>& votes) {
  std::vector<CommCheck> out;
  for (const auto& v : votes) out.push_back(v.comm);
  return out;
}

}  // namespace culprit::harness
