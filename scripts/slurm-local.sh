#!/usr/bin/env bash
# A throwaway Slurm cluster on this machine, for the tests (and for trying --launcher slurm).
#   scripts/slurm-local.sh install               apt-get install Debian's slurmctld, slurmd, client and munge (root)
#   scripts/slurm-local.sh up DIR [CPUS [NODES]]  start munged, slurmctld and NODES slurmd (default 1) with state
#                                                and logs under DIR; CPUS is what each node advertises (default 8)
#   scripts/slurm-local.sh down DIR              stop them
# One node is called "localhost". Several are node1..nodeN: one slurmd each (slurmd -N nodeK), all on 127.0.0.1,
# each on its own port (Debian's Slurm is built with multiple-slurmd support), so a job really spans N nodes of
# Slurm's, on one host. Ports: SLURM_LOCAL_PORT (slurmctld, default 6817) and the NODES ports after it.
# Then: export SLURM_CONF=DIR/slurm.conf. No systemd, no cgroups: processes are tracked via /proc.
set -euo pipefail
USAGE="usage: slurm-local.sh install|up DIR [CPUS [NODES]]|down DIR"
CMD="${1:?$USAGE}"

install() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null && return 0
    [[ $(id -u) == 0 ]] || { echo "slurm-local: installing Slurm needs root (apt-get)" >&2; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
}

up() {
    local dir cpus nodes user
    dir="$(mkdir -p "$1" && cd "$1" && pwd)"
    cpus="${2:-8}"
    nodes="${3:-1}"
    [[ "$nodes" =~ ^[1-9][0-9]*$ ]] || { echo "slurm-local: NODES must be a whole number >= 1 (got '$nodes')" >&2; exit 2; }
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
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
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
CONF
    local names=() name i
    if (( nodes == 1 )); then names=(localhost); else for i in $(seq 1 "$nodes"); do names+=("node$i"); done; fi
    for i in "${!names[@]}"; do
        echo "NodeName=${names[i]} NodeAddr=127.0.0.1 Port=$((port + 1 + i)) CPUs=$cpus State=UNKNOWN" >> "$dir/slurm.conf"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${names[*]}") Default=YES MaxTime=INFINITE State=UP" >> "$dir/slurm.conf"
    slurmctld -f "$dir/slurm.conf"
    for name in "${names[@]}"; do
        mkdir -p "$dir/spool/$name"
        slurmd -f "$dir/slurm.conf" -N "$name"
    done
    wait_idle "$dir" "$nodes"
}

wait_idle() {
    local dir="$1" nodes="$2" idle
    for _ in $(seq 1 30); do
        idle="$(SLURM_CONF="$dir/slurm.conf" sinfo -h -N -o %T 2>/dev/null | grep -cE '^(idle|mixed)' || true)"
        (( idle == nodes )) && { echo "slurm-local: up, $nodes node(s) ($dir/slurm.conf)"; return 0; }
        sleep 1
    done
    echo "slurm-local: $idle of $nodes node(s) became idle; see $dir/log" >&2
    exit 1
}

down() {
    local dir="$1" pidfile
    for pidfile in "$dir"/slurmd.*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        [[ -f "$pidfile" ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
}

case "$CMD" in
    install) install ;;
    up) up "${2:?$USAGE}" "${3:-8}" "${4:-1}" ;;
    down) down "${2:?$USAGE}" ;;
    *) echo "$USAGE" >&2; exit 2 ;;
esac
