#!/usr/bin/env python3
"""Lists what is left in a Lambda Cloud, RunPod or Vast.ai fake.

    python3 leak_check.py --endpoint http://127.0.0.1:PORT [--prefix gangway-] [--keys]

Reads the fake's `GET /_fake/state` and its `leaks` list: instances (pods,
contracts) that are not terminated or destroyed, whatever their state
(stopped and outbid ones count). With --prefix only those whose name or
label starts with it count; with --keys SSH keys left in the account count
too (Lambda's and Vast's account keys).

Prints each one and exits 1 if anything is left; otherwise prints
`leak check: nothing left in <cloud>` and exits 0. Exits 2 when the fake
cannot be asked. Standard library only.
"""

import argparse
import json
import sys
import urllib.request


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--prefix", default="", help="count only names/labels starting with this")
    p.add_argument("--keys", action="store_true", help="count account SSH keys too")
    args = p.parse_args()
    try:
        with urllib.request.urlopen(args.endpoint.rstrip("/") + "/_fake/state", timeout=20) as resp:
            state = json.load(resp)
    except (OSError, ValueError) as err:
        print(f"leak check: cannot ask {args.endpoint}: {err}", file=sys.stderr)
        return 2
    cloud = state.get("cloud", "?")
    left = [x for x in state.get("leaks", [])
            if not args.prefix or (x.get("name") or "").startswith(args.prefix)]
    if args.keys:
        for key in state.get("ssh_keys", []):
            left.append({"kind": "ssh key", "id": key.get("id"), "name": key.get("name"), "status": "-"})
    for x in left:
        print(f"leak check: {cloud}: {x['kind']} {x['id']} {x.get('name') or '-'} ({x.get('status')})")
    if left:
        print(f"leak check: {len(left)} resource(s) left in {cloud}")
        return 1
    print(f"leak check: nothing left in {cloud}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
