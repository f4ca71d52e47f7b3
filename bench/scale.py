#!/usr/bin/env python3
"""Up to 64 ranks on one machine: what detection, the trace, diagnosis, audit and memory cost as
functions of the world size W, with an injected fault found at every W.

    nice -n 19 .venv/bin/python bench/scale.py [--worlds 2,4,8,16,32,64] [--json FILE] [--keep DIR]
                                               [--no-twin] [--env-variants W]

Every W trains the same small model (mlp, `--hidden 16`: 970 parameters in 6 tensors, global batch
64 in M = 64 micro-shards, so W <= 64; SGD with momentum; checkpoints every K = 4 steps, `--trace
layer`, the default detectors) with two faults injected (docs/detection.md, `--inject`):

  silent    step 3, rank W/2 - 1, forward output of fc3, a bitflip of mantissa bit 12 (transient):
            no online detector sees it (every replica receives the same reduced gradient);
  detected  step 10, rank W - 1, forward output of fc2, a NaN (transient): the NaN/Inf detector
            halts the run at step 10 (exit 11; checkpoints 0, 4 and 8 are on disk).

then `culprit bisect` and `culprit audit` on the same W ranks. The truth is the injected spec. Each W
is scored against it, never against culprit's own output:
  detect  the first incident is at step 10 and names rank W - 1 (incidents.jsonl's fields);
  bisect  diagnosis.json: hardware-transient, step 10, phase forward, layer fc2, rank W - 1;
  audit   audit.json: exactly one interval does not reproduce, the one holding step 3, and its detail
          names step 3, micro-shard 64/W * (W/2 - 1) (the first one the silent rank computes), rank
          W/2 - 1 and layer fc3 (the detail is text for people: read here with a regular expression,
          the only place this bench reads one);
  twin    (unless --no-twin) a clean twin of the run trains all 12 steps; the two traces, read with
          h5py, first differ at step 3 in the micro-shard and layer above, recorded by the silent
          rank: the injected fault is where the record shows it. The twins' final fingerprints must
          be equal at every W (world-size invariance up to 64 ranks).

Measured per W (the formulas: docs/scale.md):
  detector ms       metrics.jsonl's detector_seconds (rank 0's: NaN/Inf scans, fingerprints, the
                    vote including its wait for the slowest rank), median over steps 2-9
  vote B            bytes each rank contributes to the one all-gather of the vote per step
                    (harness/detect/vote.cpp): 8 (3 + 3W + 4M + 2T), T parameter tensors; received:
                    (W - 1) times that. Measured by a PMPI shim (LD_PRELOAD, built here with mpicc)
                    that counts every collective's bytes: MPI_Iallgather has one caller, the vote
  reduction B       the same shim: what a rank sends in the tree exchange (Ialltoallv) plus what it
                    receives in the all-gather of reduced chunks (Iallgatherv), per step
  trace B/step/rank the trace files' bytes / (steps x W) (at 10 steps a file is mostly one 64-row
                    HDF5 chunk per column) and the rows' own bytes (h5py dtypes x
                    rows: what a long run grows by), against the formula
  bisect, audit s   wall time of `mpirun ... culprit bisect|audit` (start-up included) and the
                    tools' own seconds (diagnosis.json, audit.json)
  memory            each rank's peak RSS (GNU time %M) in train, bisect and audit; from the shim,
                    each training rank's /proc/self/status and smaps_rollup just before
                    MPI_Finalize (RssAnon: private; RssFile: library pages, shared between ranks;
                    Pss); the machine's MemAvailable drop while the job ran (sampled every 0.25 s;
                    noisy when anything else runs);
                    and a process that only loads culprit (`culprit train --help`: libtorch's
                    start-up)
--env-variants W trains the clean twin at W ranks once per environment variant (glibc arenas,
OpenMP threads, an mmap threshold, Open MPI's shared-memory transport with fewer buffers) to see
whether any lowers the memory per rank.
Prints three tables (costs, memory, the diagnoses against the truth); --json writes the raw numbers.
Exits 1 unless every W is exact. A W is skipped when MemAvailable is below W x --mib-per-rank + 1 GiB.
Results: docs/performance.md ("Scaling to 64 ranks") and docs/scale.md.
"""
import argparse
import glob
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import h5py
import numpy as np

from pmpi_shim import build_shim, parse_dump
from scale_tables import tables, vote_table

HERE = os.path.dirname(os.path.abspath(__file__))
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(HERE, "..", "build", "culprit"))
COMM = os.path.basename(CULPRIT)[:15]  # the process's name in /proc/PID/status (15 characters at most)
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

M, B, K, STEPS, HIDDEN = 64, 64, 4, 12, 16
S_SILENT, S_DETECTED = 3, 10
MODEL = ["--model", "mlp", "--hidden", str(HIDDEN), "--global-batch", str(B), "--micro-shards", str(M),
         "--samples", "256", "--steps", str(STEPS), "--checkpoint-every", str(K), "--quiet"]
ENV_VARIANTS = [  # (name, environment, mpirun options)
    ("defaults", {}, []),
    ("MALLOC_ARENA_MAX=1", {"MALLOC_ARENA_MAX": "1"}, []),
    ("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}, []),
    ("arena 1 + mmap threshold 64 KiB", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=65536"},
     []),
    ("vader: no fast boxes, free list 64", {}, ["--mca", "btl_vader_fbox_max", "0", "--mca", "btl_vader_free_list_max", "64"]),
]

def mem_available_kib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


class MemSampler(threading.Thread):
    """The machine's MemAvailable while a job runs: the job's real footprint (shared pages once)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.before = mem_available_kib()
        self.lowest = self.before
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.25):
            self.lowest = min(self.lowest, mem_available_kib())

    def stop(self):
        self.done.set()
        self.join()
        return (self.before - self.lowest) / 1024.0


# --cluster: the ranks start with srun over the 4 nodes of scripts/slurm-cluster.sh instead of mpirun.
CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "slurm-cluster.sh")
CLUSTER_ENV = {"CULPRIT_CLUSTER_NAME": "scale", "CULPRIT_CLUSTER_NET": "127.204.0",
               "CULPRIT_CLUSTER_DIR": "/tmp/scale-cluster", "CULPRIT_CLUSTER_NODES": "4"}
CLUSTER_LAUNCH = None


def run_ranks(work, tag, world, args, shim, env=None, mca=()):
    """mpirun -np world culprit ARGS, each rank under GNU time (and the shim): every rank's exit code,
    peak RSS (KiB) and shim dumps; the wall time; the machine's memory drop."""
    prefix = os.path.join(work, "ranks", tag)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    for p in glob.glob(prefix + ".*"):
        os.remove(p)
    assigns = ["%s=%s" % (k, shlex.quote(v)) for k, v in (env or {}).items()]
    if shim:
        assigns += ["LD_PRELOAD=" + shlex.quote(shim), 'SCALE_SHIM_OUT="$0.shim"']
    # The wrapper exits 0 whatever culprit's code (recorded per rank): a rank exiting 11 first would
    # otherwise make mpirun kill the others before their GNU time wrote its line.
    wrap = ('/usr/bin/time -o "$0.rss-$OMPI_COMM_WORLD_RANK" -f %M env ' + " ".join(assigns) + ' "$@"; '
            'echo $? > "$0.code-$OMPI_COMM_WORLD_RANK"')
    if CLUSTER_LAUNCH:
        cmd = CLUSTER_LAUNCH + ["-n", str(world), "bash", "-c", wrap.replace("OMPI_COMM_WORLD_RANK", "SLURM_PROCID"),
                                prefix, CULPRIT] + args
    else:
        cmd = MPIRUN + list(mca) + ["-np", str(world), "bash", "-c", wrap, prefix, CULPRIT] + args
    sampler = MemSampler()
    sampler.start()
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **CLUSTER_ENV))
    wall = time.time() - t0
    drop = sampler.stop()
    codes, rss, dumps = {}, {}, {}
    for r in range(world):
        try:
            codes[r] = int(open("%s.code-%d" % (prefix, r)).read().split()[-1])
            rss[r] = int(open("%s.rss-%d" % (prefix, r)).read().split()[-1])
        except (OSError, ValueError, IndexError):
            codes.setdefault(r, None)
        for when in ("finalize", "exit"):
            for path in glob.glob("%s.shim-%d-*.%s" % (prefix, r, when)):
                d = parse_dump(path)
                if d["status"].get("Name") == COMM:
                    dumps.setdefault(r, {})[when] = d
    return {"codes": codes, "rss_kib": rss, "dumps": dumps, "wall": wall, "mem_drop_mib": drop,
            "mpirun_exit": p.returncode, "out": (p.stdout + p.stderr)[-3000:]}


def faults(world):
    silent, detected = world // 2 - 1, world - 1
    return silent, detected, [
        "--inject", "step=%d,rank=%d,layer=fc3,phase=forward,kind=bitflip,bit=12" % (S_SILENT, silent),
        "--inject", "step=%d,rank=%d,layer=fc2,phase=forward,kind=nan" % (S_DETECTED, detected)]


def names(attr):
    """A newline-separated name list attribute (bytes or str)."""
    return (attr.decode() if isinstance(attr, bytes) else str(attr)).split("\n")


def trace_facts(run_dir):
    """Sizes and rows of the trace: file bytes, the committed rows' own bytes, steps, header facts."""
    files = sorted(glob.glob(os.path.join(run_dir, "trace", "*.h5")))
    total = sum(os.path.getsize(f) for f in files)
    row_bytes, steps, facts = 0, 0, {}
    for path in files:
        with h5py.File(path, "r") as f:
            ns, nh = int(f.attrs["steps_committed"]), int(f.attrs["shards_committed"])
            steps = max(steps, ns)
            for group, n in (("steps", ns), ("shards", nh)):
                for ds in f[group].values():
                    row_bytes += ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)) * n
            facts = {"params": len(names(f.attrs["params"])), "layers": names(f.attrs["layers"]),
                     "samples_per_shard": int(f.attrs["samples_per_shard"])}
    return {"files": len(files), "file_bytes": total, "row_bytes": row_bytes, "steps": steps, **facts}


def trace_rows(run_dir):
    """Every committed row by key, as bytes: ('step', rank, step) and ('shard', step, k) -> (rank, per column)."""
    rows, layers = {}, []
    for path in sorted(glob.glob(os.path.join(run_dir, "trace", "*.h5"))):
        with h5py.File(path, "r") as f:
            rank, ns, nh = int(f.attrs["rank"]), int(f.attrs["steps_committed"]), int(f.attrs["shards_committed"])
            layers = names(f.attrs["layers"])
            st, sh = f["steps"], f["shards"]
            cols = {c: st[c][:ns] for c in ("step", "loss", "grad_fp", "param_fp", "opt_fp")}
            for i in range(ns):
                rows[("step", rank, int(cols["step"][i]))] = (rank, {c: cols[c][i].tobytes() for c in cols if c != "step"})
            scol = {c: sh[c][:nh] for c in ("step", "shard", "rank", "loss", "grad_fp", "input_fp", "fwd_fp", "bwd_fp")}
            for i in range(nh):
                rows[("shard", int(scol["step"][i]), int(scol["shard"][i]))] = (
                    int(scol["rank"][i]), {c: scol[c][i].tobytes() if c != "fwd_fp" else tuple(int(x) for x in scol[c][i])
                                           for c in ("loss", "grad_fp", "input_fp", "fwd_fp", "bwd_fp")})
    return rows, layers


def first_difference(faulty_dir, twin_dir):
    """Where the faulty run's record first departs from its clean twin's, read with h5py:
    (step, micro-shard, recording rank, first layer whose forward output differs) or None."""
    fr, layers = trace_rows(faulty_dir)
    tr, _ = trace_rows(twin_dir)
    step_of = lambda k: k[2] if k[0] == "step" else k[1]
    for s in sorted({step_of(k) for k in fr}):
        shards = sorted(k for k in fr if k[0] == "shard" and k[1] == s and tr.get(k) != fr[k])
        if shards:
            k = shards[0]
            a, b = fr[k][1]["fwd_fp"], tr[k][1]["fwd_fp"]
            layer = next((layers[i] for i in range(len(a)) if a[i] != b[i]), "")
            return {"step": s, "shard": k[2], "rank": fr[k][0], "layer": layer}
        if any(k for k in fr if step_of(k) == s and tr.get(k) != fr[k]):
            return {"step": s, "shard": None, "rank": None, "layer": ""}
    return None


def first_incident(run_dir):
    path = os.path.join(run_dir, "incidents.jsonl")
    if not os.path.exists(path):
        return None
    for line in open(path):
        if line.endswith("\n"):
            d = json.loads(line)
            if d.get("detector") not in ("collective-timeout", "jobs"):
                return d
    return None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def memory_of(job):
    """Per-rank memory of a job: peak RSS (GNU time) and, from the shim's pre-finalize snapshot, its parts."""
    rss = list(job["rss_kib"].values())
    snaps = [d.get("finalize", d.get("exit")) for d in job["dumps"].values()]
    snaps = [s["status"] for s in snaps if s]
    pick = lambda k: [s.get(k) for s in snaps if isinstance(s.get(k), int)]
    mib = lambda v: v / 1024.0 if v is not None else None
    return {"peak_rss_max_mib": mib(max(rss)) if rss else None, "peak_rss_median_mib": mib(median(rss)),
            "rss_anon_median_mib": mib(median(pick("RssAnon"))), "rss_file_median_mib": mib(median(pick("RssFile"))),
            "rss_shmem_median_mib": mib(median(pick("RssShmem"))), "pss_median_mib": mib(median(pick("Pss"))),
            "pss_sum_mib": mib(sum(pick("Pss"))) if pick("Pss") else None, "threads_max": max(pick("Threads") or [0]),
            "ranks_measured": len(rss), "job_mem_drop_mib": job["mem_drop_mib"]}


VOTE_COMMS = ("culprit-vote-node", "culprit-vote-leaders")  # the vote's summary (node_topology.cpp names them)


def vote_bytes(dump, steps):
    """One rank's vote per step from its shim dump: the summary's collectives (on the vote's node and
    leaders communicators) and the all-gather of records (the second round, or every step before)."""
    mpi = dump["mpi"]
    summary = [(k, n) for k, n in mpi.items() if k[3] in VOTE_COMMS]
    gather = [(k, n) for k, n in mpi.items() if k[0] == "Iallgather"]
    per_step = lambda keys, i: sum(k[i] * n for k, n in keys) / max(1, steps)
    leader = any(k[3] == "culprit-vote-leaders" or (k[0] == "Ireduce" and k[2] > 0) for k, _ in summary) or not summary
    return {"leader": leader, "summary_send": per_step(summary, 1), "summary_recv": per_step(summary, 2),
            "summary_calls": sum(n for _, n in summary),
            "gather_calls": sum(n for _, n in gather),
            "gather_send": gather[0][0][1] if gather else 0, "gather_recv": gather[0][0][2] if gather else 0}


def collectives(job, steps):
    """Per-step bytes from the shim (every rank's dump before finalize): the vote, by role (the node
    leaders and the other ranks: the busiest of each), and the reduction (rank 0's). The reduction's
    totals over the run / steps (a bucketed reduction makes several calls a step)."""
    dumps = {r: d.get("finalize", d.get("exit")) for r, d in job["dumps"].items()}
    dumps = {r: d for r, d in dumps.items() if d}
    if 0 not in dumps:
        return {}
    mpi = dumps[0]["mpi"]
    pick = lambda fn: [(k[1], k[2], n) for k, n in mpi.items() if k[0] == fn]
    per_step = lambda keys, i: sum(k[i] * k[2] for k in keys) / max(1, steps)
    votes = {r: vote_bytes(d, steps) for r, d in dumps.items()}
    out = {
        "reduction_sent_bytes": per_step(pick("Ialltoallv"), 0),
        "reduction_gather_recv_bytes": per_step(pick("Iallgatherv"), 1),
        "reduction_calls": sum(n for _, _, n in pick("Ialltoallv")),
        "small_collectives": sum(n for k, n in mpi.items() if k[0] in ("Iallreduce", "Allreduce", "Ibcast", "Bcast")
                                 and k[3] not in VOTE_COMMS),
        "vote_ranks": len(votes),
        "vote_leaders": sum(v["leader"] for v in votes.values()),
        "vote_gather_calls": votes[0]["gather_calls"],
        "vote_gather_send_bytes": votes[0]["gather_send"],  # per call, the same on every rank
        "vote_gather_recv_bytes": votes[0]["gather_recv"],
    }
    for role, leader in (("leader", True), ("other", False)):
        vs = [v for v in votes.values() if v["leader"] == leader]
        for f in ("summary_send", "summary_recv"):
            out["vote_%s_%s_bytes" % (role, f)] = max(v[f] for v in vs) if vs else None
    # The old columns: what a rank sends and receives in the vote per step, all collectives together.
    out["vote_send_bytes"] = max((v["summary_send"] + v["gather_send"] * v["gather_calls"] / max(1, steps))
                                 for v in votes.values())
    out["vote_recv_bytes"] = max((v["summary_recv"] + v["gather_recv"] * v["gather_calls"] / max(1, steps))
                                 for v in votes.values())
    return out


def math_of(run_dir):
    """The math libraries and thread counts the run recorded (run.json)."""
    try:
        j = json.load(open(os.path.join(run_dir, "run.json")))
    except (OSError, ValueError):
        return {}
    return {k: j.get(k) for k in ("blas", "intra_op_threads", "math", "mpi_thread_level", "versions")}


def incidents_of(run_dir):
    """incidents.jsonl without its times and Slurm job ids (every srun of --cluster is a job of its
    own): what the decisions were."""
    path = os.path.join(run_dir, "incidents.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [{k: v for k, v in json.loads(l).items() if k not in ("time", "slurm_job_id")}
                for l in f if l.endswith("\n")]


def vote_arrangements(work, world, shim):
    """The faulty run three ways (docs/scale.md 2.1): the vote before the summary (CULPRIT_VOTE_GATHER:
    one all-gather of records a step), the summary over 4 "nodes" of W/4 ranks (CULPRIT_NODE_SPLIT),
    and over what MPI_COMM_TYPE_SHARED gives on this machine (one node). Bytes per rank per step by
    role, and whether the incidents and every step's fingerprint and loss are the same bits."""
    _, _, inject = faults(world)
    out = {"world": world}
    ref = None
    for name, env in (("before", {"CULPRIT_VOTE_GATHER": "1"}),
                      ("nodes4", {"CULPRIT_NODE_SPLIT": str(max(1, world // 4))}),
                      ("shared", {})):
        run_dir = os.path.join(work, "w%d-%s" % (world, name))
        shutil.rmtree(run_dir, ignore_errors=True)
        job = run_ranks(work, "w%d-%s" % (world, name), world, ["train", "--run-dir", run_dir] + MODEL + inject, shim,
                        env=env)
        rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        facts = {"incidents": incidents_of(run_dir), "steps": [(r["step"], r["loss"], r["fingerprint"]) for r in rows]}
        ref = ref or facts
        out[name] = {"codes": sorted(set(job["codes"].values()), key=str), "collectives": collectives(job, len(rows)),
                     "steps": len(rows), "same_decisions_and_bits": facts == ref, "math": math_of(run_dir)}
        if set(job["codes"].values()) != {11}:
            out[name]["out"] = job["out"]
    return out


def formulas(world, t_params, n_layers, spm, p_params):
    return {
        "vote_words": 3 + 3 * world + 4 * M + 2 * t_params,  # one record (the second round's all-gather)
        "summary_words": 3 + 1 + 4 * M + 1 + 2 * 2 * t_params,  # vote_summary.h: flat in W
        "vote_send_bytes": 8 * (3 + 3 * world + 4 * M + 2 * t_params),
        "vote_recv_bytes": 8 * (3 + 3 * world + 4 * M + 2 * t_params) * (world - 1),
        "reduction_bytes": 2 * (world - 1) * 4 * (p_params + 1) / world,
        "trace_row_bytes_per_step_rank": (80 + 24 * t_params) + (M / world) * (124 + 16 * n_layers + 8 * t_params + 8 * spm),
    }


def one_world(work, world, shim, twin):
    res = {"world": world}
    silent, detected, inject = faults(world)
    res["truth"] = {"silent": {"step": S_SILENT, "rank": silent, "shard": silent * M // world, "layer": "fc3",
                               "phase": "forward"},
                    "detected": {"step": S_DETECTED, "rank": detected, "shard": detected * M // world, "layer": "fc2",
                                 "phase": "forward"}}
    run_dir, twin_dir = os.path.join(work, "w%d" % world), os.path.join(work, "w%d-twin" % world)
    for d in (run_dir, twin_dir):
        shutil.rmtree(d, ignore_errors=True)
    if twin:
        job = run_ranks(work, "w%d-twin" % world, world, ["train", "--run-dir", twin_dir] + MODEL, shim)
        res["twin_train"] = {"codes": sorted(set(job["codes"].values()), key=str), "wall": job["wall"],
                             "memory": memory_of(job)}
        rows = [json.loads(l) for l in open(os.path.join(twin_dir, "metrics.jsonl"))]
        res["twin_fingerprint"] = rows[-1]["fingerprint"]
    job = run_ranks(work, "w%d-train" % world, world, ["train", "--run-dir", run_dir] + MODEL + inject, shim)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    res["train"] = {"codes": sorted(set(job["codes"].values()), key=str), "wall": job["wall"],
                    "memory": memory_of(job), "collectives": collectives(job, len(rows)), "math": math_of(run_dir)}
    if set(job["codes"].values()) != {11}:
        res["train"]["out"] = job["out"]
    mid = [r for r in rows if 2 <= r["step"] < S_DETECTED]
    res["train"]["steps"] = len(rows)
    res["train"]["detector_ms_median"] = 1e3 * median([r["detector_seconds"] for r in mid])
    res["train"]["step_ms_median"] = 1e3 * median([r["seconds"] for r in mid])
    res["train"]["detector_ms_all"] = [1e3 * r["detector_seconds"] for r in rows]
    inc = first_incident(run_dir)
    res["incident"] = {k: inc.get(k) for k in ("step", "detector", "rank", "micro_shard")} if inc else None
    tf = trace_facts(run_dir)
    res["trace"] = tf
    ck = {os.path.basename(p): os.path.getsize(p) for p in glob.glob(os.path.join(run_dir, "checkpoints", "*.h5"))}
    res["checkpoints"] = ck
    p_params = rows[-1]["optimizer_bytes"] // 4  # SGD momentum: one float per parameter
    res["params"] = p_params
    res["formula"] = formulas(world, tf["params"], len(tf["layers"]), tf["samples_per_shard"], p_params)
    if twin:
        res["twin_difference"] = first_difference(run_dir, twin_dir)
    # Diagnosis, then the audit, on the same W ranks.
    job = run_ranks(work, "w%d-bisect" % world, world, ["bisect", "--run-dir", run_dir], None)
    path = os.path.join(run_dir, "diagnosis.json")
    d = json.load(open(path)) if os.path.exists(path) else {}
    res["bisect"] = {"codes": sorted(set(job["codes"].values()), key=str), "wall": job["wall"],
                     "memory": memory_of(job),
                     **{k: d.get(k) for k in ("verdict", "step", "phase", "layer", "rank", "candidates",
                                              "steps_replayed", "seconds", "startup_seconds")}}
    if not d:
        res["bisect"]["out"] = job["out"]
    job = run_ranks(work, "w%d-audit" % world, world, ["audit", "--run-dir", run_dir], None)
    path = os.path.join(run_dir, "audit.json")
    a = json.load(open(path)) if os.path.exists(path) else {}
    res["audit"] = {"codes": sorted(set(job["codes"].values()), key=str), "wall": job["wall"],
                    "memory": memory_of(job), "seconds": a.get("seconds"), "mismatches": a.get("mismatches"),
                    "intervals": [(i["from"], i["to"], i["verdict"], i["detail"]) for i in a.get("intervals", [])]}
    if not a:
        res["audit"]["out"] = job["out"]
    res["score"] = score(res)
    return res


def score(res):
    t = res["truth"]
    s = {}
    inc = res["incident"] or {}
    s["detect"] = inc.get("step") == t["detected"]["step"] and inc.get("rank") == t["detected"]["rank"]
    b = res["bisect"]
    s["bisect"] = (b.get("verdict") == "hardware-transient" and b.get("step") == t["detected"]["step"] and
                   b.get("phase") == "forward" and b.get("layer") == t["detected"]["layer"] and
                   b.get("rank") == t["detected"]["rank"])
    a = res["audit"]
    bad = [i for i in a["intervals"] if i[2] == "mismatch"]
    ok = a.get("mismatches") == 1 and len(bad) == 1 and bad[0][0] < t["silent"]["step"] <= bad[0][1]
    if ok:
        m = re.search(r"step (\d+) micro-shard (\d+) \(recorded by rank (\d+)\b.*layer (\S+)", bad[0][3])
        ok = bool(m) and (int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)) == (
            t["silent"]["step"], t["silent"]["shard"], t["silent"]["rank"], t["silent"]["layer"])
    s["audit"] = ok
    if "twin_difference" in res:
        d = res["twin_difference"] or {}
        s["twin"] = (d.get("step"), d.get("shard"), d.get("rank"), d.get("layer")) == (
            t["silent"]["step"], t["silent"]["shard"], t["silent"]["rank"], t["silent"]["layer"])
    s["exact"] = all(s.values())
    return s


def load_only(work, shim):
    """A process that loads culprit (libtorch, MPI as a singleton) and exits: `culprit train --help`."""
    prefix = os.path.join(work, "ranks", "load")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    env = dict(os.environ)
    if shim:
        env.update(LD_PRELOAD=shim, SCALE_SHIM_OUT=prefix + ".shim")
    out = subprocess.run(["/usr/bin/time", "-f", "%M", CULPRIT, "train", "--help"], capture_output=True, text=True,
                         env=env)
    res = {"peak_rss_mib": int(out.stderr.split()[-1]) / 1024.0}
    for path in glob.glob(prefix + ".shim-*.exit"):
        st = parse_dump(path)["status"]
        if st.get("Name") == COMM:
            res.update({k: st.get(k, 0) / 1024.0 for k in ("RssAnon", "RssFile", "Pss")})
    return res


def env_variants(work, world, shim):
    out = []
    for name, env, mca in ENV_VARIANTS:
        run_dir = os.path.join(work, "env-%d" % len(out))
        shutil.rmtree(run_dir, ignore_errors=True)
        job = run_ranks(work, "env-%d" % len(out), world, ["train", "--run-dir", run_dir] + MODEL, shim, env=env,
                        mca=mca)
        m = memory_of(job)
        out.append({"variant": name, "codes": sorted(set(job["codes"].values()), key=str), **m})
        print("  %-34s peak RSS median %6.1f MiB  RssAnon %5.1f  RssFile %5.1f  Pss %5.1f  job footprint %6.0f MiB" % (
            name, m["peak_rss_median_mib"] or 0, m["rss_anon_median_mib"] or 0, m["rss_file_median_mib"] or 0,
            m["pss_median_mib"] or 0, m["job_mem_drop_mib"]), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,4,8,16,32,64")
    ap.add_argument("--json", default="", help="write the raw numbers here")
    ap.add_argument("--keep", default="", help="work in this directory and keep it (default: a temporary one, removed)")
    ap.add_argument("--no-twin", action="store_true", help="skip the clean twins (truth from the spec alone)")
    ap.add_argument("--env-variants", type=int, default=0, metavar="W",
                    help="also train at W ranks under each environment variant (memory per rank)")
    ap.add_argument("--vote-only", action="store_true",
                    help="only the vote's arrangements (before / 4 nodes / shared) of the faulty run per W")
    ap.add_argument("--cluster", action="store_true",
                    help="with --vote-only: start the ranks with srun over the 4 real nodes of scripts/slurm-cluster.sh "
                         "(started and stopped here; root): the 'shared' arrangement is then 4 nodes of W/4 ranks")
    ap.add_argument("--mib-per-rank", type=int, default=200,
                    help="refuse a W unless MemAvailable holds W x this + 1 GiB (default 200)")
    a = ap.parse_args()
    worlds = [int(w) for w in a.worlds.split(",")]
    if a.cluster and not a.vote_only:
        ap.error("--cluster goes with --vote-only")
    global CLUSTER_LAUNCH
    if a.cluster:
        env = dict(os.environ, **CLUSTER_ENV)
        subprocess.run([CLUSTER, "stop"], env=env, capture_output=True)
        subprocess.run([CLUSTER, "start"], env=env, check=True)
        CLUSTER_LAUNCH = [CLUSTER, "exec", "srun", "-N4", "-O", "--mpi=pmix", "--kill-on-bad-exit=0",
                          "--distribution=block"]
    if any(w < 2 or w > M or M % w for w in worlds):
        ap.error("worlds must divide %d and be at least 2" % M)
    work = os.path.abspath(a.keep) if a.keep else tempfile.mkdtemp(prefix="culprit-scale-")
    os.makedirs(work, exist_ok=True)
    results, out = [], {"culprit": CULPRIT, "worlds": worlds, "config": MODEL, "k": K}
    try:
        shim = build_shim(work)
        load = load_only(work, shim)
        out["load_only"] = load
        print("load only (culprit train --help): peak RSS %.1f MiB, RssAnon %.1f, RssFile %.1f, Pss %.1f" % (
            load["peak_rss_mib"], load.get("RssAnon", 0), load.get("RssFile", 0), load.get("Pss", 0)), flush=True)
        for w in worlds:
            avail = mem_available_kib() / 1024.0
            need = w * a.mib_per_rank + 1024
            if avail < need:
                print("W=%d skipped: MemAvailable %.0f MiB < %d MiB" % (w, avail, need), flush=True)
                continue
            t0, load1 = time.time(), os.getloadavg()[0]
            if a.vote_only:
                r = vote_arrangements(work, w, shim)
                r["bench_seconds"] = time.time() - t0
                results.append(r)
                same = all(r[n]["same_decisions_and_bits"] and r[n]["codes"] == [11] for n in ("before", "nodes4", "shared"))
                r["score"] = {"exact": same}
                print("W=%2d done in %.0f s: %s" % (w, r["bench_seconds"], "same decisions and bits" if same else
                                                    "DIFFERENT: %s" % json.dumps(r, default=str)[:3000]), flush=True)
                continue
            r = one_world(work, w, shim, not a.no_twin)
            r["loadavg_1min_before"] = load1
            r["bench_seconds"] = time.time() - t0
            results.append(r)
            print("W=%2d done in %.0f s (MemAvailable before: %.0f MiB): %s" % (
                w, r["bench_seconds"], avail, "exact" if r["score"]["exact"] else "NOT EXACT %s" % r["score"]), flush=True)
            for part in ("train", "bisect", "audit"):
                if "out" in r[part]:
                    print("  %s output:\n%s" % (part, r[part]["out"]), flush=True)
        out["results"] = results
        if a.env_variants:
            print("environment variants, clean training at W=%d:" % a.env_variants, flush=True)
            out["env_variants"] = env_variants(work, a.env_variants, shim)
        print()
        print(vote_table(results, a.cluster) if a.vote_only else tables(results, load, K, S_DETECTED, S_SILENT))
    finally:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        if a.cluster:
            subprocess.run([CLUSTER, "stop"], env=dict(os.environ, **CLUSTER_ENV), capture_output=True)
    return 0 if results and all(r["score"]["exact"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
