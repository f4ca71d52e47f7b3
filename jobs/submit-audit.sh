#!/bin/bash
# jobs/submit-audit.sh: submits the audit of a run as a job array and its merge job.
#
#   jobs/submit-audit.sh RUN_DIR [TASKS] [sbatch options for both jobs...]
#
# TASKS [4]: array tasks, each auditing every TASKS-th checkpoint interval (jobs/audit.sbatch). Clears
# RUN_DIR/audit/ first (parts of an earlier audit would not merge). Prints "array=ID merge=ID".
# Environment: as jobs/audit.sbatch (CULPRIT, CULPRIT_SRUN_ARGS), passed to the jobs.
# Exit code: 0 both submitted; sbatch's when a submission fails; 2 bad arguments.
set -euo pipefail
run_dir="${1:?usage: jobs/submit-audit.sh RUN_DIR [TASKS] [sbatch options...]}"
tasks="${2:-4}"
shift $(($# >= 2 ? 2 : 1))
[[ "$tasks" =~ ^[1-9][0-9]*$ ]] || { echo "submit-audit.sh: TASKS '$tasks' is not a positive count" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$run_dir/audit"
array=$(sbatch --parsable --array="0-$((tasks - 1))" "$@" "$here/audit.sbatch" "$run_dir")
array=${array%%;*}
merge=$(sbatch --parsable --dependency="afterok:$array" "$@" "$here/audit.sbatch" --merge "$run_dir")
merge=${merge%%;*}
echo "array=$array merge=$merge"
