#!/usr/bin/env python3
"""Fake RunPod API (REST v1 and v2 pods, v2 catalog, GraphQL gpuTypes and
podRentInterruptable spot pods) for
gangway's RunPod provider tests.

REST at RunPod's paths (`/v1/pods`, as under https://rest.runpod.io): create
(gpuTypeIds, gpuCount, cloudType SECURE/COMMUNITY, interruptible,
dataCenterIds, imageName, ports "22/tcp", env with PUBLIC_KEY, ...), list,
get (publicIp, portMappings {"22": PORT}), stop, delete, with `Authorization:
Bearer KEY`. GraphQL at `/graphql` (as https://api.runpod.io/graphql,
`?api_key=` or Bearer) answers `gpuTypes` with secure/community/spot prices
and `lowestPrice`, and rents spot pods (`podRentInterruptable`, its input
checked field by field, a bid under the spot price refused). Capacity per (GPU type, data center, cloud type): RunPod's
"There are no instances currently available" when none fits; spot
preemption; pods reachable through a real sshd. Requests are checked
against runpod-api-subset.json (from RunPod's REST v1 OpenAPI document, see
API-NOTES.md); violations are logged for `GET /_fake/violations`.

REST v2 at `/v2/...` (as under https://api.runpod.io) on the same port and
the same state: pods (create with gpu {id, count}, cloud, dataCenterIds,
image, ports, env, disk, mounts; list, get with status/actions/ssh.direct/
runtime.ports, `POST /v2/pods/{id}/action` start/stop/restart/terminate,
DELETE), `/v2/catalog/gpus[/{id}]` (prices, include=AVAILABILITY&product=POD
stock per data center), `/v2/catalog/datacenters[/{id}]`
(include=GPU_AVAILABILITY) and `/v2/account/ssh-keys`. Errors are RFC 9457
problem objects {title, status, detail[, errors]}; requests are checked
against runpod-api-v2-subset.json (from the v2 OpenAPI document).

    python server.py --host 127.0.0.1 --port 0 [--watch-stdin] [--verbose]
                     [--api-key KEY] [--rate-scale S] [--boot-seconds S]
"""

import json
import math
import os
import re
import secrets
import string
import sys
import time
import urllib.parse
from datetime import datetime, timezone
from http import HTTPStatus

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpucloud"))
sys.dont_write_bytecode = True

from fakecore import Fake, Reply, check_query, check_value, load_schemas, serve  # noqa: E402

SCHEMAS = load_schemas(os.path.join(HERE, "runpod-api-subset.json"))
OPS = SCHEMAS["operations"]
GQL = SCHEMAS["graphql"]
V2 = load_schemas(os.path.join(HERE, "runpod-api-v2-subset.json"))
V2OPS = V2["operations"]
V2DEFS = V2["defs"]
DATA_CENTERS = OPS["CreatePod"]["body"]["properties"]["dataCenterIds"]["items"]["enum"]

# id: (displayName, memoryInGb, securePrice, communityPrice, secureSpotPrice,
#      communitySpotPrice) in $/GPU-hour; None: not sold in that cloud.
# A100 80GB PCIe's 1.39 as in the published SkyPilot-format RunPod catalog;
# the rest are round figures of the same order, made up for tests.
GPU_TYPES = {
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 24, 0.69, 0.34, 0.35, 0.20),
    "NVIDIA GeForce RTX 5090": ("RTX 5090", 32, 0.94, 0.69, 0.50, 0.35),
    "NVIDIA RTX A6000": ("RTX A6000", 48, 0.49, 0.33, 0.25, 0.17),
    "NVIDIA RTX 6000 Ada Generation": ("RTX 6000 Ada", 48, 0.77, 0.74, 0.40, 0.37),
    "NVIDIA L40S": ("L40S", 48, 0.86, 0.79, 0.43, 0.40),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe", 80, 1.39, 1.19, 0.70, 0.60),
    "NVIDIA A100-SXM4-80GB": ("A100 SXM", 80, 1.49, None, 0.75, None),
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 80, 2.69, None, 1.35, None),
}

# (gpu type id, data center, cloud type) -> GPUs free at start.
DEFAULT_CAPACITY = {
    ("NVIDIA GeForce RTX 4090", "EU-RO-1", "SECURE"): 8,
    ("NVIDIA GeForce RTX 4090", "US-TX-3", "COMMUNITY"): 8,
    ("NVIDIA GeForce RTX 5090", "US-IL-1", "SECURE"): 8,
    ("NVIDIA RTX A6000", "CA-MTL-1", "SECURE"): 4,
    ("NVIDIA RTX 6000 Ada Generation", "EU-SE-1", "SECURE"): 4,
    ("NVIDIA L40S", "US-KS-2", "SECURE"): 4,
    ("NVIDIA A100 80GB PCIe", "US-KS-2", "SECURE"): 8,
    ("NVIDIA A100 80GB PCIe", "EU-RO-1", "COMMUNITY"): 4,
    ("NVIDIA A100-SXM4-80GB", "US-GA-2", "SECURE"): 8,
    ("NVIDIA H100 80GB HBM3", "US-GA-2", "SECURE"): 8,
}

NO_INSTANCES = "create pod: There are no instances currently available"
# REST v2 (and GraphQL podFindAndDeployOnDemand) capacity text, from public
# records of live calls; the v2 document only says "400 ... only a
# human-readable detail" (API-NOTES.md).
V2_NO_INSTANCES = ("There are no longer any instances available with the requested specifications. "
                   "Please refresh and try again.")

# The CUDA version every fake host reports (made up; v2 shows it as the
# pod's cudaVersion and matches gpu.allowedCudaVersions/minCudaVersion
# against it).
HOST_CUDA = "12.8"

# v2 catalog facts about the 26 data center ids of the v1 document: name,
# ISO country, globalNetwork, networkVolumeTypes, compliance. Names follow
# the document's examples ("US-KS-2": "US Kansas 2", "US-CA-2": "US
# California 2", "US-TX-3": "US Texas 3"); US-KS-2's globalNetwork,
# volume types and compliance are the document's example; everything else
# is made up for tests.
_PLACES = {"RO": "Romania", "MTL": "Montreal", "SE": "Sweden", "IL": "Illinois", "IS": "Iceland",
           "CZ": "Czechia", "TX": "Texas", "KS": "Kansas", "GA": "Georgia", "WA": "Washington",
           "NL": "Netherlands", "CA": "California", "NC": "North Carolina", "AU": "Australia",
           "DE": "Delaware", "JP": "Japan", "NO": "Norway", "FR": "France"}
_GLOBAL_NETWORK = {"US-KS-2", "EU-RO-1", "US-GA-2", "EU-SE-1", "US-TX-3"}


def _dc_info(dc):
    prefix, place, n = dc.split("-")
    country = {"US": "US", "CA": "CA", "OC": "AU", "AP": "JP"}.get(prefix, place)
    region = {"US": "NORTH_AMERICA", "CA": "NORTH_AMERICA", "OC": "OCEANIA", "AP": "ASIA"}.get(prefix, "EUROPE")
    volumes = ["STANDARD", "HIGH_PERFORMANCE"] if dc in ("US-KS-2", "EU-RO-1") else ["STANDARD"]
    compliance = (["SOC_2_TYPE_2", "ISO_IEC_27001"] if dc == "US-KS-2"
                  else ["GDPR"] if region == "EUROPE" else [])
    return {"name": f"{prefix} {_PLACES[place]} {n}", "country": country, "region": region,
            "globalNetwork": dc in _GLOBAL_NETWORK, "networkVolumeTypes": volumes, "compliance": compliance}


# v2 PodAction: which actions each status allows (podAction's description).
V2_ACTIONS = {"RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"],
              "ERROR": ["start", "terminate"], "PROVISIONING": ["stop", "terminate"],
              "STARTING": ["stop", "terminate"]}


def err(status, message):
    return Reply(status, {"error": message, "status": status})


def problem(status, detail, errors=None, headers=None):
    """A REST v2 error: RFC 9457 problem+json {title, status, detail[, errors]}."""
    title = {422: "Unprocessable Entity"}.get(status) or HTTPStatus(status).phrase   # 3.13 renamed 422's
    body = {"title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = list(errors)
    return Reply(status, body, ctype="application/problem+json", headers=headers)


def iso_now():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cuda_key(version):
    return tuple(int(x) for x in version.split("."))


def pod_id():
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(14))


def stamp():
    return datetime.now(timezone.utc).strftime("%a %b %d %Y %H:%M:%S GMT+0000 (Coordinated Universal Time)")


class RunPodFake(Fake):
    cloud = "runpod"
    synthetic_ssh_port = 0      # mapped ports, 20001, 20002, ...
    routes = [
        ("POST", r"/v1/pods", "CreatePod", "create"),
        ("GET", r"/v1/pods", "ListPods", "list_pods"),
        ("GET", r"/v1/pods/(?P<podId>[^/]+)", "GetPod", "get_pod"),
        ("POST", r"/v1/pods/(?P<podId>[^/]+)/stop", "StopPod", "stop_pod"),
        ("DELETE", r"/v1/pods/(?P<podId>[^/]+)", "DeletePod", "delete_pod"),
        ("POST", r"/graphql", "graphql", "graphql"),
        # REST v2 (operation names: the v2 document's operationIds)
        ("POST", r"/v2/pods", "createPod", "v2_create"),
        ("GET", r"/v2/pods", "listPods", "v2_list"),
        ("GET", r"/v2/pods/(?P<id>[^/]+)", "getPod", "v2_get"),
        ("DELETE", r"/v2/pods/(?P<id>[^/]+)", "deletePod", "v2_delete"),
        ("POST", r"/v2/pods/(?P<id>[^/]+)/action", "podAction", "v2_action"),
        ("GET", r"/v2/account/ssh-keys", "getSshKeys", "v2_ssh_keys"),
        ("PUT", r"/v2/account/ssh-keys", "updateSshKeys", "v2_ssh_keys"),
        ("GET", r"/v2/catalog/gpus", "listGpuTypes", "v2_gpus"),
        ("GET", r"/v2/catalog/gpus/(?P<id>[^/]+)", "getGpuType", "v2_gpus"),
        ("GET", r"/v2/catalog/datacenters", "listDataCenters", "v2_dcs"),
        ("GET", r"/v2/catalog/datacenters/(?P<id>[^/]+)", "getDataCenter", "v2_dcs"),
    ]

    def reset_state(self):
        self.pods = {}
        self.capacity = dict(DEFAULT_CAPACITY)
        self.create_failures = []
        self.account_keys = []          # v2 /v2/account/ssh-keys

    def handle(self, req):
        if req.path.startswith("/_fake/"):
            return super().handle(req)
        with self.lock:
            return self._handle_api(req)

    def _handle_api(self, req):
        v2 = req.path.startswith("/v2/")
        if req.path == "/graphql":
            key = self.bearer_key(req) or (req.query.get("api_key") or [None])[0]
            req.query = {k: v for k, v in req.query.items() if k != "api_key"}
        else:
            key = self.bearer_key(req)
        if key is None or key not in self.api_keys:
            self.violation(req, "auth", ["Authorization: missing or malformed" if key is None
                                         else "Authorization: unknown API key"])
            if req.path == "/graphql":
                return Reply(401, {"errors": [{"message": "Unauthorized"}]})
            if v2:
                return problem(401, "missing bearer token" if key is None else "invalid bearer token")
            return err(401, "Unauthorized")
        # RunPod publishes no REST rate limit for pods: none unless --rps N
        # (N requests a second per key, window times --rate-scale; v1, v2
        # and GraphQL share one window per key).
        if self.args.runpod_rps and not self.limiter.hit(key, "all", self.args.runpod_rps, 1.0):
            if v2:
                wait = max(1, math.ceil(self.limiter.scale))
                return problem(429, "rate limit exceeded for the second window", headers={"Retry-After": str(wait)})
            return err(429, "rate limit exceeded")
        return super().handle(req)

    def not_found(self, req, method_not_allowed=False):
        if req.path.startswith("/v2/"):
            if method_not_allowed:
                allow = [m for m, rx, _, _ in self._compiled if rx.match(req.path)]
                return problem(405, "The requested method is not allowed for this path.",
                               headers={"Allow": ", ".join(allow)})
            return problem(404, "resource not found")
        return err(404, "not found")

    # ----- views -----------------------------------------------------------

    def used(self, gpu, dc, cloud):
        return sum(p["gpuCount"] for p in self.pods.values()
                   if p["_gpu"] == gpu and p["_dc"] == dc and p["_cloud"] == cloud
                   and p["desiredStatus"] == "RUNNING")

    def free(self, gpu, dc, cloud):
        return max(0, self.capacity.get((gpu, dc, cloud), 0) - self.used(gpu, dc, cloud))

    def gpu_view(self, gpu, count):
        name, mem, sp, cp, ssp, csp = GPU_TYPES[gpu]
        out = {"id": gpu, "count": count, "displayName": name}
        for k, v in (("securePrice", sp), ("communityPrice", cp), ("secureSpotPrice", ssp),
                     ("communitySpotPrice", csp)):
            if v is not None:
                out[k] = v
        return out

    def pod_view(self, pod, query):
        out = {k: v for k, v in pod.items() if not k.startswith("_")}
        flag = lambda name: (query.get(name) or ["false"])[0] == "true"  # noqa: E731
        if flag("includeMachine"):
            out["machine"] = {"dataCenterId": pod["_dc"], "gpuTypeId": pod["_gpu"],
                              "location": pod["_dc"].split("-")[0], "secureCloud": pod["_cloud"] == "SECURE",
                              "supportPublicIp": True, "gpuDisplayName": GPU_TYPES[pod["_gpu"]][0]}
        return out

    # ----- REST ------------------------------------------------------------

    def query_ok(self, req):
        problems = []
        check_query(OPS[req.op].get("query", {}), req.query, problems)
        if problems:
            self.violation(req, "query", problems)
            return err(400, "; ".join(problems))
        return None

    def create(self, req):
        body, problems = self.checked_body(req, OPS["CreatePod"]["body"], {})
        if not problems:
            if body.get("computeType", "GPU") == "GPU" and not body.get("gpuTypeIds"):
                problems.append("gpuTypeIds: required for a GPU pod (this fake has no default GPU list)")
            if not body.get("imageName") and not body.get("templateId"):
                problems.append("imageName: required when there is no templateId")
            if body.get("templateId"):
                problems.append("templateId: templates are not emulated")
        if problems:
            self.violation(req, "body", problems)
            return err(400, "invalid input: " + "; ".join(problems))
        failure = self._pop_failure("v1")
        if failure:
            return err(failure["status"] or 500, failure["message"] or NO_INSTANCES)
        cloud = body.get("cloudType", "SECURE")
        count = body.get("gpuCount", 1)
        spot = body.get("interruptible", False)
        choice = self._place(body["gpuTypeIds"], count, cloud, body.get("dataCenterIds") or DATA_CENTERS, spot)
        if choice is None:
            return err(500, NO_INSTANCES)
        gpu, dc = choice
        pod = self._new_pod(
            gpu, dc, cloud, count, spot, name=body.get("name", "my pod"), image=body["imageName"],
            env=dict(body.get("env", {})), ports=list(body.get("ports", ["8888/http", "22/tcp"])),
            locked=body.get("locked", False), disk=body.get("containerDiskInGb", 50),
            volume=body.get("volumeInGb", 20), mount_path=body.get("volumeMountPath", "/workspace"),
            vcpus=body.get("vcpuCount", 2 * count))
        return Reply(201, self.pod_view(pod, {}))

    def _pop_failure(self, api):
        """The first queued /_fake/create-failure meant for `api`, if any."""
        for n, failure in enumerate(self.create_failures):
            if failure["api"] in (None, api):
                return self.create_failures.pop(n)
        return None

    def _unit_price(self, gpu, cloud, spot):
        name, mem, sp, cp, ssp, csp = GPU_TYPES[gpu]
        return (ssp if cloud == "SECURE" else csp) if spot else (sp if cloud == "SECURE" else cp)

    def _place(self, gpus, count, cloud, dcs, spot=False):
        """(gpu, dc): the first of `gpus` with `count` GPUs free in the first
        of `dcs` that has them in `cloud` (and an sshd slot free, and a
        price in that cloud); None when nothing fits."""
        free_slots = self.slots.free()
        if free_slots is not None and free_slots <= 0:
            return None
        for gpu in gpus:
            if gpu not in GPU_TYPES or self._unit_price(gpu, cloud, spot) is None:
                continue
            for dc in dcs:
                if self.free(gpu, dc, cloud) >= count:
                    return gpu, dc
        return None

    def _new_pod(self, gpu, dc, cloud, count, spot, name, image, env, ports, locked, disk, volume,
                 mount_path, vcpus, args="", global_networking=False):
        """A pod record: the v1 Pod fields, and `_`-prefixed ones both
        views derive the rest from."""
        pid = pod_id()
        address, port = self.slots.take(pid)
        unit = self._unit_price(gpu, cloud, spot)
        pod = {
            "id": pid, "name": name, "desiredStatus": "RUNNING",
            "image": image, "env": env, "ports": ports,
            "publicIp": None, "portMappings": {},
            "gpu": self.gpu_view(gpu, count), "gpuCount": count,
            "costPerHr": round(unit * count, 4), "adjustedCostPerHr": round(unit * count, 4),
            "interruptible": spot, "locked": locked,
            "containerDiskInGb": disk, "volumeInGb": volume,
            "volumeMountPath": mount_path,
            "vcpuCount": vcpus, "memoryInGb": 31 * count,
            "machineId": secrets.token_hex(6), "consumerUserId": "user_fake",
            "lastStartedAt": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "lastStatusChange": f"Rented by User: {stamp()}",
            "_gpu": gpu, "_dc": dc, "_cloud": cloud, "_address": address, "_ssh_port": port,
            "_created": time.monotonic(), "_booted": False,
            "_created_at": iso_now(), "_started_at": None, "_started": None,
            "_args": args, "_global": global_networking,
        }
        self.pods[pid] = pod
        return pod

    def list_pods(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        q = req.query
        out = []
        for pod in self.pods.values():
            if "id" in q and pod["id"] not in q["id"]:
                continue
            if "name" in q and pod["name"] not in q["name"]:
                continue
            if "desiredStatus" in q and pod["desiredStatus"] not in q["desiredStatus"]:
                continue
            if "gpuTypeId" in q and pod["_gpu"] not in q["gpuTypeId"]:
                continue
            if "dataCenterId" in q and pod["_dc"] not in q["dataCenterId"]:
                continue
            if "imageName" in q and pod["image"] not in q["imageName"]:
                continue
            out.append(self.pod_view(pod, q))
        return Reply(200, out)

    def get_pod(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        pod = self.pods.get(req.params["podId"])
        if pod is None:
            return err(404, "pod not found")
        return Reply(200, self.pod_view(pod, req.query))

    def stop_pod(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        if req.body.strip() not in (b"", b"{}", b"null"):
            self.violation(req, "body", ["body: StopPod takes none"])
        pod = self.pods.get(req.params["podId"])
        if pod is None:
            return err(400, "invalid pod id")
        self._stop(pod, f"Stopped by user: {stamp()}")
        return Reply(200, self.pod_view(pod, {}))

    def delete_pod(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        pod = self.pods.pop(req.params["podId"], None)
        if pod is None:
            return err(400, "invalid pod id")
        self.slots.release(pod["id"])
        return Reply(204)

    def _stop(self, pod, why):
        pod["desiredStatus"] = "EXITED"
        pod["publicIp"] = None
        pod["portMappings"] = {}
        pod["lastStatusChange"] = why
        self.slots.release(pod["id"])

    # ----- REST v2 ---------------------------------------------------------

    def v2_query(self, req, spec=None):
        """None, or the 422 for query parameters `spec` (the operation's by
        default) does not allow; comma-separated arrays ("csv") are split."""
        spec = V2OPS[req.op]["query"] if spec is None else spec
        problems = []
        for name, values in req.query.items():
            schema = spec.get(name)
            if schema is None:
                problems.append(f"query parameter {name}: unknown")
            elif len(values) > 1:
                problems.append(f"query parameter {name}: given {len(values)} times (one value, comma-separated)")
            elif schema.get("csv"):
                sub = {k: v for k, v in schema.items() if k != "csv"}
                items = values[0].split(",") if values[0] != "" else []
                check_value(sub, items, f"query parameter {name}", problems, {})
            else:
                check_query({name: schema}, {name: values}, problems)
        if problems:
            self.violation(req, "query", problems)
            return problem(422, "Request validation failed.", problems)
        return None

    def v2_body(self, req, schema):
        """(body, None) or (None, the problem answer); violations logged."""
        try:
            body = req.json()
        except ValueError:
            self.violation(req, "body", ["body: not JSON"])
            return None, problem(400, "request body is not valid JSON")
        problems = []
        if body is None:
            problems.append("body: missing (a JSON object is required)")
        else:
            check_value(schema, body, "", problems, V2DEFS)
        if not problems and req.op == "createPod" and "templateId" not in body and "image" not in body:
            problems.append("image: required unless templateId is set")
        if problems:
            self.violation(req, "body", problems)
            return None, problem(422, "Request validation failed.", problems)
        return body, None

    def v2_rule(self, req, why, status=400):
        """A request that matches the schema but breaks a documented rule (or
        asks for something the fake does not emulate): a violation too."""
        self.violation(req, "rule", [why])
        return problem(status, why)

    def v2_status(self, pod):
        if pod["desiredStatus"] != "RUNNING":
            return "EXITED"
        if pod["_booted"]:
            return "RUNNING"
        half = self.args.boot_seconds / 2
        return "PROVISIONING" if time.monotonic() - pod["_created"] < half else "STARTING"

    def pod_v2_view(self, pod):
        """The v2 Pod of a pod record (made through v1 or v2)."""
        status = self.v2_status(pod)
        running = status == "RUNNING"
        ip, mapped = pod["publicIp"], pod["portMappings"]
        direct = None
        if running and ip and "22/tcp" in pod["ports"] and "22" in mapped:
            direct = {"host": ip, "port": mapped["22"], "username": "root",
                      "command": f"ssh root@{ip} -p {mapped['22']}"}
        user = f"{pod['id']}-{pod['machineId'][:8]}"
        runtime = None
        if running:
            runtime = {"uptime": int(time.monotonic() - (pod["_started"] or pod["_created"])),
                       "ports": [{"private": int(spec.split("/")[0]), "public": mapped.get(spec.split("/")[0]),
                                  "type": "tcp", "ip": ip}
                                 for spec in pod["ports"] if spec.endswith("/tcp")]}
        mounts = {}
        if pod["volumeInGb"]:
            mounts["persistent"] = {"size": pod["volumeInGb"], "path": pod["volumeMountPath"]}
        net = {"enabled": bool(pod["_global"])}
        if pod["_global"]:
            octets = int(pod["machineId"][:4], 16)
            net.update(ip=f"10.65.{octets >> 8}.{octets & 255}", internalDns=f"{pod['id']}.runpod.internal")
        return {
            "id": pod["id"], "name": pod["name"], "image": pod["image"], "args": pod["_args"],
            "disk": pod["containerDiskInGb"], "ports": list(pod["ports"]), "env": dict(pod["env"]),
            "registry": None, "status": status, "actions": list(V2_ACTIONS[status]), "mounts": mounts,
            "gpu": {"id": pod["_gpu"], "count": pod["gpuCount"]}, "cloud": pod["_cloud"],
            "dataCenterId": pod["_dc"], "cudaVersion": HOST_CUDA,
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": user,
                              "command": f"ssh {user}@ssh.runpod.io"},
                    "direct": direct},
            "template": None, "cost": 0.0 if status == "EXITED" else pod["costPerHr"],
            "locked": pod["locked"], "globalNetworking": net, "runtime": runtime,
            "createdAt": pod["_created_at"], "startedAt": pod["_started_at"],
        }

    def v2_create(self, req):
        bad = self.v2_query(req, {})
        if bad:
            return bad
        body, bad = self.v2_body(req, V2OPS["createPod"]["body"])
        if bad:
            return bad
        gpu = body.get("gpu")
        if (gpu is None) == ("cpu" not in body):
            return self.v2_rule(req, "exactly one of gpu or cpu must be set")
        mounts = body.get("mounts", {})
        if "persistent" in mounts and "network" in mounts:
            return self.v2_rule(req, "mounts: persistent and network are mutually exclusive")
        if gpu and gpu.get("allowedCudaVersions") and "minCudaVersion" in gpu:
            return self.v2_rule(req, "gpu: allowedCudaVersions and minCudaVersion are mutually exclusive")
        if "cpu" in body:
            return self.v2_rule(req, "cpu: CPU pods are not emulated by this fake")
        if "templateId" in body:
            return self.v2_rule(req, f"template {body['templateId']} not found (templates are not emulated)", 404)
        if mounts.get("network"):
            return self.v2_rule(req, "network volume not found (network volumes are not emulated)", 404)
        failure = self._pop_failure("v2")
        if failure:
            return problem(failure["status"] or 400, failure["message"] or V2_NO_INSTANCES)
        gid, count = gpu["id"], gpu.get("count", 1)
        if gid not in GPU_TYPES:
            return problem(400, f"gpu.id: unknown GPU type {gid!r}")
        dcs = body.get("dataCenterIds") or DATA_CENTERS
        unknown = [d for d in dcs if d not in DATA_CENTERS]
        if unknown:
            return problem(400, f"dataCenterIds: unknown data center {unknown[0]!r}")
        if body.get("globalNetworking"):
            dcs = [d for d in dcs if _dc_info(d)["globalNetwork"]]
        allowed = gpu.get("allowedCudaVersions") or [HOST_CUDA]
        floor = gpu.get("minCudaVersion", "0.0")
        cloud = body.get("cloud", "SECURE")
        choice = None
        if HOST_CUDA in allowed and cuda_key(HOST_CUDA) >= cuda_key(floor):
            choice = self._place([gid], count, cloud, dcs)
        if choice is None:
            return problem(400, V2_NO_INSTANCES)
        env = dict(body.get("env", {}))
        for flag, var, value in (("startSsh", "PUBLIC_KEY", "\n".join(self.account_keys)),
                                 ("startJupyter", "JUPYTER_PASSWORD", secrets.token_urlsafe(12))):
            if body.get(flag) and var not in env and value:
                env[var] = value
        persistent = mounts.get("persistent") or {}
        pod = self._new_pod(
            gid, choice[1], cloud, count, False, name=body["name"], image=body["image"], env=env,
            ports=list(body.get("ports", [])), locked=False, disk=body.get("disk", 50),
            volume=persistent.get("size", 0), mount_path=persistent.get("path", "/workspace"),
            vcpus=2 * count, args=body.get("args", ""), global_networking=body.get("globalNetworking", False))
        return Reply(201, self.pod_v2_view(pod))

    def v2_list(self, req):
        bad = self.v2_query(req)
        if bad:
            return bad
        return Reply(200, {"pods": [self.pod_v2_view(p) for p in self.pods.values()]})

    def v2_pod(self, req):
        return self.pods.get(urllib.parse.unquote(req.params["id"]))

    def v2_get(self, req):
        bad = self.v2_query(req)
        if bad:
            return bad
        pod = self.v2_pod(req)
        if pod is None:
            return problem(404, "The requested Pod does not exist.")
        return Reply(200, self.pod_v2_view(pod))

    def v2_delete(self, req):
        bad = self.v2_query(req)
        if bad:
            return bad
        if req.body.strip():
            self.violation(req, "body", ["body: deletePod takes none"])
        pod = self.v2_pod(req)
        if pod is None:
            return problem(404, "The requested Pod does not exist.")
        self.slots.release(pod["id"])
        del self.pods[pod["id"]]
        return Reply(204)

    def v2_action(self, req):
        bad = self.v2_query(req)
        if bad:
            return bad
        body, bad = self.v2_body(req, V2OPS["podAction"]["body"])
        if bad:
            return bad
        pod = self.v2_pod(req)
        if pod is None:
            return problem(404, "The requested Pod does not exist.")
        action, status = body["action"], self.v2_status(pod)
        if action not in V2_ACTIONS[status]:
            return problem(409, f"action {action!r} is not valid for a pod in status {status} "
                                f"(valid: {', '.join(V2_ACTIONS[status])})")
        if action == "terminate":
            self.slots.release(pod["id"])
            del self.pods[pod["id"]]
            return Reply(204)
        if action == "stop":
            self._stop(pod, f"Stopped by user: {stamp()}")
        elif action == "restart":
            pod["_started"] = time.monotonic()
            pod["_started_at"] = iso_now()
        elif action == "start":
            # back onto its machine: its GPUs must still be free there
            free_slots = self.slots.free()
            if (self.free(pod["_gpu"], pod["_dc"], pod["_cloud"]) < pod["gpuCount"]
                    or (free_slots is not None and free_slots <= 0)):
                return problem(400, V2_NO_INSTANCES)
            pod["_address"], pod["_ssh_port"] = self.slots.take(pod["id"])
            pod.update(desiredStatus="RUNNING", _created=time.monotonic(), _booted=False,
                       _started=None, _started_at=None, lastStatusChange=f"Resumed by user: {stamp()}")
        return Reply(200, self.pod_v2_view(pod))

    def v2_ssh_keys(self, req):
        bad = self.v2_query(req)
        if bad:
            return bad
        if req.method == "PUT":
            body, bad = self.v2_body(req, V2OPS["updateSshKeys"]["body"])
            if bad:
                return bad
            self.account_keys = list(body["keys"])
        return Reply(200, {"keys": list(self.account_keys)})

    # v2 catalog

    def level(self, free, count=1):
        """AvailabilityLevel for `free` GPUs (NONE below `count`, or when no
        sshd slot is free); the same thresholds as GraphQL stockStatus."""
        free_slots = self.slots.free()
        if free < count or (free_slots is not None and free_slots <= 0):
            return "NONE"
        return "HIGH" if free >= 8 else "MEDIUM" if free >= 4 else "LOW"

    def v2_gpus(self, req):
        bad = self.v2_query(req, V2OPS["listGpuTypes"]["query"])
        if bad:
            return bad
        q = {k: v[0] for k, v in req.query.items()}
        avail = q.get("include") == "AVAILABILITY"
        if avail and "product" not in q:
            return self.v2_rule(req, "product is required with include=AVAILABILITY")
        only_avail = [k for k in ("product", "count", "cloud", "countryCodes", "cudaVersions", "minCudaVersion")
                      if k in q]
        if not avail and only_avail:
            return self.v2_rule(req, f"{only_avail[0]} is valid only with include=AVAILABILITY")
        if "cudaVersions" in q and "minCudaVersion" in q:
            return self.v2_rule(req, "cudaVersions and minCudaVersion are mutually exclusive")
        one = req.params.get("id")
        if one is not None:
            one = urllib.parse.unquote(one)
            if one not in GPU_TYPES:
                return problem(404, f"GPU type {one!r} not found")
        count = int(q.get("count", 1))
        cloud = q.get("cloud", "SECURE")
        products = q.get("product", "").split(",")
        countries = q["countryCodes"].split(",") if "countryCodes" in q else None
        versions = [HOST_CUDA]
        if "cudaVersions" in q:
            versions = [v for v in versions if v in q["cudaVersions"].split(",")]
        if "minCudaVersion" in q:
            floor = q["minCudaVersion"] if "." in q["minCudaVersion"] else q["minCudaVersion"] + ".0"
            versions = [v for v in versions if cuda_key(v) >= cuda_key(floor)]
        out = []
        for gid in ([one] if one else GPU_TYPES):
            name, mem, sp, cp, ssp, csp = GPU_TYPES[gid]
            row = {"id": gid, "name": name, "pool": None, "manufacturer": "NVIDIA", "memory": mem,
                   "secure": sp is not None, "community": cp is not None,
                   "price": {"secure": sp or 0.0, "community": cp or 0.0},
                   "maxCount": {"secure": 8 if sp is not None else 0, "community": 8 if cp is not None else 0}}
            if avail:
                offered = [d for (g, d, c) in self.capacity if g == gid and c == cloud
                           and (countries is None or _dc_info(d)["country"] in countries)]
                if countries is not None and not offered and one is None:
                    continue        # the list drops a type with no data center in those countries
                dcs = [{"id": d, "name": _dc_info(d)["name"],
                        "availability": self.level(self.free(gid, d, cloud), count)
                        if "POD" in products and versions else "NONE"}
                       for d in DATA_CENTERS if d in offered]
                levels = [x["availability"] for x in dcs]
                best = max(levels, key=["NONE", "LOW", "MEDIUM", "HIGH"].index, default="NONE")
                row["availability"] = best
                if best != "NONE":
                    row["dataCenters"] = dcs
                if offered:
                    row["cudaVersions"] = [{"version": v, "available": best != "NONE"} for v in versions]
            out.append(row)
        return Reply(200, out[0] if one else {"gpus": out})

    def v2_dcs(self, req):
        bad = self.v2_query(req)
        if bad:
            return bad
        q = {k: v[0] for k, v in req.query.items()}
        include = q.get("include", "").split(",")
        one = req.params.get("id")
        if one is not None:
            one = urllib.parse.unquote(one)
            if one not in DATA_CENTERS:
                return problem(404, f"data center {one!r} not found")
        out = []
        for dc in ([one] if one else DATA_CENTERS):
            info = _dc_info(dc)
            if "regions" in q and info["region"] not in q["regions"].split(","):
                continue
            if "networkVolumeTypes" in q and not set(q["networkVolumeTypes"].split(",")) <= set(info["networkVolumeTypes"]):
                continue
            if "compliance" in q and not set(q["compliance"].split(",")) <= set(info["compliance"]):
                continue
            if "globalNetwork" in q and info["globalNetwork"] != (q["globalNetwork"] == "true"):
                continue
            row = {"id": dc, "name": info["name"], "region": info["region"], "globalNetwork": info["globalNetwork"],
                   "networkVolumeTypes": list(info["networkVolumeTypes"]), "compliance": list(info["compliance"])}
            if "GPU_AVAILABILITY" in include:
                gpus = []
                for gid in GPU_TYPES:
                    clouds = [c for (g, d, c) in self.capacity if g == gid and d == dc]
                    if clouds:
                        gpus.append({"id": gid, "name": GPU_TYPES[gid][0],
                                     "availability": self.level(max(self.free(gid, dc, c) for c in clouds))})
                if gpus:
                    row["gpuAvailability"] = gpus
            out.append(row)     # no CPU flavors in the fake: cpuAvailability never appears
        return Reply(200, out[0] if one else {"dataCenters": out})

    # ----- GraphQL ---------------------------------------------------------

    def graphql(self, req):
        try:
            body = req.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            self.violation(req, "body", ["body: a JSON object with a query string"])
            return Reply(400, {"errors": [{"message": "Must provide query string."}]})
        unknown = set(body) - {"query", "variables", "operationName"}
        problems = [f"{k}: unknown field" for k in sorted(unknown)]
        try:
            doc = parse_graphql(body["query"], body.get("variables") or {})
        except ValueError as e:
            self.violation(req, "graphql", [str(e)])
            return Reply(400, {"errors": [{"message": f"Syntax Error: {e}"}]})
        if doc["operation"] not in ("query", "mutation"):
            problems.append(f"{doc['operation']}: only queries (gpuTypes) and mutations "
                            "(podRentInterruptable) are emulated")
        data, errors, refusals = {}, [], []
        for field in doc["selections"]:
            if doc["operation"] == "mutation":
                if field["name"] != "podRentInterruptable":
                    errors.append(f'Cannot query field "{field["name"]}" on type "Mutation".')
                    continue
                data[field["alias"]] = self.gql_rent(field, errors, refusals)
                continue
            if field["name"] != "gpuTypes":
                errors.append(f'Cannot query field "{field["name"]}" on type "Query".')
                continue
            data[field["alias"]] = self.gql_gpu_types(field, errors)
        problems.extend(errors)
        if problems:
            self.violation(req, "graphql", problems)
        if errors:
            # the document's validation (and variable coercion) fails before
            # anything runs: HTTP 400, no data
            return Reply(400, {"errors": [{"message": m, "extensions": {"code": "BAD_USER_INPUT"}}
                                          for m in errors]})
        if refusals:
            status = refusals[0].get("status") or 200
            body = {"errors": [{"message": r["message"], "path": [r["field"]]} for r in refusals]}
            if status == 200:
                body["data"] = data
            return Reply(status, body)
        return Reply(200, {"data": data})

    def gql_input_errors(self, value, type_name, where, errors):
        """Checks `value` against GraphQL input type `type_name` ("Float!",
        "[EnvironmentVariableInput]", an input object or enum of GQL),
        appending graphql-js's words for what is wrong."""
        if type_name.endswith("!"):
            if value is None:
                errors.append(f'Variable "$input" got invalid value null at "{where}"; '
                              f'Expected non-nullable type "{type_name}" not to be null.')
                return
            type_name = type_name[:-1]
        if value is None:
            return
        if type_name.startswith("["):
            inner = type_name[1:-1]
            for n, item in enumerate(value if isinstance(value, list) else [value]):
                self.gql_input_errors(item, inner, f"{where}[{n}]" if isinstance(value, list) else where, errors)
            return
        bad = None
        if type_name == "Float":
            bad = not isinstance(value, (int, float)) or isinstance(value, bool)
        elif type_name == "Int":
            bad = not isinstance(value, int) or isinstance(value, bool) or not -2**31 <= value < 2**31
        elif type_name in ("String", "DateTime"):
            bad = not isinstance(value, str)
        elif type_name == "Boolean":
            bad = not isinstance(value, bool)
        elif isinstance(GQL.get(type_name), list):         # an enum
            bad = value not in GQL[type_name]
        elif isinstance(GQL.get(type_name), dict):         # an input object
            if not isinstance(value, dict):
                bad = True
            else:
                fields = GQL[type_name]
                for k in value:
                    if k not in fields:
                        errors.append(f'Variable "$input" got invalid value at "{where}"; '
                                      f'Field "{k}" is not defined by type "{type_name}".')
                for k, t in fields.items():
                    if t.endswith("!") and k not in value:
                        errors.append(f'Variable "$input" got invalid value at "{where}"; '
                                      f'Field "{k}" of required type "{t}" was not provided.')
                    elif k in value:
                        self.gql_input_errors(value[k], t, f"{where}.{k}", errors)
                return
        if bad:
            errors.append(f'Variable "$input" got invalid value {json.dumps(value)[:60]} at "{where}"; '
                          f'{type_name} cannot represent {json.dumps(value)[:60]}.')

    def gql_rent(self, field, errors, refusals):
        """podRentInterruptable: a spot pod, or None with the reason in
        `refusals` (HTTP 200, `errors`, a null pod, as GraphQL answers)."""
        if set(field["args"]) != {"input"}:
            errors.append('Field "podRentInterruptable" takes exactly one argument, "input" '
                          '(PodRentInterruptableInput!).')
            return None
        inp = field["args"]["input"]
        self.gql_input_errors(inp, "PodRentInterruptableInput!", "input", errors)
        for sel in field["selections"]:
            if sel["name"] not in GQL["Pod"]:
                errors.append(f'Cannot query field "{sel["name"]}" on type "Pod".')
            elif sel["name"] == "machine":
                for sub in sel["selections"]:
                    if sub["name"] not in GQL["Machine"]:
                        errors.append(f'Cannot query field "{sub["name"]}" on type "Machine".')
        if not field["selections"]:
            errors.append('Field "podRentInterruptable" of type "Pod" must have a selection of subfields.')
        if errors:
            return None

        def refuse(message, status=None):
            refusals.append({"field": field["alias"], "message": message, "status": status})
            return None

        failure = self._pop_failure("graphql")
        if failure:
            return refuse(failure["message"] or V2_NO_INSTANCES, failure["status"])
        if inp.get("templateId") or inp.get("networkVolumeId"):
            return refuse("templates and network volumes are not emulated by this fake")
        gid = inp.get("gpuTypeId")
        if gid not in GPU_TYPES:
            return refuse(V2_NO_INSTANCES)
        count = inp.get("gpuCount") or 1
        dcs = [inp["dataCenterId"]] if inp.get("dataCenterId") else DATA_CENTERS
        if dcs[0] not in DATA_CENTERS:
            return refuse(f"dataCenterId: unknown data center {dcs[0]!r}")
        ports = [p for p in (inp.get("ports") or "").split(",") if p]
        bad_ports = [p for p in ports if not re.fullmatch(r"\d{1,5}/(tcp|http)", p)]
        if bad_ports:
            return refuse(f"ports: {bad_ports[0]!r} is not PORT/tcp or PORT/http")
        clouds = {"SECURE": ["SECURE"], "COMMUNITY": ["COMMUNITY"]}.get(inp.get("cloudType") or "ALL",
                                                                      ["SECURE", "COMMUNITY"])
        bid = inp["bidPerGpu"]
        priced = [(c, self._unit_price(gid, c, True)) for c in clouds]
        priced = [(c, p) for c, p in priced if p is not None]
        if not priced:
            return refuse(V2_NO_INSTANCES)
        floor = min(p for _, p in priced)
        if bid < floor:
            return refuse(f"Your bid of ${bid}/GPU is below the current minimum bid of ${floor}/GPU "
                          "for this GPU type: raise your bid.")
        choice = None
        for cloud, price in priced:
            if bid >= price:
                choice = self._place([gid], count, cloud, dcs, spot=True)
                if choice:
                    break
        if choice is None:
            return refuse(V2_NO_INSTANCES)
        env = {e["key"]: e["value"] for e in inp.get("env") or []}
        pod = self._new_pod(
            gid, choice[1], cloud, count, True, name=inp.get("name") or "my pod",
            image=inp.get("imageName") or "runpod/base", env=env, ports=ports, locked=False,
            disk=inp.get("containerDiskInGb") or 50, volume=inp.get("volumeInGb") or 0,
            mount_path=inp.get("volumeMountPath") or "/workspace", vcpus=2 * count)
        pod["costPerHr"] = pod["adjustedCostPerHr"] = round(bid * count, 4)
        pod["_bid"] = bid
        pod["_public"] = inp.get("supportPublicIp", True) is not False
        values = {"id": pod["id"], "name": pod["name"], "desiredStatus": pod["desiredStatus"],
                  "imageName": pod["image"], "env": [f"{k}={v}" for k, v in env.items()],
                  "machineId": pod["machineId"], "machine": {"podHostId": f"{pod['id']}-{pod['machineId'][:8]}"},
                  "costPerHr": pod["costPerHr"], "adjustedCostPerHr": pod["adjustedCostPerHr"],
                  "gpuCount": count, "vcpuCount": pod["vcpuCount"], "memoryInGb": pod["memoryInGb"],
                  "containerDiskInGb": pod["containerDiskInGb"], "volumeInGb": pod["volumeInGb"],
                  "volumeMountPath": pod["volumeMountPath"], "ports": ",".join(ports),
                  "interruptible": True, "locked": False, "lastStatusChange": pod["lastStatusChange"],
                  "lastStartedAt": pod["lastStartedAt"]}
        out = {}
        for sel in field["selections"]:
            v = values[sel["name"]]
            if sel["name"] == "machine":
                v = {sub["alias"]: v[sub["name"]] for sub in sel["selections"]}
            out[sel["alias"]] = v
        return out

    def gql_gpu_types(self, field, errors):
        filt = field["args"].get("input") or {}
        for k in filt:
            if k not in GQL["GpuTypeFilter"]:
                errors.append(f'Field "{k}" is not defined by type "GpuTypeFilter".')
        ids = list(GPU_TYPES)
        if "id" in filt:
            ids = [i for i in ids if i == filt["id"]]
        if "ids" in filt:
            ids = [i for i in ids if i in filt["ids"]]
        out = []
        for gid in ids:
            name, mem, sp, cp, ssp, csp = GPU_TYPES[gid]
            values = {"id": gid, "displayName": name, "memoryInGb": mem,
                      "secureCloud": sp is not None, "communityCloud": cp is not None,
                      "securePrice": sp, "communityPrice": cp,
                      "secureSpotPrice": ssp, "communitySpotPrice": csp}
            row = {}
            for sel in field["selections"]:
                if sel["name"] not in GQL["GpuType"]:
                    errors.append(f'Cannot query field "{sel["name"]}" on type "GpuType".')
                elif sel["name"] == "lowestPrice":
                    row[sel["alias"]] = self.gql_lowest(gid, sel, errors)
                else:
                    row[sel["alias"]] = values[sel["name"]]
            out.append(row)
        return out

    def gql_lowest(self, gid, field, errors):
        inp = field["args"].get("input")
        if not isinstance(inp, dict) or "gpuCount" not in inp:
            errors.append('Argument "input" of type "GpuLowestPriceInput!" is required (with gpuCount).')
            return None
        for k in inp:
            if k not in GQL["GpuLowestPriceInput"]:
                errors.append(f'Field "{k}" is not defined by type "GpuLowestPriceInput".')
        name, mem, sp, cp, ssp, csp = GPU_TYPES[gid]
        count = inp["gpuCount"]
        secure = inp.get("secureCloud")
        clouds = ["SECURE"] if secure is True else ["COMMUNITY"] if secure is False else ["SECURE", "COMMUNITY"]
        prices = [(sp, ssp) if c == "SECURE" else (cp, csp) for c in clouds]
        prices = [p for p in prices if p[0] is not None]
        free = max((self.free(gid, dc, c) for dc in DATA_CENTERS for c in clouds), default=0)
        values = {
            "gpuName": name, "gpuTypeId": gid,
            "uninterruptablePrice": round(min(p[0] for p in prices) * count, 4) if prices else None,
            "minimumBidPrice": round(min(p[1] for p in prices) * count, 4) if prices else None,
            "minMemory": 31 * count, "minVcpu": 2 * count,
            "stockStatus": None if free < count else ("High" if free >= 8 else "Medium" if free >= 4 else "Low"),
            "availableGpuCounts": [n for n in (1, 2, 4, 8) if n <= free],
        }
        row = {}
        for sel in field["selections"]:
            if sel["name"] not in GQL["LowestPrice"]:
                errors.append(f'Cannot query field "{sel["name"]}" on type "LowestPrice".')
            else:
                row[sel["alias"]] = values[sel["name"]]
        return row

    # ----- time and control -----------------------------------------------

    def tick(self):
        now = time.monotonic()
        for pod in self.pods.values():
            if (pod["desiredStatus"] == "RUNNING" and not pod["_booted"]
                    and now - pod["_created"] >= self.args.boot_seconds):
                pod["_booted"] = True
                pod["publicIp"] = pod["_address"] if pod.get("_public", True) else None
                mapped = {}
                for n, spec in enumerate(pod["ports"]):
                    port, proto = spec.split("/")
                    if proto == "tcp":
                        mapped[port] = pod["_ssh_port"] if port == "22" else 30000 + (hash(pod["id"]) + n) % 20000
                pod["portMappings"] = mapped
                pod["_started"] = now
                pod["_started_at"] = iso_now()
                self.slots.install_key(pod["env"].get("PUBLIC_KEY", ""))

    def state(self):
        live = [p for p in self.pods.values()]
        return {
            "pods": [dict(self.pod_view(p, {"includeMachine": ["true"]}), _ssh=[p["_address"], p["_ssh_port"]],
                          _v2=self.pod_v2_view(p), _bid=p.get("_bid"))
                     for p in live],
            "ssh_keys": [{"id": str(n), "name": (k.split(None, 2)[2:] or [None])[0], "public_key": k}
                         for n, k in enumerate(self.account_keys)],
            "capacity": [{"gpuTypeId": g, "dataCenterId": d, "cloudType": c, "gpus": n,
                          "free": self.free(g, d, c)} for (g, d, c), n in self.capacity.items()],
            "leaks": [{"kind": "pod", "id": p["id"], "name": p["name"], "status": p["desiredStatus"]}
                      for p in live],
        }

    def control(self, what, req):
        b = req.control_body
        if what == "capacity" and req.method == "POST":
            g, d, c = b["gpuTypeId"], b["dataCenterId"], b.get("cloudType", "SECURE")
            if g not in GPU_TYPES or d not in DATA_CENTERS or c not in ("SECURE", "COMMUNITY"):
                raise ValueError("gpuTypeId, dataCenterId or cloudType unknown to the fake")
            if b.get("gpus") is None:
                self.capacity.pop((g, d, c), None)
            else:
                self.capacity[(g, d, c)] = int(b["gpus"])
            return Reply(200, self.state()["capacity"])
        if what == "create-failure" and req.method == "POST":
            api = b.get("api")
            if api not in (None, "v1", "v2", "graphql"):
                raise ValueError('"api" is "v1", "v2", "graphql" (podRentInterruptable) or absent (any)')
            status = b.get("status")
            if status is not None:
                status = int(status)
                HTTPStatus(status)      # ValueError when it is no HTTP status
            failure = {"status": status, "message": b.get("message"), "api": api}
            self.create_failures.extend([failure] * int(b.get("times", 1)))
            return Reply(200, {"queued": len(self.create_failures)})
        if what == "rps" and req.method in ("GET", "POST"):
            if req.method == "POST":
                rps = b.get("rps")
                if not isinstance(rps, int) or isinstance(rps, bool) or rps < 0:
                    raise ValueError('"rps" is an integer >= 0 (0: no limit)')
                self.args.runpod_rps = rps
                self.limiter.forget_windows()
            return Reply(200, {"rps": self.args.runpod_rps})
        if what == "preempt" and req.method == "POST":
            pod = self.pods.get(b["id"])
            if pod is None:
                raise KeyError(f"no pod {b['id']!r}")
            if not pod["interruptible"] and not b.get("force"):
                raise ValueError("the pod is not interruptible (force: true to stop it anyway)")
            if b.get("terminate"):
                self.slots.release(pod["id"])
                del self.pods[pod["id"]]
                return Reply(200, {"terminated": b["id"]})
            self._stop(pod, f"Stopped by system: spot pod interrupted (outbid): {stamp()}")
            return Reply(200, self.pod_view(pod, {}))
        return None


# ----- a GraphQL subset: one operation, fields, aliases, arguments ------------

TOKEN = re.compile(r'\s*(?:(\.\.\.)|([{}()\[\]:,!$=@])|("(?:[^"\\]|\\.)*")|(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)|([_A-Za-z][_0-9A-Za-z]*)|(#[^\n]*))')


def tokenize(text):
    pos, out = 0, []
    text = text.rstrip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"unexpected character at {pos}: {text[pos:pos + 10]!r}")
        pos = m.end()
        spread, punct, string_, number, name, comment = m.groups()
        if comment:
            continue
        if spread:
            raise ValueError("fragments are not emulated")
        if punct:
            out.append(("p", punct))
        elif string_:
            out.append(("v", bytes(string_[1:-1], "utf-8").decode("unicode_escape")))
        elif number:
            out.append(("v", float(number) if "." in number or "e" in number.lower() else int(number)))
        elif name:
            out.append(("n", name))
    return out


def parse_graphql(text, variables):
    toks = tokenize(text)
    i = 0

    def peek(kind=None, value=None):
        if i >= len(toks):
            return False
        k, v = toks[i]
        return (kind is None or k == kind) and (value is None or v == value)

    def take(kind=None, value=None):
        nonlocal i
        if not peek(kind, value):
            got = toks[i] if i < len(toks) else "end"
            raise ValueError(f"expected {value or kind}, got {got}")
        i += 1
        return toks[i - 1][1]

    def value():
        if peek("p", "$"):
            take("p", "$")
            name = take("n")
            if name not in variables:
                raise ValueError(f'Variable "${name}" is not defined by the request')
            return variables[name]
        if peek("p", "{"):
            take("p", "{")
            obj = {}
            while not peek("p", "}"):
                k = take("n")
                take("p", ":")
                obj[k] = value()
                if peek("p", ","):
                    take("p", ",")
            take("p", "}")
            return obj
        if peek("p", "["):
            take("p", "[")
            arr = []
            while not peek("p", "]"):
                arr.append(value())
                if peek("p", ","):
                    take("p", ",")
            take("p", "]")
            return arr
        if peek("v"):
            return take("v")
        name = take("n")
        return {"true": True, "false": False, "null": None}.get(name, name)

    def selections():
        take("p", "{")
        out = []
        while not peek("p", "}"):
            alias = name = take("n")
            if peek("p", ":"):
                take("p", ":")
                name = take("n")
            args = {}
            if peek("p", "("):
                take("p", "(")
                while not peek("p", ")"):
                    k = take("n")
                    take("p", ":")
                    args[k] = value()
                    if peek("p", ","):
                        take("p", ",")
                take("p", ")")
            sub = selections() if peek("p", "{") else []
            out.append({"alias": alias, "name": name, "args": args, "selections": sub})
            if peek("p", ","):
                take("p", ",")
        take("p", "}")
        return out

    operation = "query"
    if peek("n"):
        operation = take("n")
        if peek("n"):
            take("n")
        if peek("p", "("):     # variable definitions: skipped
            depth = 0
            while True:
                k, v = toks[i]
                i += 1
                depth += (v == "(") - (v == ")") if k == "p" else 0
                if depth == 0:
                    break
    sel = selections()
    if i != len(toks):
        raise ValueError("only one operation per request is emulated")
    return {"operation": operation, "selections": sel}


def main():
    import fakecore
    parser_factory = fakecore.arg_parser

    def arg_parser(description):
        p = parser_factory(description)
        p.add_argument("--rps", dest="runpod_rps", type=int, default=0,
                       help="requests a second per key before 429 (default 0: no limit, none is published)")
        return p
    fakecore.arg_parser = arg_parser
    return serve(RunPodFake, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
