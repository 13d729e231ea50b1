#!/bin/sh
# aws-spot-watch.sh: the AWS spot interruption watcher gangway runs on nodes.
#
# EC2 posts a spot instance's interruption two minutes ahead at the instance
# metadata service (IMDSv2): GET /latest/meta-data/spot/instance-action
# answers 404 until then, and 200 with JSON such as
#   {"action": "terminate", "time": "2026-12-02T22:51:00Z"}
# afterwards. Every GET carries a session token from PUT /latest/api/token.
#
# Usage:
#   aws-spot-watch.sh --once   print the notice JSON and exit 0 if one is
#                              posted; exit 1, silently, if none is; exit 2,
#                              with a message on stderr, if the metadata
#                              service cannot be reached (not an EC2 node)
#   aws-spot-watch.sh          poll until a notice is posted, then write it
#                              to $GANGWAY_NOTICE_FILE (if set), send
#                              SIGTERM to process group $GANGWAY_NOTICE_PGID
#                              (if set: the job's ranks checkpoint on it),
#                              print it and exit 0; exit 2 if the metadata
#                              service cannot be reached on the first try
#
# Environment:
#   GANGWAY_IMDS_ENDPOINT  metadata service (default http://169.254.169.254)
#   GANGWAY_SPOT_POLL_S    seconds between polls (default 5; fractions ok)
#   GANGWAY_NOTICE_FILE    where the notice JSON is written (polling mode)
#   GANGWAY_NOTICE_PGID    process group to SIGTERM (polling mode)
#
# Needs only a POSIX shell and curl.

set -u

IMDS=${GANGWAY_IMDS_ENDPOINT:-http://169.254.169.254}
IMDS=${IMDS%/}
POLL=${GANGWAY_SPOT_POLL_S:-5}
TOKEN=
NOTICE=
# Short timeouts: the service is link-local and answers at once, or is not
# there at all.
CURL="curl -s --connect-timeout 1 --max-time 2"

# Gets a fresh session token into TOKEN; fails if there is none.
new_token() {
    TOKEN=$($CURL -f -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 21600' \
        "$IMDS/latest/api/token") && [ -n "$TOKEN" ]
}

# Asks for the instance action once, into NOTICE. Returns 0 when a notice
# is posted, 1 when none is, 2 when the service cannot be asked.
check() {
    [ -n "$TOKEN" ] || new_token || return 2
    for _try in 1 2; do
        # The body, then the 3-digit HTTP status ("000": no answer).
        out=$($CURL -w '%{http_code}' -H "X-aws-ec2-metadata-token: $TOKEN" \
            "$IMDS/latest/meta-data/spot/instance-action") || return 2
        code=${out#"${out%???}"}
        NOTICE=${out%???}
        case $code in
        200) return 0 ;;
        404) return 1 ;;
        401) new_token || return 2 ;; # the token expired: one more try
        *) return 2 ;;
        esac
    done
    return 2
}

unreachable() {
    echo "aws-spot-watch: cannot read spot/instance-action from the instance metadata service at $IMDS (not an EC2 node?)" >&2
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

# Polling mode. Only the first answer decides whether this is an EC2 node;
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
    # Whole or not at all: readers never see half a notice.
    printf '%s\n' "$NOTICE" >"$GANGWAY_NOTICE_FILE.tmp" &&
        mv -f "$GANGWAY_NOTICE_FILE.tmp" "$GANGWAY_NOTICE_FILE"
fi
if [ -n "${GANGWAY_NOTICE_PGID:-}" ]; then
    kill -s TERM -- "-$GANGWAY_NOTICE_PGID"
fi
printf '%s\n' "$NOTICE"
exit 0
