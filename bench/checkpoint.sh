#!/usr/bin/env bash
# Checkpoint cost for a model of >= 100 MB of state (mlp --hidden 4096 with SGD momentum: 135 MB),
# in interleaved rounds so that every ratio compares measurements taken next to each other (this VM's
# memory and disk speed drift by 2x over minutes). Each round:
#  - the plain write: the same number of bytes, 64 MiB pwrites + fsync, median of 3;
#  - the in-memory copy of the same bytes (numpy copyto into a preallocated array), median of 5;
#  - culprit train with --async-checkpoint false at W = 1 and 2: the writer alone on the machine
#    (training waits), i.e. the checkpoint writer's own throughput; at W = 2 with the default one
#    writer per host and with both ranks writing half of every tensor (sync-w2all);
#  - culprit train with --async-checkpoint (the default) at W = 1 and 2: the training stall per
#    checkpoint (stall_seconds: the time the training loop waits; the state copy is pipelined with the
#    next step's forward and backward passes), the write throughput while the ranks keep training on
#    the same cores, and how much longer the step that overlaps the copy takes than the others.
# Prints every round and the median of the per-round ratios. Needs a build in ./build.
# Usage: bench/checkpoint.sh [ROUNDS=3]; writes under ${BENCH_DIR:-/tmp/culprit-bench}.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
dir="${BENCH_DIR:-/tmp/culprit-bench}"
rounds="${1:-3}"
rm -rf "$dir" && mkdir -p "$dir"
exec "$CULPRIT_PY" - "$dir" "$rounds" <<'PY'
import json, os, statistics, subprocess, sys, time
import numpy as np

d, rounds = sys.argv[1], int(sys.argv[2])
args = ["--model", "mlp", "--hidden", "4096", "--samples", "64", "--global-batch", "8", "--micro-shards", "8",
        "--steps", "12", "--checkpoint-every", "2", "--keep-last", "1", "--trace", "off", "--quiet"]
ALL = ["--checkpoint-writers-per-host", "0"]  # both ranks write (default: one writer per host)
runs = [("sync-w1", 1, False, []), ("sync-w2", 2, False, []), ("sync-w2all", 2, False, ALL),
        ("async-w1", 1, True, []), ("async-w2", 2, True, [])]

def train(name, w, asyn, extra=()):
    run = "%s/%s" % (d, name)
    subprocess.run(["rm", "-rf", run], check=True)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(w), "build/culprit", "train",
           "--run-dir", run] + args + list(extra) + ([] if asyn else ["--async-checkpoint", "false"])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(run + "/checkpoints.jsonl")]
    rows = [r for r in rows if r["step"] > 0]  # step 0 holds no optimizer state yet (half the bytes)
    tput = statistics.median(r["bytes"] / r["write_seconds"] for r in rows)
    stall = statistics.median(r["stall_seconds"] for r in rows)
    # What the pipelined copy costs the step it overlaps: the steps that follow a checkpoint (odd
    # ones: every 2nd step is checkpointed) against the others, median step times (metrics.jsonl).
    secs = {m["step"]: m["seconds"] for m in map(json.loads, open(run + "/metrics.jsonl"))}
    after = statistics.median(v for k, v in secs.items() if k % 2 == 1 and k > 1)
    other = statistics.median(v for k, v in secs.items() if k % 2 == 0)
    size = os.path.getsize(run + "/checkpoints/step-00000012.h5")
    return tput, stall, size, after - other

def plain_write(size):
    # Like checkpoints under --keep-last 1, each new file is written while the previous one still
    # exists, which is then deleted (recycled page-cache pages are much cheaper than fresh ones here).
    blob = np.random.default_rng(0).standard_normal(size // 4).astype(np.float32).tobytes()
    rates, prev = [], None
    for i in range(3):
        path = "%s/plain-%d.bin" % (d, i)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        t = time.perf_counter()
        for off in range(0, len(blob), 64 << 20):
            os.pwrite(fd, memoryview(blob)[off:off + (64 << 20)], off)
        os.fsync(fd)
        rates.append(len(blob) / (time.perf_counter() - t))
        os.close(fd)
        if prev:
            os.unlink(prev)
        prev = path
    os.unlink(prev)
    return statistics.median(rates)

def mem_copy(size):
    src = np.ones(size // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    ts = []
    for _ in range(5):
        t = time.perf_counter(); np.copyto(dst, src); ts.append(time.perf_counter() - t)
    return statistics.median(ts)

size = train("size-probe", 1, True)[2]
slow = {r[0]: [] for r in runs}
print("checkpoint file: %.1f MB; %d interleaved rounds" % (size / 1e6, rounds))
hdr = "%-6s %10s %9s" % ("round", "plain MB/s", "copy ms")
for name, _, asyn, _ in runs:
    hdr += " | %-8s %6s" % (name, "xplain") + (" %7s %6s" % ("stall", "xcopy") if asyn else "")
print(hdr)
ratios = {r[0]: ([], []) for r in runs}
for r in range(rounds):
    plain, copy = plain_write(size), mem_copy(size)
    line = "%-6d %10.0f %9.1f" % (r + 1, plain / 1e6, copy * 1e3)
    for name, w, asyn, opts in runs:
        tput, stall, _, extra = train(name, w, asyn, opts)
        slow[name].append(extra)
        ratios[name][0].append(tput / plain)
        ratios[name][1].append(stall / copy)
        line += " | %8.0f %6.2f" % (tput / 1e6, tput / plain)
        if asyn:
            line += " %5.1fms %6.2f" % (stall * 1e3, stall / copy)
    print(line, flush=True)
line = "%-27s" % "median"
for name, _, asyn, _ in runs:
    line += " | %8s %6.2f" % ("", statistics.median(ratios[name][0]))
    if asyn:
        line += " %7s %6.2f" % ("", statistics.median(ratios[name][1]))
print(line)
print("targets: writer throughput (sync-w1, sync-w2) >= 0.70x plain; async stall <= 1.20x copy")
print("the step after an async checkpoint (it overlaps the state copy) vs the other steps, median over rounds: " +
      ", ".join("%s %+.1f ms" % (n, statistics.median(slow[n]) * 1e3) for n, _, a, _ in runs if a))
PY
