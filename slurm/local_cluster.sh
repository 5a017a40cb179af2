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
set -euo pipefail

CPUS=${HPC_RL_SLURM_CPUS:-16}
CONF=/etc/slurm/slurm.conf
MARK="# managed by hpc_rl slurm/local_cluster.sh"
STATE=/var/lib/hpc_rl_slurm
LOGDIR=/var/log/hpc_rl_slurm
HOST=$(hostname -s)
PARTITION=debug

die() { echo "local_cluster: $*" >&2; exit 1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

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
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# No cgroups in containers: track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node declares $CPUS CPUs on a machine with fewer: trust the declaration.
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=300
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

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
