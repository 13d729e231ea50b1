#!/bin/sh
# gcp-preempted-watch.sh: how the GCP spot/preemptible watcher gangway runs
# on nodes asks for a notice. The loop after it, its usage (--once, or
# polling) and the rest of its environment are every cloud's:
# providers/api/templates/notice-watch.sh. gangway_gcp::PREEMPTED_WATCHER
# puts the two together.
#
# GCE gives a spot VM about 30 s of warning: the metadata server's
# instance/preempted turns from FALSE to TRUE (and the VM gets an ACPI
# shutdown); TRUE is the notice. Asked with the header Metadata-Flavor:
# Google.
#
# Environment:
#   GCE_METADATA_HOST    metadata server host[:port]
#                        (default metadata.google.internal)
#   GANGWAY_SPOT_POLL_S  seconds between polls (default 2; fractions ok)
#
# Plain polling rather than ?wait_for_change=true: a wait started just after
# the value changed would block until the next change (or its timeout).
#
# Needs only a POSIX shell and curl.

set -u

URL="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance/preempted"
DEFAULT_POLL_S=2
UNREACHABLE="gcp-preempted-watch: cannot read instance/preempted from the metadata server at $URL (not a GCE node?)"

# Asks once, into NOTICE. Returns 0 when the VM is being preempted, 1 when
# not, 2 when the metadata server cannot be asked.
check() {
    v=$(curl -sf --connect-timeout 1 --max-time 2 -H 'Metadata-Flavor: Google' "$URL") || return 2
    case $v in
    TRUE) NOTICE=$v; return 0 ;;
    FALSE) return 1 ;;
    *) return 2 ;;
    esac
}
