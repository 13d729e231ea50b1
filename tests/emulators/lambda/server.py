#!/usr/bin/env python3
"""Fake Lambda Cloud API (v1) for gangway's Lambda provider tests.

Serves instance types with `regions_with_capacity_available`, launches,
instances list/get/rename, terminate and SSH keys at Lambda's paths
(`/api/v1/...`), with Bearer or Basic auth, Lambda's `{"data": ...}` and
`{"error": {code, message, suggestion}}` bodies, its rate limits (one
request a second, one launch every 12 seconds, per key), capacity per
(instance type, region) and instances reachable through a real sshd.
Every request is checked against lambda-api-subset.json (written from
Lambda's OpenAPI document 1.8.3, see API-NOTES.md); violations are logged
for `GET /_fake/violations`.

    python server.py --host 127.0.0.1 --port 0 [--watch-stdin] [--verbose]
                     [--api-key KEY] [--rate-scale S] [--boot-seconds S]

README.md next to this file has the details.
"""

import os
import secrets
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpucloud"))
sys.dont_write_bytecode = True

from fakecore import Fake, Reply, check_query, load_schemas, serve  # noqa: E402

SCHEMAS = load_schemas(os.path.join(HERE, "lambda-api-subset.json"))
DEFS = SCHEMAS["defs"]
OPS = SCHEMAS["operations"]

REGION_DESCRIPTIONS = {
    "us-east-1": "Virginia, USA", "us-east-2": "Washington DC, USA", "us-east-3": "Ohio, USA",
    "us-west-1": "California, USA", "us-west-2": "Arizona, USA", "us-west-3": "Utah, USA",
    "us-south-1": "Texas, USA", "us-south-2": "North Texas, USA", "us-south-3": "Central Texas, USA",
    "us-midwest-1": "Illinois, USA", "us-midwest-2": "Kansas, USA",
    "europe-central-1": "Germany", "asia-south-1": "India", "australia-east-1": "Australia",
    "me-west-1": "Israel", "asia-northeast-1": "Tokyo, Japan", "asia-northeast-2": "Seoul, South Korea",
}

# name: (description, gpu_description, price in cents/h, vcpus, memory GiB, storage GiB, gpus)
# Prices, vCPUs and memory as in the published SkyPilot-format Lambda catalog
# (../shared/catalogs/skypilot-format/lambda/vms.csv); storage is made up.
INSTANCE_TYPES = {
    "gpu_1x_a10": ("1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 129, 30, 200, 1400, 1),
    "gpu_1x_a6000": ("1x RTX A6000 (48 GB)", "RTX A6000 (48 GB)", 109, 14, 100, 512, 1),
    "gpu_1x_a100_sxm4": ("1x A100 (40 GB SXM4)", "A100 (40 GB SXM4)", 199, 30, 200, 512, 1),
    "gpu_1x_h100_pcie": ("1x H100 (80 GB PCIe)", "H100 (80 GB PCIe)", 329, 26, 200, 1024, 1),
    "gpu_1x_gh200": ("1x GH200 (96 GB)", "GH200 (96 GB)", 229, 64, 432, 4096, 1),
    "gpu_2x_a6000": ("2x RTX A6000 (48 GB)", "RTX A6000 (48 GB)", 218, 28, 200, 1024, 2),
    "gpu_8x_a100_80gb_sxm4": ("8x A100 (80 GB SXM4)", "A100 (80 GB SXM4)", 2232, 240, 1800, 19456, 8),
    "gpu_8x_h100_sxm5": ("8x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 3192, 208, 1800, 24780, 8),
}

# Where each type has capacity at start, and how many instances of it fit.
DEFAULT_CAPACITY = {
    "gpu_1x_a10": {"us-east-1": 4, "us-west-1": 4},
    "gpu_1x_a6000": {"us-south-1": 4},
    "gpu_1x_a100_sxm4": {"us-east-1": 4},
    "gpu_1x_h100_pcie": {"us-west-3": 2},
    "gpu_1x_gh200": {"us-east-3": 2},
    "gpu_2x_a6000": {"us-south-1": 2},
    "gpu_8x_a100_80gb_sxm4": {"us-east-1": 2},
    "gpu_8x_h100_sxm5": {"us-south-2": 2, "us-west-3": 2},
}

ERR = {
    "unauthorized": (401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
                     "Check your API key or create a new one, then try again."),
    "invalid": (400, "global/invalid-parameters", "Invalid request data.", None),
    "capacity": (400, "instance-operations/launch/insufficient-capacity",
                 "Not enough capacity to fulfill launch request.", None),
    "not_found": (404, "global/object-does-not-exist", "Specified instance does not exist.", None),
    "quota": (400, "global/quota-exceeded", "Quota exceeded.", "Contact Support to increase your quota."),
    # Not in the published document; see API-NOTES.md ("Rate limits").
    "rate": (429, "global/rate-limited", "Rate limit exceeded.", "Slow down and try again."),
}


def error(kind, message=None, suggestion=None):
    status, code, default_message, default_suggestion = ERR[kind]
    body = {"code": code, "message": message or default_message}
    if suggestion or default_suggestion:
        body["suggestion"] = suggestion or default_suggestion
    return Reply(status, {"error": body})


class LambdaFake(Fake):
    cloud = "lambda"
    synthetic_ssh_port = 22
    routes = [
        ("GET", r"/api/v1/instance-types", "listInstanceTypes", "list_types"),
        ("GET", r"/api/v1/instances", "listInstances", "list_instances"),
        ("GET", r"/api/v1/instances/(?P<id>[^/]+)", "getInstance", "get_instance"),
        ("POST", r"/api/v1/instances/(?P<id>[^/]+)", "postInstance", "post_instance"),
        ("POST", r"/api/v1/instance-operations/launch", "launchInstance", "launch"),
        ("POST", r"/api/v1/instance-operations/terminate", "terminateInstance", "terminate"),
        ("GET", r"/api/v1/ssh-keys", "listSSHKeys", "list_keys"),
        ("POST", r"/api/v1/ssh-keys", "addSSHKey", "add_key"),
        ("DELETE", r"/api/v1/ssh-keys/(?P<id>[^/]+)", "deleteSSHKey", "delete_key"),
    ]

    def reset_state(self):
        self.instances = {}     # id -> dict (internal fields start with _)
        self.keys = {}          # id -> {"id", "name", "public_key"}
        self.capacity = {t: dict(r) for t, r in DEFAULT_CAPACITY.items()}
        self.launch_failures = []   # queued error kinds for the next launches
        self.launched = 0

    # ----- common checks -------------------------------------------------

    def handle(self, req):
        if req.path.startswith("/_fake/"):
            return super().handle(req)
        key = self.bearer_key(req) or self.basic_key(req)
        if key is None or key not in self.api_keys:
            self.violation(req, "auth", ["Authorization: missing, malformed or an unknown key"
                                         if key is None else "Authorization: unknown API key"])
            return error("unauthorized")
        req.api_key = key
        # One request a second per key, and one launch every 12 seconds (five
        # a minute): the document's introduction.
        if not self.limiter.hit(key, "all", 1, 1.0):
            return error("rate")
        if req.method == "POST" and req.path == OPS["launchInstance"]["path"]:
            if not self.limiter.hit(key, "launch", 1, 12.0):
                return error("rate")
        return super().handle(req)

    def not_found(self, req, method_not_allowed=False):
        return Reply(404, {"error": {"code": "global/object-does-not-exist",
                                     "message": "Not found.", "suggestion": "Check the URL."}})

    def query_ok(self, req):
        problems = []
        check_query(OPS[req.op].get("query", {}), req.query, problems)
        if problems:
            self.violation(req, "query", problems)
            return error("invalid", "; ".join(problems))
        return None

    def body_of(self, req):
        body, problems = self.checked_body(req, OPS[req.op]["body"], DEFS)
        if problems:
            self.violation(req, "body", problems)
            return None, error("invalid", "; ".join(problems))
        return body, None

    # ----- views -----------------------------------------------------------

    def type_view(self, name):
        desc, gpu, cents, vcpus, mem, storage, gpus = INSTANCE_TYPES[name]
        return {"name": name, "description": desc, "gpu_description": gpu,
                "price_cents_per_hour": cents,
                "specs": {"vcpus": vcpus, "memory_gib": mem, "storage_gib": storage, "gpus": gpus}}

    def region_view(self, name):
        return {"name": name, "description": REGION_DESCRIPTIONS.get(name, name)}

    def free_in(self, type_name, region):
        total = self.capacity.get(type_name, {}).get(region, 0)
        used = sum(1 for i in self.instances.values()
                   if i["_type"] == type_name and i["_region"] == region and i["status"] != "terminated")
        return max(0, total - used)

    def instance_view(self, inst):
        out = {k: v for k, v in inst.items() if not k.startswith("_")}
        terminating = inst["status"] in ("terminating", "terminated")
        booted = inst["status"] == "active"
        out["actions"] = {
            a: ({"available": True} if booted and not terminating else
                {"available": False,
                 "reason_code": "vm-is-terminating" if terminating else "vm-has-not-launched",
                 "reason_description": "The instance is terminating." if terminating
                 else "The instance has not launched yet."})
            for a in ("migrate", "rebuild", "restart", "cold_reboot")}
        out["actions"]["terminate"] = {"available": not terminating} if not terminating else {
            "available": False, "reason_code": "vm-is-terminating",
            "reason_description": "The instance is terminating."}
        return out

    # ----- handlers --------------------------------------------------------

    def list_types(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        data = {}
        for name in INSTANCE_TYPES:
            regions = [self.region_view(r) for r in sorted(self.capacity.get(name, {}))
                       if self.free_in(name, r) > 0]
            if self.slots.free() == 0:
                regions = []
            data[name] = {"instance_type": self.type_view(name), "regions_with_capacity_available": regions}
        return Reply(200, {"data": data})

    def list_instances(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        live = [self.instance_view(i) for i in self.instances.values() if i["status"] != "terminated"]
        return Reply(200, {"data": live})

    def get_instance(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        inst = self.instances.get(req.params["id"])
        if inst is None or inst["status"] == "terminated":
            return error("not_found")
        return Reply(200, {"data": self.instance_view(inst)})

    def post_instance(self, req):
        body, bad = self.body_of(req)
        if bad:
            return bad
        inst = self.instances.get(req.params["id"])
        if inst is None or inst["status"] == "terminated":
            return error("not_found")
        if "name" in body:
            inst["name"] = body["name"]
        return Reply(200, {"data": self.instance_view(inst)})

    def launch(self, req):
        body, bad = self.body_of(req)
        if bad:
            return bad
        if self.launch_failures:
            kind = self.launch_failures.pop(0)
            return error(kind)
        type_name = body["instance_type_name"]
        region = body["region_name"]
        if type_name not in INSTANCE_TYPES:
            return Reply(404, {"error": {"code": "global/object-does-not-exist",
                                         "message": f"Instance type {type_name!r} does not exist.",
                                         "suggestion": "List the instance types and pick one of them."}})
        names = body["ssh_key_names"]
        if len(names) != 1:
            self.violation(req, "body", [f"ssh_key_names: exactly one SSH key must be specified, got {len(names)}"])
            return error("invalid", "Exactly one SSH key must be specified.")
        key = next((k for k in self.keys.values() if k["name"] == names[0]), None)
        if key is None:
            return Reply(404, {"error": {"code": "global/object-does-not-exist",
                                         "message": f"SSH key {names[0]!r} does not exist.",
                                         "suggestion": "Add the SSH key first."}})
        if body.get("file_system_names"):
            return Reply(404, {"error": {"code": "global/object-does-not-exist",
                                         "message": f"File system {body['file_system_names'][0]!r} does not exist.",
                                         "suggestion": "This fake has no file systems."}})
        quantity = body.get("quantity", 1)
        free_slots = self.slots.free()
        if self.free_in(type_name, region) < quantity or (free_slots is not None and free_slots < quantity):
            return error("capacity")
        ids = []
        for _ in range(quantity):
            iid = secrets.token_hex(16)
            address, port = self.slots.take(iid)
            self.launched += 1
            self.instances[iid] = {
                "id": iid, "name": body.get("name"), "status": "booting",
                "ssh_key_names": list(names), "file_system_names": [],
                "region": self.region_view(region), "instance_type": self.type_view(type_name),
                "tags": list(body.get("tags", [])),
                "_type": type_name, "_region": region, "_address": address, "_ssh_port": port,
                "_key": key["public_key"], "_created": time.monotonic(), "_ended": None,
            }
            if body.get("name") is None:
                del self.instances[iid]["name"]
            ids.append(iid)
        return Reply(200, {"data": {"instance_ids": ids}})

    def terminate(self, req):
        body, bad = self.body_of(req)
        if bad:
            return bad
        ids = body["instance_ids"]
        missing = [i for i in ids if i not in self.instances or self.instances[i]["status"] == "terminated"]
        if missing:
            return error("not_found", f"Specified instance does not exist: {missing[0]}.")
        out = []
        for iid in ids:
            inst = self.instances[iid]
            if inst["status"] != "terminating":
                inst["status"] = "terminating"
                inst["_ended"] = time.monotonic()
            out.append(self.instance_view(inst))
        return Reply(200, {"data": {"terminated_instances": out}})

    def list_keys(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        return Reply(200, {"data": list(self.keys.values())})

    def add_key(self, req):
        body, bad = self.body_of(req)
        if bad:
            return bad
        if any(k["name"] == body["name"] for k in self.keys.values()):
            return error("invalid", f"An SSH key named {body['name']!r} already exists.")
        kid = secrets.token_hex(16)
        entry = {"id": kid, "name": body["name"]}
        if body.get("public_key"):
            entry["public_key"] = body["public_key"].strip()
            self.keys[kid] = entry
            return Reply(200, {"data": dict(entry)})
        # No public key: Lambda makes a pair and answers the private half once.
        private, public = generate_pair()
        entry["public_key"] = public
        self.keys[kid] = entry
        return Reply(200, {"data": dict(entry, private_key=private)})

    def delete_key(self, req):
        bad = self.query_ok(req)
        if bad:
            return bad
        if req.params["id"] not in self.keys:
            return error("invalid", "SSH key does not exist.")
        del self.keys[req.params["id"]]
        return Reply(200, {"data": {}})

    # ----- time ------------------------------------------------------------

    def tick(self):
        now = time.monotonic()
        for iid, inst in self.instances.items():
            if inst["status"] == "booting" and now - inst["_created"] >= self.args.boot_seconds:
                inst["status"] = "active"
                inst["ip"] = inst["_address"]
                inst["private_ip"] = f"10.19.{(self.launched // 250) % 250}.{2 + hash(iid) % 250}"
                inst["hostname"] = inst["_address"].replace(".", "-") + ".cloud.lambda.ai"
                inst["jupyter_token"] = secrets.token_hex(16)
                inst["jupyter_url"] = f"https://jupyter-{inst['jupyter_token']}.lambdaspaces.com/?token={inst['jupyter_token']}"
                self.slots.install_key(inst["_key"])
            if inst["status"] == "terminating" and now - inst["_ended"] >= min(1.0, self.args.boot_seconds):
                inst["status"] = "terminated"
                self.slots.release(iid)

    # ----- control ---------------------------------------------------------

    def state(self):
        return {
            "instances": [dict(self.instance_view(i), _region=i["_region"], _type=i["_type"],
                               _ssh=[i["_address"], i["_ssh_port"]])
                          for i in self.instances.values() if i["status"] != "terminated"],
            "ssh_keys": list(self.keys.values()),
            "capacity": self.capacity,
            "leaks": [{"kind": "instance", "id": i["id"], "name": i.get("name"), "status": i["status"]}
                      for i in self.instances.values() if i["status"] != "terminated"],
        }

    def control(self, what, req):
        b = req.control_body
        if what == "capacity" and req.method == "POST":
            t, r, n = b["instance_type"], b["region"], b.get("available")
            if t not in INSTANCE_TYPES:
                raise ValueError(f"unknown instance_type {t!r}")
            if r not in DEFS["PublicRegionCode"]["enum"]:
                raise ValueError(f"unknown region {r!r}")
            if n is None:
                self.capacity.get(t, {}).pop(r, None)
            else:
                self.capacity.setdefault(t, {})[r] = int(n)
            return Reply(200, {"capacity": self.capacity})
        if what == "capacity" and req.method == "GET":
            return Reply(200, {"capacity": self.capacity})
        if what == "launch-failure" and req.method == "POST":
            kind = b.get("kind", "capacity")
            if kind not in ERR:
                raise ValueError(f"kind is one of {sorted(ERR)}")
            self.launch_failures.extend([kind] * int(b.get("times", 1)))
            return Reply(200, {"queued": self.launch_failures})
        if what == "preempt" and req.method == "POST":
            # Lambda's InstanceStatus has "preempted"; its on-demand instances
            # are not preemptible, but the status exists, so tests can see it.
            inst = self.instances.get(b["id"])
            if inst is None or inst["status"] == "terminated":
                raise KeyError(f"no live instance {b['id']!r}")
            inst["status"] = "preempted"
            self.slots.release(b["id"])
            return Reply(200, {"data": self.instance_view(inst)})
        return None


def generate_pair():
    """An ed25519 pair from ssh-keygen (a fixed fake when it is missing)."""
    try:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lambda-generated", "-f", path],
                           check=True, capture_output=True, timeout=20)
            with open(path) as f:
                private = f.read()
            with open(path + ".pub") as f:
                public = f.read().strip()
            return private, public
    except (OSError, subprocess.SubprocessError):
        return ("-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----\n",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFakeFakeFakeFakeFakeFakeFakeFakeFake lambda-generated")


if __name__ == "__main__":
    sys.exit(serve(LambdaFake, __doc__.split("\n\n")[0]))
