# Helpers for selftest.sh and capture-fixtures.sh; source it after DIR/env.
# Not a program: no set -e here, every function returns a status.

# job_field JOB FIELD: one field of `scontrol -o show job JOB` (JobState,
# Reason, Restarts, NodeList ...), empty when the job is unknown.
job_field() {
  scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

# wait_job JOB SECONDS STATE...: waits until the job's JobState is one of
# STATE (RUNNING, PENDING, COMPLETED, CANCELLED, NODE_FAIL, FAILED ...);
# prints the state it ended in. 1 on timeout.
wait_job() {
  local job="$1" secs="$2" st want
  shift 2
  local end=$(( $(date +%s%N) + secs * 1000000000 ))
  while :; do
    st="$(job_field "$job" JobState)"
    for want in "$@"; do [ "$st" = "$want" ] && { echo "$st"; return 0; }; done
    [ "$(date +%s%N)" -ge "$end" ] && { echo "${st:-unknown}"; return 1; }
    sleep 0.1
  done
}

# wait_node NODE SECONDS STATE: waits until `sinfo -N -o %T` for the node is
# STATE exactly (idle, down, allocated; a trailing * means not responding).
wait_node() {
  local node="$1" secs="$2" want="$3" st
  local end=$(( $(date +%s%N) + secs * 1000000000 ))
  while :; do
    st="$(sinfo -h -N -n "$node" -o %T 2>/dev/null | head -1)"
    [ "$st" = "$want" ] && { echo "$st"; return 0; }
    [ "$(date +%s%N)" -ge "$end" ] && { echo "${st:-unknown}"; return 1; }
    sleep 0.1
  done
}

# wait_file FILE SECONDS PATTERN: waits until FILE has a line matching PATTERN.
wait_file() {
  local end=$(( $(date +%s%N) + $2 * 1000000000 ))
  until grep -q -- "$3" "$1" 2>/dev/null; do
    [ "$(date +%s%N)" -ge "$end" ] && return 1
    sleep 0.1
  done
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

# wait_step STEP SECONDS: waits until `scontrol show step STEP` (e.g. 7.0)
# shows it RUNNING.
wait_step() {
  local end=$(( $(date +%s%N) + $2 * 1000000000 ))
  until scontrol show step "$1" 2>/dev/null | grep -q 'State=RUNNING'; do
    [ "$(date +%s%N)" -ge "$end" ] && return 1
    sleep 0.1
  done
}
