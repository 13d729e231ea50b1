#!/bin/sh
# azure-preempt-watch.sh: how the Azure Spot eviction watcher gangway runs on
# nodes asks for a notice. The loop after it, its usage (--once, or polling)
# and the rest of its environment are every cloud's:
# providers/api/templates/notice-watch.sh. gangway_azure::PREEMPT_WATCHER
# puts the two together.
#
# Azure announces a Spot eviction through Scheduled Events on the instance
# metadata service, at least 30 s ahead: GET /metadata/scheduledevents
# (header Metadata: true) answers {"DocumentIncarnation": n, "Events": [...]}
# and an event with "EventType": "Preempt" is the notice; the document, on
# one line, is what is reported.
#
# Environment:
#   GANGWAY_AZURE_IMDS_ENDPOINT  metadata service (default http://169.254.169.254)
#   GANGWAY_SPOT_POLL_S          seconds between polls (default 2; fractions ok)
#
# Needs only a POSIX shell, curl and tr.

set -u

IMDS=${GANGWAY_AZURE_IMDS_ENDPOINT:-http://169.254.169.254}
IMDS=${IMDS%/}
URL="$IMDS/metadata/scheduledevents?api-version=2020-07-01"
DEFAULT_POLL_S=2
UNREACHABLE="azure-preempt-watch: cannot read scheduled events from the instance metadata service at $IMDS (not an Azure VM?)"

# Asks once, into NOTICE. Returns 0 when a Preempt event is scheduled or
# started, 1 when none is, 2 when the service cannot be asked.
check() {
    doc=$(curl -sf --connect-timeout 1 --max-time 5 -H 'Metadata: true' "$URL") || return 2
    doc=$(printf '%s' "$doc" | tr -d '\n\r')
    case $doc in
    *'"Events"'*) ;;
    *) return 2 ;;
    esac
    # JSON spacing varies: squeeze it out before matching the event type.
    flat=$(printf '%s' "$doc" | tr -d ' \t')
    case $flat in
    *'"EventType":"Preempt"'*) NOTICE=$doc; return 0 ;;
    *) return 1 ;;
    esac
}
