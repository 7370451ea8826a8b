#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the real submit test (tests/test_slurm_live.py) and for trying
# `launch --executor slurm` without a cluster. For disposable machines (CI, a container): it writes
# /etc/slurm/slurm.conf and /etc/slurm/slurmdbd.conf and runs every daemon as root.
#
#   scripts/slurm_local.sh install   apt-get install Debian's slurm-wlm, slurmdbd, mariadb-server, munge (~40 s)
#   scripts/slurm_local.sh start     start munged, mariadbd, slurmdbd, slurmctld, slurmd; wait until a job can run
#   scripts/slurm_local.sh stop      stop every daemon this script started (by its pid file)
#   scripts/slurm_local.sh status    sinfo, or exit 1 when the cluster is not up
#
# State, logs and pid files live in $LCMOE_SLURM_DIR (default /tmp/lcmoe-slurm). No systemd is needed: the daemons
# are started by hand (Debian's packages do not start services without an init system). See docs/launch.md.
set -euo pipefail

dir="${LCMOE_SLURM_DIR:-/tmp/lcmoe-slurm}"
conf=/etc/slurm/slurm.conf
marker="# written by lcmoe_recipes scripts/slurm_local.sh"
db_pass=lcmoe-local-only

need_root() {
  if [ "$(id -u)" != 0 ]; then echo "slurm_local.sh: $1 needs root (it writes /etc/slurm and starts daemons)" >&2; exit 2; fi
}

install_packages() {
  need_root install
  if command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null; then
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm slurmdbd mariadb-server mariadb-client munge >/dev/null
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2 i
  shift 2
  for ((i = 0; i < limit * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "slurm_local.sh: $what did not come up within ${limit}s; logs in $dir/log" >&2
  tail -n 20 "$dir"/log/*.log >&2 2>/dev/null || true
  return 1
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_configs() {
  if [ -f "$conf" ] && ! grep -qF "$marker" "$conf"; then
    echo "slurm_local.sh: $conf exists and was not written by this script; refusing to replace it" >&2
    exit 2
  fi
  local host cpus mem
  host="$(hostname -s)"
  cpus="$(nproc)"
  mem="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
  mkdir -p /etc/slurm "$dir"/{state,spool,log,run}
  cat >"$conf" <<EOF
$marker
ClusterName=lcmoe
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=600
# a requeued job waits until its credentials expire (AuthInfo cred_expire, default 120 s; the minimum is 5): 10 s is
# ample for a step launch on this one machine, and the fault drill (tests/test_drill.py) restarts 4 times
AuthInfo=cred_expire=10
# the main scheduler tests pending jobs every sched_interval s (default 60), backfill every bf_interval s (default
# 30): a requeued job whose hold has passed starts within 2 s instead of up to a minute
SchedulerParameters=sched_interval=2,bf_interval=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat >/etc/slurm/slurmdbd.conf <<EOF
$marker
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$dir/run/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
}

start() {
  need_root start
  install_packages
  write_configs
  # munge: authentication for every Slurm daemon and client
  if ! alive /run/munge/munged.pid; then
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged
  fi
  wait_for 10 munged bash -c 'munge -n | unmunge'
  # mariadb: slurmdbd's store, so that sacct (which NeMo-Run reads job state with) answers
  if ! alive /run/mysqld/mysqld.pid; then
    mkdir -p /run/mysqld
    chown mysql:mysql /run/mysqld
    (mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid --socket=/run/mysqld/mysqld.sock \
      --log-error="$dir/log/mariadb.log" >/dev/null 2>&1 &)
  fi
  wait_for 30 mariadbd mysqladmin --socket=/run/mysqld/mysqld.sock ping
  # a controller without saved state numbers jobs from 1 again: an accounting store kept from an earlier one (mariadb
  # keeps /var/lib/mysql) would hold jobs of the same ids, and sacct -j ID -- NeMo-Run's job state -- would answer
  # with both (a job read as done while it still runs); so a fresh controller gets a fresh store
  if ! alive "$dir/run/slurmctld.pid" && [ ! -f "$dir/state/job_state" ]; then
    alive "$dir/run/slurmdbd.pid" && kill "$(cat "$dir/run/slurmdbd.pid")" && sleep 1
    mysql --socket=/run/mysqld/mysqld.sock -e "DROP DATABASE IF EXISTS slurm_acct_db;"
  fi
  mysql --socket=/run/mysqld/mysqld.sock -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$db_pass';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  alive "$dir/run/slurmdbd.pid" || slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -i -Q add cluster lcmoe >/dev/null 2>&1 || true
  alive "$dir/run/slurmctld.pid" || slurmctld -i
  wait_for 30 slurmctld scontrol ping
  alive "$dir/run/slurmd.pid" || slurmd
  wait_for 30 "the node" bash -c "sinfo -h -o %t | grep -qE '^(idle|mix|alloc)'"
  echo "slurm_local.sh: one-node cluster 'lcmoe' up ($(sinfo -h -o '%P %D node(s) %c CPUs %t')); logs in $dir/log"
}

stop() {
  local name pidfile pid
  for name in slurmd slurmctld slurmdbd; do
    pidfile="$dir/run/$name.pid"
    if alive "$pidfile"; then kill "$(cat "$pidfile")"; fi
  done
  if alive /run/mysqld/mysqld.pid; then kill "$(cat /run/mysqld/mysqld.pid)"; fi
  if alive /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)"; fi
  for pidfile in "$dir"/run/*.pid /run/mysqld/mysqld.pid /run/munge/munged.pid; do
    for _ in $(seq 50); do alive "$pidfile" || break; sleep 0.2; done
    if alive "$pidfile"; then pid="$(cat "$pidfile")"; kill -9 "$pid" 2>/dev/null || true; fi
  done
  echo "slurm_local.sh: stopped"
}

case "${1:-}" in
  install) install_packages ;;
  start) start ;;
  stop) stop ;;
  status) sinfo ;;
  *) sed -n '2,10p' "$0"; [ "${1:-}" = -h ] || [ "${1:-}" = --help ] || exit 2 ;;
esac
