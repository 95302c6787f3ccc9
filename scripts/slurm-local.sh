#!/usr/bin/env bash
# A one-machine Slurm cluster in a folder of its own, for testing memfit's sweeps against a real
# scheduler:  scripts/slurm-local.sh start|stop|status  [DIR, default /tmp/memfit-slurm]
#
# start: installs Debian's slurm-wlm and munge if missing (as root, idempotently), writes a
# munge key, a minimal slurm.conf (this host as controller and only node, one partition
# `debug`, CPUs = nproc, no accounting daemon; finished jobs go to DIR/jobcomp.log) and starts
# munged, slurmctld and slurmd with their sockets, pids, state and logs under DIR. Prints the
# line to source: export SLURM_CONF=DIR/slurm.conf. Does nothing if the cluster already runs.
# stop: stops the daemons it started (by their pid files, waiting for them to end) and removes
# DIR. No other process is touched and nothing is left behind.
set -euo pipefail
cmd="${1:?usage: scripts/slurm-local.sh start|stop|status [DIR]}"
dir="${2:-${MEMFIT_SLURM_DIR:-/tmp/memfit-slurm}}"
host="$(hostname -s)"

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pid() { # PIDFILE NAME
  if alive "$1"; then
    local pid; pid="$(cat "$1")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
}

case "$cmd" in
start)
  if alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid" && alive "$dir/munged.pid"; then
    echo "export SLURM_CONF=$dir/slurm.conf"; exit 0
  fi
  [[ "$(id -u)" -eq 0 ]] || { echo "slurm-local: must run as root (slurmd runs jobs as any user)" >&2; exit 2; }
  need=()
  for pkg in slurm-wlm munge; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
  done
  if (( ${#need[@]} )); then
    echo "slurm-local: installing ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  fi
  mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
  chmod 700 "$dir/munge"
  [[ -f "$dir/munge/munge.key" ]] || { dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$dir/munge/munge.key"; }
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/munged.log" --pid-file="$dir/munged.pid" --seed-file="$dir/munge/seed"
  cat > "$dir/slurm.conf" <<CONF
ClusterName=memfit-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=${MEMFIT_SLURM_PORT:-6917}
SlurmdPort=$(( ${MEMFIT_SLURM_PORT:-6917} + 1 ))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.log
MinJobAge=600
SchedulerParameters=defer_batch
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 100); do
    if sinfo -h -o %T 2>/dev/null | grep -qE "idle|mix|alloc"; then
      echo "export SLURM_CONF=$dir/slurm.conf"; exit 0
    fi
    sleep 0.2
  done
  echo "slurm-local: the node did not come up; logs in $dir" >&2
  tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  exit 1
  ;;
stop)
  [[ -d "$dir" ]] || exit 0
  stop_pid "$dir/slurmd.pid"
  stop_pid "$dir/slurmctld.pid"
  stop_pid "$dir/munged.pid"
  rm -rf "$dir"
  ;;
status)
  for d in munged slurmctld slurmd; do
    if alive "$dir/$d.pid"; then echo "$d: running (pid $(cat "$dir/$d.pid"))"; else echo "$d: stopped"; fi
  done
  ;;
*) echo "usage: scripts/slurm-local.sh start|stop|status [DIR]" >&2; exit 2 ;;
esac
