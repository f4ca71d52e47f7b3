#!/usr/bin/env bash
# bench/gpu-deps.sh: fetches, as Debian 12 packages, what bench/gpu-check.sh needs on a GPU machine that
# cannot install packages or reach a mirror, into ./gpu-deps/debs (kept out of git; about 33 MB):
#   core/     the kernel check's xxhash and GoogleTest sources; for GPU training (bench/gpu-train.sh)
#             Open MPI, PMIx, parallel HDF5, Boost.Program_options, nlohmann-json and SQLite (the
#             ledger), development files and runtime;
#   support/  the shared libraries those link (libevent, hwloc, libfabric, UCX, libcurl, ...), used
#             there only where the machine has no library of that name.
# Run it here, then carry gpu-deps/debs along (the device tool: carry ["gpu-deps/debs"]);
# bench/gpu-env.sh unpacks them there (dpkg-deb -x, nothing installed) and relocates Open MPI.
# Exit code: apt-get's on failure, 0 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
core=(libxxhash-dev libxxhash0 googletest nlohmann-json3-dev
      libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libpmix2
      libhdf5-openmpi-103-1 libhdf5-openmpi-dev
      libboost-program-options1.74.0 libboost-program-options1.74-dev libboost1.74-dev
      libsqlite3-0 libsqlite3-dev)
support=(libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libudev1 libfabric1 libucx0 libibverbs1 librdmacm1
         libnl-3-200 libnl-route-3-200 libnuma1 libpsm-infinipath1 libpsm2-2 libmunge2 libatomic1
         libaec0 libsz2 libcurl4 libssl3 libzstd1 libbrotli1 libnghttp2-14 libpsl5 librtmp1 libssh2-1
         libidn2-0 libunistring2 libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3 libgssapi-krb5-2
         libk5crypto3 libkrb5-3 libkrb5support0 libkeyutils1 libcom-err2 libgnutls30 libhogweed6 libnettle8
         libgmp10 libp11-kit0 libffi8 libtasn1-6 libbsd0 libmd0)
rm -rf gpu-deps && mkdir -p gpu-deps/debs/core gpu-deps/debs/support
# apt-get download as root warns that its sandbox user cannot write here; the download is unaffected.
(cd gpu-deps/debs/core && apt-get download "${core[@]}" 2>&1 | grep -v "unsandboxed" || true)
(cd gpu-deps/debs/support && apt-get download "${support[@]}" 2>&1 | grep -v "unsandboxed" || true)
n=$(ls gpu-deps/debs/core/*.deb gpu-deps/debs/support/*.deb | wc -l)
[ "$n" -eq $(( ${#core[@]} + ${#support[@]} )) ] || { echo "gpu-deps: only $n of $(( ${#core[@]} + ${#support[@]} )) packages fetched"; exit 1; }
du -sh gpu-deps/debs
