#!/usr/bin/env bash
# Stops the Slurm cluster that start.sh started in DIR, and everything it ran.
#
#   tests/emulators/slurm/stop.sh DIR
#
# Finds the cluster's processes: the pids in DIR's pid files (munged,
# slurmctld, slurmd), any process whose command line names DIR/slurm.conf or
# DIR's munge socket, Slurm's helpers (slurmstepd, slurmscriptd) with an open
# file or working directory under DIR, and job processes (SLURM_JOB_ID set
# and SLURM_CONF=DIR/slurm.conf in their environment). Never itself or its
# ancestors. Job processes and slurmstepd get SIGKILL at once (the cluster is
# thrown away; slurmstepd ignores SIGTERM); the daemons get SIGTERM, and
# SIGKILL after 5 s. Then it looks again until nothing is left. Leaves DIR's
# files (logs) in place. Idempotent: a stopped cluster or a missing DIR is
# fine.
#
# Exit: 0 nothing left running; 1 something survived (listed); 2 usage.
set -uo pipefail

[ $# = 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
say() { echo "stop.sh: $*"; }
if [ ! -d "$1" ]; then say "$1 does not exist; nothing to stop"; exit 0; fi
dir="$(cd "$1" && pwd -P)"
conf="$dir/slurm.conf"
socket="$dir/munge/munge.socket"

# Self and ancestors are never touched (a caller may have sourced DIR/env or
# sit in DIR).
declare -A keep=()
p=$$
while [ -n "$p" ] && [ "$p" != 0 ]; do
  keep[$p]=1
  p="$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null)"
done

# find_procs: prints "PID KIND" lines, KIND daemon or job. Builtins only in
# the loop over /proc (it runs a few times; forks per process are slow).
find_procs() {
  local d pid cmd comm a f link
  local -a args envs
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    [ -n "${keep[$pid]-}" ] && continue
    args=(); mapfile -d '' args < "$d/cmdline" 2>/dev/null || continue
    [ "${#args[@]}" = 0 ] && continue # kernel threads, zombies
    cmd="${args[*]}"
    comm=""; read -r comm < "$d/comm" 2>/dev/null
    if [[ "$cmd" == *"$conf"* || "$cmd" == *"$socket"* ]]; then
      case "$comm" in slurmctld|slurmd|munged) echo "$pid daemon" ;; *) echo "$pid job" ;; esac
      continue
    fi
    case "$comm" in
      slurmstepd|slurmscriptd)
        for f in "$d/cwd" "$d"/fd/*; do
          link="$(readlink "$f" 2>/dev/null)" || continue
          if [[ "$link" == "$dir/"* ]]; then
            [ "$comm" = slurmstepd ] && echo "$pid job" || echo "$pid daemon"
            continue 2
          fi
        done ;;
    esac
    envs=(); mapfile -d '' envs < "$d/environ" 2>/dev/null || continue
    local job=0 ours=0
    for a in "${envs[@]}"; do
      [[ "$a" == SLURM_JOB_ID=* ]] && job=1
      [[ "$a" == "SLURM_CONF=$conf" ]] && ours=1
    done
    [ "$job$ours" = 11 ] && echo "$pid job"
  done 2>/dev/null
}

describe() { local p; for p in "$@"; do echo "  $p $( { tr '\0' ' ' < "/proc/$p/cmdline"; } 2>/dev/null | cut -c1-150)"; done; }
alive() { local p; for p in "$@"; do [ -d "/proc/$p" ] && [ -n "$( { tr -d '\0' < "/proc/$p/cmdline"; } 2>/dev/null)" ] && echo "$p"; done; }

found="$(find_procs)"
if [ -z "$found" ]; then say "nothing running for $dir"; exit 0; fi
daemons=($(awk '$2 == "daemon" {print $1}' <<<"$found"))
jobs=($(awk '$2 == "job" {print $1}' <<<"$found"))
say "stopping ${#daemons[@]} daemons and ${#jobs[@]} job processes of $dir:"
describe "${daemons[@]}" "${jobs[@]}"
[ "${#jobs[@]}" != 0 ] && kill -KILL "${jobs[@]}" 2>/dev/null
[ "${#daemons[@]}" != 0 ] && kill -TERM "${daemons[@]}" 2>/dev/null

for round in 1 2 3; do
  for _ in $(seq 50); do
    left=($(alive "${daemons[@]}" "${jobs[@]}"))
    [ "${#left[@]}" = 0 ] && break
    sleep 0.1
  done
  if [ "${#left[@]}" != 0 ]; then
    say "still running after 5 s, sending SIGKILL:"
    describe "${left[@]}"
    kill -KILL "${left[@]}" 2>/dev/null
    sleep 0.2
  fi
  # Anything new (a job forking while we looked)?
  found="$(find_procs)"
  [ -z "$found" ] && break
  daemons=(); jobs=($(awk '{print $1}' <<<"$found"))
  say "found more, sending SIGKILL:"
  describe "${jobs[@]}"
  kill -KILL "${jobs[@]}" 2>/dev/null
done

found="$(find_procs)"
if [ -n "$found" ]; then
  say "these survived SIGKILL:" >&2
  describe $(awk '{print $1}' <<<"$found") >&2
  exit 1
fi
say "stopped; nothing left running for $dir"
