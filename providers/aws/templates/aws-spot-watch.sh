#!/bin/sh
# aws-spot-watch.sh: how the AWS spot interruption watcher gangway runs on
# nodes asks for a notice. The loop after it, its usage (--once, or polling)
# and the rest of its environment are every cloud's:
# providers/api/templates/notice-watch.sh. gangway_aws::SPOT_WATCHER puts
# the two together.
#
# EC2 posts a spot instance's interruption two minutes ahead at the instance
# metadata service (IMDSv2): GET /latest/meta-data/spot/instance-action
# answers 404 until then, and 200 with JSON such as
#   {"action": "terminate", "time": "2026-12-02T22:51:00Z"}
# afterwards: that JSON is the notice. Every GET carries a session token
# from PUT /latest/api/token.
#
# Environment:
#   GANGWAY_IMDS_ENDPOINT  metadata service (default http://169.254.169.254)
#   GANGWAY_SPOT_POLL_S    seconds between polls (default 5; fractions ok)
#
# Needs only a POSIX shell and curl.

set -u

IMDS=${GANGWAY_IMDS_ENDPOINT:-http://169.254.169.254}
IMDS=${IMDS%/}
DEFAULT_POLL_S=5
UNREACHABLE="aws-spot-watch: cannot read spot/instance-action from the instance metadata service at $IMDS (not an EC2 node?)"
TOKEN=
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
