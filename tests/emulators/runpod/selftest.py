#!/usr/bin/env python3
"""Self test of the RunPod fake (server.py) with urllib.

    python3 selftest.py

Starts the fake on a free port and checks auth, the pod create shape checks,
capacity ("There are no instances currently available"), create/list/get
(publicIp, portMappings), stop, delete, GraphQL gpuTypes with prices and
lowestPrice, spot preemption, the violation log and leak_check.py, and ssh
into a pod through a real sshd when one can run (else `SKIPPED ssh: why`);
then REST v2 (v2_checks): problem+json errors (401, 404, 405, 409, 422,
400 rules and capacity, 429 from the limiter v1 shares), the GPU and data
center catalogs, create/list/get/action/delete, ssh through ssh.direct,
account keys with startSsh, and pods made through one API seen, stopped,
started and deleted through the other; then GraphQL spot pods (spot_checks):
podRentInterruptable's input checked field by field, a bid under the spot
price and no capacity refused with HTTP 200 `errors`, the pod seen through
v2, reached through ssh.direct, preempted to EXITED, and deleted.
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

        v2_checks(url, sshd, pub)
        spot_checks(url, sshd, pub)
    finally:
        if sshd is not None:
            sshd.close()
        stop(proc)
    return summary()


def v2_checks(url, sshd, pub):
    """REST v2 on the same server and state as v1."""
    api = url + "/v2"
    v1 = url + "/v1"

    def rp(method, path, body=None, headers=AUTH, base=None):
        return call((base or api) + path, method, body, headers)

    def violations():
        return call(url + "/_fake/violations")[1]["count"]

    def is_problem(status, body, hdrs, detail=None):
        return (isinstance(body, dict) and body.get("status") == status and isinstance(body.get("title"), str)
                and isinstance(body.get("detail"), str) and (detail is None or body["detail"] == detail)
                and hdrs.get("Content-Type") == "application/problem+json")

    # auth
    s, b, h = rp("GET", "/pods", headers={})
    check("v2 no key: 401 problem 'missing bearer token'", s == 401 and is_problem(401, b, h, "missing bearer token"), b)
    s, b, h = rp("GET", "/pods", headers={"Authorization": "Bearer wrong"})
    check("v2 unknown key: 401 problem", s == 401 and is_problem(401, b, h), b)
    check("two auth violations", violations() == 2)
    call(url + "/_fake/violations", "DELETE")

    # catalog: GPU types
    s, b, _ = rp("GET", "/catalog/gpus")
    a100 = next((g for g in b.get("gpus", []) if g["id"] == "NVIDIA A100 80GB PCIe"), {}) if s == 200 else b
    check("catalog/gpus: {gpus: [...]} with price.secure/community, maxCount, no availability unasked",
          s == 200 and len(b["gpus"]) == 8 and a100.get("price") == {"secure": 1.39, "community": 1.19}
          and a100["maxCount"] == {"secure": 8, "community": 8} and a100["memory"] == 80
          and "availability" not in a100 and "dataCenters" not in a100, b)
    s, b, _ = rp("GET", "/catalog/gpus?include=AVAILABILITY&product=POD")
    a100 = next(g for g in b["gpus"] if g["id"] == "NVIDIA A100 80GB PCIe")
    sxm = next(g for g in b["gpus"] if g["id"] == "NVIDIA A100-SXM4-80GB")
    check("include=AVAILABILITY&product=POD: availability and dataCenters per data center (SECURE)",
          s == 200 and a100["availability"] == "HIGH"
          and a100["dataCenters"] == [{"id": "US-KS-2", "name": "US Kansas 2", "availability": "HIGH"}]
          and a100["cudaVersions"] == [{"version": "12.8", "available": True}]
          and sxm["community"] is False and sxm["price"]["community"] == 0.0, a100)
    s, b, _ = rp("GET", "/catalog/gpus?include=AVAILABILITY&product=POD&cloud=COMMUNITY&count=8")
    a100 = next(g for g in b["gpus"] if g["id"] == "NVIDIA A100 80GB PCIe")
    check("cloud=COMMUNITY&count=8: NONE where only 4 are free, dataCenters omitted",
          s == 200 and a100["availability"] == "NONE" and "dataCenters" not in a100, a100)
    s, b, _ = rp("GET", "/catalog/gpus?include=AVAILABILITY&product=POD&countryCodes=RO")
    check("countryCodes=RO: only GPU types offered in Romania (SECURE)",
          s == 200 and [g["id"] for g in b["gpus"]] == ["NVIDIA GeForce RTX 4090"]
          and b["gpus"][0]["dataCenters"][0]["id"] == "EU-RO-1", b)
    s, b, _ = rp("GET", "/catalog/gpus/NVIDIA%20L40S?include=AVAILABILITY&product=POD&minCudaVersion=13")
    check("catalog/gpus/{id} with minCudaVersion above every host: NONE",
          s == 200 and b["id"] == "NVIDIA L40S" and b["availability"] == "NONE" and b["cudaVersions"] == [], b)
    s, b, h = rp("GET", "/catalog/gpus/NVIDIA%20A100")
    check("catalog/gpus/{unknown}: 404 problem", s == 404 and is_problem(404, b, h), b)
    call(url + "/_fake/violations", "DELETE")
    bad = [("include=AVAILABILITY", 400), ("product=POD", 400), ("cloud=SECURE", 400),
           ("include=AVAILABILITY&product=POD&cudaVersions=12.8&minCudaVersion=12", 400),
           ("include=AVAILABILITY&product=POD&countryCodes=fr", 422), ("include=PRICES", 422),
           ("colour=red", 422)]
    results = [rp("GET", "/catalog/gpus?" + qs)[0] for qs, _ in bad]
    check("catalog/gpus rule breaks: 400, malformed/unknown parameters: 422",
          results == [want for _, want in bad], list(zip(bad, results)))
    check("each of them a violation", violations() == len(bad))
    call(url + "/_fake/violations", "DELETE")

    # catalog: data centers
    s, b, _ = rp("GET", "/catalog/datacenters")
    ks2 = next((d for d in b.get("dataCenters", []) if d["id"] == "US-KS-2"), None) if s == 200 else None
    check("catalog/datacenters: 26, with region, globalNetwork, networkVolumeTypes, compliance",
          s == 200 and len(b["dataCenters"]) == 26 and ks2 and ks2["region"] == "NORTH_AMERICA"
          and ks2["globalNetwork"] is True and "gpuAvailability" not in ks2, b)
    s, b, _ = rp("GET", "/catalog/datacenters?regions=OCEANIA,ASIA")
    check("regions=OCEANIA,ASIA", s == 200 and sorted(d["id"] for d in b["dataCenters"]) == ["AP-JP-1", "OC-AU-1"], b)
    s, b, _ = rp("GET", "/catalog/datacenters?regions=EUROPE&include=GPU_AVAILABILITY&globalNetwork=true")
    check("regions=EUROPE&include=GPU_AVAILABILITY&globalNetwork=true: gpuAvailability per data center",
          s == 200 and [d["id"] for d in b["dataCenters"]] == ["EU-RO-1", "EU-SE-1"]
          and {g["id"]: g["availability"] for g in b["dataCenters"][0]["gpuAvailability"]}
          == {"NVIDIA GeForce RTX 4090": "HIGH", "NVIDIA A100 80GB PCIe": "MEDIUM"}, b)
    s, b, _ = rp("GET", "/catalog/datacenters/US-KS-2?include=GPU_AVAILABILITY")
    check("catalog/datacenters/{id}", s == 200 and b["name"] == "US Kansas 2"
          and [g["id"] for g in b["gpuAvailability"]] == ["NVIDIA L40S", "NVIDIA A100 80GB PCIe"], b)
    s, b, h = rp("GET", "/catalog/datacenters/MARS-1")
    check("catalog/datacenters/{unknown}: 404 problem", s == 404 and is_problem(404, b, h), b)
    s, b, _ = rp("GET", "/catalog/datacenters?regions=MARS")
    check("unknown region: 422 and a violation", s == 422 and violations() == 1, b)
    call(url + "/_fake/violations", "DELETE")

    # create: shape checks
    base = {"name": "gangway-v2-0", "image": "runpod/base:0.6.2-cuda12.2.0",
            "gpu": {"id": "NVIDIA A100 80GB PCIe", "count": 1}, "cloud": "SECURE", "disk": 40,
            "ports": ["22/tcp", "8888/http"], "mounts": {"persistent": {"size": 20, "path": "/workspace"}},
            "env": {"PUBLIC_KEY": pub, "GANGWAY_CLUSTER": "c2"}}
    shape = [
        ("interruptible (v1's spot flag; v2 has none)", dict(base, interruptible=True), "interruptible"),
        ("bidPerGpu", dict(base, bidPerGpu=0.2), "bidPerGpu"),
        ("v1's flat gpuTypeIds", dict(base, gpuTypeIds=["NVIDIA L40S"]), "gpuTypeIds"),
        ("no name", {k: v for k, v in base.items() if k != "name"}, "name"),
        ("no image", {k: v for k, v in base.items() if k != "image"}, "image"),
        ("cloud ALL", dict(base, cloud="ALL"), "cloud"),
        ("ports as a string", dict(base, ports="22/tcp"), "ports"),
        ("gpu.count 0", dict(base, gpu={"id": "NVIDIA L40S", "count": 0}), "gpu.count"),
        ("persistent mount below 10 GB", dict(base, mounts={"persistent": {"size": 5, "path": "/w"}}), "size"),
    ]
    for what, body, word in shape:
        s, b, h = rp("POST", "/pods", body)
        check(f"create, {what}: 422 problem naming it in errors",
              s == 422 and is_problem(422, b, h) and any(word in e for e in b.get("errors", [])), b)
    rules = [
        ("gpu and cpu", dict(base, cpu={"id": "cpu5c", "vcpuCount": 4})),
        ("neither gpu nor cpu", {k: v for k, v in base.items() if k != "gpu"}),
        ("allowedCudaVersions and minCudaVersion",
         dict(base, gpu={"id": "NVIDIA L40S", "allowedCudaVersions": ["12.8"], "minCudaVersion": "12.1"})),
    ]
    for what, body in rules:
        s, b, h = rp("POST", "/pods", body)
        check(f"create, {what}: 400 problem", s == 400 and is_problem(400, b, h), b)
    check("each shape and rule break a violation", violations() == len(shape) + len(rules))
    call(url + "/_fake/violations", "DELETE")

    # capacity
    no_more = {"title": "Bad Request", "status": 400,
               "detail": "There are no longer any instances available with the requested specifications. "
                         "Please refresh and try again."}
    s, b, _ = rp("POST", "/pods", dict(base, dataCenterIds=["EU-SE-1"]))
    check("no capacity there: 400 'There are no longer any instances available...'", s == 400 and b == no_more, b)
    s, b, _ = rp("POST", "/pods", dict(base, gpu={"id": "NVIDIA A100 80GB PCIe", "allowedCudaVersions": ["11.8"]}))
    check("allowedCudaVersions no host has: the capacity error", s == 400 and b == no_more, b)
    call(url + "/_fake/create-failure", "POST", {"api": "v2"})
    s, b, _ = rp("POST", "/pods", base)
    check("/_fake/create-failure {api: v2}: the next v2 create gets the capacity error", s == 400 and b == no_more, b)
    check("capacity answers are no violations", violations() == 0)

    # create, reach, list
    s, pod, _ = rp("POST", "/pods", base)
    check("create: 201, PROVISIONING, actions stop/terminate, no ssh.direct, runtime null, startedAt null",
          s == 201 and pod["status"] == "PROVISIONING" and pod["actions"] == ["stop", "terminate"]
          and pod["ssh"]["direct"] is None and pod["runtime"] is None and pod["startedAt"] is None
          and pod["cost"] == 1.39 and pod["dataCenterId"] == "US-KS-2" and pod["disk"] == 40
          and pod["mounts"] == {"persistent": {"size": 20, "path": "/workspace"}}
          and pod["gpu"] == {"id": "NVIDIA A100 80GB PCIe", "count": 1}, pod)
    pid = pod["id"]
    got = wait_for(lambda: (lambda r: r[1] if r[1].get("status") == "RUNNING" else None)(rp("GET", f"/pods/{pid}")), 5)
    direct = (got or {}).get("ssh", {}).get("direct") or {}
    check("get once up: RUNNING, ssh.direct {host, port, username root}, runtime.ports 22/tcp, startedAt",
          got and direct.get("username") == "root" and direct.get("port") and got["startedAt"]
          and got["actions"] == ["stop", "restart", "terminate"]
          and got["runtime"]["ports"] == [{"private": 22, "public": direct["port"], "type": "tcp",
                                           "ip": direct["host"]}], got)
    s, b1, _ = rp("GET", f"/pods/{pid}", base=v1)
    check("the v2 pod through v1: same publicIp and portMappings['22']",
          s == 200 and b1["desiredStatus"] == "RUNNING" and b1["publicIp"] == direct.get("host")
          and b1["portMappings"].get("22") == direct.get("port") and b1["gpu"]["id"]
          == "NVIDIA A100 80GB PCIe" and b1["interruptible"] is False, b1)
    if sshd is not None:
        r = sshd.ssh(direct["host"], direct["port"], "echo v2-reached")
        check("ssh root@ssh.direct.host -p ssh.direct.port reaches the pod",
              r.returncode == 0 and r.stdout.strip() == "v2-reached", r.stderr)
    s, b, _ = rp("GET", "/pods")
    check("list: {pods: [...]}", s == 200 and [p["id"] for p in b["pods"]] == [pid], b)
    s, b, _ = rp("GET", "/pods?includeClusterPods=false")
    check("list ?includeClusterPods=false", s == 200 and len(b["pods"]) == 1, b)
    s, b, _ = rp("GET", "/pods?name=gangway-v2-0")
    check("list ?name= (v2 has no name filter): 422 and a violation", s == 422 and violations() == 1, b)
    call(url + "/_fake/violations", "DELETE")

    # actions
    s, b, _ = rp("POST", f"/pods/{pid}/action", {"action": "restart"})
    check("action restart: 200, RUNNING", s == 200 and b["status"] == "RUNNING", b)
    s, b, _ = rp("POST", f"/pods/{pid}/action", {"action": "stop"})
    check("action stop: 200, EXITED, cost 0, no ssh.direct, runtime null, actions start/terminate",
          s == 200 and b["status"] == "EXITED" and b["cost"] == 0.0 and b["ssh"]["direct"] is None
          and b["runtime"] is None and b["actions"] == ["start", "terminate"], b)
    s, b, _ = rp("GET", f"/pods/{pid}", base=v1)
    check("stopped through v2, v1 shows EXITED", s == 200 and b["desiredStatus"] == "EXITED" and b["publicIp"] is None, b)
    s, b, h = rp("POST", f"/pods/{pid}/action", {"action": "stop"})
    check("action stop on EXITED: 409 problem", s == 409 and is_problem(409, b, h), b)
    s, b, _ = rp("POST", f"/pods/{pid}/action", {"action": "start"})
    check("action start: 200, back to PROVISIONING", s == 200 and b["status"] in ("PROVISIONING", "STARTING"), b)
    got = wait_for(lambda: (lambda r: r[1] if r[1].get("status") == "RUNNING" else None)(rp("GET", f"/pods/{pid}")), 5)
    check("started pod RUNNING again with an ssh.direct", got and got["ssh"]["direct"], got)
    s, b, _ = rp("POST", f"/pods/{pid}/action", {"action": "reset"})
    check("action reset (v1 only): 422 and a violation", s == 422 and violations() == 1, b)
    s, b, _ = rp("POST", f"/pods/{pid}/action")
    check("action without a body: 422", s == 422, b)
    call(url + "/_fake/violations", "DELETE")
    s, b, _ = rp("POST", f"/pods/{pid}/action", {"action": "terminate"})
    check("action terminate: 204", s == 204 and b is None, b)
    s, b, h = rp("GET", f"/pods/{pid}")
    check("then get: 404 problem", s == 404 and is_problem(404, b, h), b)
    s, b, _ = rp("GET", f"/pods/{pid}", base=v1)
    check("and v1 get: 404", s == 404, b)
    s, b, h = rp("POST", f"/pods/{pid}/action", {"action": "start"})
    check("action on an unknown pod: 404 problem", s == 404 and is_problem(404, b, h), b)
    s, b, h = rp("DELETE", f"/pods/{pid}")
    check("DELETE an unknown pod: 404 problem", s == 404 and is_problem(404, b, h), b)

    # v1 spot pod through v2, preemption, DELETE
    s, spot, _ = rp("POST", "/pods", {"name": "gangway-spot-v1", "imageName": "runpod/base:0.6.2-cuda12.2.0",
                                      "gpuTypeIds": ["NVIDIA GeForce RTX 4090"], "cloudType": "COMMUNITY",
                                      "interruptible": True, "ports": ["22/tcp"], "env": {"PUBLIC_KEY": pub}},
                    base=v1)
    sid = spot.get("id")
    got = wait_for(lambda: (lambda r: r[1] if r[1].get("status") == "RUNNING" else None)(rp("GET", f"/pods/{sid}")), 5)
    check("a v1 interruptible pod through v2: RUNNING, COMMUNITY, cost 0.2, ssh.direct",
          got and got["cloud"] == "COMMUNITY" and got["cost"] == 0.2 and got["ssh"]["direct"]
          and got["mounts"] == {"persistent": {"size": 20, "path": "/workspace"}}, got)
    s, b, _ = rp("GET", "/pods")
    check("v2 list shows the v1 pod", s == 200 and [p["id"] for p in b["pods"]] == [sid], b)
    call(url + "/_fake/preempt", "POST", {"id": sid})
    s, b, _ = rp("GET", f"/pods/{sid}")
    check("preempted: v2 shows EXITED, cost 0, no ssh.direct, runtime null",
          s == 200 and b["status"] == "EXITED" and b["cost"] == 0.0 and b["ssh"]["direct"] is None
          and b["runtime"] is None, b)
    s, b, _ = rp("POST", f"/pods/{sid}/action", {"action": "start"})
    check("v2 start of the preempted v1 pod: 200", s == 200 and b["status"] in ("PROVISIONING", "STARTING"), b)
    got = wait_for(lambda: (lambda r: r[1] if r[1].get("publicIp") else None)(rp("GET", f"/pods/{sid}", base=v1)), 5)
    check("v1 sees it RUNNING with a publicIp again", got and got["desiredStatus"] == "RUNNING", got)
    s, b, _ = rp("DELETE", f"/pods/{sid}")
    check("v2 DELETE of the v1 pod: 204", s == 204, b)
    s, b, _ = rp("GET", f"/pods/{sid}", base=v1)
    check("gone through v1 too", s == 404, b)

    # account keys and startSsh
    s, b, _ = rp("PUT", "/account/ssh-keys", {"keys": [pub]})
    check("PUT account/ssh-keys: the set", s == 200 and b == {"keys": [pub]}, b)
    s, b, _ = rp("PUT", "/account/ssh-keys", {"keys": ["not a key"]})
    check("PUT a malformed key: 422", s == 422 and violations() == 1, b)
    call(url + "/_fake/violations", "DELETE")
    if sshd is not None:
        open(sshd.authorized_keys, "w").close()     # so only the injected PUBLIC_KEY can let ssh in
    nokey = dict(base, name="gangway-v2-ssh", env={}, startSsh=True, ports=["22/tcp"])
    s, pod, _ = rp("POST", "/pods", nokey)
    check("startSsh without env.PUBLIC_KEY: the account's keys as PUBLIC_KEY", s == 201
          and pod["env"].get("PUBLIC_KEY") == pub, pod)
    if sshd is not None:
        got = wait_for(lambda: (lambda r: r[1] if r[1].get("status") == "RUNNING" else None)(
            rp("GET", f"/pods/{pod['id']}")), 5)
        r = sshd.ssh(got["ssh"]["direct"]["host"], got["ssh"]["direct"]["port"], "echo keyed")
        check("and ssh reaches it with that key", r.returncode == 0 and r.stdout.strip() == "keyed", r.stderr)
    rp("DELETE", f"/pods/{pod['id']}")
    s, b, _ = rp("GET", "/account/ssh-keys")
    check("GET account/ssh-keys", s == 200 and b == {"keys": [pub]}, b)
    rp("PUT", "/account/ssh-keys", {"keys": []})

    # paths and methods
    s, b, h = rp("PUT", "/pods")
    check("PUT /v2/pods: 405 problem with Allow", s == 405 and is_problem(405, b, h) and h.get("Allow") == "POST, GET", b)
    s, b, h = rp("GET", "/pods/x/logs")
    check("unserved path: 404 problem", s == 404 and is_problem(404, b, h), b)
    check("both violations", violations() == 2)
    call(url + "/_fake/violations", "DELETE")

    # the rate limiter v1 and v2 share
    call(url + "/_fake/rate-limit", "POST", {"scale": 30})     # 2 requests per 30 s
    call(url + "/_fake/rps", "POST", {"rps": 2})
    codes = [rp("GET", "/pods", base=v1)[0], rp("GET", "/pods", base=v1)[0]]
    s, b, h = rp("GET", "/pods")
    check("--rps: two v1 calls use the window, the v2 call gets 429 problem with Retry-After",
          codes == [200, 200] and s == 429 and is_problem(429, b, h) and h.get("Retry-After") == "30", (codes, b))
    s, b, _ = rp("GET", "/pods", base=v1)
    check("and v1 its 429", s == 429 and b == {"error": "rate limit exceeded", "status": 429}, b)
    call(url + "/_fake/rps", "POST", {"rps": 0})
    call(url + "/_fake/rate-limit", "POST", {"scale": 1})

    s, v, _ = call(url + "/_fake/violations")
    check("v2: no violations left", v["count"] == 0, v)
    leak = subprocess.run([sys.executable, os.path.join(HERE, "..", "gpucloud", "leak_check.py"),
                           "--endpoint", url, "--keys"], capture_output=True, text=True)
    check("leak_check.py --keys: nothing left (exit 0)", leak.returncode == 0, leak.stdout)


RENT = ("mutation RentInterruptable($input: PodRentInterruptableInput!) "
        "{ podRentInterruptable(input: $input) { id desiredStatus imageName env machine { podHostId } } }")


def spot_checks(url, sshd, pub):
    """GraphQL podRentInterruptable: spot pods that v2 then shows."""
    def gql(variables, query=RENT):
        return call(url + "/graphql", "POST", {"query": query, "variables": variables}, AUTH)

    def v2(method, path):
        return call(url + "/v2" + path, method, None, AUTH)

    def violations():
        return call(url + "/_fake/violations")[1]["count"]

    call(url + "/_fake/violations", "DELETE")
    if sshd is not None:
        call(url + "/_fake/machines", "POST", {"slots": [["127.0.0.1", sshd.port]], "authorized_keys": ""})
    base = {"bidPerGpu": 0.7, "cloudType": "SECURE", "gpuCount": 1, "gpuTypeId": "NVIDIA A100 80GB PCIe",
            "dataCenterId": "US-KS-2", "name": "gangway-spot-0", "imageName": "runpod/pytorch",
            "volumeInGb": 0, "ports": "22/tcp,8000/tcp", "supportPublicIp": True,
            "env": [{"key": "PUBLIC_KEY", "value": pub}, {"key": "GANGWAY_TAG_CLUSTER", "value": "sp"}]}

    # the input type, field by field: each refused with HTTP 400 and a violation
    for name, inp, words in [
        ("an unknown field", dict(base, interruptible=True),
         'Field "interruptible" is not defined by type "PodRentInterruptableInput"'),
        ("bidPerGpu missing", {k: v for k, v in base.items() if k != "bidPerGpu"},
         'Field "bidPerGpu" of required type "Float!" was not provided'),
        ("bidPerGpu a string", dict(base, bidPerGpu="0.7"), 'at "input.bidPerGpu"'),
        ("gpuCount a float", dict(base, gpuCount=1.5), 'at "input.gpuCount"'),
        ("cloudType not in CloudTypeEnum", dict(base, cloudType="SPOT"), 'at "input.cloudType"'),
        ("env as an object (REST's shape)", dict(base, env={"A": "b"}), 'at "input.env'),
        ("env item without value", dict(base, env=[{"key": "A"}]),
         'Field "value" of required type "String!" was not provided'),
        ("ports as a list (REST's shape)", dict(base, ports=["22/tcp"]), 'at "input.ports'),
    ]:
        s, b, _ = gql({"input": inp})
        msg = " ".join(e["message"] for e in b.get("errors", [])) if isinstance(b, dict) else ""
        check(f"podRentInterruptable, {name}: 400 and a violation", s == 400 and words in msg
              and "data" not in b and violations() == 1, b)
        call(url + "/_fake/violations", "DELETE")
    s, b, _ = gql({"input": base}, RENT.replace("desiredStatus", "bogus"))
    check("an unknown Pod field: 400", s == 400 and 'Cannot query field "bogus" on type "Pod"' in
          b["errors"][0]["message"] and violations() == 1, b)
    call(url + "/_fake/violations", "DELETE")

    # refusals: HTTP 200, errors[], a null pod, no violation
    s, b, _ = gql({"input": dict(base, bidPerGpu=0.5)})
    check("a bid under the spot price ($0.70): 200, errors, null pod",
          s == 200 and b["data"]["podRentInterruptable"] is None
          and "below the current minimum bid" in b["errors"][0]["message"], b)
    s, b, _ = gql({"input": dict(base, gpuTypeId="NVIDIA H100 80GB HBM3", bidPerGpu=2.0)})
    check("no spot H100 free in US-KS-2: RunPod's capacity words",
          s == 200 and b["data"]["podRentInterruptable"] is None
          and "no longer any instances available" in b["errors"][0]["message"], b)
    call(url + "/_fake/create-failure", "POST", {"api": "graphql"})
    s, b, _ = gql({"input": base})
    check("/_fake/create-failure api graphql: the capacity words once",
          s == 200 and "no longer any instances" in b["errors"][0]["message"], b)
    call(url + "/_fake/create-failure", "POST", {"api": "graphql", "status": 429, "message": "slow down"})
    s, b, _ = gql({"input": base})
    check("... or the status asked for", s == 429 and b["errors"][0]["message"] == "slow down", b)
    check("refusals are no violations", violations() == 0)

    # a spot pod, seen through v2
    s, b, _ = gql({"input": base})
    pod = (b.get("data") or {}).get("podRentInterruptable") or {}
    check("a spot pod: id, desiredStatus RUNNING, env as K=V strings, machine.podHostId",
          s == 200 and pod.get("desiredStatus") == "RUNNING" and "GANGWAY_TAG_CLUSTER=sp" in pod.get("env", [])
          and pod["machine"]["podHostId"].startswith(pod["id"]), b)
    sid = pod.get("id")
    state = call(url + "/_fake/state")[1]
    rec = next((p for p in state["pods"] if p["id"] == sid), {})
    check("the fake holds it interruptible at the bid", rec.get("interruptible") is True and rec.get("_bid") == 0.7
          and rec.get("costPerHr") == 0.7, rec)
    got = wait_for(lambda: (lambda r: r[1] if r[1].get("status") == "RUNNING" else None)(v2("GET", f"/pods/{sid}")), 5)
    check("v2 shows it RUNNING in US-KS-2 with the env and ports asked",
          got and got["dataCenterId"] == "US-KS-2" and got["env"]["GANGWAY_TAG_CLUSTER"] == "sp"
          and got["ports"] == ["22/tcp", "8000/tcp"] and got["cloud"] == "SECURE", got)
    if sshd is not None and got:
        r = sshd.ssh(got["ssh"]["direct"]["host"], got["ssh"]["direct"]["port"], "echo spot-reached")
        check("ssh through ssh.direct with the PUBLIC_KEY given", r.returncode == 0
              and r.stdout.strip() == "spot-reached", r.stderr)
    s, b, _ = call(url + "/_fake/preempt", "POST", {"id": sid})
    check("/_fake/preempt interrupts it", s == 200 and "spot pod interrupted" in b["lastStatusChange"], b)
    s, b, _ = v2("GET", f"/pods/{sid}")
    check("v2 shows the interrupted spot pod EXITED, cost 0, no ssh.direct, runtime null",
          s == 200 and b["status"] == "EXITED" and b["cost"] == 0.0 and b["ssh"]["direct"] is None
          and b["runtime"] is None, b)
    s, b, _ = v2("DELETE", f"/pods/{sid}")
    check("and v2 deletes it: 204", s == 204, b)
    check("spot: no violations", violations() == 0)
    leak = subprocess.run([sys.executable, os.path.join(HERE, "..", "gpucloud", "leak_check.py"),
                           "--endpoint", url], capture_output=True, text=True)
    check("spot: leak_check.py finds nothing (exit 0)", leak.returncode == 0, leak.stdout)


if __name__ == "__main__":
    sys.exit(main())
