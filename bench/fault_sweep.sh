#!/usr/bin/env bash
# The fault sweep: kills gangway with SIGKILL at every point where it talks
# to a provider (as each call arrives and as it returns), then does what a
# user would do next, and checks from the provider's side that nothing was
# left. On the local cloud: `launch --down` of a 2-node cluster, and a
# managed job on 2 spot nodes preempted once (its controller killed). On
# the EC2 emulator, the GCE fake and the Azure fake (which count the
# requests and kill at each one themselves): `launch --provision-only` of 2
# nodes and its `down`, each kill followed by a relaunch of the same name and `down
# --all`; and a terminate that fails once, then always. Prints the figures
# quoted in docs/reliability.md. The regular test suite runs a subset of
# the same kill points; this runs all of them. It needs the EC2 emulator's
# and the GCE fake's venvs and the Azure fake's schema file
# (tests/emulators/{ec2,gce,azure}/setup.sh; GANGWAY_TEST_AZURE_SCHEMA, else
# target/azure-venv/arm-schema.json): a skip of their tests fails it.
#
#   bench/fault_sweep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$SECONDS
GANGWAY_FAULT_SWEEP=full GANGWAY_REQUIRE_SUITES=local,aws,gcp,azure \
  cargo test --test it -- reliability::the_fault_sweep cloud_sweep::the_fault_sweep cloud_sweep::a_failing \
  --nocapture --test-threads 1 2>&1 | tee "$log" | grep -oE 'fault sweep \(.*|test result.*|test .*FAILED' || true
if ! grep -q '^test result: ok. 8 passed' "$log"; then
  echo "fault sweep: FAILED (output above; full log kept in ${log}.kept)" >&2
  cp "$log" "${log}.kept"
  exit 1
fi
echo "fault sweep: done in $((SECONDS - start)) s"
