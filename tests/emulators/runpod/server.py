#!/usr/bin/env python3
"""Fake RunPod API (REST v1 pods, GraphQL gpuTypes) for gangway's RunPod
provider tests.

REST at RunPod's paths (`/v1/pods`, as under https://rest.runpod.io): create
(gpuTypeIds, gpuCount, cloudType SECURE/COMMUNITY, interruptible,
dataCenterIds, imageName, ports "22/tcp", env with PUBLIC_KEY, ...), list,
get (publicIp, portMappings {"22": PORT}), stop, delete, with `Authorization:
Bearer KEY`. GraphQL at `/graphql` (as https://api.runpod.io/graphql,
`?api_key=` or Bearer) answers `gpuTypes` with secure/community/spot prices
and `lowestPrice`. Capacity per (GPU type, data center, cloud type): RunPod's
"There are no instances currently available" when none fits; spot
preemption; pods reachable through a real sshd. Requests are checked
against runpod-api-subset.json (from RunPod's REST v1 OpenAPI document, see
API-NOTES.md); violations are logged for `GET /_fake/violations`.

    python server.py --host 127.0.0.1 --port 0 [--watch-stdin] [--verbose]
                     [--api-key KEY] [--rate-scale S] [--boot-seconds S]
"""

import os
import re
import secrets
import string
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpucloud"))
sys.dont_write_bytecode = True

from fakecore import Fake, Reply, check_query, load_schemas, serve  # noqa: E402

SCHEMAS = load_schemas(os.path.join(HERE, "runpod-api-subset.json"))
OPS = SCHEMAS["operations"]
GQL = SCHEMAS["graphql"]
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


def err(status, message):
    return Reply(status, {"error": message, "status": status})


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
    ]

    def reset_state(self):
        self.pods = {}
        self.capacity = dict(DEFAULT_CAPACITY)
        self.create_failures = []

    def handle(self, req):
        if req.path.startswith("/_fake/"):
            return super().handle(req)
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
            return err(401, "Unauthorized")
        # RunPod publishes no REST rate limit for pods: none unless --rps N
        # (N requests a second per key, window times --rate-scale).
        if self.args.runpod_rps and not self.limiter.hit(key, "all", self.args.runpod_rps, 1.0):
            return err(429, "rate limit exceeded")
        return super().handle(req)

    def not_found(self, req, method_not_allowed=False):
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
        if self.create_failures:
            status, message = self.create_failures.pop(0)
            return err(status, message)
        cloud = body.get("cloudType", "SECURE")
        count = body.get("gpuCount", 1)
        gpus = body["gpuTypeIds"]
        dcs = body.get("dataCenterIds") or DATA_CENTERS
        choice = None
        free_slots = self.slots.free()
        if free_slots is None or free_slots > 0:
            for gpu in gpus:
                if gpu not in GPU_TYPES:
                    continue
                for dc in dcs:
                    if self.free(gpu, dc, cloud) >= count:
                        choice = (gpu, dc)
                        break
                if choice:
                    break
        if choice is None:
            return err(500, NO_INSTANCES)
        gpu, dc = choice
        pid = pod_id()
        address, port = self.slots.take(pid)
        name, mem, sp, cp, ssp, csp = GPU_TYPES[gpu]
        spot = body.get("interruptible", False)
        unit = (ssp if cloud == "SECURE" else csp) if spot else (sp if cloud == "SECURE" else cp)
        if unit is None:
            self.slots.release(pid)
            return err(500, NO_INSTANCES)
        env = dict(body.get("env", {}))
        pod = {
            "id": pid, "name": body.get("name", "my pod"), "desiredStatus": "RUNNING",
            "image": body["imageName"], "env": env,
            "ports": list(body.get("ports", ["8888/http", "22/tcp"])),
            "publicIp": None, "portMappings": {},
            "gpu": self.gpu_view(gpu, count), "gpuCount": count,
            "costPerHr": round(unit * count, 4), "adjustedCostPerHr": round(unit * count, 4),
            "interruptible": spot, "locked": body.get("locked", False),
            "containerDiskInGb": body.get("containerDiskInGb", 50), "volumeInGb": body.get("volumeInGb", 20),
            "volumeMountPath": body.get("volumeMountPath", "/workspace"),
            "vcpuCount": body.get("vcpuCount", 2 * count), "memoryInGb": 31 * count,
            "machineId": secrets.token_hex(6), "consumerUserId": "user_fake",
            "lastStartedAt": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "lastStatusChange": f"Rented by User: {stamp()}",
            "_gpu": gpu, "_dc": dc, "_cloud": cloud, "_address": address, "_ssh_port": port,
            "_created": time.monotonic(), "_booted": False,
        }
        self.pods[pid] = pod
        return Reply(201, self.pod_view(pod, {}))

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
        if doc["operation"] != "query":
            problems.append(f"{doc['operation']}: only queries (gpuTypes) are emulated")
        data, errors = {}, []
        for field in doc["selections"]:
            if field["name"] != "gpuTypes":
                errors.append(f'Cannot query field "{field["name"]}" on type "Query".')
                continue
            data[field["alias"]] = self.gql_gpu_types(field, errors)
        problems.extend(errors)
        if problems:
            self.violation(req, "graphql", problems)
        if errors:
            return Reply(400, {"errors": [{"message": m} for m in errors]})
        return Reply(200, {"data": data})

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
                pod["publicIp"] = pod["_address"]
                mapped = {}
                for n, spec in enumerate(pod["ports"]):
                    port, proto = spec.split("/")
                    if proto == "tcp":
                        mapped[port] = pod["_ssh_port"] if port == "22" else 30000 + (hash(pod["id"]) + n) % 20000
                pod["portMappings"] = mapped
                self.slots.install_key(pod["env"].get("PUBLIC_KEY", ""))

    def state(self):
        live = [p for p in self.pods.values()]
        return {
            "pods": [dict(self.pod_view(p, {"includeMachine": ["true"]}), _ssh=[p["_address"], p["_ssh_port"]])
                     for p in live],
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
            self.create_failures.extend([(int(b.get("status", 500)), b.get("message", NO_INSTANCES))]
                                        * int(b.get("times", 1)))
            return Reply(200, {"queued": len(self.create_failures)})
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
