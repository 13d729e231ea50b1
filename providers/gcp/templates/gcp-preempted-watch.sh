#!/bin/sh
# gcp-preempted-watch.sh: the GCP spot/preemptible watcher gangway runs on
# nodes.
#
# GCE gives a spot VM about 30 s of warning: the metadata server's
# instance/preempted turns from FALSE to TRUE (and the VM gets an ACPI
# shutdown). Asked with the header Metadata-Flavor: Google.
#
# Usage:
#   gcp-preempted-watch.sh --once   print TRUE and exit 0 if the VM is being
#                                   preempted; exit 1, silently, if not;
#                                   exit 2, with a message on stderr, if
#                                   the metadata server cannot be reached
#                                   (not a GCE node)
#   gcp-preempted-watch.sh          poll until it is, then write TRUE to
#                                   $GANGWAY_NOTICE_FILE (if set), send
#                                   SIGTERM to process group
#                                   $GANGWAY_NOTICE_PGID (if set), print
#                                   TRUE and exit 0; exit 2 if the metadata
#                                   server cannot be reached on the first try
#
# Environment:
#   GCE_METADATA_HOST    metadata server host[:port]
#                        (default metadata.google.internal)
#   GANGWAY_SPOT_POLL_S  seconds between polls (default 2; fractions ok)
#   GANGWAY_NOTICE_FILE  where TRUE is written (polling mode)
#   GANGWAY_NOTICE_PGID  process group to SIGTERM (polling mode)
#
# Plain polling rather than ?wait_for_change=true: a wait started just after
# the value changed would block until the next change (or its timeout).
#
# Needs only a POSIX shell and curl.

set -u

URL="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance/preempted"
POLL=${GANGWAY_SPOT_POLL_S:-2}

# Returns 0 when the VM is being preempted, 1 when not, 2 when the
# metadata server cannot be asked.
check() {
    v=$(curl -sf --connect-timeout 1 --max-time 2 -H 'Metadata-Flavor: Google' "$URL") || return 2
    case $v in
    TRUE) return 0 ;;
    FALSE) return 1 ;;
    *) return 2 ;;
    esac
}

unreachable() {
    echo "gcp-preempted-watch: cannot read instance/preempted from the metadata server at $URL (not a GCE node?)" >&2
    exit 2
}

if [ "${1:-}" = --once ]; then
    check
    case $? in
    0) echo TRUE ;;
    1) exit 1 ;;
    *) unreachable ;;
    esac
    exit 0
fi

# Polling mode. Only the first answer decides whether this is a GCE node;
# later failures are taken as passing and retried.
check
rc=$?
[ "$rc" -eq 2 ] && unreachable
while [ "$rc" -ne 0 ]; do
    sleep "$POLL"
    check
    rc=$?
done

if [ -n "${GANGWAY_NOTICE_FILE:-}" ]; then
    echo TRUE >"$GANGWAY_NOTICE_FILE.tmp" &&
        mv -f "$GANGWAY_NOTICE_FILE.tmp" "$GANGWAY_NOTICE_FILE"
fi
if [ -n "${GANGWAY_NOTICE_PGID:-}" ]; then
    kill -s TERM -- "-$GANGWAY_NOTICE_PGID"
fi
echo TRUE
exit 0
