#!/usr/bin/env python3
"""Streaming a token data set larger than the memory budget: resident memory per rank and the read
stall per step, beside a small data set, in one run.

    .venv/bin/python bench/stream.py [--gib 3] [--budget-mib 384] [--world 2] [--steps 500] [--keep]

What it does (results: docs/performance.md ("Streaming a data set larger than memory")):
1. Writes two token files (uint16, vocabulary 512, random ids from a fixed seed, made here with
   numpy: nothing is downloaded) in a fresh directory: a large one of --gib GiB and a small one of
   --small-mib MiB, each with its PATH.json sidecar.
2. `culprit prepare-data` on the large one (its record stands for the scan at open; timed), then
   evicts the file from the page cache (posix_fadvise DONTNEED), so that training reads it cold.
3. Trains gpt on each file under mpirun with the same options (the read-ahead is always on): the
   large file twice, with --shuffle randperm (its order holds 8 bytes per sample on every rank)
   and feistel (O(1)), evicted before each; then the small file. Each rank runs in a memory budget
   of --budget-mib: a cgroup v2 child with memory.max per rank where the machine has a writable
   cgroup v2 with the memory controller; otherwise (this VM: its cgroup v2 carries no memory
   controller) the budget is checked on the samples, and the bench says so.
4. Samples every rank's /proc/PID/status (VmRSS, RssFile, RssAnon) every --interval seconds and
   reports per rank, while it trains (from the end of step 1 to before the last step ends): the
   first sample, the last and the peak, and the growth peak - first; the budget applies to the
   process's whole life.
5. The read stall per step: metrics.jsonl's data_wait_seconds / seconds (rank 0's), median and p95
   over the steps after the first (step 1's samples are not read ahead), against a 5% target;
   data_read_seconds (the reads' own time, behind compute) beside it.
6. What the release of read pages saves: the distinct pages of the large file each rank read
   (computed from the run's randperm order), which RssFile would hold without it.
Exits 1 when a budget, the flatness (growth over --flat-mib) or the stall target is missed. The
files are deleted at the end unless --keep.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(HERE, "..", "build", "culprit"))
VOCAB = 512
SEED = 1234  # culprit train's default --seed
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def write_tokens(path, n_tokens, seed, seq_len):
    import numpy as np
    rng = np.random.default_rng(seed)
    chunk = 32 << 20  # tokens per write: 64 MiB
    with open(path, "wb") as f:
        left = n_tokens
        while left:
            m = min(chunk, left)
            f.write(rng.integers(0, VOCAB, m, dtype=np.uint16).astype("<u2").tobytes())
            left -= m
    with open(path + ".json", "w") as f:
        json.dump({"dtype": "uint16", "vocab": VOCAB, "seq_len": seq_len}, f)


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- the memory budget ----

def cgroup2_memory_parent():
    """A writable cgroup v2 directory whose children can have memory.max, or (None, why not)."""
    mounts = [l.split() for l in open("/proc/mounts")]
    roots = [m[1] for m in mounts if m[2] == "cgroup2"]
    if not roots:
        return None, "no cgroup v2 is mounted"
    own = next((l.strip()[3:] for l in open("/proc/self/cgroup") if l.startswith("0::")), None)
    for root in roots:
        try:
            controllers = open(os.path.join(root, "cgroup.controllers")).read().split()
        except OSError:
            continue
        if "memory" not in controllers:
            return None, "cgroup v2 at %s has no memory controller (controllers: %s)" % (root, " ".join(controllers) or "none")
        parent = os.path.join(root, (own or "/").lstrip("/"))
        if not os.access(parent, os.W_OK):
            return None, "cgroup v2 directory %s is not writable" % parent
        try:
            if "memory" not in open(os.path.join(parent, "cgroup.subtree_control")).read().split():
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
        except OSError as e:
            return None, "cannot enable the memory controller below %s: %s" % (parent, e)
        return parent, ""
    return None, "no readable cgroup v2"


class Budget:
    """One cgroup v2 child per rank with memory.max, when the machine allows; else a bound checked on
    the samples. Its rank wrapper puts each rank in its cgroup before exec'ing culprit."""

    def __init__(self, budget_bytes, world, tag):
        self.bytes = budget_bytes
        self.dirs = []
        parent, self.why_not = cgroup2_memory_parent()
        if parent is None:
            return
        try:
            base = os.path.join(parent, tag)
            os.mkdir(base)
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
            for r in range(world):
                d = os.path.join(base, "rank-%d" % r)
                os.mkdir(d)
                with open(os.path.join(d, "memory.max"), "w") as f:
                    f.write(str(budget_bytes))
                self.dirs.append(d)
            self.base = base
        except OSError as e:
            self.why_not = "cannot make cgroups below %s: %s" % (parent, e)
            self.close()
            self.dirs = []

    @property
    def enforced(self):
        return bool(self.dirs)

    def wrapper(self, work):
        """A shell wrapper: records the rank's pid, joins its cgroup, execs the command."""
        path = os.path.join(work, "rank.sh")
        join = ""
        if self.enforced:
            join = 'echo $$ > "%s/rank-$OMPI_COMM_WORLD_RANK/cgroup.procs" || exit 97\n' % self.base
        with open(path, "w") as f:
            f.write('#!/bin/sh\necho $$ > "%s/pid.$OMPI_COMM_WORLD_RANK"\n%sexec "$@"\n' % (work, join))
        os.chmod(path, 0o755)
        return path

    def events(self):
        """Per rank, memory.events' counters (max: times the limit was hit; oom_kill)."""
        out = []
        for d in self.dirs:
            ev = dict(l.split() for l in open(os.path.join(d, "memory.events")))
            out.append({k: int(v) for k, v in ev.items()})
        return out

    def close(self):
        for d in reversed(self.dirs):
            try:
                os.rmdir(d)
            except OSError:
                pass
        if getattr(self, "base", None):
            try:
                os.rmdir(self.base)
            except OSError:
                pass


# ---- sampling ----

def status_kb(pid):
    out = {}
    try:
        for line in open("/proc/%d/status" % pid):
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssFile", "RssAnon"):
                out[k] = int(v.split()[0])
    except OSError:
        return None
    return out if len(out) == 3 else None


class Sampler(threading.Thread):
    def __init__(self, work, world, interval, metrics):
        super().__init__(daemon=True)
        self.work, self.world, self.interval, self.metrics = work, world, interval, metrics
        self.samples = {r: [] for r in range(world)}  # rank: [(t, steps done, {VmRSS, RssFile, RssAnon})]
        self.stop = threading.Event()

    def steps_done(self):
        try:
            with open(self.metrics) as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    def run(self):
        pids = {}
        while not self.stop.is_set():
            for r in range(self.world):
                if r not in pids:
                    try:
                        pids[r] = int(open(os.path.join(self.work, "pid.%d" % r)).read())
                    except (OSError, ValueError):
                        continue
                s = status_kb(pids[r])
                if s:
                    self.samples[r].append((time.monotonic(), self.steps_done(), s))
            self.stop.wait(self.interval)


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def pages_read(n_windows, seq_len, steps, batch, shards, world):
    """Per rank: the distinct 4 KiB pages of the file its windows cover (randperm order, epoch 0)."""
    import torch
    g = torch.Generator()
    g.manual_seed(SEED)
    order = torch.randperm(n_windows, generator=g)[: steps * batch].view(steps, batch)
    per = batch // shards
    out = []
    for r in range(world):
        lo, hi = r * shards // world, (r + 1) * shards // world
        w = order[:, lo * per: hi * per].reshape(-1).to(torch.int64)
        first = (w * seq_len * 2) // 4096
        last = ((w * seq_len + seq_len) * 2 + 1) // 4096
        pages = torch.unique(torch.cat([first, last]))
        out.append(int(pages.numel()))
    return out


def train(work, name, data, a, budget, shuffle="randperm"):
    run_dir = os.path.join(work, "run-%s-%s" % (name, shuffle))
    wrapper = budget.wrapper(work)
    for r in range(a.world):
        try:
            os.remove(os.path.join(work, "pid.%d" % r))
        except OSError:
            pass
    cmd = MPIRUN + ["-np", str(a.world), wrapper, CULPRIT, "train", "--run-dir", run_dir, "--quiet",
                    "--model", "gpt", "--data", "tokens:" + data, "--layers", str(a.layers), "--width", str(a.width),
                    "--heads", "2", "--optimizer", "adamw", "--lr", "0.001", "--steps", str(a.steps),
                    "--global-batch", str(a.global_batch), "--micro-shards", str(a.micro_shards),
                    "--checkpoint-every", "0", "--trace", "step", "--shuffle", shuffle]
    sampler = Sampler(work, a.world, a.interval, os.path.join(run_dir, "metrics.jsonl"))
    sampler.start()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit("stream.py: training on %s failed (exit %d):\n%s\n%s" % (name, proc.returncode, proc.stdout, proc.stderr))
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    stall = [r["data_wait_seconds"] / r["seconds"] for r in rows[1:]]
    read = [r["data_read_seconds"] / r["seconds"] for r in rows[1:]]
    ranks = []
    keys = ("VmRSS", "RssFile", "RssAnon")
    for r in range(a.world):
        s = sampler.samples[r]
        # While training: from the end of step 1 to before the last step ends (then the rank writes
        # its last checkpoint, closes the data and unmaps it: what it held while training is gone).
        training = [x for x in s if 1 <= x[1] < len(rows)] or s
        mib = lambda x, k: x[2][k] / 1024.0  # noqa: E731
        ranks.append({
            "samples": len(s), "samples_training": len(training),
            "first": {k: mib(training[0], k) for k in keys},
            "last": {k: mib(training[-1], k) for k in keys},
            "peak": {k: max(mib(x, k) for x in training) for k in keys},
            "max": {k: max(mib(x, k) for x in s) for k in keys},  # the whole process, start-up included
        })
    return {
        "name": name, "shuffle": shuffle, "wall_seconds": wall, "steps": len(rows),
        "step_seconds_median": statistics.median(r["seconds"] for r in rows[1:]),
        "stall_median": statistics.median(stall), "stall_p95": percentile(stall, 0.95), "stall_max": max(stall),
        "step1_wait_seconds": rows[0]["data_wait_seconds"],
        "read_share_median": statistics.median(read),
        "ranks": ranks, "events": budget.events(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=3.0, help="the large data set's size")
    ap.add_argument("--small-mib", type=float, default=8.0, help="the small data set's size")
    ap.add_argument("--budget-mib", type=float, default=384.0, help="memory budget per rank")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--micro-shards", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between RSS samples")
    ap.add_argument("--flat-mib", type=float, default=16.0, help="allowed growth of a rank's RSS, first to last")
    ap.add_argument("--stall-target", type=float, default=0.05)
    ap.add_argument("--dir", help="where to write the data sets (default: a new directory in $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the data sets and runs")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="culprit-stream-", dir=a.dir)
    need = a.gib * (1 << 30) + a.small_mib * (1 << 20)
    free = shutil.disk_usage(work).free
    if free < 2 * need:
        sys.exit("stream.py: %s has %.1f GiB free; the data sets need %.1f GiB (twice that kept free)" %
                 (work, free / (1 << 30), need / (1 << 30)))
    budget = Budget(int(a.budget_mib * (1 << 20)), a.world, os.path.basename(work))
    results = {"config": vars(a), "budget_enforced": budget.enforced,
               "budget_how": "cgroup v2 memory.max per rank" if budget.enforced else
               "checked on the samples (%s)" % budget.why_not}
    try:
        big, small = os.path.join(work, "big.bin"), os.path.join(work, "small.bin")
        t0 = time.monotonic()
        write_tokens(big, int(a.gib * (1 << 30)) // 2, 1, a.seq_len)
        write_tokens(small, int(a.small_mib * (1 << 20)) // 2, 2, a.seq_len)
        results["generate_seconds"] = time.monotonic() - t0
        t0 = time.monotonic()
        prep = subprocess.run([CULPRIT, "prepare-data", "--data", "tokens:" + big], capture_output=True, text=True)
        if prep.returncode != 0:
            sys.exit("stream.py: prepare-data failed:\n" + prep.stderr)
        results["prepare_seconds"] = time.monotonic() - t0
        evict(big)
        runs = [train(work, "large", big, a, budget)]
        evict(big)
        runs += [train(work, "large", big, a, budget, "feistel"), train(work, "small", small, a, budget)]
        results["runs"] = runs
        n_big = (os.path.getsize(big) // 2 - 1) // a.seq_len
        results["large_pages_read_per_rank_mib"] = [p * 4096 / (1 << 20) for p in pages_read(
            n_big, a.seq_len, a.steps, a.global_batch, a.micro_shards, a.world)]
        results["large_bytes"] = os.path.getsize(big)
        results["small_bytes"] = os.path.getsize(small)
    finally:
        budget.close()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    print("stream.py: gpt (%d layers, width %d, seq_len %d), global batch %d, %d micro-shards, W=%d, %d steps" %
          (a.layers, a.width, a.seq_len, a.global_batch, a.micro_shards, a.world, a.steps))
    print("data: large %.2f GiB (%d windows), small %.1f MiB; budget %.0f MiB per rank (the large data set is "
          "%.1fx the job's); %s" % (results["large_bytes"] / (1 << 30), n_big, results["small_bytes"] / (1 << 20),
                                         a.budget_mib, results["large_bytes"] / (a.budget_mib * (1 << 20) * a.world),
                                         results["budget_how"]))
    print("generate %.1f s, prepare-data (the large file's record: its scan and block fingerprints) %.1f s; the large "
          "file evicted from the page cache before its run" % (results["generate_seconds"], results["prepare_seconds"]))
    print()
    print("| data | order | rank | VmRSS first / last / peak (MiB) | RssFile first / last / peak | growth | max | "
          "step (median) | stall median | stall p95 | reads / step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    failed = []
    for run in results["runs"]:
        for r, rk in enumerate(run["ranks"]):
            growth = rk["peak"]["VmRSS"] - rk["first"]["VmRSS"]
            print("| %s | %s | %d | %.0f / %.0f / %.0f | %.1f / %.1f / %.1f | %+.1f | %.0f | %.1f ms | %.2f%% | %.2f%% | %.2f%% |" % (
                run["name"], run["shuffle"], r, rk["first"]["VmRSS"], rk["last"]["VmRSS"], rk["peak"]["VmRSS"],
                rk["first"]["RssFile"], rk["last"]["RssFile"], rk["peak"]["RssFile"], growth, rk["max"]["VmRSS"],
                1000 * run["step_seconds_median"],
                100 * run["stall_median"], 100 * run["stall_p95"], 100 * run["read_share_median"]))
            if rk["max"]["VmRSS"] > a.budget_mib:
                failed.append("%s rank %d: max RSS %.0f MiB over the budget" % (run["name"], r, rk["max"]["VmRSS"]))
            if growth > a.flat_mib:
                failed.append("%s rank %d: RSS grew %.1f MiB" % (run["name"], r, growth))
        if run["stall_p95"] > a.stall_target:
            failed.append("%s: stall p95 %.2f%% over the target" % (run["name"], 100 * run["stall_p95"]))
        for r, ev in enumerate(run["events"]):
            if ev.get("oom_kill", 0) or ev.get("max", 0):
                failed.append("%s rank %d: memory.events %s" % (run["name"], r, ev))
    print()
    print("step 1 (not read ahead) waited %s s for its samples (in the table's order)" %
          " / ".join("%.4f" % run["step1_wait_seconds"] for run in results["runs"]))
    print("without the release of read pages, each rank's RssFile would have held the large file's pages it "
          "read (randperm run): %s MiB" % " / ".join("%.1f" % m for m in results["large_pages_read_per_rank_mib"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if failed:
        print("MISSED: " + "; ".join(failed))
        sys.exit(1)
    print("ok: every rank within %.0f MiB, flat (growth <= %.0f MiB), stall p95 <= %.0f%%" %
          (a.budget_mib, a.flat_mib, 100 * a.stall_target))


if __name__ == "__main__":
    main()
