#!/usr/bin/env bash
# The fault sweep: kills gangway with SIGKILL at every point where it talks
# to a provider (as each call arrives and as it returns), then does what a
# user would do next, and checks from the provider's side that nothing was
# left: `launch --down` of a 2-node cluster, and a managed job on 2 spot
# nodes preempted once (its controller killed). Prints the figures quoted
# in docs/reliability.md. The regular test suite runs a subset of the same
# kill points; this runs all of them.
#
#   bench/fault_sweep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$SECONDS
GANGWAY_FAULT_SWEEP=full cargo test --test it -- reliability::the_fault_sweep \
  --nocapture --test-threads 1 2>&1 | tee "$log" | grep -oE 'fault sweep \(.*|test result.*|test .*FAILED' || true
if ! grep -q '^test result: ok. 2 passed' "$log"; then
  echo "fault sweep: FAILED (output above; full log kept in ${log}.kept)" >&2
  cp "$log" "${log}.kept"
  exit 1
fi
echo "fault sweep: done in $((SECONDS - start)) s"
