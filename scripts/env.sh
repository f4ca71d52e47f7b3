# Sourced by the scripts: Open MPI refuses to run as root without these (containers, CI).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# The interpreter with culprit's torch (scripts/setup.sh makes .venv): the scripts' Python.
CULPRIT_PY="${CULPRIT_PY:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python}"
export CULPRIT_PY
