#!/usr/bin/env python3
"""Lists what gangway left behind in an ARM endpoint (the Azure fake).

    python leak_check.py --endpoint http://127.0.0.1:PORT --subscription SUB[,SUB2] [--all]

Looks, in each subscription, for resource groups and for the resources a
launch makes (virtual machines, disks, network interfaces, public IP
addresses, network security groups, virtual networks, proximity placement
groups) that belong to gangway: they carry a tag key `gangway-cluster`, or
their name (a resource group's, or the resource's own) starts with
`gangway-`, or they sit in such a resource group. With --all, everything
counts. Lists are read through ARM's own REST API (with any bearer token
the fake takes), following nextLink.

Prints what it finds and exits 1 if anything is left; otherwise prints
`leak check: nothing left in <subscriptions>` and exits 0. Exits 2 when the
endpoint cannot be asked. Standard library only.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

TAG_KEY = "gangway-cluster"
NAME_PREFIX = "gangway-"
LISTS = [
    ("virtual machine", "Microsoft.Compute/virtualMachines", "2024-11-01"),
    ("disk", "Microsoft.Compute/disks", "2024-03-02"),
    ("proximity placement group", "Microsoft.Compute/proximityPlacementGroups", "2024-11-01"),
    ("network interface", "Microsoft.Network/networkInterfaces", "2024-10-01"),
    ("public IP address", "Microsoft.Network/publicIPAddresses", "2024-10-01"),
    ("network security group", "Microsoft.Network/networkSecurityGroups", "2024-10-01"),
    ("virtual network", "Microsoft.Network/virtualNetworks", "2024-10-01"),
]


def get_all(endpoint, path, api_version, token):
    url = f"{endpoint.rstrip('/')}{path}?api-version={api_version}"
    items = []
    while url:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                page = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"GET {path}: HTTP {err.code}: {err.read()[:300]!r}") from err
        items += page.get("value", [])
        url = page.get("nextLink")
    return items


def rg_of(resource_id):
    parts = resource_id.split("/")
    low = [p.lower() for p in parts]
    return parts[low.index("resourcegroups") + 1] if "resourcegroups" in low else ""


def is_gangways(name, tags, group=""):
    return TAG_KEY in (tags or {}) or name.startswith(NAME_PREFIX) or group.startswith(NAME_PREFIX)


def describe(tags):
    return ", ".join(f"{k}={v}" for k, v in sorted((tags or {}).items())) or "no tags"


def leaks_in(endpoint, sub, everything, token):
    left = []
    for group in get_all(endpoint, f"/subscriptions/{sub}/resourcegroups", "2025-03-01", token):
        if everything or is_gangways(group["name"], group.get("tags")):
            left.append(("resource group", group["id"], group.get("tags")))
    for kind, type_path, api in LISTS:
        for res in get_all(endpoint, f"/subscriptions/{sub}/providers/{type_path}", api, token):
            if everything or is_gangways(res["name"], res.get("tags"), rg_of(res["id"])):
                state = (res.get("properties") or {}).get("provisioningState")
                left.append((f"{kind} ({state})" if state else kind, res["id"], res.get("tags")))
    return left


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True, help="e.g. http://127.0.0.1:5000")
    parser.add_argument("--subscription", required=True, help="one or more ids, comma separated")
    parser.add_argument("--token", default="leak-check", help="bearer token to send")
    parser.add_argument("--all", action="store_true", help="count every resource, not only gangway's")
    args = parser.parse_args()
    subs = [s for s in args.subscription.split(",") if s]
    found = 0
    for sub in subs:
        try:
            left = leaks_in(args.endpoint, sub, args.all, args.token)
        except (OSError, RuntimeError, ValueError) as err:
            print(f"leak check: cannot ask {args.endpoint}: {err}", file=sys.stderr)
            return 2
        for kind, rid, tags in left:
            print(f"leak check: {kind} {rid} ({describe(tags)})")
        found += len(left)
    if found:
        print(f"leak check: {found} resource(s) left in {','.join(subs)}")
        return 1
    print(f"leak check: nothing left in {','.join(subs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
