#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine (munge + slurmctld + slurmd, no systemd), for tests and for
# trying sbatch scripts and Hydra sweeps before a real allocation.
#
#   slurm/local_cluster.sh up       start it (idempotent: a running cluster is left as it is)
#   slurm/local_cluster.sh down     stop the daemons it started
#   slurm/local_cluster.sh status   daemons and `sinfo`; exit 0 only when the node is usable
#
# The node is declared with more CPUs than the machine has (CPUS, default 16; SlurmdParameters=config_overrides)
# so that jobs of up to 8 MPI ranks run oversubscribed on 2 real cores. Needs root and Debian's slurm-wlm and munge
# (installed by `make setup`). There is no accounting daemon: `sacct` does not work here.
#
# Multi-host mode: N hosts mh1..mhN emulated on this machine, to run jobs whose ranks talk over a network.
#
#   slurm/local_cluster.sh up --hosts N       a bridge, one network namespace and one slurmd per host, slurmctld
#                                             outside (idempotent for the same N)
#   slurm/local_cluster.sh down --hosts N     stop its daemons and every process left on its hosts, delete the
#                                             namespaces and the bridge
#   slurm/local_cluster.sh status --hosts N   exit 0 only when all N nodes are usable
#   slurm/local_cluster.sh on HOST CMD...     run CMD on emulated host HOST with /bin/sh, as ssh would (so it
#                                             also stands in for ssh: OMPI_MCA_plm_rsh_agent="...sh on")
#
# Each host has its own hostname and /etc/hosts, /tmp, /dev/shm, SysV IPC namespace and network namespace on the
# bridge, so Open MPI and Slurm's PMIx plugin see separate nodes and talk TCP between them (a shared /tmp or
# /dev/shm would let them use shared memory across "hosts"). Everything outside /tmp is shared; directories under
# /tmp that jobs must see are listed in HPC_RL_MH_SHARED_DIRS at `up` (a checkout under /tmp is shared by itself).
# The cluster has its own configuration, state, ports and daemons (under MH_STATE below), so it runs beside the
# single-node cluster and never touches /etc/slurm/slurm.conf: point the Slurm tools at it with
# `export SLURM_CONF=/var/lib/hpc_rl_slurm_mh/slurm.conf`.
set -euo pipefail

CPUS=${HPC_RL_SLURM_CPUS:-16}
CONF=/etc/slurm/slurm.conf
MARK="# managed by hpc_rl slurm/local_cluster.sh"
STATE=/var/lib/hpc_rl_slurm
LOGDIR=/var/log/hpc_rl_slurm
HOST=$(hostname -s)
PARTITION=debug

MH_STATE=/var/lib/hpc_rl_slurm_mh  # not under /tmp: every emulated host has a private /tmp
MH_CONF=$MH_STATE/slurm.conf
MH_NETNS=hpcrl-  # network namespaces hpcrl-mh1 ...
MH_BRIDGE=hpcrlmh0
MH_SUBNET=${HPC_RL_MH_SUBNET:-10.79.0}  # hosts are .1 .. .N, slurmctld's side of the bridge is .254
MH_HOST_CPUS=${HPC_RL_MH_HOST_CPUS:-4}  # CPUs each emulated host declares (config_overrides, as above)
MH_PORTS=(6917 6918)  # slurmctld, slurmd: not the default ports the single-node cluster uses
MH_LOCK=/run/lock/hpc_rl_local_cluster_mh.lock  # serialises `up`/`down --hosts` of concurrent callers
SELF=$(readlink -f "$0")

die() { echo "local_cluster: $*" >&2; exit 1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# The settings both modes share. No cgroups in containers: processes are tracked by parentage and nothing is
# bound; nodes declare more CPUs than the machine has (config_overrides trusts the declaration); no accounting.
common_conf() {
  cat <<'EOF'
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
EOF
}

write_conf() {
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; refusing to overwrite a site's Slurm configuration"
  fi
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" "$LOGDIR"
  local mem
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  cat > "$CONF.tmp" <<EOF
$MARK
ClusterName=hpcrl
SlurmctldHost=$HOST
$(common_conf)
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
KillWait=10
NodeName=$HOST CPUs=$CPUS RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  mv "$CONF.tmp" "$CONF"
}

start_munge() {
  if pgrep -x munged >/dev/null; then return; fi
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && return; sleep 0.1; done
  die "munged did not start"
}

node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null | head -1 | tr -d '*~#'; }

up() {
  [ "$(id -u)" -eq 0 ] || die "needs root (munged, slurmctld and slurmd are system daemons)"
  command -v slurmctld >/dev/null || die "slurmctld not found: run 'make setup' (Debian package slurm-wlm)"
  write_conf
  start_munge
  alive "$STATE/slurmctld.pid" || slurmctld -f "$CONF"
  alive "$STATE/slurmd.pid" || slurmd -f "$CONF"
  local state=""
  for _ in $(seq 150); do
    state=$(node_state)
    case "$state" in
      idle|mixed|allocated|completing) echo "local_cluster: node $HOST $state ($CPUS CPUs, partition $PARTITION)"; return 0 ;;
      down|drained|draining|drain) scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
  done
  tail -n 20 "$LOGDIR/slurmctld.log" "$LOGDIR/slurmd.log" >&2 || true
  die "node $HOST did not become idle within 30 s (state: ${state:-none})"
}

down() {
  for d in slurmd slurmctld; do
    if alive "$STATE/$d.pid"; then
      kill "$(cat "$STATE/$d.pid")"
      for _ in $(seq 50); do alive "$STATE/$d.pid" || break; sleep 0.1; done
    fi
  done
  echo "local_cluster: stopped"
}

status() {
  local ok=0
  for d in slurmctld slurmd; do
    if alive "$STATE/$d.pid"; then echo "$d: running (pid $(cat "$STATE/$d.pid"))"; else echo "$d: stopped"; ok=1; fi
  done
  pgrep -x munged >/dev/null && echo "munged: running" || { echo "munged: stopped"; ok=1; }
  [ $ok -eq 0 ] && sinfo
  return $ok
}

# ---------------------------------------------------------------------------------------------------------------
# Multi-host mode

mh_ours() {  # pid is alive, not a zombie, and runs with this cluster's configuration (never a recycled pid)
  [ -n "$1" ] && [ -r "/proc/$1/status" ] && ! grep -q '^State:.*Z' "/proc/$1/status" \
    && tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -qF -- "-f $MH_CONF"
}
mh_pid() { cat "$MH_STATE/run/$1.pid" 2>/dev/null || true; }
mh_hosts_up() { cat "$MH_STATE/hosts_up" 2>/dev/null || echo 0; }
mh_usable() {  # number of nodes able to run jobs
  SLURM_CONF=$MH_CONF sinfo -h -t idle,mixed,allocated,completing -o %D 2>/dev/null | awk '{n += $1} END {print n + 0}'
}

mh_check_n() {
  [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 2 ] && [ "$1" -le 16 ] || die "--hosts must be an integer in [2, 16], got '$1'"
}

mh_write_files() {
  local n=$1 i
  rm -rf "$MH_STATE/spool" "$MH_STATE/nodes" "$MH_STATE/state"
  mkdir -p "$MH_STATE"/{state,run,log}
  { echo "127.0.0.1 localhost"; echo "$MH_SUBNET.254 $HOST"
    for i in $(seq 1 "$n"); do echo "$MH_SUBNET.$i mh$i"; mkdir -p "$MH_STATE/spool/mh$i" "$MH_STATE/nodes/mh$i/tmp"; done
  } > "$MH_STATE/hosts"
  # Only the backfill scheduler starts heterogeneous jobs (slurm/train_het.sbatch), every bf_interval seconds (30 by
  # default): at 1 s such a job, and its requeued restart, start as soon as the hosts are free.
  cat > "$MH_CONF" <<EOF
$MARK (multi-host mode, $n hosts)
ClusterName=hpcrlmh
SlurmctldHost=$HOST($MH_SUBNET.254)
SlurmctldPort=${MH_PORTS[0]}
SlurmdPort=${MH_PORTS[1]}
$(common_conf)
StateSaveLocation=$MH_STATE/state
SlurmdSpoolDir=$MH_STATE/spool/%n
SlurmctldPidFile=$MH_STATE/run/slurmctld.pid
SlurmdPidFile=$MH_STATE/run/slurmd.%n.pid
SlurmctldLogFile=$MH_STATE/log/slurmctld.log
SlurmdLogFile=$MH_STATE/log/slurmd.%n.log
KillWait=5
SchedulerParameters=bf_interval=1
NodeName=DEFAULT CPUs=$MH_HOST_CPUS RealMemory=1000 State=UNKNOWN
EOF
  for i in $(seq 1 "$n"); do echo "NodeName=mh$i NodeAddr=$MH_SUBNET.$i NodeHostname=mh$i" >> "$MH_CONF"; done
  echo "PartitionName=mh Nodes=mh[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >> "$MH_CONF"
}

mh_net_up() {
  local n=$1 i ns
  ip link add "$MH_BRIDGE" type bridge
  ip addr add "$MH_SUBNET.254/24" dev "$MH_BRIDGE"
  ip link set "$MH_BRIDGE" up
  for i in $(seq 1 "$n"); do
    ns=${MH_NETNS}mh$i
    ip netns add "$ns"
    ip link add "${MH_BRIDGE}v$i" type veth peer name eth0 netns "$ns"
    ip link set "${MH_BRIDGE}v$i" master "$MH_BRIDGE" up
    ip -n "$ns" addr add "$MH_SUBNET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

mh_up() {
  local n=$1 running i port tool
  [ "$(id -u)" -eq 0 ] || die "multi-host mode needs root (network namespaces, mounts, system daemons)"
  for tool in ip unshare nsenter ss slurmctld slurmd; do
    command -v "$tool" >/dev/null || die "$tool not found: run 'make setup' (Debian packages iproute2, util-linux, slurm-wlm)"
  done
  running=$(mh_hosts_up)
  if [ "$running" -ne 0 ] && mh_ours "$(mh_pid slurmctld)"; then
    [ "$running" -eq "$n" ] || die "a $running-host cluster is running; stop it first: $0 down --hosts $running"
    if [ "$(mh_usable)" -eq "$n" ]; then echo "local_cluster: $n hosts already up (SLURM_CONF=$MH_CONF)"; return 0; fi
  fi
  [ "$running" -eq 0 ] || mh_down  # a half-dead cluster (daemons gone, namespaces left): start clean
  if ip link show "$MH_BRIDGE" >/dev/null 2>&1 || ip -br -4 addr | grep -q " $MH_SUBNET\."; then
    die "bridge $MH_BRIDGE or subnet $MH_SUBNET.0/24 is already in use on this machine (set HPC_RL_MH_SUBNET)"
  fi
  for port in "${MH_PORTS[@]}"; do
    [ -z "$(ss -Hltn "sport = :$port")" ] || die "TCP port $port is in use; the multi-host cluster's slurmctld needs it"
  done
  start_munge 9>&-  # munged outlives this script: it must not hold the lock
  mh_write_files "$n"
  echo "$n" > "$MH_STATE/hosts_up"
  mh_net_up "$n"
  slurmctld -f "$MH_CONF" -c 9>&-
  for i in $(seq 1 "$n"); do "$SELF" on "mh$i" slurmd -f "$MH_CONF" -N "mh$i" 9>&-; done
  for _ in $(seq 150); do
    if [ "$(mh_usable)" -eq "$n" ]; then
      echo "local_cluster: hosts mh[1-$n] up on $MH_SUBNET.0/24, $MH_HOST_CPUS CPUs each (SLURM_CONF=$MH_CONF)"
      return 0
    fi
    sleep 0.2
  done
  tail -n 20 "$MH_STATE"/log/*.log >&2 || true
  SLURM_CONF=$MH_CONF sinfo >&2 || true
  die "the $n emulated hosts did not become idle within 30 s"
}

mh_down() {
  local n i p f left
  n=$(mh_hosts_up)
  [ "$n" -ne 0 ] || n=16  # nothing recorded: sweep every name this mode could have used
  for f in "$MH_STATE"/run/slurmd.*.pid "$MH_STATE/run/slurmctld.pid"; do
    p=$(cat "$f" 2>/dev/null || true)
    if mh_ours "$p"; then kill "$p" 2>/dev/null || true; fi
  done
  for _ in $(seq 40); do
    left=$(for i in $(seq 1 "$n"); do ip netns pids "${MH_NETNS}mh$i" 2>/dev/null || true; done)
    if mh_ours "$(mh_pid slurmctld)"; then left="$left $(mh_pid slurmctld)"; fi
    [ -z "${left// /}" ] && break
    sleep 0.25
  done
  # Whatever still lives in these namespaces was started on the emulated hosts (job steps, ranks): end it.
  for i in $(seq 1 "$n"); do
    for p in $(ip netns pids "${MH_NETNS}mh$i" 2>/dev/null || true); do kill -9 "$p" 2>/dev/null || true; done
  done
  p=$(mh_pid slurmctld)
  if mh_ours "$p"; then kill -9 "$p" 2>/dev/null || true; fi
  for i in $(seq 1 "$n"); do ip netns del "${MH_NETNS}mh$i" 2>/dev/null || true; done  # deletes the veth pairs too
  ip link del "$MH_BRIDGE" 2>/dev/null || true
  rm -rf "$MH_STATE/run" "$MH_STATE/nodes" "$MH_STATE/spool" "$MH_STATE/hosts_up"
  echo "local_cluster: multi-host cluster stopped"
}

mh_status() {
  local n=$1 up ok=0 i p
  up=$(mh_hosts_up)
  if [ "$up" -eq 0 ]; then echo "multi-host cluster: not running"; return 1; fi
  [ "$up" -eq "$n" ] || { echo "multi-host cluster: $up hosts running, not $n"; ok=1; }
  p=$(mh_pid slurmctld)
  if mh_ours "$p"; then echo "slurmctld: running (pid $p)"; else echo "slurmctld: stopped"; ok=1; fi
  for i in $(seq 1 "$up"); do
    p=$(mh_pid "slurmd.mh$i")
    if mh_ours "$p"; then echo "slurmd mh$i: running (pid $p, netns ${MH_NETNS}mh$i)"; else echo "slurmd mh$i: stopped"; ok=1; fi
  done
  echo "SLURM_CONF=$MH_CONF"
  [ $ok -eq 0 ] && SLURM_CONF=$MH_CONF sinfo && [ "$(mh_usable)" -eq "$n" ]
}

# `on HOST CMD...` enters the host in three steps, each needing the namespaces of the one before: private mount,
# UTS and IPC namespaces (hostname, /etc/hosts, the shared dirs, the cgroup tree set aside); then the network
# namespace, whose own sysfs replaces /sys with the cgroup tree put back (slurmd reads it); then the private /tmp
# and /dev/shm, and CMD.
mh_on() {
  while [[ "${1:-}" == -* ]]; do shift; done  # options an rsh launcher passes to ssh mean nothing here
  [ $# -ge 2 ] || die "usage: $0 on HOST CMD..."
  local h=$1; shift
  [ -f "$MH_STATE/hosts_up" ] || die "no multi-host cluster is up (run: $0 up --hosts N)"
  [ -e "/run/netns/${MH_NETNS}$h" ] || die "no emulated host '$h' (hosts: mh1..mh$(mh_hosts_up))"
  exec unshare --mount --uts --ipc --propagation slave -- "$SELF" _on-mounts "$h" "$@"
}

mh_on_mounts() {
  local h=$1 d t; shift
  local D=$MH_STATE/nodes/$h/tmp CG=$MH_STATE/nodes/$h/cgroup
  hostname "$h"
  mount --bind "$MH_STATE/hosts" /etc/hosts
  mkdir -p "$D" "$CG"; chmod 1777 "$D"
  for d in "$(dirname "$(dirname "$SELF")")" ${HPC_RL_MH_SHARED_DIRS:-}; do
    case "$d" in /tmp/*) t=$D/${d#/tmp/}; mkdir -p "$t"; mount --bind "$d" "$t" ;; esac
  done
  mount --rbind /sys/fs/cgroup "$CG"
  exec nsenter --net="/run/netns/${MH_NETNS}$h" -- "$SELF" _on-netns "$h" "$@"
}

mh_on_netns() {
  local h=$1; shift
  local D=$MH_STATE/nodes/$h/tmp CG=$MH_STATE/nodes/$h/cgroup
  umount -l /sys
  mount -t sysfs "sysfs-$h" /sys
  mount --rbind "$CG" /sys/fs/cgroup
  umount -l "$CG"
  mount --rbind "$D" /tmp
  mount -t tmpfs -o size=512m "shm-$h" /dev/shm
  exec /bin/sh -c "$*"  # like ssh: the remote shell runs the words joined (Open MPI sends one command line)
}

with_mh_lock() {  # one `up`/`down --hosts` at a time; the daemons started under it do not inherit the lock's fd
  exec 9>"$MH_LOCK"
  flock -w 120 9 || die "another 'local_cluster.sh up/down --hosts' held $MH_LOCK for 120 s"
  "$@"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
hosts=""
case "$cmd" in
  up|down|status)
    if [ $# -gt 0 ]; then
      { [ "$1" = "--hosts" ] && [ $# -eq 2 ]; } || die "usage: $0 $cmd [--hosts N]"
      hosts=$2
      mh_check_n "$hosts"
    fi ;;
esac
case "$cmd" in
  up) if [ -n "$hosts" ]; then with_mh_lock mh_up "$hosts"; else up; fi ;;
  down) if [ -n "$hosts" ]; then with_mh_lock mh_down; else down; fi ;;
  status) if [ -n "$hosts" ]; then mh_status "$hosts"; else status; fi ;;
  on) mh_on "$@" ;;
  _on-mounts) mh_on_mounts "$@" ;;
  _on-netns) mh_on_netns "$@" ;;
  *) echo "usage: $0 up|down|status [--hosts N] | on HOST CMD..." >&2; exit 2 ;;
esac
