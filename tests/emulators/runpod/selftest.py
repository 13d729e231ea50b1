#!/usr/bin/env python3
"""Self test of the RunPod fake (server.py) with urllib.

    python3 selftest.py

Starts the fake on a free port and checks auth, the pod create shape checks,
capacity ("There are no instances currently available"), create/list/get
(publicIp, portMappings), stop, delete, GraphQL gpuTypes with prices and
lowestPrice, spot preemption, the violation log and leak_check.py, and ssh
into a pod through a real sshd when one can run (else `SKIPPED ssh: why`).
Prints one line per check and `N passed, N failed`; exits 1 on failure.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpucloud"))
sys.dont_write_bytecode = True

from testkit import Sshd, call, check, start, stop, summary, wait_for  # noqa: E402

AUTH = {"Authorization": "Bearer test-key"}
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayFakeKeyForTheSelftestOnlyAAAAAAAAAA selftest"


def main():
    proc, url = start(os.path.join(HERE, "server.py"), "--boot-seconds", "0.3")
    rest = url + "/v1"
    sshd = None
    try:
        def rp(method, path, body=None, headers=AUTH):
            return call(rest + path, method, body, headers)

        def gql(query, variables=None, headers=AUTH, qs=""):
            body = {"query": query}
            if variables is not None:
                body["variables"] = variables
            return call(url + "/graphql" + qs, "POST", body, headers)

        s, b, _ = rp("GET", "/pods", headers={})
        check("no key: 401", s == 401, b)
        s, b, _ = rp("GET", "/pods")
        check("list: an empty array", s == 200 and b == [], b)
        call(url + "/_fake/violations", "DELETE")

        sshd_why = Sshd.why_not()
        pub = PUB
        if sshd_why is None:
            sshd = Sshd()
            pub = sshd.public_key
            call(url + "/_fake/machines", "POST", {"slots": [["127.0.0.1", sshd.port]],
                                                   "authorized_keys": sshd.authorized_keys})

        base = {"name": "gangway-c1-0", "imageName": "runpod/base:0.6.2-cuda12.2.0",
                "gpuTypeIds": ["NVIDIA A100 80GB PCIe"], "gpuCount": 1, "cloudType": "SECURE",
                "containerDiskInGb": 40, "ports": ["22/tcp", "8888/http"],
                "env": {"PUBLIC_KEY": pub, "GANGWAY_CLUSTER": "c1"}}
        # shape checks
        s, b, _ = rp("POST", "/pods", dict(base, gpuTypeIds=["NVIDIA A100"]))
        check("unknown GPU type id: 400 naming gpuTypeIds", s == 400 and "gpuTypeIds" in b["error"], b)
        s, b, _ = rp("POST", "/pods", dict(base, cloudType="ALL"))
        check("cloudType ALL (GraphQL's, not REST's): 400", s == 400 and "cloudType" in b["error"], b)
        s, b, _ = rp("POST", "/pods", dict(base, ports="22/tcp"))
        check("ports as a string: 400", s == 400 and "ports" in b["error"], b)
        s, b, _ = rp("POST", "/pods", dict(base, env=[{"key": "A", "value": "b"}]))
        check("env as GraphQL's key/value list: 400", s == 400 and "env" in b["error"], b)
        s, b, _ = rp("POST", "/pods", dict(base, bidPerGpu=0.2))
        check("unknown field: 400", s == 400 and "bidPerGpu" in b["error"], b)
        s, v, _ = call(url + "/_fake/violations")
        check("five violations logged", v["count"] == 5, v)
        call(url + "/_fake/violations", "DELETE")

        # capacity
        s, b, _ = rp("POST", "/pods", dict(base, dataCenterIds=["EU-SE-1"]))
        check("no capacity there: 500 'There are no instances currently available'",
              s == 500 and b == {"error": "create pod: There are no instances currently available", "status": 500}, b)

        # create and reach
        s, pod, _ = rp("POST", "/pods", base)
        check("create: 201 with id, desiredStatus RUNNING, costPerHr, no publicIp yet",
              s == 201 and pod["desiredStatus"] == "RUNNING" and pod["costPerHr"] == 1.39
              and pod["publicIp"] is None and pod["portMappings"] == {}, pod)
        pid = pod["id"]
        got = wait_for(lambda: (lambda r: r[1] if r[1].get("publicIp") else None)(rp("GET", f"/pods/{pid}")), 5)
        check("get: publicIp and portMappings {'22': PORT} once up",
              got and got["portMappings"].get("22") and got["publicIp"], got)
        s, b, _ = rp("GET", f"/pods/{pid}?includeMachine=true")
        check("includeMachine: machine.dataCenterId", s == 200 and b["machine"]["dataCenterId"] == "US-KS-2", b)
        if sshd is not None:
            r = sshd.ssh(got["publicIp"], got["portMappings"]["22"], "echo reached-$((40+2))")
            check("ssh root@publicIp -p portMappings['22'] with PUBLIC_KEY reaches the pod",
                  r.returncode == 0 and r.stdout.strip() == "reached-42", r.stderr)
            s, b, _ = rp("POST", "/pods", dict(base, name="gangway-c1-1"))
            check("the only sshd slot is taken: no instances available", s == 500, b)
        else:
            print(f"SKIPPED ssh: {sshd_why}")
        s, b, _ = rp("GET", "/pods?name=gangway-c1-0&desiredStatus=RUNNING")
        check("list filtered by name and desiredStatus", s == 200 and [p["id"] for p in b] == [pid], b)
        s, b, _ = rp("GET", "/pods?colour=red")
        check("unknown query parameter: 400 and a violation", s == 400, b)
        call(url + "/_fake/violations", "DELETE")

        # stop, delete
        s, b, _ = rp("POST", f"/pods/{pid}/stop")
        check("stop: desiredStatus EXITED, no publicIp", s == 200 and b["desiredStatus"] == "EXITED" and b["publicIp"] is None, b)
        s, b, _ = rp("DELETE", f"/pods/{pid}")
        check("delete: 204", s == 204, b)
        s, b, _ = rp("GET", f"/pods/{pid}")
        check("then get: 404", s == 404, b)

        # spot and preemption
        s, spot, _ = rp("POST", "/pods", dict(base, name="gangway-spot", interruptible=True,
                                              cloudType="COMMUNITY", gpuTypeIds=["NVIDIA GeForce RTX 4090"]))
        check("interruptible COMMUNITY pod at the community spot price",
              s == 201 and spot["interruptible"] and spot["costPerHr"] == 0.2, spot)
        s, b, _ = call(url + "/_fake/preempt", "POST", {"id": spot["id"]})
        check("preempt: the pod shows EXITED with the reason in lastStatusChange",
              s == 200 and b["desiredStatus"] == "EXITED" and "interrupted" in b["lastStatusChange"], b)
        s, b, _ = rp("GET", f"/pods/{spot['id']}")
        check("GET after preemption: EXITED", s == 200 and b["desiredStatus"] == "EXITED", b)
        leak = subprocess.run([sys.executable, os.path.join(HERE, "..", "gpucloud", "leak_check.py"),
                               "--endpoint", url], capture_output=True, text=True)
        check("leak_check.py counts the stopped pod (exit 1)", leak.returncode == 1 and spot["id"] in leak.stdout,
              leak.stdout)
        rp("DELETE", f"/pods/{spot['id']}")
        leak = subprocess.run([sys.executable, os.path.join(HERE, "..", "gpucloud", "leak_check.py"),
                               "--endpoint", url], capture_output=True, text=True)
        check("leak_check.py: nothing left after delete (exit 0)", leak.returncode == 0, leak.stdout)

        # GraphQL
        q = ("query { gpuTypes { id displayName memoryInGb secureCloud communityCloud "
             "securePrice communityPrice secureSpotPrice communitySpotPrice } }")
        s, b, _ = gql(q)
        a100 = next(g for g in b["data"]["gpuTypes"] if g["id"] == "NVIDIA A100 80GB PCIe")
        check("gpuTypes with secure/community/spot prices",
              s == 200 and a100["securePrice"] == 1.39 and a100["communitySpotPrice"] == 0.6, b)
        q2 = ("query LowestPrice($input: GpuLowestPriceInput!) { gpuTypes(input: {id: \"NVIDIA L40S\"}) "
              "{ id lowestPrice(input: $input) { gpuName gpuTypeId minimumBidPrice uninterruptablePrice "
              "stockStatus availableGpuCounts } } }")
        s, b, _ = gql(q2, {"input": {"gpuCount": 2, "secureCloud": True}}, headers={}, qs="?api_key=test-key")
        lp = b["data"]["gpuTypes"][0]["lowestPrice"] if s == 200 else b
        check("lowestPrice with variables and ?api_key=: prices for the count, stock",
              s == 200 and lp["uninterruptablePrice"] == 1.72 and lp["minimumBidPrice"] == 0.86
              and lp["stockStatus"] == "Medium" and lp["availableGpuCounts"] == [1, 2, 4], lp)
        s, b, _ = gql("query { gpuTypes { id bogus } }")
        check("unknown GraphQL field: errors[] and a violation",
              s == 400 and "bogus" in b["errors"][0]["message"], b)
        s, v, _ = call(url + "/_fake/violations")
        check("exactly that violation", v["count"] == 1, v)
        call(url + "/_fake/violations", "DELETE")
        s, v, _ = call(url + "/_fake/violations")
        check("no violations left", v["count"] == 0, v)
    finally:
        if sshd is not None:
            sshd.close()
        stop(proc)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
