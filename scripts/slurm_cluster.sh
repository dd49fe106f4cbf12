#!/usr/bin/env bash
# A real SLURM cluster of NODES nodes on this one machine, for tests (tests/slurm/), from
# Debian's packages (22.05):
#   scripts/slurm_cluster.sh install             apt-get the packages if sbatch or slurmctld is
#                                                missing
#   scripts/slurm_cluster.sh start DIR [NODES]   munge, slurmctld and a slurmd per node (default
#                                                1) with all their state in DIR; prints
#                                                `export SLURM_CONF=DIR/slurm.conf` (clients)
#   scripts/slurm_cluster.sh stop DIR            stop every daemon started in DIR, drop its names
#
# No systemd, no cgroups: processes are tracked through /proc (proctrack/linuxproc), tasks are
# not bound (task/none), and cons_tres gives each job its own CPUs, so two single-CPU jobs run
# at once on two cores. Every node is this machine: each declares all its cores and memory
# (oversubscribed: N nodes claim N times the cores, so a 2-rank point still fits one node), and
# runs its own slurmd (`slurmd -N NAME`) on its own Port=, with its spool, pid and log file
# (%n: the node's name). The node names are unique to DIR (two clusters never share one) and
# must resolve, as on a real cluster: a job's ranks meet at its first node by name (MASTER_ADDR,
# submitit), so `start` adds a line for them to /etc/hosts (127.0.0.1), marked with DIR, and
# `stop` removes that line, and only that one. munge
# runs as its own user, on a socket of its own, so a munge the machine already runs is left alone;
# that user must reach its files, which DIR under a private folder (`mktemp -d`: 0700) denies,
# so they live in a folder of their own under /tmp (DIR/munge links to it; `stop` removes it).
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

# The nodes' names: a prefix from DIR's path (unique to the cluster), then 1..NODES
node_names() {
  local dir=$1 count=$2 prefix i
  prefix="c$(printf '%s' "$dir" | md5sum | cut -c1-6)n"
  for i in $(seq "$count"); do printf '%s%s\n' "$prefix" "$i"; done
}

HOSTS=/etc/hosts
HOSTS_LOCK=/tmp/nanogpt-slurm-cluster-hosts.lock  # clusters started and stopped at once take turns
hosts_mark() { printf '# nanogpt slurm_cluster %s' "$1"; }

# /etc/hosts without the line marked for DIR (written in place: it may be a mount point)
hosts_drop() {
  local mark; mark=$(hosts_mark "$1")
  [ -w "$HOSTS" ] || return 0
  (
    flock 9
    if grep -qF " $mark" "$HOSTS"; then
      local kept; kept=$(awk -v m=" $mark" 'substr($0, length($0) - length(m) + 1) != m' "$HOSTS")
      printf '%s\n' "$kept" >"$HOSTS"
    fi
  ) 9>"$HOSTS_LOCK"
}

hosts_add() {
  local dir=$1; shift
  if [ ! -w "$HOSTS" ]; then
    echo "slurm_cluster: cannot write $HOSTS to make the node names $* resolve (needs root)" >&2
    return 1
  fi
  hosts_drop "$dir"
  (
    flock 9
    printf '127.0.0.1 %s %s\n' "$*" "$(hosts_mark "$dir")" >>"$HOSTS"
  ) 9>"$HOSTS_LOCK"
}

# munge's folder for DIR: a new one under /tmp (0755: its user and the clients reach it), linked
# from DIR/munge; an earlier start's is dropped first
munge_folder() {
  local dir=$1 folder
  drop_munge_folder "$dir"
  folder=$(mktemp -d /tmp/nanogpt-munge.XXXXXX)
  chmod 755 "$folder"
  ln -sfn "$folder" "$dir/munge"
  printf '%s\n' "$folder"
}

drop_munge_folder() {
  local link=$1/munge folder
  [ -L "$link" ] || return 0
  folder=$(readlink "$link")
  case "$folder" in /tmp/nanogpt-munge.*) rm -rf "$folder" ;; esac
  rm -f "$link"
}

start() {
  local dir; dir=$(realpath -m "$1")
  local count=${2:-1}
  if ! [[ "$count" =~ ^[1-9][0-9]*$ ]]; then
    echo "slurm_cluster: NODES is '$count'; give a count of nodes, 1 or more" >&2
    return 2
  fi
  mkdir -p "$dir"/{state,spool,log}
  chmod 755 "$dir"
  local host; host=$(hostname -s)
  local cpus; cpus=$(nproc --all)
  local mem_mb; mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  local names; mapfile -t names < <(node_names "$dir" "$count")
  hosts_add "$dir" "${names[@]}"

  # munge: its files in a folder its user can reach (see the top), its key (the package makes
  # one; else one of our own), its socket there
  local munge
  munge=$(munge_folder "$dir")
  if ! runuser -u munge -- test -x "$munge"; then
    echo "slurm_cluster: the munge user cannot reach $munge (a folder above it is private);" \
      "make /tmp reachable by all (mode 1777) and start again" >&2
    rm -rf "$munge" "$dir/munge"
    return 1
  fi
  local key=/etc/munge/munge.key
  if [ ! -s "$key" ]; then
    key="$munge/munge.key"
    dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
  fi
  cp "$key" "$munge/munge.key"
  chown -R munge:munge "$munge"
  chmod 755 "$munge"  # clients reach the socket in it
  chmod 400 "$munge/munge.key"
  runuser -u munge -- munged --key-file="$munge/munge.key" \
    --socket="$munge/munge.socket" --pid-file="$munge/munged.pid" \
    --log-file="$munge/munged.log" --seed-file="$munge/munged.seed"

  # Job ids of their own: submitit seeds a job's MASTER_PORT with its id, so two clusters on one
  # machine numbering their jobs alike would give two jobs at once the same port
  local first_job; first_job=$(( 1 + 16#$(printf '%s' "$dir" | md5sum | cut -c7-10) * 1000 ))
  cat >"$dir/slurm.conf" <<CONF
ClusterName=nanogpt-test
FirstJobId=$first_job
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
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
CONF
  local name
  for name in "${names[@]}"; do
    mkdir -p "$dir/spool/$name"
    echo "NodeName=$name NodeHostname=$host NodeAddr=127.0.0.1 Port=$(free_port)" \
      "CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN" >>"$dir/slurm.conf"
  done
  local list; list=$(IFS=,; echo "${names[*]}")
  echo "PartitionName=debug Nodes=$list Default=YES MaxTime=INFINITE State=UP" \
    "OverSubscribe=NO" >>"$dir/slurm.conf"
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -i -f "$SLURM_CONF"   # -i: no state from an earlier run
  for name in "${names[@]}"; do
    slurmd -f "$SLURM_CONF" -N "$name"
  done
  # up: every node answers and is idle
  for _ in $(seq 60); do
    if [ "$(sinfo -h -N -o %T 2>/dev/null | grep -cx idle)" = "$count" ]; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 1
  done
  echo "slurm_cluster: not every node came up within 60 s (logs in $dir/log)" >&2
  stop "$dir"
  return 1
}

stop() {
  local dir; dir=$(realpath -m "$1")
  local pidfile pid
  for pidfile in "$dir"/slurmd*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do  # munge/: a link
    [ -s "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  hosts_drop "$dir"
  drop_munge_folder "$dir"
}

case "${1:-}" in
  install) install ;;
  start) [ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 start DIR [NODES]" >&2; exit 2; }
    install; start "$2" "${3:-1}" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 install | start DIR [NODES] | stop DIR" >&2; exit 2 ;;
esac
