#!/usr/bin/env bash
# Checkpoint cost for a model of >= 100 MB of state (mlp --hidden 4096 with SGD momentum: 135 MB):
#  - write throughput of culprit's checkpoint (W = 1 and 2) against a plain sequential write of the
#    same number of bytes to the same disk (pwrite + fsync, median of 6);
#  - the training stall per checkpoint with --async-checkpoint on and off, against an in-memory copy
#    of the same bytes.
# Needs a build in ./build. Writes under ${BENCH_DIR:-/tmp/culprit-bench}.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
dir="${BENCH_DIR:-/tmp/culprit-bench}"
rm -rf "$dir" && mkdir -p "$dir"
args=(--model mlp --hidden 4096 --samples 64 --global-batch 8 --micro-shards 8 --steps 12 --checkpoint-every 2
      --keep-last 1 --trace off --quiet)
mpirun --oversubscribe --bind-to none -np 1 build/culprit train --run-dir "$dir/async-w1" "${args[@]}" >/dev/null
mpirun --oversubscribe --bind-to none -np 2 build/culprit train --run-dir "$dir/async-w2" "${args[@]}" >/dev/null
mpirun --oversubscribe --bind-to none -np 1 build/culprit train --run-dir "$dir/sync-w1" "${args[@]}" \
  --async-checkpoint false >/dev/null
bytes=$(stat -c %s "$dir/async-w1/checkpoints/step-00000012.h5")
/usr/bin/python3 - "$dir" "$bytes" <<'PY'
import json, re, sys, time
import numpy as np
d, size = sys.argv[1], int(sys.argv[2])
# The plain write: the same number of (random) bytes, 64 MiB pwrites, fsync; median of 6. Like
# checkpoints under --keep-last 1, each new file is written while the previous one still exists,
# which is then deleted: on a VM, page-cache pages recycled from a just-deleted file are much
# cheaper than fresh ones, so deleting first would flatter the plain write.
import os
blob = np.random.default_rng(0).standard_normal(size // 4).astype(np.float32).tobytes()
rates = []
prev = None
for i in range(6):
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
plain = sorted(rates)[3]
def log(name):
    return [json.loads(l) for l in open("%s/%s/checkpoints.jsonl" % (d, name))]
src = np.ones(size // 4, dtype=np.float32)
dst = np.empty_like(src)
copies = []
for _ in range(5):
    t = time.perf_counter(); np.copyto(dst, src); copies.append(time.perf_counter() - t)
copy = sorted(copies)[2]
print("checkpoint file: %.1f MB; plain sequential write (pwrite + fsync, median of 6): %.0f MB/s; in-memory copy: %.1f ms"
      % (size / 1e6, plain / 1e6, copy * 1e3))
print("%-10s %14s %12s %18s %18s" % ("run", "write MB/s", "vs plain", "stall ms (median)", "stall / copy"))
for name in ("async-w1", "async-w2", "sync-w1"):
    rows = log(name)
    tput = sorted(r["bytes"] / r["write_seconds"] for r in rows)[len(rows) // 2]
    if rows[0]["async"]:
        stalls = sorted(r["copy_seconds"] + r["wait_seconds"] for r in rows)
    else:
        stalls = sorted(r["copy_seconds"] + r["total_io_seconds"] for r in rows)
    stall = stalls[len(stalls) // 2]
    print("%-10s %14.0f %12.2f %18.1f %18.2f" % (name, tput / 1e6, tput / plain, stall * 1e3, stall / copy))
PY
