#!/usr/bin/env bash
# Installs the Debian 12 packages culprit needs (only those missing), then configures and builds
# with the CMake preset "default" (Ninja, ccache, precompiled headers) into ./build.
#   CULPRIT_PRESET=asan scripts/setup.sh   builds the AddressSanitizer preset instead.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  g++ cmake ninja-build ccache pkg-config
  libtorch-dev                        # libtorch 1.13
  openmpi-bin libopenmpi-dev          # Open MPI 4.1
  libhdf5-openmpi-dev hdf5-tools      # parallel HDF5 1.10, h5ls
  libboost-program-options-dev
  libxxhash-dev nlohmann-json3-dev
  googletest libgtest-dev
  clang libclang-rt-14-dev           # libFuzzer target (tests/fuzz)
  python3-torch python3-h5py python3-xxhash python3-numpy  # reference and interop tests
  pybind11-dev python3-dev           # the Python package (python/, docs/python.md)
  chromium                           # headless: loads diagnosis.html in a real browser (test_bisect)
  slurm-wlm munge                    # a real single-node Slurm for jobs/ (scripts/slurm.sh, test_slurm)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

preset="${CULPRIT_PRESET:-default}"
cmake --preset "$preset" >/dev/null
# Each libtorch translation unit takes ~1.4 GB to compile: two jobs fit in 24 GiB comfortably.
cmake --build --preset "$preset" -j "${CULPRIT_BUILD_JOBS:-2}"
