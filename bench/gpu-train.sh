#!/usr/bin/env bash
# GPU training check (part of bench/gpu-check.sh): culprit built against a CUDA-enabled libtorch,
# trained with --device cuda, and `culprit screen --device cuda` with and without a flipped bit. Skips (exit 0, saying why) where there is no such libtorch, no GPU or
# no MPI/HDF5/Boost development files; exit 3 when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
# The interpreter whose torch culprit is built against (docs/build.md): the machine's python3, or
# CULPRIT_PYTHON; it must see a GPU.
python="${CULPRIT_PYTHON:-$(command -v python3 || true)}"
if [ -z "$python" ] || ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-train: skipped: no torch that sees a GPU (set CULPRIT_PYTHON to the interpreter of one)"
  exit 0
fi
# MPI, parallel HDF5 and Boost: the machine's, or else those bench/gpu-deps.sh brought (relocated).
. bench/gpu-env.sh
if ! command -v mpicxx >/dev/null || ! command -v h5pcc >/dev/null; then
  if gpu_deps_use_mpi; then
    echo "gpu-train: Open MPI, HDF5 and Boost from gpu-deps/debs (bench/gpu-deps.sh)"
  else
    echo "gpu-train: skipped: no mpicxx/h5pcc here and no gpu-deps/debs (run bench/gpu-deps.sh and bring gpu-deps/debs)"
    exit 0
  fi
fi
echo "gpu-train: libtorch of $python ($("$python" -c 'import torch; print(torch.__version__)'))"
cmake -S . -B build-gpu-train -DCMAKE_BUILD_TYPE=Release -DCULPRIT_PYTHON="$python" "${GPU_DEPS_CMAKE[@]}" \
  -DCULPRIT_BUILD_TESTS=OFF -DCULPRIT_BUILD_BENCH=OFF >/dev/null &&
  cmake --build build-gpu-train --target culprit -j "$(nproc)" >/dev/null || { echo "gpu-train: FAIL: the build failed"; exit 3; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dir=$(mktemp -d)
args=(--model gpt --steps 20 --global-batch 32 --micro-shards 8 --checkpoint-every 10 --quiet --device cuda)
fail=0
fp() { python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["fingerprint"])' "$1/metrics.jsonl"; }
mpirun --oversubscribe -np 2 build-gpu-train/culprit train --run-dir "$dir/a" "${args[@]}" || fail=1
mpirun --oversubscribe -np 2 build-gpu-train/culprit train --run-dir "$dir/b" "${args[@]}" || fail=1
mpirun --oversubscribe -np 1 build-gpu-train/culprit train --run-dir "$dir/c" "${args[@]}" || fail=1
a=$(fp "$dir/a") b=$(fp "$dir/b") c=$(fp "$dir/c")
echo "gpu-train: final fingerprints: W=2 $a, W=2 again $b, W=1 $c; devices: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["devices"])' "$dir/a/run.json" 2>/dev/null)"
[ -n "$a" ] && [ "$a" = "$b" ] && echo "gpu-train: PASS run to run (W=2)" || { echo "gpu-train: FAIL run to run"; fail=1; }
[ "$a" = "$c" ] && echo "gpu-train: PASS across world sizes (W=2 vs W=1)" || echo "gpu-train: DIFFERS across world sizes (W=2 vs W=1; see docs/cuda.md)"
build-gpu-train/culprit diff "$dir/a/checkpoints/step-00000020.h5" "$dir/b/checkpoints/step-00000020.h5" | tail -n 1
# Negative control: a NaN injected into rank 1's forward pass on the GPU is caught (exit 11: numerical).
mpirun --oversubscribe -np 2 build-gpu-train/culprit train --run-dir "$dir/nan" "${args[@]}" \
  --inject step=3,rank=1,layer=blocks.0.mlp.fc,phase=forward,kind=nan >/dev/null 2>&1
code=$?
[ "$code" -ne 0 ] && grep -q "step=3" "$dir/nan/incidents.log" && echo "gpu-train: PASS injected NaN caught (exit $code)" \
  || { echo "gpu-train: FAIL injected NaN not caught (exit $code)"; fail=1; }
# culprit screen on the GPU: the known answers pass; a bit flipped in the GPU's matrix product from
# repetition 2 on fails the device (exit 10) and names its host in the exclude list.
screen=(build-gpu-train/culprit screen --device cuda --seconds 5 --size 512)
mpirun --oversubscribe -np 1 "${screen[@]}" --report "$dir/screen.json"
code=$?
[ "$code" -eq 0 ] && echo "gpu-train: PASS culprit screen --device cuda" || { echo "gpu-train: FAIL culprit screen (exit $code)"; fail=1; }
mpirun --oversubscribe -np 1 "${screen[@]}" --report "$dir/flip.json" \
  --inject rank=0,layer=matmul,step=2,index=5,kind=bitflip,bit=4,mode=persistent >/dev/null 2>&1
code=$?
verdict=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["devices"][0]["verdict"])' "$dir/flip.json" 2>/dev/null)
[ "$code" -eq 10 ] && [ "$verdict" = fail ] && echo "gpu-train: PASS flip in the GPU matmul caught by culprit screen (exit 10)" \
  || { echo "gpu-train: FAIL flip not caught by culprit screen (exit $code, verdict '$verdict')"; fail=1; }
rm -rf "$dir"
[ "$fail" = 0 ] || exit 3
