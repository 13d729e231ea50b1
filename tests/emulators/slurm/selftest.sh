#!/usr/bin/env bash
# Checks the Slurm emulator end to end on a fresh 4-node cluster.
#
#   tests/emulators/slurm/selftest.sh          # KEEP=1: keep the cluster's dir
#
# install.sh (or skip), start.sh in a new mktemp dir, then: nodes, GRES,
# partitions, sbatch + srun, steps in an allocation, topology, JSON output,
# a node set DOWN under a job (requeue, and NODE_FAIL with --no-requeue),
# scancel, pending reasons, preemption (REQUEUE, and SIGTERM with GraceTime).
# `note` lines record what this Slurm did where more than one answer is
# plausible. Always stops the cluster (stop.sh) and removes its dir unless
# KEEP=1; on failures prints the tail of slurmctld's log.
#
# Ends with `N passed, N failed`. Exit: 0 all passed, 1 failures, 3 SKIPPED
# (cannot install or run Slurm here).
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
export PATH="$PATH:/usr/sbin:/sbin"
passed=0 failed=0
t_start=$(date +%s.%N)
at() { awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%5.1f", b - a }'; }
ok() { passed=$((passed + 1)); echo "$(at) ok    $*"; }
bad() { failed=$((failed + 1)); echo "$(at) FAIL  $*"; }
note() { echo "$(at) note  $*"; }

out="$("$here/install.sh" 2>&1)"; rc=$?
if [ "$rc" = 3 ]; then echo "$out" | grep SKIPPED; exit 3; fi
if [ "$rc" != 0 ]; then echo "$out"; echo "selftest.sh: install.sh failed"; echo "0 passed, 1 failed"; exit 1; fi
echo "$out" | grep -m1 'slurm-wlm'
if [ "$(id -u)" != 0 ]; then echo "SKIPPED: selftest.sh must run as root (start.sh does)"; exit 3; fi

dir="$(mktemp -d /tmp/gw-slurm.XXXXXX)"
stopped=0
cleanup() {
  [ "$stopped" = 1 ] && return
  stopped=1
  cd /
  if [ "$failed" != 0 ] && [ -f "$dir/log/slurmctld.log" ]; then
    echo "----- last lines of $dir/log/slurmctld.log"; tail -n 25 "$dir/log/slurmctld.log"
  fi
  if "$here/stop.sh" "$dir" >/dev/null; then ok "stop.sh left no process behind"
  else bad "stop.sh left processes behind"; "$here/stop.sh" "$dir"; fi
  if [ -n "$(ps -eo args | grep -F "$dir" | grep -v grep)" ]; then bad "processes naming $dir still run"; fi
  if [ "${KEEP:-0}" = 1 ]; then echo "selftest.sh: kept $dir"; else rm -rf "$dir"; fi
}
trap 'cleanup; echo "interrupted"; echo "$passed passed, $((failed + 1)) failed"; exit 1' INT TERM

# ---------------------------------------------------------------- start
t=$(date +%s.%N)
if "$here/start.sh" "$dir" 4 > "$dir.start.log" 2>&1; then
  ok "start.sh: 4 nodes idle after $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}') s ($(grep -o 'all 4 nodes idle after [0-9.]* s' "$dir.start.log"))"
  rm -f "$dir.start.log"
else
  cat "$dir.start.log"; rm -f "$dir.start.log"
  bad "start.sh failed"
  cleanup; echo "$passed passed, $failed failed"; exit 1
fi
# shellcheck source=/dev/null
. "$dir/env"
. "$here/lib.sh"
mkdir -p "$dir/work" && cd "$dir/work" || exit 1

# ---------------------------------------------------------------- nodes
got="$(sinfo -h -N -o '%N %T' | sort -u | tr '\n' ' ')"
[ "$got" = "n1 idle n2 idle n3 idle n4 idle " ] && ok "sinfo: 4 idle nodes" || bad "sinfo: want n1..n4 idle, got: $got"
got="$(sinfo -h -N -o '%N %G' | sort -u | awk '{print $2}' | sort -u | tr '\n' ' ')"
[ "$got" = "gpu:fake:2 " ] && ok "sinfo: every node has Gres gpu:fake:2" || bad "sinfo GRES: got $got"
got="$(sinfo -h -o '%P %D %N' | tr '\n' ',')"
[ "$got" = "gpu* 4 n[1-4],debug 2 n[1-2],urgent 4 n[1-4]," ] && ok "partitions: $got" || bad "partitions: got $got"

# ---------------------------------------------------------------- sbatch + srun
t=$(now)
j=$(sbatch --parsable --nodes=2 -o "hostname-%j.out" --wrap 'srun hostname')
st="$(wait_job "$j" 30 COMPLETED FAILED CANCELLED)"
lines="$(wc -l < "hostname-$j.out" 2>/dev/null)"
if [ "$st" = COMPLETED ] && [ "$lines" = 2 ]; then ok "sbatch --nodes=2 --wrap 'srun hostname': COMPLETED in $(since "$t") s, 2 lines"
else bad "sbatch srun hostname: state $st, output: $(cat "hostname-$j.out" 2>/dev/null)"; fi

# ---------------------------------------------------------------- steps in an allocation
j=$(sbatch --parsable --nodes=2 --gpus-per-node=fake:2 -o "steps-%j.out" --wrap '
for s in 1 2; do
  srun --nodes=2 --ntasks-per-node=1 bash -c "echo step=\$SLURM_STEP_ID node=\$SLURMD_NODENAME nodeid=\$SLURM_NODEID procid=\$SLURM_PROCID gpus=\$CUDA_VISIBLE_DEVICES"
done')
st="$(wait_job "$j" 30 COMPLETED FAILED CANCELLED)"
f="steps-$j.out"
good=1
for s in 0 1; do
  [ "$(grep "^step=$s " "$f" | sed 's/.*nodeid=\([0-9]*\).*/\1/' | sort | tr '\n' ' ')" = "0 1 " ] || good=0
  [ "$(grep "^step=$s " "$f" | sed 's/.*procid=\([0-9]*\).*/\1/' | sort | tr '\n' ' ')" = "0 1 " ] || good=0
  [ "$(grep "^step=$s " "$f" | sed 's/.*node=\(n[0-9]*\).*/\1/' | sort -u | wc -l)" = 2 ] || good=0
done
gpus="CUDA_VISIBLE_DEVICES=0,1"
if [ -c "$GANGWAY_SLURM_DIR/dev/nvidia0" ]; then
  [ "$(grep -c 'gpus=0,1$' "$f")" = 4 ] || good=0
else
  gpus="fake GPU files are not devices here (mknod refused): CUDA_VISIBLE_DEVICES not checked"
fi
if [ "$st" = COMPLETED ] && [ "$good" = 1 ]; then
  ok "two srun steps (--nodes=2 --ntasks-per-node=1) in one allocation: distinct SLURM_NODEID/SLURM_PROCID/SLURMD_NODENAME, $gpus"
else bad "steps: state $st, output:"; cat "$f"; fi

# ---------------------------------------------------------------- topology
topo="$(scontrol show topology)"
if grep -q 'SwitchName=s1 .*Nodes=n\[1-2\]' <<<"$topo" && grep -q 'SwitchName=s2 .*Nodes=n\[3-4\]' <<<"$topo" \
  && grep -q 'SwitchName=s0 .*Switches=s\[1-2\]' <<<"$topo"; then
  ok "scontrol show topology: s0 over s1 (n1,n2) and s2 (n3,n4)"
else bad "topology: $topo"; fi

# ---------------------------------------------------------------- JSON
if command -v python3 >/dev/null; then
  got="$(squeue --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["meta"]["Slurm"]["release"], d["meta"]["plugin"]["type"], len(d["jobs"]))' 2>&1)"
  [ $? = 0 ] && ok "squeue --json parses (release, plugin, jobs: $got)" || bad "squeue --json: $got"
  got="$(sinfo --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(sorted(n["name"] for n in d["nodes"])))' 2>&1)"
  [ "$got" = "n1 n2 n3 n4" ] && ok "sinfo --json parses: nodes $got" || bad "sinfo --json: $got"
  got="$(squeue --json -t RUNNING | python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["jobs"]), "jobs, states", sorted({j["job_state"] for j in d["jobs"]}))')"
  note "squeue --json ignores filters: -t RUNNING (nothing is running) gives $got"
else
  squeue --json | head -c1 | grep -q '{' && ok "squeue --json answers JSON (python3 missing: not parsed)" || bad "squeue --json"
  sinfo --json | head -c1 | grep -q '{' && ok "sinfo --json answers JSON (python3 missing: not parsed)" || bad "sinfo --json"
fi
if got="$(scontrol show job "$j" --json 2>&1)" && [ "${got:0:1}" = "{" ]; then
  note "scontrol show job --json works here"
else
  note "scontrol show job --json does not work here: $(head -1 <<<"$got")"
fi

# ---------------------------------------------------------------- node DOWN under a job
j=$(sbatch --parsable --nodes=2 -w n1,n2 -o "down-%j.out" --wrap 'srun sleep 300')
st="$(wait_job "$j" 30 RUNNING)" || bad "down test: job never ran ($st)"
t=$(now)
scontrol update nodename=n2 state=down reason=selftest
st="$(wait_job "$j" 15 PENDING NODE_FAIL FAILED CANCELLED)"
if [ "$st" = PENDING ] && [ "$(job_field "$j" Restarts)" = 1 ]; then
  ok "n2 DOWN: running 2-node job requeued after $(since "$t") s (PENDING, Reason=$(job_field "$j" Reason), Restarts=1)"
else bad "n2 DOWN: job state $st, Restarts=$(job_field "$j" Restarts)"; fi
note "requeued job: SubmitTime=$(job_field "$j" SubmitTime) EligibleTime=$(job_field "$j" EligibleTime) (held back about 2 minutes)"
st="$(wait_node n2 5 down)" && ok "sinfo: n2 down, reason $(sinfo -h -N -n n2 -o %E | head -1)" || bad "n2 state $st, want down"
scontrol update nodename=n2 state=resume
st="$(wait_node n2 20 idle)" && ok "state=resume: n2 idle again" || bad "after resume n2 is $st"
scontrol update jobid="$j" starttime=now
st="$(wait_job "$j" 30 RUNNING)" && ok "requeued job runs again after scontrol update StartTime=now (on $(job_field "$j" NodeList))" || bad "requeued job did not run again: $st"
scancel "$j"; wait_job "$j" 30 CANCELLED >/dev/null

j=$(sbatch --parsable --no-requeue --nodes=2 -w n1,n2 -o "down-%j.out" --wrap 'srun sleep 300')
wait_job "$j" 30 RUNNING >/dev/null || bad "no-requeue job never ran"
scontrol update nodename=n2 state=down reason=selftest
st="$(wait_job "$j" 15 NODE_FAIL PENDING FAILED CANCELLED)"
[ "$st" = NODE_FAIL ] && ok "n2 DOWN under a --no-requeue job: NODE_FAIL, Reason=$(job_field "$j" Reason)" || bad "--no-requeue job on DOWN node: $st"
scontrol update nodename=n2 state=resume
wait_node n2 20 idle >/dev/null || bad "n2 not idle after second resume"

# ---------------------------------------------------------------- scancel
a=$(sbatch --parsable --nodes=1 --wrap 'sleep 300'); b=$(sbatch --parsable --nodes=2 --wrap 'srun sleep 300')
wait_job "$a" 30 RUNNING >/dev/null; wait_job "$b" 30 RUNNING >/dev/null
scancel "$a" "$b"
end=$(( $(date +%s) + 20 )); while [ -n "$(squeue -h)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
if [ -z "$(squeue -h)" ] && [ "$(job_field "$a" JobState)" = CANCELLED ] && [ "$(job_field "$b" JobState)" = CANCELLED ]; then
  ok "scancel: both jobs CANCELLED, squeue empty"
else bad "scancel: squeue: $(squeue -h -o '%i %T' | tr '\n' ' '), states $(job_field "$a" JobState) $(job_field "$b" JobState)"; fi

# ---------------------------------------------------------------- pending reasons
fill=$(sbatch --parsable --nodes=4 --exclusive -o "fill-%j.out" --wrap 'srun sleep 300')
wait_job "$fill" 30 RUNNING >/dev/null || bad "the job filling the cluster never ran"
p1=$(sbatch --parsable --nodes=2 --wrap true); p2=$(sbatch --parsable --nodes=2 --wrap true)
p3=$(sbatch --parsable --nodes=5 --wrap true)
end=$(( $(date +%s) + 15 ))
while [ "$(date +%s)" -lt "$end" ]; do
  r1="$(squeue -h -j "$p1" -o %r)"; r2="$(squeue -h -j "$p2" -o %r)"; r3="$(squeue -h -j "$p3" -o %r)"
  [ "$r1" = Resources ] && [ "$r2" = Priority ] && [ "$r3" = PartitionNodeLimit ] && break
  sleep 0.2
done
[ "$r1" = Resources ] && ok "full cluster: next job PENDING, squeue %r Resources" || bad "pending reason of $p1: $r1"
[ "$r2" = Priority ] && ok "job behind it: PENDING, Priority" || bad "pending reason of $p2: $r2 (want Priority)"
[ "$r3" = PartitionNodeLimit ] && ok "--nodes=5 on 4 nodes: accepted, PENDING, PartitionNodeLimit" || bad "--nodes=5: $r3"
if msg="$(sbatch --gres=gpu:fake:3 --wrap true 2>&1)"; then bad "--gres=gpu:fake:3 was accepted: $msg"
else ok "--gres=gpu:fake:3 (2 per node) refused at submit: ${msg#sbatch: error: }"; fi
scancel "$p1" "$p2" "$p3"

# ---------------------------------------------------------------- preemption (gpu, no GraceTime)
t=$(now)
u=$(sbatch --parsable -p urgent --nodes=2 -w n1,n2 --wrap 'sleep 300')
st="$(wait_job "$fill" 30 PENDING COMPLETED FAILED CANCELLED PREEMPTED)"
if [ "$st" = PENDING ] && [ "$(job_field "$fill" Restarts)" = 1 ]; then
  ok "urgent job preempts the gpu job: victim requeued after $(since "$t") s (PENDING, Reason=$(job_field "$fill" Reason), Restarts=1)"
else bad "preempted gpu job: $st, Restarts=$(job_field "$fill" Restarts)"; fi
st="$(wait_job "$u" 30 RUNNING)" && ok "urgent job RUNNING $(since "$t") s after submit" || bad "urgent job: $st"
grep -q "preempted JobId=$fill has been requeued" "$GANGWAY_SLURM_DIR/log/slurmctld.log" \
  && ok "slurmctld.log: preempted JobId=$fill has been requeued" || bad "no preemption line in slurmctld.log"
grep -q 'DUE TO PREEMPTION' "fill-$fill.out" && note "victim's output: $(grep -m1 'DUE TO PREEMPTION' "fill-$fill.out")"
scancel "$u" "$fill"
end=$(( $(date +%s) + 20 )); while [ -n "$(squeue -h)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done

# ---------------------------------------------------------------- preemption (debug, GraceTime=5)
v=$(sbatch --parsable -p debug --nodes=2 --exclusive -o "grace-%j.out" --wrap '
srun bash -c "trap \"echo \$SLURMD_NODENAME got SIGTERM; exit 0\" TERM; sleep 300 & wait"
echo "step ended $?"')
wait_job "$v" 30 RUNNING >/dev/null || bad "debug victim never ran"
wait_step "$v.0" 15 || bad "debug victim's step never ran"
sleep 0.2 # let bash set its trap
t=$(now)
u=$(sbatch --parsable -p urgent --nodes=2 -w n1,n2 --wrap 'sleep 300')
if wait_file "grace-$v.out" 15 'got SIGTERM'; then
  ok "GraceTime=5: the victim's tasks got SIGTERM $(since "$t") s after the urgent submit"
else bad "GraceTime victim got no SIGTERM: $(cat "grace-$v.out")"; fi
st="$(wait_job "$v" 20 COMPLETED FAILED PENDING CANCELLED)"
note "GraceTime victim whose tasks exit 0 on SIGTERM ends $st (Restarts=$(job_field "$v" Restarts)): not requeued"
st="$(wait_job "$u" 30 RUNNING)" && ok "urgent job RUNNING $(since "$t") s after submit" || bad "urgent job after GraceTime victim: $st"
scancel "$u" "$v"
end=$(( $(date +%s) + 20 )); while [ -n "$(squeue -h)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
[ -z "$(squeue -h)" ] && ok "squeue empty at the end" || bad "squeue not empty at the end: $(squeue -h)"

cleanup
echo "selftest.sh: $(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b-a}') s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
