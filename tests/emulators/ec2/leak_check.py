#!/usr/bin/env python3
"""Lists what gangway left behind in an EC2 endpoint (the test emulator).

    python leak_check.py --endpoint http://127.0.0.1:PORT [--regions r1,r2] [--all]

Looks, in each region, for non-terminated instances, security groups other
than `default`, placement groups and key pairs that belong to gangway: they
carry a tag key `gangway-cluster`, or their name (the Name tag for an
instance) starts with `gangway-`. With --all, every such resource counts,
gangway's or not.

Prints what it finds and exits 1 if anything is left; otherwise prints
`leak check: nothing left in <regions>` and exits 0. Exits 2 when the
endpoint cannot be asked. Standard library only: plain HTTP and XML.
"""

import argparse
import sys
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

TAG_KEY = "gangway-cluster"
NAME_PREFIX = "gangway-"


def local(tag):
    """An element's name without its XML namespace."""
    return tag.rsplit("}", 1)[-1]


def child(elem, name):
    for c in elem:
        if local(c.tag) == name:
            return c
    return None


def text(elem, name):
    c = child(elem, name)
    return c.text if c is not None and c.text is not None else ""


def items(elem, name):
    """The <item> children of elem's <name> child."""
    c = child(elem, name)
    return [] if c is None else [i for i in c if local(i.tag) == "item"]


def tags_of(elem):
    return {text(i, "key"): text(i, "value") for i in items(elem, "tagSet")}


def ec2_call(endpoint, region, params):
    """One EC2 query call; returns the parsed XML root. Follows nextToken."""
    results = []
    token = None
    while True:
        query = dict(params, Version="2016-11-15")
        if token:
            query["NextToken"] = token
        req = urllib.request.Request(
            endpoint.rstrip("/") + "/",
            data=urllib.parse.urlencode(query).encode(),
            headers={
                "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
                # moto routes on the SigV4 credential scope and checks no signature.
                "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20000101/"
                f"{region}/ec2/aws4_request, SignedHeaders=host, Signature=0",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                root = ET.fromstring(resp.read())
        except urllib.error.HTTPError as err:
            raise RuntimeError(
                f"{params['Action']} in {region}: HTTP {err.code}: {err.read()[:300]!r}"
            ) from err
        results.append(root)
        token = text(root, "nextToken")
        if not token:
            return results


def is_gangways(name, tags):
    return TAG_KEY in tags or name.startswith(NAME_PREFIX)


def describe(tags):
    return ", ".join(f"{k}={v}" for k, v in sorted(tags.items())) or "no tags"


def leaks_in(endpoint, region, everything):
    """[(kind, id, name, tags)] of what is left in one region."""
    left = []
    for root in ec2_call(endpoint, region, {"Action": "DescribeInstances"}):
        for reservation in items(root, "reservationSet"):
            for inst in items(reservation, "instancesSet"):
                state = text(child(inst, "instanceState"), "name")
                tags = tags_of(inst)
                name = tags.get("Name", "")
                if state != "terminated" and (everything or is_gangways(name, tags)):
                    left.append((f"instance ({state})", text(inst, "instanceId"), name, tags))
    for root in ec2_call(endpoint, region, {"Action": "DescribeSecurityGroups"}):
        for group in items(root, "securityGroupInfo"):
            name, tags = text(group, "groupName"), tags_of(group)
            if name != "default" and (everything or is_gangways(name, tags)):
                left.append(("security group", text(group, "groupId"), name, tags))
    for root in ec2_call(endpoint, region, {"Action": "DescribePlacementGroups"}):
        for group in items(root, "placementGroupSet"):
            name, tags = text(group, "groupName"), tags_of(group)
            if everything or is_gangways(name, tags):
                left.append(("placement group", text(group, "groupId"), name, tags))
    for root in ec2_call(endpoint, region, {"Action": "DescribeKeyPairs"}):
        for key in items(root, "keySet"):
            name, tags = text(key, "keyName"), tags_of(key)
            if everything or is_gangways(name, tags):
                left.append(("key pair", text(key, "keyPairId"), name, tags))
    return left


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True, help="e.g. http://127.0.0.1:5000")
    parser.add_argument("--regions", default="us-east-1,us-west-2,eu-west-1")
    parser.add_argument("--all", action="store_true",
                        help="count every resource, not only gangway's")
    args = parser.parse_args()
    regions = [r for r in args.regions.split(",") if r]

    found = 0
    for region in regions:
        try:
            left = leaks_in(args.endpoint, region, args.all)
        except (OSError, RuntimeError, ET.ParseError) as err:
            print(f"leak check: cannot ask {args.endpoint}: {err}", file=sys.stderr)
            return 2
        for kind, rid, name, tags in left:
            print(f"leak check: {region}: {kind} {rid} {name or '-'} ({describe(tags)})")
        found += len(left)
    if found:
        print(f"leak check: {found} resource(s) left in {','.join(regions)}")
        return 1
    print(f"leak check: nothing left in {','.join(regions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
