#!/usr/bin/env bash
# A real single-node Slurm for culprit's tests (and for trying jobs/ on one machine).
#
#   scripts/slurm.sh start    install slurm-wlm and munge if missing (Debian), write a slurm.conf for
#                             this host, start munged, slurmctld and slurmd, wait until the node is idle
#   scripts/slurm.sh stop     stop the daemons this script started, by their PIDs
#   scripts/slurm.sh env      print `export SLURM_CONF=...` for the clients (sbatch, squeue, scontrol)
#
# Environment: CULPRIT_SLURM_DIR (default /tmp/culprit-slurm): configuration, state, spool, logs and
# PID files; CULPRIT_SLURM_PORT (default 16817; slurmd uses the next port).
# The node's CPUs and memory come from `slurmd -C`; ProctrackType=proctrack/linuxproc,
# TaskPlugin=task/none, MpiDefault=pmix (Debian's Open MPI works with `srun --mpi=pmix` only). Jobs
# with more tasks than cores use `sbatch -O` / `srun -O` (overcommit).
# Exit codes: 0 done; 1 a daemon did not start or the node did not become idle (the line says which
# and where its log is).
set -euo pipefail
dir="${CULPRIT_SLURM_DIR:-/tmp/culprit-slurm}"
port="${CULPRIT_SLURM_PORT:-16817}"
conf="$dir/slurm.conf"

fail() {
  echo "slurm.sh: $*" >&2
  exit 1
}

need_packages() {
  local missing=()
  for p in slurm-wlm munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "slurm.sh: installing ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi  # a munged already answers
  [ -f /etc/munge/munge.key ] || fail "no /etc/munge/munge.key (the munge package creates it)"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged --force --pid-file=/run/munge/munged.pid
  for _ in $(seq 50); do
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && [ -s /run/munge/munged.pid ]; then
      cp /run/munge/munged.pid "$dir/munged.pid"  # ours to stop
      return
    fi
    sleep 0.1
  done
  fail "munged did not start (see /var/log/munge/munged.log)"
}

write_conf() {
  local host node
  host=$(hostname -s)
  # slurmd -C: "NodeName=h CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24000"
  node=$(/usr/sbin/slurmd -C | head -n 1)
  [[ "$node" == NodeName=* ]] || fail "slurmd -C printed no node line: $node"
  mkdir -p "$dir/state" "$dir/spool"
  cat >"$conf" <<EOF
# Written by scripts/slurm.sh for a single-node test cluster on $host.
ClusterName=culprit
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
SlurmctldPort=$port
SlurmdPort=$((port + 1))
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
$node NodeAddr=127.0.0.1 State=UNKNOWN
# A second node that never comes up (nothing listens on its port): a job that excludes this host
# stays pending for it, as on a cluster with other nodes, instead of being refused at submission.
NodeName=culprit-spare NodeAddr=127.0.0.1 Port=$((port + 2)) ${node#NodeName=* } State=DOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  [ "$(id -u)" -eq 0 ] || fail "the test cluster's daemons need root (slurmd runs jobs as their users)"
  need_packages
  mkdir -p "$dir"
  if alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid"; then
    echo "slurm.sh: already running ($conf)" >&2
  else
    stop_daemons quiet
    write_conf
    start_munge
    export SLURM_CONF="$conf"
    /usr/sbin/slurmctld -c -f "$conf" || fail "slurmctld did not start (see $dir/slurmctld.log)"
    /usr/sbin/slurmd -f "$conf" || fail "slurmd did not start (see $dir/slurmd.log)"
  fi
  export SLURM_CONF="$conf"
  local state=""
  for _ in $(seq 150); do
    state=$(sinfo -h -n "$(hostname -s)" -o "%T" 2>/dev/null | head -n 1 || true)
    case "$state" in
      idle* | mixed* | allocated*) echo "slurm.sh: node $(hostname -s) is $state; export SLURM_CONF=$conf" >&2; return ;;
      down* | drain*) scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
  done
  fail "the node did not become idle within 30 s (state '${state:-none}'; see $dir/slurmctld.log and $dir/slurmd.log)"
}

stop_daemons() {
  for d in slurmd slurmctld munged; do
    local pidfile="$dir/$d.pid"
    if alive "$pidfile"; then
      local pid
      pid=$(cat "$pidfile")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      [ "${1:-}" = quiet ] || echo "slurm.sh: stopped $d ($pid)" >&2
    fi
    rm -f "$pidfile"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop_daemons ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) echo "usage: scripts/slurm.sh start|stop|env" >&2; exit 2 ;;
esac
