#!/usr/bin/env bash
# Starts a throwaway Slurm cluster on this machine, everything under DIR.
#
#   tests/emulators/slurm/start.sh DIR [NODES]      # NODES: default 4
#
# One munged (own key, own socket), one slurmctld and NODES slurmd (n1..nN),
# all on this host, all files under DIR, so it never touches a system munged
# or /etc/slurm and several clusters can run side by side (own ports, own
# ClusterName). Every start makes a fresh cluster: the config, key and state
# under DIR are rewritten. Waits until sinfo shows every node idle (30 s;
# then it prints the logs, stops what it started and exits 1), then writes
# DIR/env (source it: SLURM_CONF etc.) and prints it. stop.sh DIR stops
# everything again.
#
# What the cluster has (README.md says what works):
#   partitions: gpu (default, all nodes), debug (n1,n2), urgent (all nodes,
#               PriorityTier 10: preempts gpu and debug jobs, PreemptMode
#               REQUEUE; debug has GraceTime=5, gpu none)
#   nodes:      2 CPUs, RealMemory 1000 MB, Gres=gpu:fake:2 each
#   topology:   tree, s0 on top of s1 (n1,n2), s2 (n3,n4), s3 (n5,n6) ...
#   ReturnToService=1: a node set DOWN by hand stays down until
#               state=resume (with 2 it comes back at its next ping)
#   SchedulerParameters=batch_sched_delay=0: jobs start within ~1 s, not 3
#
# Exit: 0 running; 1 failed (logs printed); 2 usage; 3 `SKIPPED:` (not root,
# or Slurm/MUNGE not installed: run install.sh).
set -uo pipefail

usage() { echo "usage: $0 DIR [NODES]   (NODES 1..64, default 4)" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
nodes="${2:-4}"
[[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 64 ] || usage
export PATH="$PATH:/usr/sbin:/sbin"
say() { echo "start.sh: $*"; }
here="$(cd "$(dirname "$0")" && pwd)"
# fail MSG [LOG...]: prints MSG and the logs, stops whatever was started.
fail() {
  local msg="$1" f; shift
  say "$msg" >&2
  for f in "$@"; do [ -f "$f" ] && { echo "===== $f" >&2; tail -n 40 "$f" >&2; }; done
  "$here/stop.sh" "$dir" >&2
  exit 1
}
now() { date +%s.%N; }
t0=$(now)
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

if [ "$(id -u)" != 0 ]; then
  echo "SKIPPED: start.sh must run as root (slurmd runs jobs as their users and SlurmUser is root)"
  exit 3
fi
for c in munged munge unmunge slurmctld slurmd sinfo scontrol; do
  command -v "$c" >/dev/null || { echo "SKIPPED: $c is not installed (run tests/emulators/slurm/install.sh)"; exit 3; }
done

dir="$(realpath -m "$1")"
# Unix socket paths are limited to 107 bytes; slurmd's step sockets live in
# DIR/spool/nK/ and are named HOST_JOBID.STEPID.
if [ "${#dir}" -gt 60 ]; then
  say "$dir is too long (${#dir} > 60 characters): the unix sockets under it would not fit" >&2
  exit 1
fi
mkdir -p "$dir" || exit 1
dir="$(cd "$dir" && pwd -P)"
if [ "$(stat -c %u "$dir")" != "$(id -u)" ]; then
  say "$dir is not owned by $(id -un); not using it" >&2
  exit 1
fi
conf="$dir/slurm.conf"
for pidfile in "$dir/run/slurmctld.pid" "$dir"/run/slurmd-*.pid "$dir/munge/munged.pid"; do
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null; then
    say "a cluster is already running in $dir ($pidfile); run stop.sh $dir first" >&2
    exit 1
  fi
done

host="$(hostname -s)"
hostaddr="$(getent hosts "$host" | awk '{print $1; exit}')"
if [ -z "$hostaddr" ]; then
  say "this host's name $host does not resolve (getent hosts $host); add it to /etc/hosts" >&2
  exit 1
fi

# Free TCP ports: random ones that no socket holds, below the kernel's
# ephemeral range (a port from that range was once taken by an outgoing
# connection or a port-0 listener before slurmd bound it). Slurm needs one
# for slurmctld and one per slurmd (all slurmd share the host).
used="$(ss -Htan 2>/dev/null | awk '{n = split($4, a, ":"); print a[n]}' | sort -u)"
eph="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)"
top="${eph:-32768}"; [ "$top" -gt 12000 ] || top=32768
ports=()
while [ "${#ports[@]}" -lt $((nodes + 1)) ]; do
  p=$((10000 + RANDOM % (top - 10000)))
  if ! grep -qx "$p" <<<"$used" && [[ " ${ports[*]-} " != *" $p "* ]]; then ports+=("$p"); fi
done
ctld_port="${ports[0]}"

# A fresh cluster every time.
rm -rf "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/munge" "$dir/dev" "$dir/env"
mkdir -p "$dir/state" "$dir/log" "$dir/run" "$dir/munge"
for i in $(seq 1 "$nodes"); do mkdir -p "$dir/spool/n$i"; done
# munged insists that everyone can reach its socket (x on every directory
# above it) and that nobody but root can write where its key lives.
chmod go+x "$dir"
chmod 755 "$dir/munge"

cluster="gw$(printf '%s' "$dir" | cksum | awk '{printf "%08x", $1}')"
nodelist="n[1-$nodes]"; [ "$nodes" = 1 ] && nodelist=n1
debugnodes="n[1-2]"; [ "$nodes" = 1 ] && debugnodes=n1

say "cluster $cluster in $dir: $nodes nodes on $host ($hostaddr), slurmctld port $ctld_port, slurmd ports ${ports[*]:1}"

# --- munge ---------------------------------------------------------------
key="$dir/munge/munge.key"
socket="$dir/munge/munge.socket"
if command -v mungekey >/dev/null; then
  mungekey --create --keyfile="$key" --force >/dev/null || exit 1
else
  dd if=/dev/urandom of="$key" bs=1024 count=1 status=none || exit 1
fi
chmod 400 "$key"
trap 'fail "interrupted"' INT TERM
say "munged --socket=$socket"
munged --socket="$socket" --key-file="$key" --pid-file="$dir/munge/munged.pid" \
  --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" \
  || fail "munged did not start:" "$dir/log/munged.log"
munge -n --socket="$socket" | unmunge --socket="$socket" >/dev/null \
  || fail "munge/unmunge through $socket failed:" "$dir/log/munged.log"

# --- config --------------------------------------------------------------
{
  cat <<CONF
# Written by gangway tests/emulators/slurm/start.sh for a throwaway cluster.
ClusterName=$cluster
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=${ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
TopologyPlugin=topology/tree
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=1
KillWait=5
MinJobAge=300
InactiveLimit=0
MailProg=/bin/true

CONF
  for i in $(seq 1 "$nodes"); do
    echo "NodeName=n$i NodeHostname=$host NodeAddr=$hostaddr Port=${ports[$i]} CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:fake:2 State=UNKNOWN"
  done
  cat <<CONF

PartitionName=gpu Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=debug Nodes=$debugnodes MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=5
PartitionName=urgent Nodes=$nodelist MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
CONF
} > "$conf"

# Fake GPUs. gres/gpu drops a GPU without File= ("Removing file-less GPU"),
# and wants a character or block device there: DIR/dev/nvidia0 and nvidia1
# are copies of /dev/null (char 1:3), shared by all nodes. Where mknod is not
# allowed they are plain files, which slurmd logs as an error but still
# counts (jobs then get an empty CUDA_VISIBLE_DEVICES).
mkdir -p "$dir/dev"
rm -f "$dir/dev/nvidia0" "$dir/dev/nvidia1"
gpu_files=devices
for g in 0 1; do
  mknod -m 666 "$dir/dev/nvidia$g" c 1 3 2>/dev/null || { : > "$dir/dev/nvidia$g"; gpu_files="plain files (mknod failed: jobs get an empty CUDA_VISIBLE_DEVICES)"; }
done
say "fake GPUs: $dir/dev/nvidia[0-1] are $gpu_files"
echo "AutoDetect=off
NodeName=$nodelist Name=gpu Type=fake File=$dir/dev/nvidia[0-1]" > "$dir/gres.conf"
: > "$dir/plugstack.conf"
{
  switches=()
  for ((i = 1, s = 1; i <= nodes; i += 2, s++)); do
    if [ $((i + 1)) -le "$nodes" ]; then echo "SwitchName=s$s Nodes=n[$i-$((i + 1))]"; else echo "SwitchName=s$s Nodes=n$i"; fi
    switches+=("s$s")
  done
  if [ "${#switches[@]}" = 1 ]; then echo "SwitchName=s0 Switches=s1"; else echo "SwitchName=s0 Switches=s[1-${#switches[@]}]"; fi
} > "$dir/topology.conf"

# --- daemons -------------------------------------------------------------
export SLURM_CONF="$conf"
say "slurmctld -f $conf"
slurmctld -f "$conf" || fail "slurmctld did not start:" "$dir/log/slurmctld.log"
for i in $(seq 1 "$nodes"); do
  slurmd -N "n$i" -f "$conf" || fail "slurmd -N n$i did not start:" "$dir/log/slurmd-n$i.log" "$dir/log/slurmctld.log"
done
say "slurmd -N n1..n$nodes -f $conf started after $(since "$t0") s"

deadline=$(( $(date +%s) + 30 ))
while :; do
  idle="$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | awk '$2 == "idle"' | wc -l)"
  [ "$idle" = "$nodes" ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    sinfo -N -l >&2
    fail "not all nodes idle after 30 s ($idle of $nodes); stopping:" "$dir"/log/*.log
  fi
  sleep 0.1
done

cat > "$dir/env" <<ENV
export SLURM_CONF=$conf
# Slurm finds munged through AuthInfo=socket=... in slurm.conf; the munge and
# unmunge commands need -S \$GANGWAY_SLURM_MUNGE_SOCKET.
export GANGWAY_SLURM_MUNGE_SOCKET=$socket
export GANGWAY_SLURM_DIR=$dir
export GANGWAY_SLURM_CLUSTER=$cluster
ENV
say "all $nodes nodes idle after $(since "$t0") s; DIR/env:"
cat "$dir/env"
