#!/usr/bin/env bash
# scripts/slurm-cluster.sh: a real N-node Slurm (default 4 nodes) on this one Linux machine, for
# culprit's multi-node tests and for trying jobs/ locally (docs/slurm.md, "Try it on one machine").
#
#   scripts/slurm-cluster.sh start          build the namespaces, start munged, slurmctld and one
#                                           slurmd per node; wait until every node is idle (1-3 s)
#   scripts/slurm-cluster.sh stop           cancel every job, stop the daemons by their PIDs, kill
#                                           whatever still runs in our namespaces, delete them (4 s)
#   scripts/slurm-cluster.sh exec [CMD...]  run CMD (default: a shell) on the login node with
#                                           SLURM_CONF set, e.g. `... exec srun -N3 hostname`;
#                                           the caller's environment and directory are kept
#   scripts/slurm-cluster.sh on NODE [CMD]  run CMD inside NODE's namespaces (logged in on NODE)
#   scripts/slurm-cluster.sh crash NODE     pull NODE's plug: its link goes down and every process
#                                           in it is SIGKILLed; slurmctld marks it DOWN within ~40 s
#   scripts/slurm-cluster.sh boot NODE      bring a crashed NODE back (link up, slurmd restarted)
#   scripts/slurm-cluster.sh status         the daemons' PIDs and `sinfo -N`
#   scripts/slurm-cluster.sh env            `export SLURM_CONF=...` for clients run on the login node
#   scripts/slurm-cluster.sh shared         print DIR/shared: a directory whose later mounts every
#                                           node sees (a test mounts a small or read-only filesystem
#                                           there: a full or read-only shared filesystem)
#
# Every node is a slurmd in its own network, UTS and mount namespace: hostname nodeI, address
# NET.(10+I) on a veth plugged into a bridge in the login namespace (NET.1: munged, slurmctld and the
# clients); no other interface, no default route. The mount namespace is a slave of the host's with
# our hosts file bound over /etc/hosts; everything else is shared, as a cluster's shared filesystem
# is (per-node spool, TmpFS, logs and PID files use Slurm's %n). Not `ip netns exec`: it remounts
# /sys, hiding /sys/fs/cgroup, and slurmd 22.05 then refuses to start.
# Addresses: NET defaults to 127.201.0, loopback addresses put on the veths (route_localnet=1, lo
# narrowed to 127.0.0.1/32 inside): inside, a real L2 network between the namespaces; outside, this
# machine's own loopback, so even a client started by mistake outside the namespaces with our
# slurm.conf cannot send a packet off the machine (a private range would follow the default route
# out). Cost: Open MPI leaves 127/8 out of its TCP interfaces by default, so a TaskProlog exports
# OMPI_MCA_btl_tcp_if_include=NET.0/24 (and oob_tcp_if_include) into every task that lacks them.
# Nothing here touches the system's or scripts/slurm.sh's Slurm: own namespaces, ports bound only
# inside them, own munged socket and key, everything under DIR.
#
# Environment: CULPRIT_CLUSTER_NAME [culprit] (the namespaces are NAME-login and NAME-nodeI: two
# clusters of different names and networks can run at once), CULPRIT_CLUSTER_DIR [/tmp/NAME-cluster],
# CULPRIT_CLUSTER_NODES [4], CULPRIT_CLUSTER_NET [127.201.0] (three octets inside 127.0.0.0/8),
# CULPRIT_CLUSTER_CPUS [nproc] and CULPRIT_CLUSTER_MEM [2000] (MB) advertised per node (all nodes
# share this machine's cores: good for correctness, not for timing).
# Needs root (namespaces, mounts), iproute2, util-linux, slurm-wlm and munge (installed when missing).
# Exit codes: 0 done; 1 failed (the line says what and where the log is); 2 usage.
set -euo pipefail

self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
NAME=${CULPRIT_CLUSTER_NAME:-culprit}
D=${CULPRIT_CLUSTER_DIR:-/tmp/$NAME-cluster}
N=${CULPRIT_CLUSTER_NODES:-4}
NET=${CULPRIT_CLUSTER_NET:-127.201.0}
CPUS=${CULPRIT_CLUSTER_CPUS:-$(nproc)}
MEM=${CULPRIT_CLUSTER_MEM:-2000}
HUB=$NAME-login
CONF=$D/etc/slurm.conf
NSLIST=$D/run/netns # the namespaces this script created, one a line: stop deletes exactly these

say() { echo "slurm-cluster: $*" >&2; }
fail() {
  say "$*"
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ours_ns() { [[ $1 =~ ^$NAME-(login|node[0-9]+)$ ]]; } # a namespace name this script makes
# in_netns PID NS: whether process PID runs in our network namespace NS (a PID file may be stale and
# its number taken by another process since: never signal that one).
in_netns() {
  local a b
  a=$(stat -L -c %i "/proc/$1/ns/net" 2>/dev/null) && b=$(stat -L -c %i "/run/netns/$2" 2>/dev/null) && [ "$a" = "$b" ]
}
# daemon_pid FILE NS: the PID in FILE when that process lives in NS.
daemon_pid() {
  local pid
  alive "$1" || return 1
  pid=$(cat "$1")
  [[ $pid =~ ^[0-9]+$ ]] && in_netns "$pid" "$2" && echo "$pid"
}
nodes_started() {
  local n=0
  [ -s "$NSLIST" ] && n=$(grep -c "^$NAME-node" "$NSLIST" || true)
  echo "${n:-0}"
}
node_index() { # node3 -> 3
  [[ "${1:-}" =~ ^node([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] && [ "${BASH_REMATCH[1]}" -le "$(nodes_started)" ] ||
    fail "no node '${1:-}' (node1..node$(nodes_started))"
  echo "${BASH_REMATCH[1]}"
}

# in_ns NETNS HOSTNAME CMD...: CMD in the network namespace NETNS, a new UTS namespace named HOSTNAME
# and a new mount namespace (a slave of the host's) with our hosts file over /etc/hosts.
in_ns() {
  local ns=$1 host=$2
  shift 2
  # shellcheck disable=SC2016 # expanded by the inner sh
  nsenter --net="/run/netns/$ns" -- unshare --uts --mount --propagation slave -- /bin/sh -c \
    'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
    sh "$D/etc/hosts" "$host" "$@"
}
client() { in_ns "$HUB" login env SLURM_CONF="$CONF" "$@"; }

need_packages() {
  local missing=() p tool sudo=""
  for p in slurm-wlm munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  for tool in ip unshare nsenter /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged sinfo; do
    command -v "$tool" >/dev/null || fail "missing $tool"
  done
}

write_conf() {
  local i
  cat <<EOF
# Written by scripts/slurm-cluster.sh: a $N-node cluster in network namespaces on this machine.
ClusterName=$NAME
SlurmctldHost=login($NET.1)
SlurmctldPort=7817
# The same port on every node: each node has its own network stack.
SlurmdPort=7818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$D/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Per-node TmpFS: the PMIx plugin makes spmix_appdir_<job>.<step> under it, and the nodes share /tmp
# (with a shared one every pmix step fails on all nodes but one: "File exists").
TmpFS=$D/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
TaskProlog=$D/etc/task-prolog.sh
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The nodes share this machine's cores: the configured CPUs and memory are taken as given.
SlurmdParameters=config_overrides
ReturnToService=2
# A crashed node is DOWN after SlurmdTimeout plus the ping's own timeout (~40 s).
SlurmdTimeout=10
MinJobAge=3600
KillWait=5
InactiveLimit=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
EOF
  for i in $(seq "$N"); do
    echo "NodeName=node$i NodeAddr=$NET.$((10 + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
  done
  echo "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

# DIR holds the cluster's keys and configuration, written and run by root: an absolute path that is
# not a system directory, and when it exists already, root's and writable by root only (a directory
# another user made in /tmp beforehand could be swapped under us).
check_dir() {
  [[ $D == /?* && $D != *'/../'* && $D != *'/..' ]] || fail "CULPRIT_CLUSTER_DIR=$D: an absolute path other than /, without .."
  case ${D%/} in
    / | /bin | /boot | /dev | /etc | /home | /lib* | /opt | /proc | /root | /run | /sbin | /srv | /sys | /tmp | /usr | /var)
      fail "CULPRIT_CLUSTER_DIR=$D is a system directory: give a directory of its own (default /tmp/$NAME-cluster)" ;;
  esac
  if [ -e "$D" ] || [ -L "$D" ]; then
    [ -d "$D" ] && [ ! -L "$D" ] || fail "CULPRIT_CLUSTER_DIR=$D exists and is not a directory (or is a link)"
    [ "$(stat -c %u "$D")" = 0 ] && [ $((0$(stat -c %a "$D") & 022)) -eq 0 ] ||
      fail "CULPRIT_CLUSTER_DIR=$D is not root's alone (owner $(stat -c %U "$D"), mode $(stat -c %a "$D")): remove it or give another"
  fi
}

write_files() {
  mkdir -p -m 0755 "$D"
  rm -rf "${D:?}"/{etc,munge,state,run,log,spool,tmp}
  mkdir -p "$D"/{etc,munge,state,run,log,spool,tmp}
  chmod 0755 "$D/munge" # munged wants its socket's directory searchable by every job's user
  dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$D/munge/munge.key"
  local i
  {
    echo "127.0.0.1 localhost"
    echo "$NET.1 login"
    for i in $(seq "$N"); do echo "$NET.$((10 + i)) node$i"; done
  } >"$D/etc/hosts"
  cat >"$D/etc/task-prolog.sh" <<EOF
#!/bin/sh
# TaskProlog (scripts/slurm-cluster.sh): the nodes' addresses are in 127.0.0.0/8, which Open MPI
# leaves out of its TCP interfaces by default; name the cluster's network unless the job chose one.
[ -n "\${OMPI_MCA_btl_tcp_if_include:-}" ] || echo "export OMPI_MCA_btl_tcp_if_include=$NET.0/24"
[ -n "\${OMPI_MCA_oob_tcp_if_include:-}" ] || echo "export OMPI_MCA_oob_tcp_if_include=$NET.0/24"
exit 0
EOF
  chmod 0755 "$D/etc/task-prolog.sh"
  for i in $(seq "$N"); do mkdir -p "$D/spool/node$i" "$D/tmp/node$i"; done
  write_conf >"$CONF"
}

# DIR/shared, a shared mount point: the nodes' mount namespaces are slaves of the host's, so a
# filesystem mounted under it later (by a test, on the host) appears on every node, as a cluster's
# shared filesystem does. The rest of the host's mounts are private here: without this a mount made
# after start would stay invisible to the nodes.
make_shared_dir() {
  mkdir -p "$D/shared"
  echo shared >"$D/run/mounts" # first: stop unmounts it even when a step below fails
  mount --bind "$D/shared" "$D/shared"
  # Its own peer group: on a host whose / is shared (systemd's default) the bind mount would join
  # /'s, and a test's mounts under it would spread into every namespace of the host.
  mount --make-private "$D/shared"
  mount --make-shared "$D/shared"
}

# add_ns NAME: a network namespace whose lo keeps 127.0.0.1 only (/32), so that NET.x can live on its
# veth; route_localnet lets 127/8 packets and ARP through. IPv4 only.
add_ns() {
  ip netns add "$1"
  echo "$1" >>"$NSLIST"
  ip -n "$1" link set lo up
  ip -n "$1" addr del 127.0.0.1/8 dev lo
  ip -n "$1" addr add 127.0.0.1/32 dev lo
  ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
    net.ipv4.conf.all.route_localnet=1 net.ipv4.conf.default.route_localnet=1
}

make_net() {
  local ns i
  for ns in "$HUB" $(seq -f "$NAME-node%g" 1 "$N"); do
    [ ! -e "/run/netns/$ns" ] || fail "network namespace $ns already exists (not ours: $NSLIST lacks it)"
  done
  add_ns "$HUB"
  ip -n "$HUB" link add br0 type bridge
  ip netns exec "$HUB" sysctl -qw net.ipv4.conf.br0.route_localnet=1
  ip -n "$HUB" addr add "$NET.1/24" dev br0
  ip -n "$HUB" link set br0 up
  for i in $(seq "$N"); do
    ns=$NAME-node$i
    add_ns "$ns"
    ip -n "$HUB" link add "veth$i" type veth peer name eth0 netns "$ns"
    ip -n "$HUB" link set "veth$i" master br0 up
    ip netns exec "$ns" sysctl -qw net.ipv4.conf.eth0.route_localnet=1
    ip -n "$ns" addr add "$NET.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

start_munged() {
  in_ns "$HUB" login /usr/sbin/munged --force --socket="$D/munge/munge.socket" \
    --key-file="$D/munge/munge.key" --pid-file="$D/run/munged.pid" \
    --seed-file="$D/munge/munged.seed" --log-file="$D/log/munged.log" ||
    fail "munged did not start (see $D/log/munged.log)"
  local _
  for _ in $(seq 50); do
    munge -S "$D/munge/munge.socket" -n 2>/dev/null | unmunge -S "$D/munge/munge.socket" >/dev/null 2>&1 && return
    sleep 0.1
  done
  fail "munged does not answer on $D/munge/munge.socket (see $D/log/munged.log)"
}

start_slurmd() { # I
  in_ns "$NAME-node$1" "node$1" /usr/sbin/slurmd -f "$CONF" -N "node$1" ||
    fail "slurmd on node$1 did not start (see $D/log/slurmd.node$1.log)"
}

wait_idle() { # COUNT
  local _ idle=0
  for _ in $(seq 300); do
    idle=$(client sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l || true)
    [ "$idle" -ge "$1" ] && return
    sleep 0.1
  done
  client sinfo -N >&2 || true
  fail "only $idle of $1 nodes became idle within 30 s (see $D/log/)"
}

start() {
  [ "$(id -u)" -eq 0 ] || fail "needs root (network, UTS and mount namespaces; slurmd runs jobs as their users)"
  [[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le 200 ] || fail "CULPRIT_CLUSTER_NODES=$N: 1 to 200"
  [[ "$NET" =~ ^127\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
    fail "CULPRIT_CLUSTER_NET=$NET: three octets inside 127.0.0.0/8 (never a routable range)"
  [[ "$NAME" =~ ^[a-z][a-z0-9]{0,15}$ ]] || fail "CULPRIT_CLUSTER_NAME=$NAME: lower-case letters and digits"
  [ ! -s "$NSLIST" ] || fail "already running ($NSLIST exists): $self stop"
  need_packages
  local t0 i
  t0=$(now)
  write_files
  trap 'say "start failed; cleaning up"; stop >/dev/null 2>&1 || true' EXIT
  make_net
  make_shared_dir
  start_munged
  in_ns "$HUB" login /usr/sbin/slurmctld -c -f "$CONF" || fail "slurmctld did not start (see $D/log/slurmctld.log)"
  for i in $(seq "$N"); do start_slurmd "$i"; done
  wait_idle "$N"
  trap - EXIT
  say "$N nodes idle after $(since "$t0") s; clients: $self exec CMD; stop: $self stop"
}

# stop_pids PID...: SIGTERM, up to 5 s for all of them to exit, then SIGKILL for those left.
stop_pids() {
  [ "$#" -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  local _ p left=()
  for _ in $(seq 50); do
    left=()
    for p in "$@"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
    [ "${#left[@]}" -eq 0 ] && return 0
    sleep 0.1
  done
  kill -9 "${left[@]}" 2>/dev/null || true
}

ns_pids() { # [GLOB]: every process in our namespaces (whose namespace name matches GLOB)
  local ns
  [ -s "$NSLIST" ] || return 0
  while read -r ns; do
    ours_ns "$ns" || continue
    # shellcheck disable=SC2254 # a glob on purpose
    case $ns in ${1:-*}) ;; *) continue ;; esac
    [ -e "/run/netns/$ns" ] && ip netns pids "$ns" 2>/dev/null
  done <"$NSLIST"
  return 0
}

node_job_pids() { # the processes in the nodes' namespaces other than their slurmd
  local f p
  local -A daemon=()
  for f in "$D"/run/slurmd.*.pid; do [ -s "$f" ] && daemon[$(cat "$f")]=1; done
  for p in $(ns_pids "$NAME-node*"); do [ -n "${daemon[$p]:-}" ] || echo "$p"; done
}

stop() {
  if [ ! -s "$NSLIST" ]; then
    say "not running (no $NSLIST)"
    return 0
  fi
  local t0 _ pids=() f ns jobs
  t0=$(now)
  # 1. Cancel every job, so that slurmstepd ends the tasks the Slurm way (SIGTERM, KillWait, SIGKILL).
  if alive "$D/run/slurmctld.pid" && alive "$D/run/munged.pid"; then
    jobs=$(client squeue -h -o '%A' 2>/dev/null | tr '\n' ' ' || true)
    if [ -n "${jobs// /}" ]; then
      # shellcheck disable=SC2086
      client scancel $jobs 2>/dev/null || true
      for _ in $(seq 100); do
        [ -z "$(node_job_pids)" ] && break
        sleep 0.1
      done
    fi
  fi
  # 2. The daemons by their PID files, each only while it runs in our namespace: slurmd's and
  # slurmctld together (each takes ~2 s), then munged.
  local p n
  for f in "$D"/run/slurmd.node*.pid; do
    n=${f##*/slurmd.}
    n=${n%.pid}
    p=$(daemon_pid "$f" "$NAME-$n") && pids+=("$p")
  done
  p=$(daemon_pid "$D/run/slurmctld.pid" "$HUB") && pids+=("$p")
  stop_pids "${pids[@]}"
  p=$(daemon_pid "$D/run/munged.pid" "$HUB") && stop_pids "$p"
  # 3. Anything still running in our namespaces (a step that outlived its slurmd, a client).
  mapfile -t pids < <(ns_pids)
  [ "${#pids[@]}" -eq 0 ] || stop_pids "${pids[@]}"
  # 4. DIR/shared and whatever a test mounted under it; then the namespaces (their veths and the
  # bridge go with them).
  if [ -s "$D/run/mounts" ]; then
    if umount -R "$D/shared" 2>/dev/null || umount -R -l "$D/shared" 2>/dev/null; then
      rm -f "$D/run/mounts"
    else
      say "could not unmount $D/shared (kept $D/run/mounts: stop again to retry)"
    fi
  fi
  while read -r ns; do
    ours_ns "$ns" && [ -e "/run/netns/$ns" ] && ip netns del "$ns"
  done <"$NSLIST"
  rm -f "$NSLIST" "$D"/run/*.pid
  say "stopped in $(since "$t0") s"
}

crash() { # NODE
  local i pids
  i=$(node_index "$1")
  ip -n "$HUB" link set "veth$i" down
  mapfile -t pids < <(ip netns pids "$NAME-node$i")
  [ "${#pids[@]}" -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
  rm -f "$D/run/slurmd.node$i.pid" # dead: its number may be reused by another process
  say "node$i crashed: link down, ${#pids[@]} process(es) SIGKILLed; DOWN in slurmctld within ~40 s"
}

boot() { # NODE
  local i _
  i=$(node_index "$1")
  alive "$D/run/slurmd.node$i.pid" && fail "node$i is running"
  ip -n "$HUB" link set "veth$i" up
  start_slurmd "$i"
  for _ in $(seq 300); do
    case $(client sinfo -h -n "node$i" -o '%T' 2>/dev/null) in idle* | mixed* | alloc*) say "node$i is back" && return ;; esac
    sleep 0.1
  done
  fail "node$i did not return to service within 30 s (see $D/log/slurmd.node$i.log)"
}

status() {
  local f
  [ -s "$NSLIST" ] || {
    echo "not running"
    return 0
  }
  for f in munged slurmctld $(seq -f 'slurmd.node%g' 1 "$(nodes_started)"); do
    if alive "$D/run/$f.pid"; then echo "$f $(cat "$D/run/$f.pid")"; else echo "$f dead"; fi
  done
  client sinfo -N -o '%N %T %C %m %E'
}

running() { [ -s "$NSLIST" ] || fail "not running: $self start"; }

case "${1:-}" in start | stop | status | exec | on | crash | boot | env | shared) check_dir ;; esac
case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  exec)
    shift
    running
    if [ "$#" -eq 0 ]; then client bash -i; else client "$@"; fi
    ;;
  on)
    shift
    running
    i=$(node_index "${1:-}")
    shift
    in_ns "$NAME-node$i" "node$i" env SLURM_CONF="$CONF" "${@:-bash}"
    ;;
  crash | boot)
    running
    "$1" "${2:-}"
    ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  shared) echo "$D/shared" ;;
  *)
    echo "usage: $self start|stop|status|exec [CMD...]|on NODE [CMD...]|crash NODE|boot NODE|env|shared" >&2
    exit 2
    ;;
esac
