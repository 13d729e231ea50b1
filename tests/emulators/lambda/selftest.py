#!/usr/bin/env python3
"""Self test of the Lambda Cloud fake (server.py) with urllib.

    python3 selftest.py

Starts the fake on a free port (rate limits scaled to a hundredth), checks
auth, instance types, SSH keys, launch (capacity, quantity, unknown fields,
missing fields), list/get/rename, terminate, rate limiting, the violation
log and leak_check.py, and ssh into a launched instance through a real
sshd when one can run (else `SKIPPED ssh: why`). Prints one line per check
and `N passed, N failed`; exits 1 if anything failed.
"""

import base64
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpucloud"))
sys.dont_write_bytecode = True

from testkit import Sshd, call, check, start, stop, summary, wait_for  # noqa: E402

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def main():
    proc, url = start(os.path.join(HERE, "server.py"), "--rate-scale", "0.01", "--boot-seconds", "0.3")
    api = url + "/api/v1"
    sshd = None
    try:
        def lam(method, path, body=None, headers=AUTH):
            # the scaled limits: one request in 10 ms, one launch in 120 ms
            time.sleep(0.125 if path.endswith("/launch") else 0.011)
            return call(api + path, method, body, headers)

        # auth
        s, b, _ = call(api + "/instances")
        check("no Authorization: 401 global/invalid-api-key", s == 401 and b["error"]["code"] == "global/invalid-api-key", b)
        s, b, _ = call(api + "/instances", headers={"Authorization": "Bearer nope"})
        check("unknown key: 401", s == 401, b)
        basic = base64.b64encode(f"{KEY}:".encode()).decode()
        s, b, _ = lam("GET", "/instances", headers={"Authorization": f"Basic {basic}"})
        check("Basic base64(KEY:) accepted", s == 200 and b == {"data": []}, b)
        s, b, _ = lam("GET", "/instances", headers={"Authorization": f"Basic {KEY}"})
        check("Basic with the bare key accepted", s == 200, b)
        s, v, _ = call(url + "/_fake/violations")
        check("the two bad auths are violations", v["count"] == 2, v)
        call(url + "/_fake/violations", "DELETE")

        # instance types
        s, b, _ = lam("GET", "/instance-types")
        h100 = b["data"]["gpu_8x_h100_sxm5"]
        check("instance-types: data map with instance_type and regions_with_capacity_available",
              s == 200 and h100["instance_type"]["price_cents_per_hour"] == 3192
              and {r["name"] for r in h100["regions_with_capacity_available"]} == {"us-south-2", "us-west-3"}
              and set(h100["instance_type"]["specs"]) == {"vcpus", "memory_gib", "storage_gib", "gpus"}, b)

        # ssh keys
        sshd_why = Sshd.why_not()
        if sshd_why is None:
            sshd = Sshd()
            pub = sshd.public_key
        else:
            pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayFakeKeyForTheSelftestOnlyAAAAAAAAAA selftest"
        s, b, _ = lam("POST", "/ssh-keys", {"name": "gw-key", "public_key": pub})
        check("ssh-keys add: id, name, public_key", s == 200 and b["data"]["name"] == "gw-key" and b["data"]["public_key"] == pub, b)
        key_id = b["data"]["id"]
        s, b, _ = lam("POST", "/ssh-keys", {"name": "gw-key", "public_key": pub})
        check("duplicate key name: 400 global/invalid-parameters", s == 400 and b["error"]["code"] == "global/invalid-parameters", b)
        s, b, _ = lam("POST", "/ssh-keys", {"name": "generated"})
        check("ssh-keys add without public_key: a generated pair with private_key",
              s == 200 and "PRIVATE KEY" in b["data"].get("private_key", ""), b)
        gen_id = b["data"]["id"]
        s, b, _ = lam("GET", "/ssh-keys")
        check("ssh-keys list", s == 200 and {k["name"] for k in b["data"]} == {"gw-key", "generated"}, b)
        s, b, _ = lam("DELETE", f"/ssh-keys/{gen_id}")
        check("ssh-keys delete: data {}", s == 200 and b == {"data": {}}, b)

        if sshd is not None:
            call(url + "/_fake/machines", "POST", {"slots": [["127.0.0.1", sshd.port]],
                                                   "authorized_keys": sshd.authorized_keys})

        # launch: shape checks
        call(url + "/_fake/violations", "DELETE")
        s, b, _ = lam("POST", "/instance-operations/launch",
                      {"region_name": "us-south-2", "instance_type_name": "gpu_8x_h100_sxm5",
                       "ssh_key_names": ["gw-key"], "colour": "red"})
        check("unknown field: 400 global/invalid-parameters naming it",
              s == 400 and b["error"]["code"] == "global/invalid-parameters" and "colour" in b["error"]["message"], b)
        s, b, _ = lam("POST", "/instance-operations/launch",
                      {"region_name": "mars-1", "instance_type_name": "gpu_8x_h100_sxm5"})
        check("bad region and missing ssh_key_names: 400",
              s == 400 and "region_name" in b["error"]["message"] and "ssh_key_names" in b["error"]["message"], b)
        s, b, _ = lam("POST", "/instance-operations/launch",
                      {"region_name": "us-south-2", "instance_type_name": "gpu_8x_h100_sxm5",
                       "ssh_key_names": ["gw-key"], "quantity": "2"})
        check("quantity as a string: 400", s == 400 and "quantity" in b["error"]["message"], b)
        s, v, _ = call(url + "/_fake/violations")
        check("three violations logged", v["count"] == 3, v)
        call(url + "/_fake/violations", "DELETE")

        # launch: capacity
        time.sleep(0.13)
        s, b, _ = lam("POST", "/instance-operations/launch",
                      {"region_name": "us-east-1", "instance_type_name": "gpu_8x_h100_sxm5",
                       "ssh_key_names": ["gw-key"]})
        check("no capacity in the region: 400 instance-operations/launch/insufficient-capacity",
              s == 400 and b["error"]["code"] == "instance-operations/launch/insufficient-capacity", b)

        # launch and reach it
        time.sleep(0.13)
        s, b, _ = lam("POST", "/instance-operations/launch",
                      {"region_name": "us-south-2", "instance_type_name": "gpu_8x_h100_sxm5",
                       "ssh_key_names": ["gw-key"], "name": "gangway-c1-0",
                       "tags": [{"key": "gangway-cluster", "value": "c1"}]})
        check("launch: data.instance_ids", s == 200 and len(b["data"]["instance_ids"]) == 1, b)
        iid = b["data"]["instance_ids"][0]
        s, b, _ = lam("GET", f"/instances/{iid}")
        check("just launched: booting", s == 200 and b["data"]["status"] == "booting", b)
        inst = wait_for(lambda: (lambda r: r[1]["data"] if r[1]["data"]["status"] == "active" else None)(
            lam("GET", f"/instances/{iid}")), timeout=5)
        check("then active with ip, region, instance_type, actions",
              inst and inst["ip"] and inst["region"]["name"] == "us-south-2"
              and inst["instance_type"]["name"] == "gpu_8x_h100_sxm5" and inst["actions"]["restart"]["available"], inst)
        if sshd is not None:
            ssh_port = call(url + "/_fake/state")[1]["instances"][0]["_ssh"][1]
            r = sshd.ssh(inst["ip"], ssh_port, "echo reached-$((40+2))")
            check("ssh root@ip -p SLOT with the named key reaches the instance",
                  r.returncode == 0 and r.stdout.strip() == "reached-42", r.stderr)
        else:
            print(f"SKIPPED ssh: {sshd_why}")

        s, b, _ = lam("POST", f"/instances/{iid}", {"name": "renamed"})
        check("rename via POST /instances/{id}", s == 200 and b["data"]["name"] == "renamed", b)
        s, b, _ = lam("GET", "/instances")
        check("list shows it", s == 200 and [i["id"] for i in b["data"]] == [iid], b)

        # a second launch: the only slot is taken (with sshd) or capacity left
        time.sleep(0.13)
        s, b, _ = lam("POST", "/instance-operations/launch",
                      {"region_name": "us-south-2", "instance_type_name": "gpu_8x_h100_sxm5",
                       "ssh_key_names": ["gw-key"], "quantity": 2})
        check("quantity 2 beyond capacity: insufficient-capacity, nothing launched",
              s == 400 and b["error"]["code"] == "instance-operations/launch/insufficient-capacity"
              and len(lam("GET", "/instances")[1]["data"]) == 1, b)

        # rate limits (scaled): a second launch at once is refused
        call(url + "/_fake/rate-limit", "POST", {"scale": 1})
        body = {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["gw-key"]}
        s1, b1, _ = call(api + "/instance-operations/launch", "POST", body, AUTH)
        s2, b2, _ = call(api + "/instances", "GET", None, AUTH)
        check("two requests within a second: 429 with the error envelope",
              s2 == 429 and b2["error"]["code"] == "global/rate-limited", (s1, b1, s2, b2))
        time.sleep(1.05)
        s3, b3, _ = call(api + "/instance-operations/launch", "POST", body, AUTH)
        check("a second launch within 12 s: 429", s3 == 429, (s3, b3))
        call(url + "/_fake/rate-limit", "POST", {"scale": 0.01})
        if s1 == 200:
            time.sleep(0.2)
            lam("POST", "/instance-operations/terminate", {"instance_ids": b1["data"]["instance_ids"]})

        # terminate
        s, b, _ = lam("POST", "/instance-operations/terminate", {"instance_ids": ["0" * 32]})
        check("terminate an unknown id: 404 global/object-does-not-exist",
              s == 404 and b["error"]["code"] == "global/object-does-not-exist", b)
        s, b, _ = lam("POST", "/instance-operations/terminate", {"instance_ids": [iid]})
        check("terminate: terminated_instances with status terminating",
              s == 200 and b["data"]["terminated_instances"][0]["status"] == "terminating", b)
        gone = wait_for(lambda: lam("GET", f"/instances/{iid}")[0] == 404, timeout=5)
        check("then gone: 404", gone)

        # leak check
        leak = subprocess.run([sys.executable, os.path.join(HERE, "..", "gpucloud", "leak_check.py"),
                               "--endpoint", url], capture_output=True, text=True)
        check("leak_check.py: nothing left (exit 0)", leak.returncode == 0, leak.stdout + leak.stderr)
        lam("DELETE", f"/ssh-keys/{key_id}")

        s, v, _ = call(url + "/_fake/violations")
        check("no violations from the well-formed calls", v["count"] == 0, v)
        s, st, _ = call(url + "/_fake/state")
        check("state: counts calls and rate-limit refusals",
              st["calls"].get("launchInstance", 0) >= 5 and st["rate_limited"] >= 2,
              (st["calls"], st["rate_limited"]))
    finally:
        if sshd is not None:
            sshd.close()
        stop(proc)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
