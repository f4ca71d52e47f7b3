#!/usr/bin/env bash
# scripts/check-torch2.sh: compiles (syntax only) culprit's libtorch units against the headers of
# libtorch 2.x, the libtorch of the PyTorch wheels that GPU training is built with
# (bench/gpu-train.sh), where Debian 12 has only 1.13. The headers come from Debian 13's libtorch-dev
# package (fetched from the Debian mirror and unpacked into build-torch2/, nothing installed).
#   scripts/check-torch2.sh        exit 0 when every unit compiles; the compiler's errors otherwise
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build-torch2
deb=pool/main/p/pytorch/libtorch-dev_2.6.0+dfsg-7_amd64.deb
if [ ! -d "$dir/root/usr/include/torch" ]; then
  mkdir -p "$dir"
  curl -fsS -o "$dir/libtorch-dev.deb" "http://deb.debian.org/debian/$deb" || { echo "check-torch2: cannot fetch $deb"; exit 2; }
  dpkg-deb -x "$dir/libtorch-dev.deb" "$dir/root"
fi
inc="$dir/root/usr/include"
mpi=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
rc=0
# The libtorch folders' units (harness/README.md), each with the precompiled header's <torch/torch.h>.
for f in harness/{model,optim,faults,screen,train}/*.cpp; do
  if g++ -std=c++17 -fsyntax-only -DCULPRIT_HAVE_CUDA=1 -DCULPRIT_VERSION='"check"' -DOMPI_SKIP_MPICXX=1 \
       -isystem "$inc" -isystem "$inc/torch/csrc/api/include" ${mpi:+-I"$mpi"} -I/usr/include/hdf5/openmpi \
       -Icommon/include -Ireduce/include -Icheckpoint/include -Iharness/include -Iharness -include torch/torch.h "$f"; then
    echo "check-torch2: $f: ok"
  else
    echo "check-torch2: $f: FAILED"
    rc=1
  fi
done
exit $rc
