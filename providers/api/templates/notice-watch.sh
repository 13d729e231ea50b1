# notice-watch.sh: the loop of every spot notice watcher gangway runs on
# nodes, after the cloud's part that says how to ask for a notice
# (providers/aws/templates/aws-spot-watch.sh,
# providers/gcp/templates/gcp-preempted-watch.sh);
# gangway_provider::notice::Watcher puts the two together.
#
# The cloud's part sets
#   DEFAULT_POLL_S  seconds between polls when GANGWAY_SPOT_POLL_S is unset
#   UNREACHABLE     what to say when its metadata service cannot be asked
# and defines `check`: it asks once, and returns 0 with the notice in
# NOTICE when one is posted, 1 when none is, 2 when the service cannot be
# asked.
#
# Usage:
#   WATCHER --once   print the notice and exit 0 if one is posted; exit 1,
#                    silently, if none is; exit 2, with UNREACHABLE on
#                    stderr, if the metadata service cannot be asked (not a
#                    node of that cloud)
#   WATCHER          poll until a notice is posted, then write it to
#                    $GANGWAY_NOTICE_FILE (if set), send SIGTERM to process
#                    group $GANGWAY_NOTICE_PGID (if set: the job's ranks
#                    checkpoint on it), print it and exit 0; exit 2 if the
#                    metadata service cannot be asked on the first try
#
# Environment:
#   GANGWAY_SPOT_POLL_S  seconds between polls (default DEFAULT_POLL_S;
#                        fractions ok)
#   GANGWAY_NOTICE_FILE  where the notice is written (polling mode)
#   GANGWAY_NOTICE_PGID  process group to SIGTERM (polling mode)

set -u

POLL=${GANGWAY_SPOT_POLL_S:-$DEFAULT_POLL_S}
NOTICE=

unreachable() {
    echo "$UNREACHABLE" >&2
    exit 2
}

if [ "${1:-}" = --once ]; then
    check
    case $? in
    0) printf '%s\n' "$NOTICE" ;;
    1) exit 1 ;;
    *) unreachable ;;
    esac
    exit 0
fi

# Polling mode. Only the first answer decides whether this is a node of the
# cloud; later failures are taken as passing and retried.
check
rc=$?
[ "$rc" -eq 2 ] && unreachable
while [ "$rc" -ne 0 ]; do
    sleep "$POLL"
    check
    rc=$?
done

if [ -n "${GANGWAY_NOTICE_FILE:-}" ]; then
    # Whole or not at all: readers never see half a notice.
    printf '%s\n' "$NOTICE" >"$GANGWAY_NOTICE_FILE.tmp" &&
        mv -f "$GANGWAY_NOTICE_FILE.tmp" "$GANGWAY_NOTICE_FILE"
fi
if [ -n "${GANGWAY_NOTICE_PGID:-}" ]; then
    kill -s TERM -- "-$GANGWAY_NOTICE_PGID"
fi
printf '%s\n' "$NOTICE"
exit 0
