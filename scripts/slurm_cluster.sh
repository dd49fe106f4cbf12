#!/usr/bin/env bash
# A real one-node SLURM cluster for tests (tests/slurm/), from Debian's packages (22.05):
#   scripts/slurm_cluster.sh install      apt-get the packages if sbatch or slurmctld is missing
#   scripts/slurm_cluster.sh start DIR    munge, slurmctld and slurmd with all their state in DIR;
#                                         prints `export SLURM_CONF=DIR/slurm.conf` (clients)
#   scripts/slurm_cluster.sh stop DIR     stop the three daemons started in DIR
#
# No systemd, no cgroups: processes are tracked through /proc (proctrack/linuxproc), tasks are
# not bound (task/none), the node is this machine with its real CPU count and memory, and
# cons_tres gives each job its own CPUs, so two single-CPU jobs run at once on two cores. munge
# runs as its own user, on a socket in DIR, so a munge the machine already runs is left alone.
# slurmctld and slurmd run as root (SlurmUser=root): jobs run as the user who submits them.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)

install() {
  if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v munged >/dev/null; then
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "slurm_cluster: installing ${PACKAGES[*]} needs root (apt-get)" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && \
         apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null; }
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  local dir; dir=$(realpath -m "$1")
  mkdir -p "$dir"/{munge,state,spool,log}
  chmod 755 "$dir"
  local host; host=$(hostname -s)
  local cpus; cpus=$(nproc --all)
  local mem_mb; mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)

  # munge: its key (the package makes one; else one of our own), its socket in DIR
  local key=/etc/munge/munge.key
  if [ ! -s "$key" ]; then
    key="$dir/munge/munge.key"
    dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
  fi
  cp "$key" "$dir/munge/munge.key"
  chown -R munge:munge "$dir/munge"
  chmod 755 "$dir/munge"  # clients reach the socket in it
  chmod 400 "$dir/munge/munge.key"
  runuser -u munge -- munged --key-file="$dir/munge/munge.key" \
    --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"

  cat >"$dir/slurm.conf" <<CONF
ClusterName=nanogpt-test
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=3600
InactiveLimit=0
SchedulerParameters=defer_batch
SlurmctldTimeout=30
SlurmdTimeout=30
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -i -f "$SLURM_CONF"   # -i: no state from an earlier run
  slurmd -f "$SLURM_CONF"
  # up: the node answers and is idle
  for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 1
  done
  echo "slurm_cluster: the node did not come up within 60 s (logs in $dir/log)" >&2
  stop "$dir"
  return 1
}

stop() {
  local dir; dir=$(realpath -m "$1")
  local pidfile pid
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -s "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

case "${1:-}" in
  install) install ;;
  start) [ $# -eq 2 ] || { echo "usage: $0 start DIR" >&2; exit 2; }; install; start "$2" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
