#!/usr/bin/env bash
# Records real Slurm command output from a throwaway cluster into
# tests/fixtures/slurm/, for the Slurm provider's parser tests.
#
#   tests/emulators/slurm/capture-fixtures.sh [OUT]   # default tests/fixtures/slurm
#
# Starts a 4-node cluster (start.sh) in /tmp/gangway-slurm-fixtures (a fixed
# path, so paths in the output stay the same from one run to the next), puts
# jobs into the states the fixtures need, writes one file per command, and
# stops the cluster (and removes its dir, unless KEEP=1). Job ids are the
# same on every run (a fresh cluster starts at 1); times, ports and the
# cluster name are not. OUT/README.md describes the files; this script does
# not rewrite it.
#
# The jobs, in order:
#   1 hello     sbatch --nodes=2 --wrap 'srun hostname'        COMPLETED
#   2 nofail    --no-requeue on n1,n2, then n2 set DOWN        NODE_FAIL
#   3 requeue   on n1,n2, then n2 set DOWN                     requeued: PENDING (BeginTime), then cancelled
#   4 victim    all 4 nodes in gpu, preempted by job 5          requeued: PENDING (BeginTime), then cancelled
#   5 urgent    partition urgent on n1,n2                      RUNNING, then cancelled
#   6 cancelme  1 node, scancel while running                  CANCELLED
#   7 train     3 nodes, --exclusive --gpus-per-node=fake:2     RUNNING  (n4 is then drained)
#   8 waits     --nodes=2 --gpus-per-node=fake:1                PENDING (Resources)
#   9 behind    --nodes=1                                      PENDING (Priority)
#  10 held      sbatch -H                                      PENDING (JobHeldUser)
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${1:-$root/tests/fixtures/slurm}"
dir=/tmp/gangway-slurm-fixtures
say() { echo "capture-fixtures.sh: $*"; }
die() { say "$*" >&2; exit 1; }

"$here/install.sh" >/dev/null; rc=$?
[ "$rc" = 3 ] && { echo "SKIPPED: cannot install Slurm here (see install.sh)"; exit 3; }
[ "$rc" = 0 ] || die "install.sh failed"
"$here/stop.sh" "$dir" >/dev/null || die "cannot stop an old cluster in $dir"
rm -rf "$dir"
trap '"$here/stop.sh" "$dir" >/dev/null; [ "${KEEP:-0}" = 1 ] || rm -rf "$dir"' EXIT
"$here/start.sh" "$dir" 4 >/dev/null || die "start.sh failed"
. "$dir/env"
. "$here/lib.sh"
mkdir -p "$dir/work" "$out" && cd "$dir/work" || exit 1

# save NAME CMD...: runs CMD, stdout (and stderr) into OUT/NAME.
save() { local name="$1"; shift; "$@" > "$out/$name" 2>&1; say "$name  <- $*"; }
expect() { # expect JOB STATE...: waits for the state or dies
  local job="$1" st; shift
  st="$(wait_job "$job" 30 "$@")" || die "job $job is $st, wanted $*"
}
node_down() { scontrol update nodename="$1" state=down reason="$2"; wait_node "$1" 10 down >/dev/null || die "$1 not down"; }
node_up() { scontrol update nodename="$1" state=resume; wait_node "$1" 20 idle >/dev/null || die "$1 not idle after resume"; }
sub() { sbatch --parsable "$@" || die "sbatch $* failed"; }

j=$(sub -J hello --nodes=2 --wrap 'srun hostname'); expect "$j" COMPLETED

j=$(sub -J nofail --no-requeue --nodes=2 -w n1,n2 --wrap 'srun sleep 600'); expect "$j" RUNNING
node_down n2 "fixture: node lost"
expect "$j" NODE_FAIL
save scontrol-show-job-node-fail.txt scontrol show job "$j"
save scontrol-show-node-down.txt scontrol show node n2
node_up n2

j=$(sub -J requeue --nodes=2 -w n1,n2 --wrap 'srun sleep 600'); expect "$j" RUNNING
node_down n2 "fixture: node lost again"
expect "$j" PENDING
save scontrol-show-job-requeued-node-down.txt scontrol show job "$j"
node_up n2
scancel "$j"; expect "$j" CANCELLED

v=$(sub -J victim --nodes=4 --exclusive --wrap 'srun sleep 600'); expect "$v" RUNNING
u=$(sub -J urgent -p urgent --nodes=2 -w n1,n2 --wrap 'sleep 600')
expect "$v" PENDING; expect "$u" RUNNING
save scontrol-show-job-requeued-preempted.txt scontrol show job "$v"
scancel "$u" "$v"; expect "$u" CANCELLED; expect "$v" CANCELLED

j=$(sub -J cancelme --nodes=1 --wrap 'sleep 600'); expect "$j" RUNNING
scancel "$j"; expect "$j" CANCELLED
save scontrol-show-job-cancelled.txt scontrol show job "$j"

# Wait until nothing is COMPLETING any more, so the states below are clean.
end=$(( $(date +%s) + 30 )); while [ -n "$(squeue -h)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done

run=$(sub -J train --nodes=3 --exclusive --gpus-per-node=fake:2 --ntasks-per-node=2 --wrap 'srun sleep 600')
expect "$run" RUNNING
scontrol update nodename=n4 state=drain reason="fixture: maintenance"
p1=$(sub -J waits --nodes=2 --gpus-per-node=fake:1 --wrap 'srun true')
p2=$(sub -J behind --nodes=1 --wrap true)
p3=$(sub -J held -H --wrap true)
# Reasons change from one scheduler pass to the next (both start as
# Priority, then the first becomes Resources); wait for the settled ones.
end=$(( $(date +%s) + 20 ))
while [ "$(date +%s)" -lt "$end" ]; do
  [ "$(job_field "$p1" Reason)" = Resources ] && [ "$(job_field "$p2" Reason)" = Priority ] && break
  sleep 0.2
done
wait_step "$run.0" 15 || die "step $run.0 never ran"
say "pending reasons: $p1 $(job_field "$p1" Reason), $p2 $(job_field "$p2" Reason), $p3 $(job_field "$p3" Reason)"

save scontrol-show-job-completed.txt scontrol show job 1
save scontrol-show-job-running.txt scontrol show job "$run"
save scontrol-show-job-pending-resources.txt scontrol show job "$p1"
save scontrol-show-job-pending-priority.txt scontrol show job "$p2"
save scontrol-show-job-pending-held.txt scontrol show job "$p3"
save scontrol-show-job-oneliner.txt scontrol -o show job
save scontrol-show-step-running.txt scontrol show step "$run.0"
save squeue.json squeue --json
save squeue.txt squeue -h -t all -o '%i|%T|%r|%P|%j|%u|%D|%C|%b|%N|%V|%S|%M|%l'
save squeue-default.txt squeue
save sinfo.json sinfo --json
save sinfo-nodes.txt sinfo -N -h -o '%N|%P|%T|%c|%m|%G|%E'
save sinfo-default.txt sinfo
save scontrol-show-node.txt scontrol show node
save scontrol-show-topology.txt scontrol show topology
save scontrol-show-partition.txt scontrol show partition

# What does not work on this version / setup, with the message it gives.
save scontrol-show-job-json.unsupported.txt scontrol show job "$run" --json
save sacct.unsupported.txt sacct
save sbatch-too-many-gpus.refused.txt sbatch --gres=gpu:fake:3 --wrap true

cp "$dir/slurm.conf" "$out/cluster-slurm.conf"
cp "$dir/gres.conf" "$out/cluster-gres.conf"
cp "$dir/topology.conf" "$out/cluster-topology.conf"
say "$(sinfo -V), $(date -u +%Y-%m-%d): $(ls "$out" | wc -l) files in $out"
