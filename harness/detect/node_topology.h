// The vote's communicators: the ranks grouped by node, one leader per node. The vote's summary is
// reduced within each node to its leader, across the nodes among the leaders, and broadcast back
// within each node (vote_summary.h), so what a rank receives grows with the ranks of its node plus
// the nodes, not with the world (docs/scale.md, 2.1). No libtorch here.
#pragma once
#include <mpi.h>

#include "culprit/mpi_util.h"

namespace culprit::harness {

struct NodeTopology {
  MPI_Comm node = MPI_COMM_NULL;     // the ranks of this rank's node, by their rank in the parent; 0 leads
  MPI_Comm leaders = MPI_COMM_NULL;  // every node's leader (node rank 0); MPI_COMM_NULL on the others
  int node_rank = 0, node_size = 1;
  int leaders_size = 0;              // the nodes (on a leader; 0 elsewhere)
  int split = 0;                     // 0: MPI_COMM_TYPE_SHARED; K: CULPRIT_NODE_SPLIT's nodes of K ranks
  bool gather_always = false;        // CULPRIT_VOTE_GATHER: the old vote, one all-gather of records a step
  bool leader() const { return node_rank == 0; }
};

// Collective over comm the first time it is asked for a communicator, then cached on it (an MPI
// attribute: built once per communicator, not per step, and freed with it). Every rank must call it
// at the same point (the vote does). The test and bench seams, read from the environment here and
// agreed by every rank (a rank that differs is a logic error on every rank):
//   CULPRIT_NODE_SPLIT=K    nodes of K consecutive ranks instead of MPI_COMM_TYPE_SHARED's split, so
//                           one machine can play several nodes (tests, bench/scale.py; never a job's)
//   CULPRIT_VOTE_GATHER=1   every step's vote is the full all-gather of records, as before the
//                           summary (the tests' reference for identical decisions, the bench's "before")
const NodeTopology& node_topology(const Comm& comm);

// Collective over comm: buf (count elements of type, op commutative) combined over every rank, on
// every rank: reduced within the node to its leader, all-reduced among the leaders, broadcast within
// the node; each step nonblocking and completed through comm's watchdog (a silent rank: exit 13).
void hierarchical_allreduce(const Comm& comm, void* buf, int count, MPI_Datatype type, MPI_Op op,
                            const char* what);

}  // namespace culprit::harness
