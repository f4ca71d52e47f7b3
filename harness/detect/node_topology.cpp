#include "detect/node_topology.h"

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "culprit/watchdog.h"

namespace culprit::harness {

namespace {

// The topology is cached on the communicator it was built for (MPI's attribute caching): a
// communicator freed and its handle reused by another (a replay's rotated layout) never finds a
// stale one, and the node and leader communicators are freed with it.
int g_keyval = MPI_KEYVAL_INVALID;
bool g_finalizing = false;

// MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else (the standard's hook for
// libraries): after that, a world's topology is deleted without MPI calls (MPI frees its objects).
int on_finalize(MPI_Comm, int, void*, void*) {
  g_finalizing = true;
  return MPI_SUCCESS;
}

int on_delete(MPI_Comm, int, void* value, void*) {
  auto* t = static_cast<NodeTopology*>(value);
  if (!g_finalizing) {
    if (t->leaders != MPI_COMM_NULL) MPI_Comm_free(&t->leaders);
    if (t->node != MPI_COMM_NULL) MPI_Comm_free(&t->node);
  }
  delete t;
  return MPI_SUCCESS;
}

int keyval() {
  if (g_keyval == MPI_KEYVAL_INVALID) {
    CULPRIT_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_delete, &g_keyval, nullptr));
    int self = MPI_KEYVAL_INVALID;
    CULPRIT_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &self, nullptr));
    CULPRIT_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, self, nullptr));
  }
  return g_keyval;
}

// A non-negative integer from the environment; unset or empty: 0.
long env_count(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end || n < 0 || n > (1L << 30)) throw std::invalid_argument(std::string(name) + "=" + v + ": not a count");
  return n;
}

NodeTopology* build(const Comm& comm) {
  auto t = std::make_unique<NodeTopology>();
  t->split = static_cast<int>(env_count("CULPRIT_NODE_SPLIT"));
  t->gather_always = env_count("CULPRIT_VOTE_GATHER") != 0;
  // Every rank must group alike, or the vote's collectives would not match. This agreement is also
  // where every rank is first seen through the watchdog: the splits below have no nonblocking form.
  long both[4] = {t->split, -t->split, t->gather_always, -static_cast<long>(t->gather_always)};
  CULPRIT_COLLECTIVE(comm, "the vote's node topology",
                     MPI_Iallreduce(MPI_IN_PLACE, both, 4, MPI_LONG, MPI_MAX, comm.comm, &_culprit_req));
  if (both[0] != -both[1] || both[2] != -both[3])
    throw std::logic_error("CULPRIT_NODE_SPLIT or CULPRIT_VOTE_GATHER differs between the ranks");
  if (t->split > 0) {
    CULPRIT_MPI_CHECK(MPI_Comm_split(comm.comm, comm.rank / t->split, comm.rank, &t->node));
  } else {
    CULPRIT_MPI_CHECK(MPI_Comm_split_type(comm.comm, MPI_COMM_TYPE_SHARED, comm.rank, MPI_INFO_NULL, &t->node));
  }
  MPI_Comm_rank(t->node, &t->node_rank);
  MPI_Comm_size(t->node, &t->node_size);
  CULPRIT_MPI_CHECK(MPI_Comm_split(comm.comm, t->leader() ? 0 : MPI_UNDEFINED, comm.rank, &t->leaders));
  if (t->leaders != MPI_COMM_NULL) MPI_Comm_size(t->leaders, &t->leaders_size);
  // Named for the bench's PMPI shim, which counts the vote's bytes by communicator.
  MPI_Comm_set_name(t->node, const_cast<char*>("culprit-vote-node"));
  if (t->leaders != MPI_COMM_NULL) MPI_Comm_set_name(t->leaders, const_cast<char*>("culprit-vote-leaders"));
  return t.release();
}

}  // namespace

const NodeTopology& node_topology(const Comm& comm) {
  const int key = keyval();
  void* value = nullptr;
  int found = 0;
  CULPRIT_MPI_CHECK(MPI_Comm_get_attr(comm.comm, key, &value, &found));
  if (found) return *static_cast<const NodeTopology*>(value);
  NodeTopology* t = build(comm);
  CULPRIT_MPI_CHECK(MPI_Comm_set_attr(comm.comm, key, t));
  return *t;
}

void hierarchical_allreduce(const Comm& comm, void* buf, int count, MPI_Datatype type, MPI_Op op,
                            const char* what) {
  const NodeTopology& t = node_topology(comm);
  Comm node = comm;  // the same watchdog, on the node's communicator
  node.comm = t.node;
  if (t.node_size > 1) {
    CULPRIT_COLLECTIVE(node, what,
                       MPI_Ireduce(t.leader() ? MPI_IN_PLACE : buf, t.leader() ? buf : nullptr, count, type, op, 0,
                                   t.node, &_culprit_req));
  }
  if (t.leader() && t.leaders_size > 1) {
    Comm leaders = comm;
    leaders.comm = t.leaders;
    CULPRIT_COLLECTIVE(leaders, what,
                       MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, t.leaders, &_culprit_req));
  }
  if (t.node_size > 1)
    CULPRIT_COLLECTIVE(node, what, MPI_Ibcast(buf, count, type, 0, t.node, &_culprit_req));
}

}  // namespace culprit::harness
