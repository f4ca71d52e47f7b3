"""bench/scale.py's PMPI shim: a C library preloaded into every rank (LD_PRELOAD) that counts the
bytes each collective call contributes and receives, by communicator name, and writes
/proc/self/status and smaps_rollup before MPI_Finalize and at exit; built here with mpicc, read back
with parse_dump.

The counts are per call, from its arguments, not from the wire: "contributed" is the data the rank
hands MPI for the others (once), "received" the bytes of other ranks' data that reach its result,
counted once per source rank — what a flat algorithm moves: Iallgather own / own (n - 1); Iallreduce
n / n (n - 1); Ireduce n from a non-root, n (n - 1) into the root; Ibcast n from the root, n into the
others. Open MPI's trees (binomial, recursive doubling) move log2(n) instead of n - 1 to the busiest
rank: the counts are an upper bound there, exact for the all-gather."""
import os
import subprocess

SHIM_C = r'''
/* bench/scale.py's shim (LD_PRELOAD): the bytes each collective call contributes and receives, counted
   through PMPI, and /proc/self/status + smaps_rollup written before MPI_Finalize and at exit. */
#define _GNU_SOURCE
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#define NKEYS 512
#include <string.h>
static struct { const char* fn; char comm[MPI_MAX_OBJECT_NAME]; long long send, recv, calls; } keys[NKEYS];
static int nkeys;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* The communicator's name (MPI_Comm_set_name; culprit names the vote's), one word; "-" when none. */
static void comm_name(MPI_Comm c, char* out) {
  int n = 0;
  out[0] = 0;
  PMPI_Comm_get_name(c, out, &n);
  if (!out[0]) strcpy(out, "-");
  for (char* p = out; *p; ++p) if (*p == ' ' || *p == '\t') *p = '_';
}
static void note_on(const char* fn, MPI_Comm c, long long send, long long recv) {
  char name[MPI_MAX_OBJECT_NAME];
  comm_name(c, name);
  pthread_mutex_lock(&mu);
  int i;
  for (i = 0; i < nkeys; ++i)
    if (keys[i].fn == fn && keys[i].send == send && keys[i].recv == recv && !strcmp(keys[i].comm, name)) break;
  if (i == nkeys && nkeys < NKEYS) {
    keys[i].fn = fn; strcpy(keys[i].comm, name); keys[i].send = send; keys[i].recv = recv; keys[i].calls = 0; ++nkeys;
  }
  if (i < NKEYS) keys[i].calls++;
  pthread_mutex_unlock(&mu);
}
#define note(fn, send, recv) note_on(fn, c, send, recv)
static long long tsize(MPI_Datatype t) { int s = 0; if (t != MPI_DATATYPE_NULL) PMPI_Type_size(t, &s); return s; }
static int me(MPI_Comm c) { int r = 0; PMPI_Comm_rank(c, &r); return r; }
static int nprocs(MPI_Comm c) { int n = 1; PMPI_Comm_size(c, &n); return n; }
int MPI_Iallgather(const void* sb, int sc, MPI_Datatype st, void* rb, int rc, MPI_Datatype rt, MPI_Comm c, MPI_Request* q) {
  long long own = sb == MPI_IN_PLACE ? rc * tsize(rt) : sc * tsize(st);
  note("Iallgather", own, own * (nprocs(c) - 1));
  return PMPI_Iallgather(sb, sc, st, rb, rc, rt, c, q);
}
int MPI_Allgather(const void* sb, int sc, MPI_Datatype st, void* rb, int rc, MPI_Datatype rt, MPI_Comm c) {
  long long own = sb == MPI_IN_PLACE ? rc * tsize(rt) : sc * tsize(st);
  note("Allgather", own, own * (nprocs(c) - 1));
  return PMPI_Allgather(sb, sc, st, rb, rc, rt, c);
}
int MPI_Iallgatherv(const void* sb, int sc, MPI_Datatype st, void* rb, const int rcs[], const int d[], MPI_Datatype rt,
                    MPI_Comm c, MPI_Request* q) {
  int n = nprocs(c), r = me(c); long long all = 0, ts = tsize(rt);
  for (int i = 0; i < n; ++i) all += rcs[i];
  note("Iallgatherv", rcs[r] * ts, (all - rcs[r]) * ts);
  return PMPI_Iallgatherv(sb, sc, st, rb, rcs, d, rt, c, q);
}
int MPI_Ialltoallv(const void* sb, const int scs[], const int sd[], MPI_Datatype st, void* rb, const int rcs[],
                   const int rd[], MPI_Datatype rt, MPI_Comm c, MPI_Request* q) {
  int n = nprocs(c), r = me(c); long long s = 0, v = 0;
  for (int i = 0; i < n; ++i) if (i != r) { s += scs[i]; v += rcs[i]; }
  note("Ialltoallv", s * tsize(st), v * tsize(rt));
  return PMPI_Ialltoallv(sb, scs, sd, st, rb, rcs, rd, rt, c, q);
}
int MPI_Iallreduce(const void* sb, void* rb, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c, MPI_Request* q) {
  note("Iallreduce", n * tsize(t), n * tsize(t) * (nprocs(c) - 1));
  return PMPI_Iallreduce(sb, rb, n, t, o, c, q);
}
int MPI_Allreduce(const void* sb, void* rb, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c) {
  note("Allreduce", n * tsize(t), n * tsize(t) * (nprocs(c) - 1));
  return PMPI_Allreduce(sb, rb, n, t, o, c);
}
int MPI_Ireduce(const void* sb, void* rb, int n, MPI_Datatype t, MPI_Op o, int root, MPI_Comm c, MPI_Request* q) {
  int root_here = me(c) == root;
  note("Ireduce", root_here ? 0 : n * tsize(t), root_here ? n * tsize(t) * (nprocs(c) - 1) : 0);
  return PMPI_Ireduce(sb, rb, n, t, o, root, c, q);
}
int MPI_Ibcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request* q) {
  note("Ibcast", me(c) == root ? n * tsize(t) : 0, me(c) == root ? 0 : n * tsize(t));
  return PMPI_Ibcast(b, n, t, root, c, q);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  note("Bcast", me(c) == root ? n * tsize(t) : 0, me(c) == root ? 0 : n * tsize(t));
  return PMPI_Bcast(b, n, t, root, c);
}
static void copy(FILE* out, const char* path) {
  char line[512];
  FILE* f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f)) fputs(line, out);
  fclose(f);
}
static void dump(const char* when) {
  const char* base = getenv("SCALE_SHIM_OUT");
  const char* rank = getenv("OMPI_COMM_WORLD_RANK");
  if (!rank) rank = getenv("SLURM_PROCID"); /* srun's direct launch (scale.py --cluster) */
  char path[4096];
  if (!base) return;
  snprintf(path, sizeof path, "%s-%s-%d.%s", base, rank ? rank : "x", (int)getpid(), when);
  FILE* out = fopen(path, "w");
  if (!out) return;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nkeys; ++i)
    fprintf(out, "mpi %s %lld %lld %lld %s\n", keys[i].fn, keys[i].send, keys[i].recv, keys[i].calls, keys[i].comm);
  pthread_mutex_unlock(&mu);
  copy(out, "/proc/self/status");
  copy(out, "/proc/self/smaps_rollup");
  fclose(out);
}
int MPI_Finalize(void) { dump("finalize"); return PMPI_Finalize(); }
__attribute__((destructor)) static void at_exit(void) { dump("exit"); }
'''


def build_shim(work):
    src, so = os.path.join(work, "shim.c"), os.path.join(work, "shim.so")
    with open(src, "w") as f:
        f.write(SHIM_C)
    p = subprocess.run(["mpicc", "-O2", "-shared", "-fPIC", "-o", so, src], capture_output=True, text=True)
    if p.returncode != 0:
        print("no PMPI shim (mpicc failed): vote bytes from the formula only\n" + p.stderr[-500:], flush=True)
        return None
    return so


def parse_dump(path):
    """A shim dump: {'mpi': {(fn, send, recv, communicator name): calls}, 'status': {field: kB or text}}."""
    out = {"mpi": {}, "status": {}}
    for line in open(path):
        if line.startswith("mpi "):
            _, fn, s, r, n, comm = line.split()
            out["mpi"][(fn, int(s), int(r), comm)] = int(n)
            continue
        if ":" not in line:
            continue
        k, v = line.split(":", 1)
        v = v.split()
        if not v:
            continue
        out["status"][k.strip()] = int(v[0]) if v[0].isdigit() else v[0]
    return out
