#!/usr/bin/env bash
# A throwaway single-node Slurm cluster on this machine, for the tests (and for trying --launcher slurm).
#   scripts/slurm-local.sh install        apt-get install Debian's slurmctld, slurmd, client and munge (root)
#   scripts/slurm-local.sh up DIR [CPUS]  start munged, slurmctld and slurmd with state and logs under DIR
#                                         (ports SLURM_LOCAL_PORT and the next one; default 6817)
#   scripts/slurm-local.sh down DIR       stop them
# Then: export SLURM_CONF=DIR/slurm.conf. No systemd, no cgroups: processes are tracked via /proc.
set -euo pipefail
CMD="${1:?usage: slurm-local.sh install|up DIR [CPUS]|down DIR}"

install() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null && return 0
    [[ $(id -u) == 0 ]] || { echo "slurm-local: installing Slurm needs root (apt-get)" >&2; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
}

up() {
    local dir cpus user
    dir="$(mkdir -p "$1" && cd "$1" && pwd)"
    cpus="${2:-8}"
    user="$(id -un)"
    local port="${SLURM_LOCAL_PORT:-6817}"
    mkdir -p "$dir"/{munge,state,spool,log}
    chmod 755 "$dir" "$dir/munge"
    [[ -f "$dir/munge/munge.key" ]] || { dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none; }
    chmod 0400 "$dir/munge/munge.key"
    munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed" --force
    cat > "$dir/slurm.conf" <<CONF
ClusterName=restartbench
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=$port
SlurmdPort=$((port + 1))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=1
MailProg=/bin/true
ReturnToService=2
MpiDefault=none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    slurmctld -f "$dir/slurm.conf"
    slurmd -f "$dir/slurm.conf" -N localhost
    for _ in $(seq 1 30); do
        SLURM_CONF="$dir/slurm.conf" sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed)' && { echo "slurm-local: up ($dir/slurm.conf)"; return 0; }
        sleep 1
    done
    echo "slurm-local: the node did not become idle; see $dir/log" >&2
    exit 1
}

down() {
    local dir="$1" pidfile
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        [[ -f "$pidfile" ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
}

case "$CMD" in
    install) install ;;
    up) up "${2:?usage: slurm-local.sh up DIR [CPUS]}" "${3:-8}" ;;
    down) down "${2:?usage: slurm-local.sh down DIR}" ;;
    *) echo "usage: slurm-local.sh install|up DIR [CPUS]|down DIR" >&2; exit 2 ;;
esac
