#!/usr/bin/env bash
# Installs the Debian 12 packages culprit needs (only those missing) and, into the project's virtual
# environment .venv, the pinned PyTorch from the Python package registry (its wheel carries libtorch
# and its CMake files: what culprit builds against) with the tests' Python packages; then configures
# and builds with the CMake preset "default" (Ninja, ccache, precompiled headers) into ./build.
#   CULPRIT_PRESET=asan scripts/setup.sh   builds the AddressSanitizer preset instead.
#   CULPRIT_PYTHON=/path/to/python scripts/setup.sh   builds against that interpreter's torch instead
#                                                     of .venv's (docs/build.md)
set -euo pipefail
cd "$(dirname "$0")/.."
# The one tested PyTorch: the GPU machines' (torch 2.11.0+cu130; docs/build.md).
TORCH_PIN="torch==2.11.0"

PACKAGES=(
  g++ cmake ninja-build ccache pkg-config
  openmpi-bin libopenmpi-dev          # Open MPI 4.1
  libhdf5-openmpi-dev hdf5-tools      # parallel HDF5 1.10, h5ls
  libboost-program-options-dev
  libxxhash-dev nlohmann-json3-dev
  libsqlite3-dev                      # the suspicion ledger (ledger/, docs/ledger.md); sqlite3 to query it
  sqlite3
  googletest libgtest-dev
  clang libclang-rt-14-dev           # libFuzzer target (tests/fuzz)
  python3-venv python3-dev pybind11-dev  # .venv (torch, tests) and the Python package (docs/python.md)
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

# .venv: torch as pinned, and what the tests read HDF5 and fingerprints with. Made once; a torch
# other than the pin is replaced.
if [ -z "${CULPRIT_PYTHON:-}" ]; then
  if ! .venv/bin/python -c "import torch, numpy, h5py, xxhash; assert torch.__version__.split('+')[0] == '${TORCH_PIN#torch==}'" 2>/dev/null; then
    echo "setup: installing $TORCH_PIN (with its CUDA libraries), numpy, h5py, xxhash into .venv"
    [ -x .venv/bin/python ] || /usr/bin/python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q "$TORCH_PIN" numpy h5py xxhash
  fi
  CULPRIT_PYTHON="$PWD/.venv/bin/python"
  # The build tree's package on .venv's path (as an editable install would be): `import culprit`
  # and `mpirun -np W .venv/bin/python train.py` need no PYTHONPATH.
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ "${CULPRIT_PRESET:-default}" != default ] || echo "$PWD/build/python" > "$site/culprit-build.pth"
fi

preset="${CULPRIT_PRESET:-default}"
cmake --preset "$preset" -DCULPRIT_PYTHON="$CULPRIT_PYTHON" >/dev/null
# Each libtorch translation unit takes ~1.4 GB to compile: two jobs fit in 24 GiB comfortably.
cmake --build --preset "$preset" -j "${CULPRIT_BUILD_JOBS:-2}"
