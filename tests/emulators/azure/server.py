#!/usr/bin/env python3
"""An Azure Resource Manager fake for gangway's Azure tests.

    python server.py [--host 127.0.0.1] [--port 0] [--watch-stdin] [--verbose]

Speaks the part of the ARM REST API a launcher needs (resource groups;
Microsoft.Network virtual networks, subnets, network security groups and
rules, public IP addresses, network interfaces; Microsoft.Compute proximity
placement groups, virtual machines, disks, VM sizes and resource SKUs), a
Microsoft identity platform token endpoint for service principals, and:

* every request checked against the official Azure SDK models of one API
  version per provider (arm_schema.py; the schema file setup.sh writes):
  api-version, unknown properties, wrong types, missing required
  properties, enumerations, read-only properties; each problem is
  answered as ARM answers it and counted (`GET /_fake/violations`);
* long-running operations (`Azure-AsyncOperation`, `Location`,
  `Retry-After`) that take `--op-polls` polls; paging with `nextLink`;
* faults per request (`POST /_fake/faults`): throttling, capacity, quota,
  authentication and authorization errors, synchronous or as a failed
  operation; capacity limits and SKU restrictions as settings;
* machines (machines.py): VMs on address pairs a real sshd listens on, the
  VM's SSH key in an authorized_keys file, and an instance metadata
  service with Scheduled Events (Spot evictions with a `Preempt` notice);
* kill points for gangway's fault sweep (`/_fake/kill`);
* the Retail Prices API (retail.py: `GET /api/retail/prices`, paged, no
  credentials) over a price sheet a test posts to `/_fake/retail`.

Standard library only. README.md has the details.
"""

import argparse
import copy
import http.server
import json
import logging
import os
import re
import secrets
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import arm_schema  # noqa: E402
import machines  # noqa: E402
import retail  # noqa: E402
from killpoints import kill_marked  # noqa: E402

log = logging.getLogger("azure-fake")
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_VENV = os.path.join(ROOT, "target", "azure-venv")

DEFAULT_SETTINGS = {
    "op_polls": 2,            # status polls an operation answers InProgress
    "op_auto_done_s": 5.0,    # an operation ends this long after it began, polled or not (<0: never)
    "retry_after": 1,         # Retry-After (seconds) on accepted operations and InProgress polls
    "page_size": 50,          # items per list page before a nextLink
    "eviction_notice_s": 30.0,  # a Preempt event's notice (Azure gives at least 30 s)
    "strict_tokens": False,   # true: only tokens this fake issued are taken
    "retail_page_size": 1000,  # Retail Prices items per page (the real service's)
}

# ----- catalog ----------------------------------------------------------------------

LOCATIONS = {
    "eastus": ("East US", ["1", "2", "3"]),
    "westus2": ("West US 2", ["1", "2", "3"]),
    "southcentralus": ("South Central US", ["1", "2", "3"]),
    "westeurope": ("West Europe", ["1", "2", "3"]),
    "northcentralus": ("North Central US", []),
}

# name: (vCPUs, memory GiB, GPUs, GPU, family, accelerated networking, resource disk MB,
#        max data disks, locations or None for all)
SIZES = {
    "Standard_ND96amsr_A100_v4": (96, 1900, 8, "A100 80GB", "standardNDAMSv4_A100Family", True,
                                  6291456, 16, ["eastus", "westus2", "southcentralus", "westeurope"]),
    "Standard_ND96asr_v4": (96, 900, 8, "A100", "standardNDASv4_A100Family", True, 6291456, 16,
                            ["eastus", "westus2", "southcentralus", "westeurope"]),
    "Standard_ND96isr_H100_v5": (96, 1900, 8, "H100", "standardNDSH100v5Family", True, 29296875, 32,
                                 ["eastus", "westeurope"]),
    "Standard_NC24ads_A100_v4": (24, 220, 1, "A100 80GB", "StandardNCADSA100v4Family", True,
                                 65536, 8, None),
    "Standard_NC6s_v3": (6, 112, 1, "V100", "standardNCSv3Family", False, 344064, 12, None),
    "Standard_NC4as_T4_v3": (4, 28, 1, "T4", "standardNCASv3_T4Family", True, 180224, 8, None),
    "Standard_D4s_v5": (4, 16, 0, None, "standardDSv5Family", True, 0, 8, None),
    "Standard_D2s_v5": (2, 8, 0, None, "standardDSv5Family", True, 0, 4, None),
    "Standard_B2s": (2, 4, 0, None, "standardBSFamily", False, 8192, 4, None),
}

COMPUTE, NETWORK = "Microsoft.Compute", "Microsoft.Network"

# kind: (provider, type segment, schema set, body model, LRO on PUT, LRO on DELETE)
# (LRO or not as each operation's x-ms-long-running-operation in the specification:
# the SDKs' begin_* methods.)
KINDS = {
    "vm": (COMPUTE, "virtualMachines", "compute", "VirtualMachine", True, True),
    "ppg": (COMPUTE, "proximityPlacementGroups", "compute", "ProximityPlacementGroup", False, False),
    "disk": (COMPUTE, "disks", "disks", "Disk", True, True),
    "vnet": (NETWORK, "virtualNetworks", "network", "VirtualNetwork", True, True),
    "nsg": (NETWORK, "networkSecurityGroups", "network", "NetworkSecurityGroup", True, True),
    "pip": (NETWORK, "publicIPAddresses", "network", "PublicIPAddress", True, True),
    "nic": (NETWORK, "networkInterfaces", "network", "NetworkInterface", True, True),
}
KIND_BY_TYPE = {(p.lower(), t.lower()): k for k, (p, t, *_rest) in KINDS.items()}
# child kind: (parent kind, segment, model, the parent's list property)
CHILDREN = {
    "subnet": ("vnet", "subnets", "Subnet", "subnets"),
    "rule": ("nsg", "securityRules", "SecurityRule", "securityRules"),
}
CHILD_BY_SEGMENT = {(c[0], c[1].lower()): k for k, c in CHILDREN.items()}

# Faults: kind -> (HTTP status, code, message template). {size}, {location}, {zone},
# {family}, {client}, {action}, {scope}, {cores} are filled in.
CAPACITY_MESSAGE = ("Allocation failed. We do not have sufficient capacity for the requested VM "
                    "size in this region. Read more about improving likelihood of allocation "
                    "success at http://aka.ms/allocation-guidance")
FAULT_KINDS = {
    "throttle": (429, "TooManyRequests", "The request is being throttled: too many requests for "
                 "this subscription in the current window. Retry after the time in the "
                 "Retry-After header."),
    "SkuNotAvailable": (409, "SkuNotAvailable", "The requested VM size for resource 'Following "
                        "SKUs have failed for Capacity Restrictions: {size}' is currently not "
                        "available in location '{location}'. Please try another size or deploy "
                        "to a different location or different zone. See "
                        "https://aka.ms/azureskunotavailable for details."),
    "AllocationFailed": (409, "AllocationFailed", CAPACITY_MESSAGE),
    "ZonalAllocationFailed": (409, "ZonalAllocationFailed", "Allocation failed. We do not have "
                              "sufficient capacity for the requested VM size in this zone. Read "
                              "more about improving likelihood of allocation success at "
                              "http://aka.ms/allocation-guidance"),
    "OverconstrainedAllocationRequest": (409, "OverconstrainedAllocationRequest", "Allocation "
                                         "failed. VM(s) with the following constraints cannot be "
                                         "allocated, because the condition is too restrictive. "
                                         "Please remove some constraints and try again. "
                                         "Constraints applied are:\n  - Proximity Placement "
                                         "Group\n  - VM Size\n"),
    "QuotaExceeded": (409, "QuotaExceeded", "Operation could not be completed as it results in "
                      "exceeding approved {family} Cores quota. Additional details - Deployment "
                      "Model: Resource Manager, Location: {location}, Current Limit: 0, Current "
                      "Usage: 0, Additional Required: {cores}, (Minimum) New Limit Required: "
                      "{cores}. Submit a request for Quota increase at https://aka.ms/"
                      "ProdportalCRP/#blade/Microsoft_Azure_Capacity/UsageAndQuota.ReactView"),
    "OperationNotAllowed": (409, "OperationNotAllowed", "Operation could not be completed as it "
                            "results in exceeding approved {family} Cores quota. Additional "
                            "details - Deployment Model: Resource Manager, Location: {location}, "
                            "Current Limit: 0, Current Usage: 0, Additional Required: {cores}, "
                            "(Minimum) New Limit Required: {cores}."),
    "InvalidAuthenticationToken": (401, "InvalidAuthenticationToken", "The access token is "
                                   "invalid."),
    "ExpiredAuthenticationToken": (401, "ExpiredAuthenticationToken", "The access token expiry "
                                   "UTC time is earlier than current UTC time."),
    "AuthorizationFailed": (403, "AuthorizationFailed", "The client '{client}' with object id "
                            "'{client}' does not have authorization to perform action '{action}' "
                            "over scope '{scope}' or the scope is invalid. If access was recently "
                            "granted, please refresh your credentials."),
    "InternalServerError": (500, "InternalServerError", "An internal server error occurred."),
    "ServiceUnavailable": (503, "ServiceUnavailable", "The service is temporarily unavailable."),
}
# The codes that fail an accepted VM creation later (the operation ends Failed).
ASYNC_CAPABLE = {"AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
                 "SkuNotAvailable", "QuotaExceeded", "OperationNotAllowed", "InternalServerError"}


def now_iso():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f0+00:00")


class ArmError(Exception):
    def __init__(self, status, code, message, target=None, details=None, headers=None,
                 violation=None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.target, self.details, self.headers = target, details, headers or {}
        self.violation = violation  # a kind: counted in /_fake/violations

    def body(self):
        error = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        if self.details:
            error["details"] = self.details
        return {"error": error}


class ControlError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def not_found(kind_type, name, rg):
    return ArmError(404, "ResourceNotFound",
                    f"The Resource '{kind_type}/{name}' under resource group '{rg}' was not "
                    "found. For more details please go to https://aka.ms/ARMResourceNotFoundFix")


def invalid(message, target=None, code="InvalidParameter", status=400):
    return ArmError(status, code, message, target=target)


def arm_id(sub, rg, provider, type_, name, child=None):
    out = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/{provider}/{type_}/{name}"
    if child:
        out += f"/{child[0]}/{child[1]}"
    return out


ID_RE = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/([^/]+)/([^/]+)/"
                   r"([^/]+)(?:/([^/]+)/([^/]+))?$", re.IGNORECASE)


def parse_id(value):
    m = ID_RE.match(value or "")
    if not m:
        return None
    sub, rg, prov, typ, name, ctype, cname = m.groups()
    return {"sub": sub, "rg": rg, "provider": prov, "type": typ, "name": name,
            "child_type": ctype, "child": cname}


def get_path(body, *keys):
    for k in keys:
        if not isinstance(body, dict):
            return None
        body = body.get(k)
    return body


class Op:
    """One long-running operation: its status URL answers InProgress for
    `polls` polls (or until `auto_done_s`), then Succeeded or Failed."""

    def __init__(self, emu, sub, provider, location, api_version, done, error=None, failed=None):
        self.id = str(uuid.uuid4())
        self.sub, self.provider, self.location = sub, provider, location
        self.api_version = api_version
        self.status = "InProgress"
        self.polls_left = emu.settings["op_polls"]
        self.started = time.monotonic()
        self.start_time = now_iso()
        self.end_time = None
        self.error = error          # {"code", "message"}: ends Failed
        self.on_done, self.on_failed = done, failed
        self.polls = 0

    def finish(self):
        if self.status != "InProgress":
            return
        self.end_time = now_iso()
        if self.error:
            self.status = "Failed"
            if self.on_failed:
                self.on_failed(self)
        else:
            self.status = "Succeeded"
            if self.on_done:
                self.on_done(self)

    def render(self):
        out = {"name": self.id, "status": self.status, "startTime": self.start_time}
        if self.end_time:
            out["endTime"] = self.end_time
        if self.status == "Failed":
            out["error"] = dict(self.error)
        return out


class Fake:
    def __init__(self, schema, settings):
        self.schema = schema
        self.settings = dict(DEFAULT_SETTINGS, **settings)
        self.lock = threading.RLock()
        self.machines = machines.Machines(self)
        self.kill = KillPoints()
        self.retail = retail.Retail(self)
        self.reset()

    def reset(self):
        with self.lock:
            self.groups = {}      # (sub, rg) lower -> group dict
            self.res = {}         # (kind, sub, rg, name) lower -> resource dict
            self.ops = {}         # id -> Op
            self.violations = []
            self.rules = []
            self.fired = []
            self.next_rule = 1
            self.capacity = []    # [{location, zone, size, available, code}]
            self.restrictions = []  # [{location, size, zones, reasonCode}]
            self.identities = {}  # (tenant, client_id) -> secret
            self.tokens = {}      # token -> {tenant, client_id, expires}
            self.evicted = []
            self.counter = 0
        self.machines.reset()
        self.kill.disarm()
        self.retail.reset()

    # ----- bookkeeping --------------------------------------------------------

    def violation(self, kind, method, path, message):
        with self.lock:
            self.violations.append({"kind": kind, "method": method, "path": path,
                                    "message": message, "time": now_iso()})
        log.warning("violation (%s) %s %s: %s", kind, method, path, message)

    def next(self):
        with self.lock:
            self.counter += 1
            return self.counter

    def tick(self):
        limit = self.settings["op_auto_done_s"]
        if limit is None or limit < 0:
            return
        with self.lock:
            due = [op for op in self.ops.values()
                   if op.status == "InProgress" and time.monotonic() - op.started >= limit]
            for op in due:
                op.finish()

    def start_op(self, sub, provider, location, api_version, done, error=None, failed=None):
        op = Op(self, sub, provider, location, api_version, done, error, failed)
        with self.lock:
            self.ops[op.id] = op
            if op.polls_left <= 0:
                op.finish()
        return op

    def poll(self, op_id):
        with self.lock:
            op = self.ops.get(op_id)
            if op is None:
                return None
            op.polls += 1
            if op.status == "InProgress":
                if op.polls_left > 0:
                    op.polls_left -= 1
                else:
                    op.finish()
            return op

    # ----- lookups ------------------------------------------------------------

    def group(self, sub, rg):
        return self.groups.get((sub.lower(), rg.lower()))

    def need_group(self, sub, rg):
        group = self.group(sub, rg)
        if group is None:
            raise ArmError(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
        return group

    def get(self, kind, sub, rg, name):
        return self.res.get((kind, sub.lower(), rg.lower(), name.lower()))

    def by_id(self, value, kind=None):
        parsed = parse_id(value)
        if not parsed or parsed["child_type"]:
            return None
        found_kind = KIND_BY_TYPE.get((parsed["provider"].lower(), parsed["type"].lower()))
        if found_kind is None or (kind and found_kind != kind):
            return None
        return self.get(found_kind, parsed["sub"], parsed["rg"], parsed["name"])

    def child_by_id(self, value, child_kind):
        parsed = parse_id(value)
        if not parsed or not parsed["child_type"]:
            return None, None
        parent_kind, segment, _model, prop = CHILDREN[child_kind]
        if parsed["child_type"].lower() != segment.lower():
            return None, None
        parent = self.get(parent_kind, parsed["sub"], parsed["rg"], parsed["name"])
        if parent is None:
            return None, None
        for child in parent["body"]["properties"].get(prop, []):
            if child["name"].lower() == parsed["child"].lower():
                return parent, child
        return parent, None

    def live_vms(self):
        return [r for r in self.res.values() if r["kind"] == "vm"]

    # ----- rendering ----------------------------------------------------------

    def render(self, res):
        body = copy.deepcopy(res["body"])
        props = body.setdefault("properties", {})
        if res["kind"] != "ppg":  # (the PPG model has no provisioningState)
            props["provisioningState"] = res["state"]
        if res["kind"] == "nic" and res.get("vm"):
            props["virtualMachine"] = {"id": res["vm"]}
        if res["kind"] == "disk":
            props["diskState"] = "Attached" if res.get("vm") else "Unattached"
            if res.get("vm"):
                body["managedBy"] = res["vm"]
        if res["kind"] == "pip" and res.get("nic_ipconfig"):
            props["ipConfiguration"] = {"id": res["nic_ipconfig"]}
        if res["kind"] == "ppg":
            props["virtualMachines"] = [{"id": vm["id"]} for vm in self.live_vms()
                                        if (vm.get("ppg") or "").lower() == res["id"].lower()]
        if res["kind"] == "vm":
            props["vmId"] = res["vm_id"]
            props["timeCreated"] = res["created"]
        return body

    # ----- faults -------------------------------------------------------------

    def add_rule(self, spec):
        if not isinstance(spec, dict):
            raise ControlError(400, "a fault rule is a JSON object")
        known = {"method", "type", "name", "location", "zone", "size", "error", "status", "code",
                 "message", "async", "times", "retry_after", "path"}
        unknown = set(spec) - known
        if unknown:
            raise ControlError(400, f"unknown fields {sorted(unknown)}; known: {sorted(known)}")
        error = spec.get("error")
        if error is None and not spec.get("code"):
            raise ControlError(400, '"error" (one of ' + ", ".join(sorted(FAULT_KINDS)) +
                               ') or "code" with "status" is required')
        if error is not None and error not in FAULT_KINDS:
            raise ControlError(400, f"unknown error {error!r}; known: {sorted(FAULT_KINDS)}")
        status, code, message = FAULT_KINDS.get(error, (None, None, None))
        rule = {
            "method": (spec.get("method") or "*").upper(),
            "type": spec.get("type"), "name": spec.get("name"), "path": spec.get("path"),
            "location": spec.get("location"), "zone": spec.get("zone"), "size": spec.get("size"),
            "error": error,
            "status": int(spec.get("status") or status or 500),
            "code": spec.get("code") or code,
            "message": spec.get("message") or message or spec.get("code"),
            "async": bool(spec.get("async")),
            "times": int(spec.get("times", 1)),
            "retry_after": spec.get("retry_after"),
        }
        if rule["async"] and rule["code"] not in ASYNC_CAPABLE:
            raise ControlError(400, f'"async" fails an accepted operation; only for {sorted(ASYNC_CAPABLE)}')
        with self.lock:
            rule["id"] = self.next_rule
            self.next_rule += 1
            rule["fired"] = 0
            self.rules.append(rule)
            return dict(rule, remaining=rule["times"])

    def take_rule(self, ctx, async_ok):
        """The first matching rule (its use counted), or None."""
        with self.lock:
            for rule in self.rules:
                if rule["times"] == 0:
                    continue
                if rule["method"] not in ("*", ctx["method"]):
                    continue
                if rule["type"] and rule["type"].lower() != (ctx.get("type") or "").lower():
                    continue
                if rule["name"] and rule["name"].lower() != (ctx.get("name") or "").lower():
                    continue
                if rule["path"] and rule["path"].lower() not in ctx["path"].lower():
                    continue
                for field in ("location", "zone", "size"):
                    if rule[field] and str(rule[field]).lower() != str(ctx.get(field) or "").lower():
                        break
                else:
                    if rule["async"] and not async_ok:
                        continue
                    if rule["times"] > 0:
                        rule["times"] -= 1
                    rule["fired"] += 1
                    self.fired.append({"rule": rule["id"], "method": ctx["method"],
                                       "path": ctx["path"], "code": rule["code"],
                                       "async": rule["async"], "time": now_iso()})
                    return rule
        return None

    def fault_error(self, rule, ctx):
        values = {
            "size": ctx.get("size") or "", "location": ctx.get("location") or "",
            "zone": ctx.get("zone") or "", "family": ctx.get("family") or "Total Regional",
            "cores": ctx.get("cores") or 0, "client": ctx.get("client") or "unknown",
            "action": ctx.get("action") or "", "scope": ctx["path"],
        }
        try:
            message = rule["message"].format(**values)
        except (KeyError, IndexError, ValueError):
            message = rule["message"]
        headers = {}
        if rule["status"] == 429:
            headers["Retry-After"] = str(rule["retry_after"] if rule["retry_after"] is not None
                                         else max(1, self.settings["retry_after"]))
            rw = "writes" if ctx["method"] in ("PUT", "DELETE", "POST", "PATCH") else "reads"
            headers[f"x-ms-ratelimit-remaining-subscription-{rw}"] = "0"
            if ctx.get("provider") == COMPUTE:
                headers["x-ms-ratelimit-remaining-resource"] = \
                    "Microsoft.Compute/PutVM3Min;0,Microsoft.Compute/PutVM30Min;0"
        if rule["status"] == 401:
            headers["WWW-Authenticate"] = ('Bearer authorization_uri="https://login.windows.net/'
                                           'common", error="invalid_token", '
                                           f'error_description="{message}"')
        return ArmError(rule["status"], rule["code"], message, headers=headers)


# ----- kill points (the fault sweep) ----------------------------------------------


class KillPoints:
    """The fault sweep's kill points, as in the GCE fake: once armed, ARM
    requests (not /_fake/, token or metadata ones) are numbered 1, 2, ...;
    request k's arrival is point 2k-1 and its return point 2k. At point
    `at`, every process whose environment has the entry `marker` is
    SIGKILLed, once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.state = None

    def arm(self, spec):
        unknown = set(spec) - {"at", "marker"}
        if unknown:
            raise ControlError(400, f"unknown fields {sorted(unknown)}; known: at, marker")
        at, marker = spec.get("at", 0), spec.get("marker", "")
        if not isinstance(at, int) or isinstance(at, bool) or at < 0:
            raise ControlError(400, '"at" is a kill point (1, 2, ...), or 0 to count only')
        if not isinstance(marker, str) or (at > 0 and "=" not in marker):
            raise ControlError(400, '"marker" is an environment entry KEY=VALUE')
        with self.lock:
            self.state = {"at": at, "marker": marker, "requests": 0, "fired": None}
            return self.view_locked()

    def view_locked(self):
        if self.state is None:
            return {"at": None, "requests": 0, "points": 0, "fired": None}
        return {**self.state, "points": 2 * self.state["requests"]}

    def view(self):
        with self.lock:
            return self.view_locked()

    def disarm(self):
        with self.lock:
            removed, self.state = self.state is not None, None
            return int(removed)

    def arrive(self):
        with self.lock:
            if self.state is None:
                return None
            self.state["requests"] += 1
            k = self.state["requests"]
            return k, self._take(2 * k - 1)

    def returning(self, k):
        with self.lock:
            return self.state is not None and self._take(2 * k)

    def _take(self, point):
        if self.state["fired"] is None and self.state["at"] == point:
            self.state["fired"] = {"point": point}
            return True
        return False

    def fire(self, request, when, what):
        with self.lock:
            state = self.state
            state["fired"].update({"request": request, "when": when, "call": what})
        killed = kill_marked(state["marker"])
        log.info("kill point: %s of request %s (%s): killed %s", when, request, what, killed)
        with self.lock:
            state["fired"]["killed"] = killed


# ----- the ARM API -----------------------------------------------------------------

S = r"/subscriptions/(?P<sub>[^/]+)"
RG = S + r"/resourcegroups/(?P<rg>[^/]+)"
TYPED = RG + r"/providers/(?P<prov>[^/]+)/(?P<type>[^/]+)"
ROUTES = [(re.compile("^" + rx + "$", re.IGNORECASE), name) for rx, name in [
    (r"/subscriptions", "subscriptions"),
    (S, "subscription"),
    (S + r"/resourcegroups", "rg_list"),
    (RG, "rg"),
    (S + r"/operationresults/(?P<op>[^/]+)", "rg_op"),
    (S + r"/providers/(?P<prov>microsoft\.(?:compute|network))/locations/(?P<loc>[^/]+)/"
         r"(?P<which>operations|operationresults)/(?P<op>[^/]+)", "op"),
    (S + r"/providers/microsoft\.compute/locations/(?P<loc>[^/]+)/vmsizes", "vmsizes"),
    (S + r"/providers/microsoft\.compute/skus", "skus"),
    (S + r"/providers/(?P<prov>[^/]+)/(?P<type>[^/]+)", "sub_list"),
    (TYPED, "rg_type_list"),
    (TYPED + r"/(?P<name>[^/]+)", "resource"),
    (TYPED + r"/(?P<name>[^/]+)/(?P<ctype>[^/]+)", "child_list"),
    (TYPED + r"/(?P<name>[^/]+)/(?P<ctype>[^/]+)/(?P<cname>[^/]+)", "child"),
]]
SUBSCRIPTION_API_VERSIONS = ("2022-12-01", "2021-01-01", "2020-01-01")
VM_ACTIONS = {"start", "poweroff", "deallocate", "restart"}


class Arm:
    def __init__(self, fake):
        self.fake = fake
        self.schema = fake.schema

    # ----- identity (Microsoft identity platform) -----------------------------

    def identity(self, method, url, raw, base):
        """Token endpoint and the discovery documents MSAL-style clients
        read first; None when the path is none of those."""
        path = url.path
        m = re.match(r"^/([^/]+)/oauth2/v2\.0/token$", path)
        if m and method == "POST":
            return self.token(m.group(1), raw)
        m = re.match(r"^/([^/]+)/v2\.0/\.well-known/openid-configuration$", path)
        if m and method == "GET":
            tenant = m.group(1)
            return 200, {
                "token_endpoint": f"{base}/{tenant}/oauth2/v2.0/token",
                "authorization_endpoint": f"{base}/{tenant}/oauth2/v2.0/authorize",
                "issuer": f"{base}/{tenant}/v2.0",
                "jwks_uri": f"{base}/{tenant}/discovery/v2.0/keys",
                "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt",
                                                          "client_secret_basic"],
                "response_types_supported": ["code", "id_token", "token"],
                "tenant_region_scope": "NA",
            }, {}
        if path == "/common/discovery/instance" and method == "GET":
            host = base.split("//", 1)[1]
            return 200, {"tenant_discovery_endpoint": f"{base}/common/v2.0/.well-known/openid-configuration",
                         "api-version": "1.1",
                         "metadata": [{"preferred_network": host, "preferred_cache": host,
                                       "aliases": [host]}]}, {}
        return None

    @staticmethod
    def aad_error(status, error, code, description):
        return status, {"error": error, "error_description": f"AADSTS{code}: {description}",
                        "error_codes": [code], "timestamp": datetime.now(timezone.utc)
                        .strftime("%Y-%m-%d %H:%M:%SZ"), "trace_id": str(uuid.uuid4()),
                        "correlation_id": str(uuid.uuid4())}, {}

    def token(self, tenant, raw):
        form = dict(urllib.parse.parse_qsl(raw.decode("utf-8", "replace")))
        fake = self.fake
        rule = fake.take_rule({"method": "POST", "path": f"/{tenant}/oauth2/v2.0/token",
                               "type": "token"}, False)
        if rule is not None:
            return self.aad_error(rule["status"], "invalid_client", 7000215,
                                  rule["message"] or "Invalid client secret provided.")
        if form.get("grant_type") != "client_credentials":
            return self.aad_error(400, "unsupported_grant_type", 70003,
                                  "The app requested an unsupported grant type "
                                  f"'{form.get('grant_type', '')}'.")
        client = form.get("client_id")
        if not client:
            return self.aad_error(400, "invalid_request", 900144,
                                  "The request body must contain the following parameter: 'client_id'.")
        scope = form.get("scope", "")
        if not scope.endswith("/.default"):
            return self.aad_error(400, "invalid_scope", 1002012,
                                  f"The provided value for scope {scope} is not valid. Client "
                                  "credential flows must have a scope value with /.default "
                                  "suffixed to the resource identifier (application ID URI).")
        secret = form.get("client_secret")
        assertion = form.get("client_assertion")
        if not secret and not assertion:
            return self.aad_error(401, "invalid_client", 7000216,
                                  "'client_assertion', 'client_secret' or 'request' is required "
                                  "for the 'client_credentials' grant type.")
        with fake.lock:
            registered = {c: s for (t, c), s in fake.identities.items() if t == tenant.lower()}
        if registered:
            if client.lower() not in registered:
                return self.aad_error(400, "unauthorized_client", 700016,
                                      f"Application with identifier '{client}' was not found in "
                                      f"the directory '{tenant}'.")
            if secret is not None and registered[client.lower()] != secret:
                return self.aad_error(401, "invalid_client", 7000215,
                                      "Invalid client secret provided. Ensure the secret being "
                                      "sent in the request is the client secret value, not the "
                                      f"client secret ID, for a secret added to app '{client}'.")
        token = "fake-arm-" + secrets.token_urlsafe(24)
        with fake.lock:
            fake.tokens[token] = {"tenant": tenant, "client_id": client,
                                  "expires": time.time() + 3599}
        return 200, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599,
                     "access_token": token}, {}

    # ----- dispatch ------------------------------------------------------------

    def route(self, path):
        for rx, name in ROUTES:
            m = rx.match(path)
            if m:
                return name, m.groupdict()
        return None, {}

    def handle(self, method, url, raw, headers, base):
        fake = self.fake
        path = url.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        name, g = self.route(path)
        client = self.authenticate(headers)
        if name is None:
            raise ArmError(404, "InvalidResourceType", f"The resource path '{path}' is not one the "
                           "fake (or ARM) knows.", violation="route")
        ctx = {"method": method, "path": path, "query": query, "base": base, "client": client,
               "g": g, "route": name}
        set_name, kind, model = self.classify(name, g, method, ctx)
        self.check_api_version(set_name, query, ctx)
        body = None
        if method in ("PUT", "PATCH") or (method == "POST" and raw.strip()):
            body = self.parse_body(raw, method, path)
            if method == "PUT" and model:
                self.check_body(set_name, model, body, method, path)
        self.fill_context(ctx, kind, body)
        async_ok = method == "PUT" and kind == "vm" and name == "resource"
        rule = fake.take_rule(ctx, async_ok)
        if rule is not None and not rule["async"]:
            raise fake.fault_error(rule, ctx)
        ctx["async_error"] = fake.fault_error(rule, ctx) if rule is not None else None
        handler = getattr(self, "h_" + name)
        status, out, hdrs = handler(ctx, kind, body)
        if out is not None and method in ("GET", "PUT") and model and status in (200, 201):
            self.check_answer(set_name, name, model, out, path)
        return status, out, hdrs

    def authenticate(self, headers):
        value = headers.get("Authorization")
        if not value:
            raise ArmError(401, "AuthenticationFailed", "Authentication failed. The "
                           "'Authorization' header is missing.", violation="auth")
        if not value.startswith("Bearer ") or not value[7:].strip():
            raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.",
                           violation="auth")
        token = value[7:].strip()
        with self.fake.lock:
            known = self.fake.tokens.get(token)
        if known is None:
            if self.fake.settings["strict_tokens"]:
                raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.",
                               headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
            return "00000000-0000-0000-0000-000000000000"
        if known["expires"] < time.time():
            raise ArmError(401, "ExpiredAuthenticationToken", "The access token expiry UTC time "
                           "is earlier than current UTC time.")
        return known["client_id"]

    def classify(self, name, g, method, ctx):
        """(schema set, kind, body model) of a route."""
        if name in ("subscription", "subscriptions"):
            ctx["type"] = "subscriptions"
            return "subscriptions", None, None
        if name in ("rg", "rg_list", "rg_op"):
            ctx["type"] = "resourceGroups"
            return "resources", "rg", "ResourceGroup" if name == "rg" else None
        if name == "op":
            ctx["type"] = "operations"
            ctx["provider"] = COMPUTE if g["prov"].lower() == "microsoft.compute" else NETWORK
            return ("compute" if ctx["provider"] == COMPUTE else "network"), None, None
        if name == "vmsizes":
            ctx["type"], ctx["provider"] = "vmSizes", COMPUTE
            return "compute", None, None
        if name == "skus":
            ctx["type"], ctx["provider"] = "skus", COMPUTE
            return "skus", None, None
        kind = KIND_BY_TYPE.get((g["prov"].lower(), g["type"].lower()))
        if kind is None:
            raise ArmError(404, "InvalidResourceType", f"The resource type '{g['type']}' could "
                           f"not be found in the namespace '{g['prov']}' for api version "
                           f"'{ctx['query'].get('api-version', '')}'.", violation="route")
        provider, type_, set_name, model, _put_lro, _del_lro = KINDS[kind]
        ctx["provider"], ctx["type"] = provider, type_
        if name in ("child", "child_list"):
            if kind == "vm" and name == "child_list" and g["ctype"].lower() == "instanceview":
                ctx["route"] = "instance_view"
                return set_name, kind, None
            if kind == "vm" and name == "child_list" and g["ctype"].lower() in VM_ACTIONS:
                ctx["route"] = "vm_action"
                return set_name, kind, None
            child = CHILD_BY_SEGMENT.get((kind, g["ctype"].lower()))
            if child is None:
                raise ArmError(404, "InvalidResourceType", f"The resource type "
                               f"'{type_}/{g['ctype']}' could not be found in the namespace "
                               f"'{provider}'.", violation="route")
            ctx["child_kind"] = child
            ctx["type"] = f"{type_}/{CHILDREN[child][1]}"
            return set_name, kind, CHILDREN[child][2] if name == "child" else None
        return set_name, kind, model if name == "resource" else None

    def check_api_version(self, set_name, query, ctx):
        given = query.get("api-version")
        if given is None:
            raise ArmError(400, "MissingApiVersionParameter", "The api-version query parameter "
                           "(?api-version=) is required for all requests.",
                           violation="api-version")
        if set_name == "subscriptions":
            wanted = SUBSCRIPTION_API_VERSIONS
        else:
            wanted = (self.schema.api_version(set_name),)
        if given not in wanted:
            if set_name == "resources" or set_name == "subscriptions":
                raise ArmError(400, "InvalidApiVersionParameter", f"The api-version '{given}' is "
                               f"invalid. The supported versions are '{', '.join(wanted)}'.",
                               violation="api-version")
            raise ArmError(400, "NoRegisteredProviderFound", "No registered resource provider "
                           f"found for API version '{given}' and type '{ctx.get('type')}'. The "
                           f"supported api-versions (in this fake) are '{', '.join(wanted)}'.",
                           violation="api-version")

    def parse_body(self, raw, method, path):
        if not raw.strip():
            raise ArmError(400, "InvalidRequestContent", "The request content was invalid and "
                           "could not be deserialized: 'the body is empty'.", violation="body")
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise ArmError(400, "InvalidRequestContent", "The request content was invalid and "
                           f"could not be deserialized: '{err}'.", violation="body")
        if not isinstance(body, dict):
            raise ArmError(400, "InvalidRequestContent", "The request content was invalid and "
                           "could not be deserialized: 'the body is not a JSON object'.",
                           violation="body")
        return body

    def check_body(self, set_name, model, body, method, path):
        problems = self.schema.check(set_name, model, body)
        refused = []
        for kind, where, message in problems:
            self.fake.violation(kind, method, path, f"{where}: {message}")
            if kind != "readonly":
                refused.append((kind, where, message))
        if not refused:
            return
        kind, where, message = refused[0]
        details = [{"code": "InvalidRequestContent" if k in ("unknown", "type", "required")
                    else "InvalidParameter", "target": w, "message": m} for k, w, m in refused]
        if kind in ("unknown", "type", "required"):
            if kind == "required" and where == "location":
                raise ArmError(400, "LocationRequired", "The location property is required for "
                               "this definition.", details=details)
            raise ArmError(400, "InvalidRequestContent", "The request content was invalid and "
                           f"could not be deserialized: '{message}'", details=details)
        raise ArmError(400, "InvalidParameter", message, target=where, details=details)

    def check_answer(self, set_name, route, model, out, path):
        """The fake's own answers against the same models: a problem is an
        emulator bug (logged; the answer still goes out)."""
        items = out.get("value", []) if route.endswith("list") else [out]
        for item in items:
            for kind, where, message in self.schema.check(set_name, model, item, request=False):
                log.error("emulator bug: answer to %s does not fit %s: %s: %s", path, model,
                          where, message)

    def fill_context(self, ctx, kind, body):
        g = ctx["g"]
        ctx["name"] = g.get("cname") or g.get("name") or g.get("rg")
        loc = g.get("loc") or (body or {}).get("location")
        if not loc and kind in KINDS and g.get("name"):
            res = self.fake.get(kind, g["sub"], g["rg"], g["name"])
            loc = res and res["body"].get("location")
        ctx["location"] = loc
        zones = (body or {}).get("zones")
        ctx["zone"] = zones[0] if isinstance(zones, list) and zones else None
        size = get_path(body, "properties", "hardwareProfile", "vmSize")
        ctx["size"] = size
        spec = SIZES.get(size) if isinstance(size, str) else None
        if spec:
            ctx["cores"] = spec[0]
            spot = str(get_path(body, "properties", "priority") or "").lower() in ("spot", "low")
            ctx["family"] = "Low Priority" if spot else spec[4]
        verb = {"GET": "read", "HEAD": "read", "PUT": "write", "PATCH": "write",
                "DELETE": "delete", "POST": "action"}[ctx["method"]]
        ctx["action"] = f"{ctx.get('provider') or 'Microsoft.Resources'}/{ctx.get('type')}/{verb}"

    # ----- helpers -------------------------------------------------------------

    def lro_headers(self, ctx, op, provider, location, api_version, location_header):
        sub = ctx["g"]["sub"]
        base = ctx["base"]
        retry = str(self.fake.settings["retry_after"])
        if provider is None:  # resource groups
            return {"Location": f"{base}/subscriptions/{sub}/operationresults/{op.id}"
                                f"?api-version={api_version}", "Retry-After": retry}
        status_url = (f"{base}/subscriptions/{sub}/providers/{provider}/locations/{location}/"
                      f"operations/{op.id}?api-version={api_version}")
        out = {"Azure-AsyncOperation": status_url, "Retry-After": retry}
        if location_header:
            if provider == COMPUTE:
                out["Location"] = status_url + "&monitor=true"
            else:
                out["Location"] = (f"{base}/subscriptions/{sub}/providers/{provider}/locations/"
                                   f"{location}/operationResults/{op.id}?api-version={api_version}")
        return out

    def page(self, ctx, items):
        size = max(1, int(self.fake.settings["page_size"]))
        try:
            start = int(ctx["query"].get("$skiptoken", "0"))
        except ValueError:
            raise ArmError(400, "InvalidSkipToken", "The $skiptoken is not one this list gave.")
        out = {"value": items[start:start + size]}
        if start + size < len(items):
            q = {k: v for k, v in ctx["query"].items() if k != "$skiptoken"}
            q["$skiptoken"] = str(start + size)
            out["nextLink"] = f"{ctx['base']}{ctx['path']}?{urllib.parse.urlencode(q)}"
        return 200, out, {}

    def need_location(self, location, what):
        if not isinstance(location, str) or location.lower() not in LOCATIONS:
            raise ArmError(400, "LocationNotAvailableForResourceType", f"The provided location "
                           f"'{location}' is not available for resource type '{what}'. List of "
                           f"available regions for the resource type is "
                           f"'{','.join(LOCATIONS)}'.")
        return location.lower()

    def etag(self):
        return f'W/"{uuid.uuid4()}"'

    # ----- subscriptions ---------------------------------------------------------

    def sub_doc(self, sub):
        return {"id": f"/subscriptions/{sub}", "subscriptionId": sub, "displayName": "gangway fake",
                "state": "Enabled", "tenantId": "00000000-0000-0000-0000-0000000000fa",
                "subscriptionPolicies": {"locationPlacementId": "Public_2014-09-01",
                                         "quotaId": "PayAsYouGo_2014-09-01", "spendingLimit": "Off"},
                "authorizationSource": "RoleBased"}

    def h_subscription(self, ctx, kind, body):
        return 200, self.sub_doc(ctx["g"]["sub"]), {}

    def h_subscriptions(self, ctx, kind, body):
        with self.fake.lock:
            subs = sorted({k[0] for k in self.fake.groups} | set(self.fake.machines.scopes))
        return 200, {"value": [self.sub_doc(s) for s in subs or ["00000000-0000-0000-0000-000000000001"]]}, {}

    # ----- resource groups -----------------------------------------------------

    def rg_doc(self, group):
        out = {"id": group["id"], "name": group["name"], "type": "Microsoft.Resources/resourceGroups",
               "location": group["location"], "properties": {"provisioningState": group["state"]}}
        if group["tags"] is not None:
            out["tags"] = dict(group["tags"])
        return out

    def h_rg(self, ctx, kind, body):
        fake, g, method = self.fake, ctx["g"], ctx["method"]
        sub, rg = g["sub"], g["rg"]
        with fake.lock:
            group = fake.group(sub, rg)
            if method == "PUT":
                location = body.get("location")
                if not isinstance(location, str) or location.lower() not in LOCATIONS:
                    raise ArmError(400, "LocationNotAvailableForResourceGroup", f"The provided "
                                   f"location '{location}' is not available for resource group. "
                                   f"List of available regions is '{','.join(LOCATIONS)}'.")
                if not re.match(r"^[-\w._()]{1,90}$", rg) or rg.endswith("."):
                    raise invalid(f"Resource group name '{rg}' is invalid.", code="InvalidResourceGroup")
                if group is not None:
                    if group["location"].lower() != location.lower():
                        raise ArmError(409, "InvalidResourceGroupLocation", f"Invalid resource "
                                       f"group location '{location}'. The Resource group already "
                                       f"exists in location '{group['location']}'.")
                    if group["state"] == "Deleting":
                        raise ArmError(409, "ResourceGroupBeingDeleted", f"The resource group "
                                       f"'{rg}' is in deprovisioning state and cannot perform "
                                       "this operation.")
                    group["tags"] = body.get("tags")
                    return 200, self.rg_doc(group), {}
                group = {"id": f"/subscriptions/{sub}/resourceGroups/{rg}", "name": rg, "sub": sub,
                         "location": location.lower(), "tags": body.get("tags"),
                         "state": "Succeeded", "created": now_iso()}
                fake.groups[(sub.lower(), rg.lower())] = group
                return 201, self.rg_doc(group), {}
            if group is None:
                if method == "HEAD":
                    return 404, None, {}
                raise ArmError(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
            if method == "HEAD":
                return 204, None, {}
            if method == "GET":
                return 200, self.rg_doc(group), {}
            if method == "DELETE":
                if group["state"] != "Deleting":
                    group["state"] = "Deleting"
                    for res in list(fake.res.values()):
                        if res["sub"].lower() == sub.lower() and res["rg"].lower() == rg.lower():
                            res["state"] = "Deleting"

                    def done(op, group=group):
                        self.delete_group_now(group)
                    group["op"] = fake.start_op(sub, None, group["location"],
                                                self.schema.api_version("resources"), done)
                op = group["op"]
                return 202, None, self.lro_headers(ctx, op, None, None,
                                                   self.schema.api_version("resources"), True)
        raise ArmError(405, "MethodNotAllowed", f"{method} is not allowed on a resource group.")

    def delete_group_now(self, group):
        fake = self.fake
        with fake.lock:
            mine = [r for r in fake.res.values() if r["sub"].lower() == group["sub"].lower()
                    and r["rg"].lower() == group["name"].lower()]
            for res in sorted(mine, key=lambda r: r["kind"] != "vm"):
                self.remove(res, cascade=False)
            fake.groups.pop((group["sub"].lower(), group["name"].lower()), None)

    def h_rg_list(self, ctx, kind, body):
        sub = ctx["g"]["sub"].lower()
        want = self.tag_filter(ctx["query"].get("$filter"))
        with self.fake.lock:
            groups = [self.rg_doc(g) for (s, _), g in sorted(self.fake.groups.items()) if s == sub]
        if want:
            groups = [g for g in groups if self.tags_match(g.get("tags") or {}, want)]
        return self.page(ctx, groups)

    @staticmethod
    def tag_filter(expr):
        """`tagName eq 'k'` or `tagName eq 'k' and tagValue eq 'v'` (ARM's
        only tag filters on these lists); None when no filter."""
        if not expr:
            return None
        m = re.match(r"^\s*tagName\s+eq\s+'([^']*)'(?:\s+and\s+tagValue\s+eq\s+'([^']*)')?\s*$",
                     expr, re.IGNORECASE)
        if not m:
            raise ArmError(400, "InvalidFilterInQueryString", f"Invalid $filter '{expr}' "
                           "specified in the query string.")
        return m.group(1), m.group(2)

    @staticmethod
    def tags_match(tags, want):
        key, value = want
        for k, v in tags.items():
            if k.lower() == key.lower() and (value is None or v == value):
                return True
        return False

    def h_rg_op(self, ctx, kind, body):
        op = self.fake.poll(ctx["g"]["op"])
        if op is None:
            raise ArmError(404, "OperationNotFound", "The operation was not found.")
        if op.status == "InProgress":
            return 202, None, {"Location": f"{ctx['base']}{ctx['path']}?api-version="
                                           f"{ctx['query']['api-version']}",
                               "Retry-After": str(self.fake.settings["retry_after"])}
        if op.status == "Failed":
            raise ArmError(409, op.error["code"], op.error["message"])
        return 200, None, {}

    # ----- operations ------------------------------------------------------------

    def h_op(self, ctx, kind, body):
        g = ctx["g"]
        op = self.fake.poll(g["op"])
        if op is None or op.sub.lower() != g["sub"].lower():
            raise ArmError(404, "NotFound", f"The operation '{g['op']}' was not found.")
        retry = {"Retry-After": str(self.fake.settings["retry_after"])}
        monitor = ctx["query"].get("monitor") == "true" or g["which"].lower() == "operationresults"
        if not monitor:
            return 200, op.render(), retry if op.status == "InProgress" else {}
        # The Location form: 202 while running, then the outcome itself.
        if op.status == "InProgress":
            return 202, None, dict(retry, Location=f"{ctx['base']}{ctx['path']}?"
                                                   f"{urllib.parse.urlencode(ctx['query'])}")
        if op.status == "Failed":
            raise ArmError(409, op.error["code"], op.error["message"])
        return (200, None, {}) if op.provider == COMPUTE else (204, None, {})

    # ----- catalog -------------------------------------------------------------------

    def sizes_in(self, location):
        return [n for n, s in SIZES.items() if s[8] is None or location in s[8]]

    def h_vmsizes(self, ctx, kind, body):
        location = self.need_location(ctx["g"]["loc"], "Microsoft.Compute/locations/vmSizes")
        out = []
        for name in self.sizes_in(location):
            s = SIZES[name]
            out.append({"name": name, "numberOfCores": s[0], "osDiskSizeInMB": 1047552,
                        "resourceDiskSizeInMB": s[6], "memoryInMB": s[1] * 1024,
                        "maxDataDiskCount": s[7]})
        return 200, {"value": out}, {}

    def restricted(self, location, size, zone=None):
        """The restriction that keeps `size` from `location` (or from
        `zone` there), or None."""
        with self.fake.lock:
            for r in self.fake.restrictions:
                if r["location"] != location or r["size"].lower() != size.lower():
                    continue
                if not r["zones"] or (zone is not None and zone in r["zones"]):
                    return r
        return None

    def h_skus(self, ctx, kind, body):
        where = None
        expr = ctx["query"].get("$filter")
        if expr:
            m = re.match(r"^\s*location\s+eq\s+'([^']+)'\s*$", expr, re.IGNORECASE)
            if not m:
                raise ArmError(400, "InvalidFilterInQueryString", f"Invalid $filter '{expr}': "
                               "only location eq 'NAME' is supported.")
            where = m.group(1).lower()
            if where not in LOCATIONS:
                return self.page(ctx, [])
        out = []
        for name, s in SIZES.items():
            for location in ([where] if where else list(LOCATIONS)):
                if name not in self.sizes_in(location):
                    continue
                zones = LOCATIONS[location][1]
                restrictions = []
                with self.fake.lock:
                    for r in self.fake.restrictions:
                        if r["location"] == location and r["size"].lower() == name.lower():
                            restrictions.append({
                                "type": "Zone" if r["zones"] else "Location",
                                "values": [location],
                                "restrictionInfo": {"locations": [location],
                                                    **({"zones": r["zones"]} if r["zones"] else {})},
                                "reasonCode": r["reasonCode"]})
                caps = [("MaxResourceVolumeMB", s[6]), ("OSVhdSizeMB", 1047552), ("vCPUs", s[0]),
                        ("MemoryGB", s[1]), ("MaxDataDiskCount", s[7]), ("LowPriorityCapable", "True"),
                        ("HyperVGenerations", "V1,V2" if not s[2] else "V2"),
                        ("vCPUsAvailable", s[0]), ("GPUs", s[2]),
                        ("AcceleratedNetworkingEnabled", "True" if s[5] else "False"),
                        ("RdmaEnabled", "True" if s[2] >= 8 else "False")]
                out.append({
                    "resourceType": "virtualMachines", "name": name, "tier": "Standard",
                    "size": name.split("_", 1)[1], "family": s[4], "locations": [location],
                    "locationInfo": [{"location": location, "zones": list(zones), "zoneDetails": []}],
                    "capabilities": [{"name": k, "value": str(v)} for k, v in caps],
                    "restrictions": restrictions,
                })
        return self.page(ctx, out)

    def set_restriction(self, spec):
        if not isinstance(spec, dict) or set(spec) - {"location", "size", "zones", "reasonCode", "clear"}:
            raise ControlError(400, 'a restriction is {"location", "size", "zones"?, "reasonCode"?} '
                               'or {"clear": true}')
        with self.fake.lock:
            if spec.get("clear"):
                self.fake.restrictions = []
                return {"restrictions": []}
            location = str(spec.get("location", "")).lower()
            if location not in LOCATIONS or spec.get("size") not in SIZES:
                raise ControlError(400, f"unknown location or size; locations {sorted(LOCATIONS)}, "
                                   f"sizes {sorted(SIZES)}")
            zones = [str(z) for z in spec.get("zones") or []]
            self.fake.restrictions.append({"location": location, "size": spec["size"],
                                           "zones": zones,
                                           "reasonCode": spec.get("reasonCode", "NotAvailableForSubscription")})
            return {"restrictions": list(self.fake.restrictions)}

    def set_capacity(self, spec):
        if not isinstance(spec, dict) or set(spec) - {"location", "zone", "size", "available", "code"}:
            raise ControlError(400, 'a capacity limit is {"location", "zone"?, "size"?, '
                               '"available": N|null, "code"?}')
        location = str(spec.get("location", "")).lower()
        if location not in LOCATIONS:
            raise ControlError(400, f"unknown location {spec.get('location')!r}")
        key = (location, spec.get("zone"), spec.get("size"))
        with self.fake.lock:
            self.fake.capacity = [c for c in self.fake.capacity
                                  if (c["location"], c["zone"], c["size"]) != key]
            if spec.get("available") is not None:
                if spec.get("code") and spec["code"] not in FAULT_KINDS:
                    raise ControlError(400, f"unknown code; known: {sorted(FAULT_KINDS)}")
                self.fake.capacity.append({"location": location, "zone": spec.get("zone"),
                                           "size": spec.get("size"),
                                           "available": int(spec["available"]),
                                           "code": spec.get("code")})
            return {"limits": list(self.fake.capacity)}

    # ----- typed resources: lists ----------------------------------------------------

    def h_sub_list(self, ctx, kind, body):
        sub = ctx["g"]["sub"].lower()
        with self.fake.lock:
            items = [self.render_for(r, ctx) for r in self.sorted_res(kind)
                     if r["sub"].lower() == sub]
        return self.page(ctx, items)

    def h_rg_type_list(self, ctx, kind, body):
        g = ctx["g"]
        with self.fake.lock:
            self.fake.need_group(g["sub"], g["rg"])
            items = [self.render_for(r, ctx) for r in self.sorted_res(kind)
                     if r["sub"].lower() == g["sub"].lower() and r["rg"].lower() == g["rg"].lower()]
        return self.page(ctx, items)

    def sorted_res(self, kind):
        return sorted((r for r in self.fake.res.values() if r["kind"] == kind),
                      key=lambda r: (r["rg"].lower(), r["name"].lower()))

    def render_for(self, res, ctx):
        out = self.fake.render(res)
        if res["kind"] == "vm" and (ctx["query"].get("$expand", "").lower() == "instanceview"
                                    or ctx["query"].get("statusOnly") == "true"):
            out["properties"]["instanceView"] = self.instance_view(res)
        if res["kind"] == "vm":
            os_profile = out["properties"].get("osProfile")
            if os_profile:
                os_profile.pop("adminPassword", None)
                os_profile.pop("customData", None)
        return out

    # ----- typed resources: one ---------------------------------------------------

    def h_resource(self, ctx, kind, body):
        fake, g, method = self.fake, ctx["g"], ctx["method"]
        with fake.lock:
            fake.need_group(g["sub"], g["rg"])
            res = fake.get(kind, g["sub"], g["rg"], g["name"])
            if method == "GET":
                if res is None:
                    raise not_found(f"{KINDS[kind][0]}/{KINDS[kind][1]}", g["name"], g["rg"])
                return 200, self.render_for(res, ctx), {}
            if method == "PUT":
                return self.put(ctx, kind, res, body)
            if method == "DELETE":
                if res is None:
                    return 204, None, {}
                return self.delete(ctx, res)
        raise ArmError(501, "NotImplementedInFake", f"{method} on {KINDS[kind][1]} is not emulated "
                       "(README.md lists what is)")

    def put(self, ctx, kind, res, body):
        fake, g = self.fake, ctx["g"]
        provider, type_, set_name, _model, put_lro, _ = KINDS[kind]
        group = fake.need_group(g["sub"], g["rg"])
        if group["state"] == "Deleting":
            raise ArmError(409, "ResourceGroupBeingDeleted", f"The resource group '{g['rg']}' is "
                           "in deprovisioning state and cannot perform this operation.")
        if res is not None and res["state"] == "Deleting":
            raise ArmError(409, "Conflict" if provider == COMPUTE else "AnotherOperationInProgress",
                           f"The resource '{g['name']}' is being deleted.")
        body = self.strip_readonly(set_name, KINDS[kind][3], body)
        location = self.need_location(body.get("location") or group["location"],
                                      f"{provider}/{type_}")
        body["location"] = location
        rid = arm_id(g["sub"], g["rg"], provider, type_, g["name"])
        new = res is None
        if new:
            res = {"kind": kind, "id": rid, "sub": g["sub"], "rg": g["rg"], "name": g["name"],
                   "state": "Creating"}
        elif res["body"].get("location") != location:
            raise invalid(f"Changing the location of '{rid}' is not allowed.",
                          code="LocationCannotBeChanged")
        stored = {"id": rid, "name": g["name"], "type": f"{provider}/{type_}", **body}
        if provider == NETWORK:
            stored["etag"] = self.etag()
            stored.setdefault("properties", {})["resourceGuid"] = \
                res.get("guid") or res.setdefault("guid", str(uuid.uuid4()))
        prepare = getattr(self, "prepare_" + kind)
        after = prepare(ctx, res, stored, new)
        res["body"] = stored
        res["state"] = ("Creating" if kind == "vm" and new else "Updating") if put_lro else "Succeeded"
        fake.res[(kind, g["sub"].lower(), g["rg"].lower(), g["name"].lower())] = res
        if after:
            after()
        if not put_lro:
            return (201 if new else 200), self.render_for(res, ctx), {}
        error = ctx.get("async_error")
        if kind == "vm" and error is None and new:
            error = self.capacity_error(ctx, res)
        error_body = {"code": error.code, "message": error.message} if error is not None else None

        def done(op, res=res):
            res["state"] = "Succeeded"
            if kind == "vm":
                self.vm_running(res)

        def failed(op, res=res):
            res["state"] = "Failed"
            res["failure"] = op.error
            if kind == "vm":
                self.vm_failed(res)
        op = fake.start_op(g["sub"], provider, location, self.schema.api_version(set_name),
                           done, error_body, failed)
        res["op"] = op.id
        headers = self.lro_headers(ctx, op, provider, location, self.schema.api_version(set_name),
                                   False)
        return (201 if new else 200), self.render_for(res, ctx), headers

    def strip_readonly(self, set_name, model, body):
        """The body without what ARM ignores (read-only properties), one
        level deep: what the fake stores and answers back."""
        body = copy.deepcopy(body)
        spec = self.schema.sets[set_name]["models"].get(model, {}).get("props", {})
        for key in list(body):
            if spec.get(key, {}).get("ro"):
                body.pop(key)
        props = spec.get("properties", {}).get("props", {})
        if isinstance(body.get("properties"), dict):
            for key in list(body["properties"]):
                if props.get(key, {}).get("ro"):
                    body["properties"].pop(key)
        return body

    def delete(self, ctx, res):
        fake = self.fake
        kind = res["kind"]
        provider, type_, set_name, _m, _p, del_lro = KINDS[kind]
        getattr(self, "can_delete_" + kind, lambda r: None)(res)
        if not del_lro:
            self.remove(res)
            return 200, None, {}
        if res["state"] != "Deleting" or not res.get("delete_op"):
            res["state"] = "Deleting"
            if kind == "vm":
                res["power"] = "stopping"

            def done(op, res=res):
                self.remove(res)
            op = fake.start_op(res["sub"], provider, res["body"]["location"],
                               self.schema.api_version(set_name), done)
            res["delete_op"] = op.id
        op = fake.ops[res["delete_op"]]
        return 202, None, self.lro_headers(ctx, op, provider, res["body"]["location"],
                                           self.schema.api_version(set_name), True)

    def remove(self, res, cascade=True):
        """Takes a resource away, with what goes with it."""
        fake = self.fake
        with fake.lock:
            key = (res["kind"], res["sub"].lower(), res["rg"].lower(), res["name"].lower())
            if fake.res.get(key) is not res:
                return
            fake.res.pop(key)
            if res["kind"] == "vm":
                self.vm_gone(res, cascade)
            elif res["kind"] == "nic":
                for pip in fake.res.values():
                    if pip["kind"] == "pip" and (pip.get("nic_ipconfig") or "").lower().startswith(
                            res["id"].lower() + "/"):
                        pip["nic_ipconfig"] = None

    # ----- children (subnets, security rules) ---------------------------------------

    def h_child_list(self, ctx, kind, body):
        if ctx["route"] == "instance_view":
            return self.h_instance_view(ctx, kind, body)
        if ctx["route"] == "vm_action":
            return self.h_vm_action(ctx, kind, body)
        g = ctx["g"]
        _pk, _seg, _model, prop = CHILDREN[ctx["child_kind"]]
        with self.fake.lock:
            self.fake.need_group(g["sub"], g["rg"])
            parent = self.fake.get(kind, g["sub"], g["rg"], g["name"])
            if parent is None:
                raise not_found(f"{KINDS[kind][0]}/{KINDS[kind][1]}", g["name"], g["rg"])
            items = copy.deepcopy(self.fake.render(parent)["properties"].get(prop, []))
        return self.page(ctx, items)

    def h_child(self, ctx, kind, body):
        fake, g, method = self.fake, ctx["g"], ctx["method"]
        child_kind = ctx["child_kind"]
        _pk, segment, model, prop = CHILDREN[child_kind]
        with fake.lock:
            fake.need_group(g["sub"], g["rg"])
            parent = fake.get(kind, g["sub"], g["rg"], g["name"])
            if parent is None:
                raise not_found(f"{KINDS[kind][0]}/{KINDS[kind][1]}", g["name"], g["rg"])
            children = parent["body"].setdefault("properties", {}).setdefault(prop, [])
            found = next((c for c in children if c["name"].lower() == g["cname"].lower()), None)
            if method == "GET":
                if found is None:
                    raise not_found(f"{KINDS[kind][0]}/{KINDS[kind][1]}/{segment}",
                                    f"{g['name']}/{g['cname']}", g["rg"])
                return 200, copy.deepcopy(found), {}
            api = self.schema.api_version("network")
            if method == "PUT":
                item = self.strip_readonly("network", model, body)
                item["name"] = g["cname"]
                item["id"] = f"{parent['id']}/{segment}/{g['cname']}"
                item["type"] = f"{KINDS[kind][0]}/{KINDS[kind][1]}/{segment}"
                item["etag"] = self.etag()
                item.setdefault("properties", {})["provisioningState"] = "Succeeded"
                if child_kind == "subnet":
                    self.check_subnet(item)
                else:
                    self.check_rule(item, children, found)
                if found is None:
                    children.append(item)
                else:
                    children[children.index(found)] = item
                op = fake.start_op(g["sub"], NETWORK, parent["body"]["location"], api, None)
                return (201 if found is None else 200), copy.deepcopy(item), \
                    self.lro_headers(ctx, op, NETWORK, parent["body"]["location"], api, False)
            if method == "DELETE":
                if found is None:
                    return 204, None, {}
                if child_kind == "subnet":
                    users = self.subnet_users(found["id"])
                    if users:
                        raise ArmError(400, "InUseSubnetCannotBeDeleted", f"Subnet "
                                       f"{g['cname']} is in use by {users[0]} and cannot be "
                                       "deleted. In order to delete the subnet, delete all the "
                                       "resources within the subnet. See aka.ms/deletesubnet.")

                def done(op, parent=parent, found=found):
                    items = parent["body"]["properties"].get(prop, [])
                    if found in items:
                        items.remove(found)
                op = fake.start_op(g["sub"], NETWORK, parent["body"]["location"], api, done)
                return 202, None, self.lro_headers(ctx, op, NETWORK, parent["body"]["location"],
                                                   api, True)
        raise ArmError(501, "NotImplementedInFake", f"{method} on {segment} is not emulated")

    def check_subnet(self, item):
        props = item["properties"]
        prefixes = props.get("addressPrefixes") or ([props["addressPrefix"]]
                                                    if props.get("addressPrefix") else [])
        if not prefixes:
            raise invalid(f"Subnet {item['name']} has no address prefix.", code="InvalidRequestFormat")
        for prefix in prefixes:
            if not re.match(r"^\d+\.\d+\.\d+\.\d+/\d+$", str(prefix)):
                raise invalid(f"Subnet {item['name']} has an invalid address prefix {prefix}.",
                              code="InvalidCIDRNotation")
        nsg = get_path(props, "networkSecurityGroup", "id")
        if nsg and self.fake.by_id(nsg, "nsg") is None:
            raise self.bad_reference(nsg, item["id"])

    def check_rule(self, item, children, found):
        props = item["properties"]
        for field in ("protocol", "access", "direction", "priority"):
            if props.get(field) is None:
                raise invalid(f"Security rule {item['name']} has no {field}; it is required.",
                              code="SecurityRuleParameterMissing" if field != "priority"
                              else "SecurityRuleInvalidPriority")
        if not 100 <= props["priority"] <= 4096:
            raise invalid(f"Security rule {item['name']} has invalid Priority. Value provided: "
                          f"{props['priority']}. Allowed range 100-4096.",
                          code="SecurityRuleInvalidPriority")
        for other in children:
            if other is found or other["name"] == item["name"]:
                continue
            o = other["properties"]
            if o.get("priority") == props["priority"] and \
                    str(o.get("direction")).lower() == str(props["direction"]).lower():
                raise invalid(f"Security rule {other['name']} conflicts with rule {item['name']}. "
                              "Rules cannot have the same Priority and Direction.",
                              code="SecurityRuleConflict")

    def subnet_users(self, subnet_id):
        out = []
        for nic in self.fake.res.values():
            if nic["kind"] != "nic":
                continue
            for cfg in nic["body"]["properties"].get("ipConfigurations", []):
                if (get_path(cfg, "properties", "subnet", "id") or "").lower() == subnet_id.lower():
                    out.append(cfg["id"])
        return out

    def bad_reference(self, ref, by):
        return ArmError(400, "InvalidResourceReference", f"Resource {ref} referenced by resource "
                        f"{by} was not found. Please make sure that the referenced resource exists, "
                        "and that both resources are in the same region.")

    # ----- network resources ----------------------------------------------------------

    def prepare_vnet(self, ctx, res, stored, new):
        props = stored.setdefault("properties", {})
        prefixes = get_path(props, "addressSpace", "addressPrefixes")
        if not prefixes:
            raise invalid("The virtual network has no address space.", code="InvalidAddressSpace")
        old = {c["name"].lower(): c for c in (res.get("body") or {}).get("properties", {})
               .get("subnets", [])}
        for subnet in props.get("subnets", []) or []:
            if not subnet.get("name"):
                raise invalid("A subnet in the request has no name.", code="InvalidRequestFormat")
            subnet["id"] = f"{stored['id']}/subnets/{subnet['name']}"
            subnet["type"] = "Microsoft.Network/virtualNetworks/subnets"
            subnet["etag"] = self.etag()
            subnet.setdefault("properties", {})["provisioningState"] = "Succeeded"
            self.check_subnet(subnet)
            old.pop(subnet["name"].lower(), None)
        for gone in old.values():
            users = self.subnet_users(gone["id"])
            if users:
                raise ArmError(400, "InUseSubnetCannotBeDeleted", f"Subnet {gone['name']} is in "
                               f"use by {users[0]} and cannot be deleted. In order to delete the "
                               "subnet, delete all the resources within the subnet. See "
                               "aka.ms/deletesubnet.")
        return None

    def can_delete_vnet(self, res):
        for subnet in res["body"]["properties"].get("subnets", []):
            users = self.subnet_users(subnet["id"])
            if users:
                raise ArmError(400, "InUseSubnetCannotBeDeleted", f"Subnet {subnet['name']} is in "
                               f"use by {users[0]} and cannot be deleted. In order to delete the "
                               "subnet, delete all the resources within the subnet. See "
                               "aka.ms/deletesubnet.")

    def prepare_nsg(self, ctx, res, stored, new):
        props = stored.setdefault("properties", {})
        rules = props.get("securityRules", []) or []
        for rule in rules:
            if not rule.get("name"):
                raise invalid("A security rule in the request has no name.", code="InvalidRequestFormat")
            rule["id"] = f"{stored['id']}/securityRules/{rule['name']}"
            rule["type"] = "Microsoft.Network/networkSecurityGroups/securityRules"
            rule["etag"] = self.etag()
            rule.setdefault("properties", {})["provisioningState"] = "Succeeded"
        for i, rule in enumerate(rules):
            self.check_rule(rule, rules[:i], None)
        return None

    def can_delete_nsg(self, res):
        users = []
        for other in self.fake.res.values():
            if other["kind"] == "nic" and (get_path(other["body"], "properties", "networkSecurityGroup",
                                                    "id") or "").lower() == res["id"].lower():
                users.append(other["id"])
            if other["kind"] == "vnet":
                for subnet in other["body"]["properties"].get("subnets", []):
                    if (get_path(subnet, "properties", "networkSecurityGroup", "id") or "").lower() \
                            == res["id"].lower():
                        users.append(subnet["id"])
        if users:
            raise ArmError(400, "InUseNetworkSecurityGroupCannotBeDeleted", f"Network security "
                           f"group {res['id']} cannot be deleted because it is in use by the "
                           f"following resources: {', '.join(users)}. In order to delete the "
                           "Network security group, remove the association with the resource(s).")

    def prepare_pip(self, ctx, res, stored, new):
        props = stored.setdefault("properties", {})
        sku = get_path(stored, "sku", "name") or "Standard"
        stored["sku"] = dict(stored.get("sku") or {}, name=sku, tier=get_path(stored, "sku", "tier")
                             or "Regional")
        method = props.get("publicIPAllocationMethod") or ("Static" if sku == "Standard" else "Dynamic")
        if sku == "Standard" and method.lower() != "static":
            raise invalid("Standard sku publicIp /subscriptions/... must have AllocationMethod set "
                          "to Static.", code="StandardSkuPublicIPAddressesMustBeStatic")
        props["publicIPAllocationMethod"] = method
        props.setdefault("publicIPAddressVersion", "IPv4")
        props.setdefault("idleTimeoutInMinutes", 4)
        if res.get("address"):
            props["ipAddress"] = res["address"]
        elif method.lower() == "static":
            res["address"] = props["ipAddress"] = f"203.0.113.{(self.fake.next() % 250) + 1}"
        return None

    def can_delete_pip(self, res):
        if res.get("nic_ipconfig"):
            raise ArmError(400, "PublicIPAddressCannotBeDeleted", f"Public IP address {res['id']} "
                           f"can not be deleted since it is still allocated to resource "
                           f"{res['nic_ipconfig']}. In order to delete the public IP, "
                           "disassociate/detach the Public IP address from the resource. To "
                           "learn how to do this, see aka.ms/deletepublicip.")

    def prepare_nic(self, ctx, res, stored, new):
        fake = self.fake
        props = stored.setdefault("properties", {})
        configs = props.get("ipConfigurations") or []
        if not configs:
            raise invalid(f"Network interface {stored['id']} must have one or more IP "
                          "configurations.", code="NetworkInterfaceMustHaveAtLeastOneIpConfiguration")
        nsg = get_path(props, "networkSecurityGroup", "id")
        if nsg and fake.by_id(nsg, "nsg") is None:
            raise self.bad_reference(nsg, stored["id"])
        claims = []
        old_addresses = res.get("private") or {}
        res["private"] = {}
        for i, cfg in enumerate(configs):
            if not cfg.get("name"):
                raise invalid("An IP configuration in the request has no name.",
                              code="InvalidRequestFormat")
            cfg["id"] = f"{stored['id']}/ipConfigurations/{cfg['name']}"
            cfg["type"] = "Microsoft.Network/networkInterfaces/ipConfigurations"
            cfg["etag"] = self.etag()
            c = cfg.setdefault("properties", {})
            c["provisioningState"] = "Succeeded"
            c.setdefault("primary", i == 0)
            c.setdefault("privateIPAllocationMethod", "Dynamic")
            c.setdefault("privateIPAddressVersion", "IPv4")
            subnet_id = get_path(c, "subnet", "id")
            if not subnet_id:
                raise invalid(f"IP configuration {cfg['id']} has no subnet.",
                              code="InvalidRequestFormat")
            vnet, subnet = fake.child_by_id(subnet_id, "subnet")
            if subnet is None:
                raise self.bad_reference(subnet_id, stored["id"])
            if vnet["body"]["location"] != stored["location"]:
                raise invalid(f"Subnet {subnet_id} is in location {vnet['body']['location']}, the "
                              f"network interface in {stored['location']}.",
                              code="InvalidResourceReference")
            address = old_addresses.get(cfg["name"]) or self.next_private(subnet)
            res["private"][cfg["name"]] = address
            c["privateIPAddress"] = address
            pip_id = get_path(c, "publicIPAddress", "id")
            if pip_id:
                pip = fake.by_id(pip_id, "pip")
                if pip is None:
                    raise self.bad_reference(pip_id, stored["id"])
                holder = pip.get("nic_ipconfig")
                if holder and holder.lower() != cfg["id"].lower():
                    raise invalid(f"Resource {pip_id} is referenced by resource {holder}, and "
                                  f"cannot be used by {cfg['id']}.", code="PublicIPAddressInUse")
                claims.append((pip, cfg["id"]))
        props.setdefault("enableAcceleratedNetworking", False)
        props.setdefault("enableIPForwarding", False)
        res.setdefault("mac", "00-0D-3A-%02X-%02X-%02X" % tuple(os.urandom(3)))
        props["macAddress"] = res["mac"]

        def after():
            for pip in fake.res.values():
                if pip["kind"] == "pip" and (pip.get("nic_ipconfig") or "").lower().startswith(
                        stored["id"].lower() + "/"):
                    pip["nic_ipconfig"] = None
            for pip, cfg_id in claims:
                pip["nic_ipconfig"] = cfg_id
        return after

    def next_private(self, subnet):
        prefix = (get_path(subnet, "properties", "addressPrefix")
                  or (get_path(subnet, "properties", "addressPrefixes") or ["10.0.0.0/24"])[0])
        base = [int(x) for x in prefix.split("/")[0].split(".")]
        n = self.fake.next() + 3
        return f"{base[0]}.{base[1]}.{base[2] + n // 250}.{n % 250 + 4}"

    def can_delete_nic(self, res):
        if res.get("vm"):
            raise ArmError(400, "NicInUse", f"Network Interface {res['id']} is used by existing "
                           f"resource {res['vm']}. In order to delete the network interface, it "
                           "must be dissociated from the resource. To learn more, see "
                           "aka.ms/deletenic.")

    # ----- compute: proximity placement groups and disks ----------------------------

    def prepare_ppg(self, ctx, res, stored, new):
        props = stored.setdefault("properties", {})
        props.setdefault("proximityPlacementGroupType", "Standard")
        return None

    def can_delete_ppg(self, res):
        users = [vm["id"] for vm in self.fake.live_vms()
                 if (vm.get("ppg") or "").lower() == res["id"].lower()]
        if users:
            raise ArmError(409, "OperationNotAllowed", f"Proximity placement group {res['id']} "
                           f"cannot be deleted while virtual machines use it: {', '.join(users)}.")

    def prepare_disk(self, ctx, res, stored, new):
        props = stored.setdefault("properties", {})
        if get_path(props, "creationData", "createOption") is None:
            raise invalid("Required parameter 'creationData.createOption' is missing (null).",
                          target="creationData.createOption")
        props.setdefault("diskSizeGB", 32)
        stored.setdefault("sku", {"name": "Premium_LRS", "tier": "Premium"})
        props.setdefault("timeCreated", now_iso())
        props.setdefault("uniqueId", str(uuid.uuid4()))
        return None

    def can_delete_disk(self, res):
        if res.get("vm"):
            raise ArmError(409, "OperationNotAllowed", f"Disk {res['name']} is attached to VM "
                           f"{res['vm']}.")

    # ----- virtual machines -----------------------------------------------------------

    def prepare_vm(self, ctx, res, stored, new):
        fake = self.fake
        props = stored.setdefault("properties", {})
        location = stored["location"]
        rid = stored["id"]
        size = get_path(props, "hardwareProfile", "vmSize")
        if not size:
            raise invalid("Required parameter 'hardwareProfile.vmSize' is missing (null).",
                          target="hardwareProfile.vmSize")
        if size not in self.sizes_in(location):
            raise invalid(f"The requested VM size {size} is not available in the current region. "
                          f"The sizes available in the current region are: "
                          f"{', '.join(self.sizes_in(location))}.", target="vmSize",
                          code="InvalidParameter")
        zones = stored.get("zones") or []
        if len(zones) > 1:
            raise invalid("A virtual machine can be in one availability zone only.", target="zones")
        for z in zones:
            if z not in LOCATIONS[location][1]:
                raise invalid(f"The zone(s) '{z}' for resource '{rid}' is not supported. The "
                              f"supported zones for location '{location}' are "
                              f"'{','.join(LOCATIONS[location][1])}'", target="zones",
                              code="InvalidParameter")
        r = self.restricted(location, size, zones[0] if zones else None)
        if r is not None:
            raise ArmError(409, "SkuNotAvailable", FAULT_KINDS["SkuNotAvailable"][2].format(
                size=size, location=location))
        if not new:
            old = res["body"]["properties"]
            if get_path(old, "hardwareProfile", "vmSize") != size and res.get("power") == "running":
                raise ArmError(409, "OperationNotAllowed", "Changing the size of a running VM is "
                               "not emulated.")
            # An update keeps what only creation sets.
            for key in ("storageProfile", "osProfile", "networkProfile", "priority"):
                if key in old and key not in props:
                    props[key] = copy.deepcopy(old[key])
        priority = props.get("priority") or "Regular"
        spot = priority.lower() in ("spot", "low")
        if spot:
            props["priority"] = "Spot" if priority.lower() == "spot" else "Low"
            props["evictionPolicy"] = props.get("evictionPolicy") or "Deallocate"
            bp = props.setdefault("billingProfile", {})
            if bp.get("maxPrice") is None:
                bp["maxPrice"] = -1
            price = bp["maxPrice"]
            if price != -1 and price <= 0:
                raise invalid("The value of parameter billingProfile.maxPrice is invalid: it is "
                              "-1 or a price greater than zero.", target="billingProfile.maxPrice")
        else:
            if props.get("evictionPolicy"):
                raise invalid("Eviction policy can be set only on Azure Spot Virtual Machines.",
                              target="evictionPolicy")
            if get_path(props, "billingProfile", "maxPrice") is not None:
                raise invalid("Max price can be set only on Azure Spot Virtual Machines.",
                              target="billingProfile")
        storage = props.get("storageProfile") or {}
        image = storage.get("imageReference") or {}
        os_disk = dict(storage.get("osDisk") or {"createOption": "FromImage"})
        if new:
            if not image:
                raise invalid("Required parameter 'storageProfile.imageReference' is missing.",
                              target="imageReference")
            if not image.get("id") and not all(image.get(k) for k in ("publisher", "offer", "sku")):
                raise invalid("The image reference needs an id, or publisher, offer and sku.",
                              target="imageReference")
            if str(os_disk.get("createOption")).lower() != "fromimage":
                raise invalid("Only osDisk.createOption FromImage is emulated.",
                              target="osDisk.createOption")
        os_profile = props.get("osProfile") or {}
        if new:
            user = os_profile.get("adminUsername")
            if not user:
                raise invalid("Required parameter 'osProfile.adminUsername' is missing (null).",
                              target="adminUsername")
            os_profile.setdefault("computerName", stored["name"][:64])
            linux = os_profile.setdefault("linuxConfiguration", {})
            keys = get_path(linux, "ssh", "publicKeys") or []
            for key in keys:
                want = f"/home/{user}/.ssh/authorized_keys"
                if key.get("path") != want:
                    raise invalid("Destination path for SSH public keys is currently limited to "
                                  f"its default value {want} due to a known issue in Linux "
                                  "provisioning agent.", target="linuxConfiguration.ssh.publicKeys.path")
                if not str(key.get("keyData", "")).startswith(("ssh-", "ecdsa-")):
                    raise invalid("The value of parameter linuxConfiguration.ssh.publicKeys.keyData "
                                  "is invalid.", target="linuxConfiguration.ssh.publicKeys.keyData",
                                  code="InvalidParameter")
            if not keys and linux.get("disablePasswordAuthentication", False):
                raise invalid("Authentication using either SSH or by user name and password must "
                              "be enabled in Linux profile.", target="linuxConfiguration")
            if not keys and not os_profile.get("adminPassword"):
                raise invalid("Required parameter 'adminPassword' is missing (null).",
                              target="adminPassword")
            props["osProfile"] = os_profile
        network = props.get("networkProfile") or {}
        if network.get("networkInterfaceConfigurations"):
            raise ArmError(501, "NotImplementedInFake", "networkInterfaceConfigurations (NICs "
                           "made by the VM) are not emulated: create the NIC first and name it "
                           "in networkProfile.networkInterfaces.")
        refs = network.get("networkInterfaces") or []
        if not refs:
            raise invalid("Virtual machine must have at least one network interface.",
                          target="networkProfile")
        nics = []
        for ref in refs:
            nic = fake.by_id(ref.get("id"), "nic")
            if nic is None:
                raise self.bad_reference(ref.get("id"), rid)
            if nic["body"]["location"] != location:
                raise invalid(f"Network interface {nic['id']} is in {nic['body']['location']}, the "
                              f"VM in {location}.", code="InvalidResourceReference")
            if nic.get("vm") and nic["vm"].lower() != rid.lower():
                raise ArmError(400, "NicInUse", f"Network Interface {nic['id']} is used by "
                               f"existing resource {nic['vm']}. In order to attach it to "
                               f"{rid}, it must be dissociated from that resource.")
            if nic["body"]["properties"].get("enableAcceleratedNetworking") and not SIZES[size][5]:
                raise invalid(f"Virtual Machine size {size} is not in the allowed list of VM sizes "
                              "for accelerated networking to be enabled on the VM at index 0 for "
                              f"VM {rid}.", code="VMSizeIsNotPermittedToEnableAcceleratedNetworking")
            rp = ref.setdefault("properties", {})
            rp.setdefault("deleteOption", "Detach")
            if len(refs) == 1:
                rp.setdefault("primary", True)
            nics.append(nic)
        ppg_id = get_path(props, "proximityPlacementGroup", "id")
        ppg = None
        if ppg_id:
            ppg = fake.by_id(ppg_id, "ppg")
            if ppg is None:
                raise self.bad_reference(ppg_id, rid)
            if ppg["body"]["location"] != location:
                raise invalid(f"Proximity placement group {ppg_id} is in "
                              f"{ppg['body']['location']}, the VM in {location}.",
                              code="InvalidResourceReference")
        if not new:
            return None
        os_disk.setdefault("deleteOption", "Detach")
        os_disk.setdefault("osType", "Linux")
        os_disk.setdefault("caching", "ReadWrite")
        disk_name = os_disk.get("name") or f"{stored['name']}_OsDisk_1_{uuid.uuid4().hex}"
        os_disk["name"] = disk_name
        disk_type = get_path(os_disk, "managedDisk", "storageAccountType") or "Premium_LRS"
        disk_id = arm_id(res["sub"], res["rg"], COMPUTE, "disks", disk_name)
        if fake.get("disk", res["sub"], res["rg"], disk_name) is not None:
            raise ArmError(409, "ConflictingUserInput", f"Disk {disk_name} already exists in "
                           f"resource group {res['rg'].upper()}. Only CreateOption.Attach is "
                           "supported.", target="/subscriptions/.../disks/" + disk_name)
        os_disk["managedDisk"] = dict(os_disk.get("managedDisk") or {}, id=disk_id,
                                      storageAccountType=disk_type)
        os_disk.setdefault("diskSizeGB", 30)
        storage["osDisk"] = os_disk
        storage.setdefault("dataDisks", [])
        props["storageProfile"] = storage
        res.update(vm_id=str(uuid.uuid4()), created=now_iso(), power="starting", ppg=ppg_id,
                   nics=[n["id"] for n in nics], disk=disk_id, size=size,
                   zone=zones[0] if zones else None, failure=None)
        # Fault and update domains: a VM's place among the VMs of its placement group
        # (or of its location without one), 3 fault and 5 update domains.
        peers = [v for v in fake.live_vms()
                 if v["body"]["location"] == location and (v.get("ppg") or "").lower()
                 == (ppg_id or "").lower()]
        res["fd"], res["ud"] = len(peers) % 3, len(peers) % 5

        def after():
            for nic in nics:
                nic["vm"] = rid
            disk = {"kind": "disk", "id": disk_id, "sub": res["sub"], "rg": res["rg"],
                    "name": disk_name, "state": "Succeeded", "vm": rid,
                    "body": {"id": disk_id, "name": disk_name, "type": "Microsoft.Compute/disks",
                             "location": location, "tags": {}, "sku": {"name": disk_type},
                             **({"zones": list(zones)} if zones else {}),
                             "properties": {"osType": "Linux", "hyperVGeneration": "V2",
                                            "creationData": {"createOption": "FromImage",
                                                             "imageReference": {"id": self.image_id(
                                                                 location, image)}},
                                            "diskSizeGB": os_disk["diskSizeGB"],
                                            "timeCreated": now_iso(),
                                            "uniqueId": str(uuid.uuid4())}}}
            fake.res[("disk", res["sub"].lower(), res["rg"].lower(), disk_name.lower())] = disk
            pair = fake.machines.take(res)
            res["pair"] = pair
        return after

    @staticmethod
    def image_id(location, image):
        if image.get("id"):
            return image["id"]
        return (f"/Subscriptions/00000000-0000-0000-0000-000000000000/Providers/Microsoft.Compute/"
                f"Locations/{location}/Publishers/{image.get('publisher')}/ArtifactTypes/VMImage/"
                f"Offers/{image.get('offer')}/Skus/{image.get('sku')}/Versions/"
                f"{image.get('version') or 'latest'}")

    def capacity_error(self, ctx, res):
        """A capacity limit or the machines' address pool that this VM
        does not fit: the error its operation fails with, or None."""
        fake = self.fake
        location, size, zone = res["body"]["location"], res["size"], res["zone"]
        for limit in fake.capacity:
            if limit["location"] != location:
                continue
            if limit["zone"] is not None and str(limit["zone"]) != str(zone):
                continue
            if limit["size"] is not None and limit["size"].lower() != size.lower():
                continue
            used = sum(1 for v in fake.live_vms() if v is not res and v["body"]["location"] == location
                       and v["state"] not in ("Failed", "Deleting")
                       and (limit["zone"] is None or str(v.get("zone")) == str(limit["zone"]))
                       and (limit["size"] is None or v["size"].lower() == limit["size"].lower()))
            if used >= limit["available"]:
                code = limit["code"] or ("ZonalAllocationFailed" if zone else "AllocationFailed")
                return self.fake.fault_error({"status": 409, "code": code,
                                              "message": FAULT_KINDS[code][2], "retry_after": None},
                                             dict(ctx, size=size, location=location))
        if res.get("pair") is False:
            code = "ZonalAllocationFailed" if zone else "AllocationFailed"
            return ArmError(409, code, FAULT_KINDS[code][2])
        return None

    def vm_running(self, res):
        res["power"] = "running"
        self.fake.machines.boot(res)

    def vm_failed(self, res):
        res["power"] = None
        self.fake.machines.release(res)

    def vm_gone(self, res, cascade):
        """After a VM is removed: its OS disk and NICs by their delete
        options (all of them when the resource group goes anyway), its
        address pair and notices."""
        fake = self.fake
        props = res["body"]["properties"]
        fake.machines.release(res, forget=True)
        disk = fake.by_id(res.get("disk") or "", "disk")
        if disk is not None:
            disk["vm"] = None
            option = get_path(props, "storageProfile", "osDisk", "deleteOption") or "Detach"
            if cascade and option.lower() == "delete":
                self.remove(disk)
        for ref in get_path(props, "networkProfile", "networkInterfaces") or []:
            nic = fake.by_id(ref.get("id") or "", "nic")
            if nic is None:
                continue
            nic["vm"] = None
            option = get_path(ref, "properties", "deleteOption") or "Detach"
            if cascade and option.lower() == "delete":
                self.remove(nic)

    def vm_addresses(self, res):
        """(public, private) of a VM: its pair, else its NIC's and public IP's."""
        pair = res.get("pair")
        if pair:
            return pair
        public = private = None
        for nic_id in res.get("nics", []):
            nic = self.fake.by_id(nic_id, "nic")
            if nic is None:
                continue
            for cfg in nic["body"]["properties"].get("ipConfigurations", []):
                private = private or get_path(cfg, "properties", "privateIPAddress")
                pip = self.fake.by_id(get_path(cfg, "properties", "publicIPAddress", "id") or "", "pip")
                if pip is not None:
                    public = public or pip["body"]["properties"].get("ipAddress")
        return public, private

    def place(self, res, pair):
        """Puts a VM at its machine's addresses: the NIC's private address
        and its public IP resource's address."""
        public, private = pair
        for nic_id in res.get("nics", [])[:1]:
            nic = self.fake.by_id(nic_id, "nic")
            if nic is None:
                continue
            cfgs = nic["body"]["properties"].get("ipConfigurations", [])
            for cfg in cfgs[:1]:
                cfg["properties"]["privateIPAddress"] = private
                nic["private"][cfg["name"]] = private
                pip = self.fake.by_id(get_path(cfg, "properties", "publicIPAddress", "id") or "", "pip")
                if pip is not None:
                    pip["address"] = pip["body"]["properties"]["ipAddress"] = public

    POWER_TEXT = {"starting": "VM starting", "running": "VM running", "stopping": "VM stopping",
                  "stopped": "VM stopped", "deallocating": "VM deallocating",
                  "deallocated": "VM deallocated"}

    def instance_view(self, res):
        state = res["state"]
        when = now_iso()
        statuses = []
        if state == "Failed":
            failure = res.get("failure") or {"code": "InternalError", "message": ""}
            statuses.append({"code": f"ProvisioningState/failed/{failure['code']}", "level": "Error",
                             "displayStatus": "Provisioning failed", "message": failure["message"],
                             "time": when})
        else:
            statuses.append({"code": f"ProvisioningState/{state.lower()}", "level": "Info",
                             "displayStatus": "Provisioning succeeded" if state == "Succeeded"
                             else state, "time": when})
        if res.get("power"):
            statuses.append({"code": f"PowerState/{res['power']}", "level": "Info",
                             "displayStatus": self.POWER_TEXT[res["power"]]})
        props = res["body"]["properties"]
        out = {"computerName": get_path(props, "osProfile", "computerName") or res["name"],
               "osName": "ubuntu", "osVersion": "22.04", "hyperVGeneration": "V2",
               "platformFaultDomain": res.get("fd", 0), "platformUpdateDomain": res.get("ud", 0),
               "statuses": statuses}
        disk_name = get_path(props, "storageProfile", "osDisk", "name")
        if disk_name:
            out["disks"] = [{"name": disk_name, "statuses": [statuses[0]]}]
        if state == "Succeeded":
            out["vmAgent"] = {"vmAgentVersion": "2.11.1.12", "statuses": [{
                "code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Ready",
                "message": "Guest Agent is running", "time": when}]}
        return out

    def h_instance_view(self, ctx, kind, body):
        g = ctx["g"]
        with self.fake.lock:
            self.fake.need_group(g["sub"], g["rg"])
            res = self.fake.get("vm", g["sub"], g["rg"], g["name"])
            if res is None:
                raise not_found("Microsoft.Compute/virtualMachines", g["name"], g["rg"])
            return 200, self.instance_view(res), {}

    def h_vm_action(self, ctx, kind, body):
        g = ctx["g"]
        action = g["ctype"].lower()
        if ctx["method"] != "POST":
            raise ArmError(405, "MethodNotAllowed", f"{g['ctype']} takes POST.")
        fake = self.fake
        with fake.lock:
            fake.need_group(g["sub"], g["rg"])
            res = fake.get("vm", g["sub"], g["rg"], g["name"])
            if res is None:
                raise not_found("Microsoft.Compute/virtualMachines", g["name"], g["rg"])
            if res["state"] in ("Creating", "Deleting"):
                raise ArmError(409, "OperationNotAllowed", f"The operation '{action}' is not "
                               f"allowed on VM '{g['name']}' while it is {res['state'].lower()}.")
            final = {"start": "running", "restart": "running", "poweroff": "stopped",
                     "deallocate": "deallocated"}[action]
            res["power"] = {"start": "starting", "restart": "starting", "poweroff": "stopping",
                            "deallocate": "deallocating"}[action]
            res["state"] = "Updating"

            def done(op, res=res, final=final):
                res["state"] = "Succeeded"
                res["power"] = final
                if final == "running":
                    fake.machines.boot(res)
                elif final == "deallocated":
                    fake.machines.release(res)
            op = fake.start_op(g["sub"], COMPUTE, res["body"]["location"],
                               self.schema.api_version("compute"), done)
        return 202, None, self.lro_headers(ctx, op, COMPUTE, res["body"]["location"],
                                           self.schema.api_version("compute"), True)

    # ----- evictions --------------------------------------------------------------------

    def find_vm(self, spec):
        name = spec.get("vm")
        if not isinstance(name, str):
            raise ControlError(400, '"vm" (the VM\'s name) is required')
        found = [r for r in self.fake.live_vms() if r["name"].lower() == name.lower()
                 and (not spec.get("resourceGroup") or r["rg"].lower() == spec["resourceGroup"].lower())
                 and (not spec.get("subscription") or r["sub"].lower() == spec["subscription"].lower())]
        if not found:
            raise ControlError(404, f"no VM {name!r}")
        if len(found) > 1:
            raise ControlError(400, f"{len(found)} VMs are called {name!r}: name resourceGroup "
                               "or subscription too")
        return found[0]

    def evict(self, spec):
        """`POST /_fake/evict`: a Spot eviction, with a Preempt notice
        (`notice_s`, default the setting) or without (`"notice": false`)."""
        if not isinstance(spec, dict) or set(spec) - {"vm", "resourceGroup", "subscription",
                                                      "notice", "notice_s"}:
            raise ControlError(400, 'an eviction is {"vm", "resourceGroup"?, "subscription"?, '
                               '"notice"?: true, "notice_s"?}')
        with self.fake.lock:
            res = self.find_vm(spec)
            if str(res["body"]["properties"].get("priority", "")).lower() not in ("spot", "low"):
                raise ControlError(400, f"VM {res['name']} is not a Spot VM")
            if res["state"] != "Succeeded" or res.get("power") != "running":
                raise ControlError(409, f"VM {res['name']} is not running "
                                   f"({res['state']}, {res.get('power')})")
            notice = spec.get("notice", True)
            seconds = spec.get("notice_s", self.fake.settings["eviction_notice_s"])
            if not notice or seconds <= 0:
                outcome = self.evict_now(res)
                return {"vm": res["id"], "notice": None, "outcome": outcome}
            event = self.fake.machines.preempt(res, float(seconds))
            return {"vm": res["id"], "notice": event, "outcome": "scheduled"}

    def evict_now(self, res):
        """Evicts a Spot VM: evictionPolicy Delete removes it (and its
        disk and NICs as their delete options say); Deallocate stops it."""
        fake = self.fake
        with fake.lock:
            key = ("vm", res["sub"].lower(), res["rg"].lower(), res["name"].lower())
            if fake.res.get(key) is not res:
                return "gone"
            policy = str(res["body"]["properties"].get("evictionPolicy") or "Deallocate")
            fake.evicted.append({"vm": res["id"], "policy": policy, "time": now_iso()})
            if policy.lower() == "delete":
                self.remove(res)
                return "deleted"
            res["power"] = "deallocated"
            fake.machines.release(res)
            return "deallocated"

    # ----- state ----------------------------------------------------------------------

    def state(self):
        fake = self.fake
        with fake.lock:
            return {
                "resource_groups": [dict(self.rg_doc(g)) for g in fake.groups.values()],
                "resources": [{"kind": r["kind"], "id": r["id"], "state": r["state"],
                               "location": r["body"].get("location"),
                               "tags": r["body"].get("tags") or {},
                               **({"power": r.get("power"), "zone": r.get("zone"),
                                   "public": (r.get("pair") or [None])[0]}
                                  if r["kind"] == "vm" else {})}
                              for r in sorted(fake.res.values(), key=lambda r: r["id"].lower())],
                "operations": [dict(op.render(), provider=op.provider, polls=op.polls)
                               for op in fake.ops.values()],
                "evicted": list(fake.evicted),
                "violations": len(fake.violations),
                "settings": dict(fake.settings),
                "capacity": list(fake.capacity),
                "restrictions": list(fake.restrictions),
                "api_versions": {k: v["api_version"] for k, v in self.schema.sets.items()},
            }


# ----- HTTP ------------------------------------------------------------------------


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, fake):
        self.fake = fake
        self.arm = fake.arm = Arm(fake)
        super().__init__(address, Handler)

    def handle_error(self, request, client_address):
        # A client gone mid-connection (the fault sweep kills them on
        # purpose) is no error of the fake's.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "Microsoft-HTTPAPI/2.0"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in two writes: with Nagle's algorithm
    # on, the body waits for the client's delayed ACK (40 ms on Linux), and
    # every request on a kept-alive connection took 40 ms more than the
    # fake's work. TCP_NODELAY, as a real server's front end answers.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        log.info("%s %s", self.address_string(), fmt % args)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send(self, status, body=None, headers=None, raw=None, ctype="application/json; charset=utf-8"):
        pending, self._kill_return = getattr(self, "_kill_return", None), None
        if pending is not None and self.server.fake.kill.returning(pending[0]):
            self.server.fake.kill.fire(pending[0], "return", pending[1])
        if raw is None:
            raw = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if raw or status not in (204,):
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("x-ms-request-id", str(uuid.uuid4()))
        self.send_header("x-ms-correlation-request-id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def handle_any(self):
        self._kill_return = None
        url = urllib.parse.urlsplit(self.path)
        raw = self._body()
        fake = self.server.fake
        try:
            if url.path.startswith("/_fake/"):
                return self.control(url, raw)
            base = f"http://{self.headers.get('Host') or '%s:%d' % self.server.server_address[:2]}"
            if url.path.rstrip("/") == "/api/retail/prices" and self.command == "GET":
                status, body, headers = fake.retail.answer(url, base)
                return self.send(status, body, headers)
            identity = self.server.arm.identity(self.command, url, raw, base)
            if identity is not None:
                status, body, headers = identity
                return self.send(status, body, headers)
            counted = fake.kill.arrive()
            if counted is not None:
                k, now = counted
                what = f"{self.command} {url.path}"
                if now:
                    fake.kill.fire(k, "arrival", what)
                    raise ArmError(503, "ServiceUnavailable",
                                   f"gangway fault sweep: the client was killed as request {k} arrived")
                self._kill_return = (k, what)
            status, body, headers = self.server.arm.handle(self.command, url, raw, self.headers, base)
            self.send(status, body, headers)
        except ArmError as err:
            if err.violation:
                fake.violation(err.violation, self.command, self.path, err.message)
            log.info("answer %d %s: %s", err.status, err.code, err.message)
            try:
                self.send(err.status, err.body(), err.headers)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client is gone (the fault sweep killed it)
        except ControlError as err:
            self.send(err.status, {"error": err.message})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as err:  # an emulator bug: say so
            log.exception("emulator bug on %s %s", self.command, self.path)
            try:
                self.send(500, {"error": {"code": "InternalServerError",
                                          "message": f"azure fake bug: {err!r}"}})
            except OSError:
                pass

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = handle_any

    # ----- control API ------------------------------------------------------------

    def control(self, url, raw):
        fake = self.server.fake
        what = url.path[len("/_fake/"):].strip("/")
        query = dict(urllib.parse.parse_qsl(url.query))
        method = self.command
        spec = None
        if method in ("POST", "PUT"):
            try:
                spec = json.loads(raw) if raw.strip() else {}
            except ValueError as err:
                raise ControlError(400, f"control body is not JSON: {err}")
        if what == "health":
            return self.send(200, raw=b"ok", ctype="text/plain")
        if what == "violations":
            if method == "DELETE":
                with fake.lock:
                    n = len(fake.violations)
                    fake.violations.clear()
                return self.send(200, {"removed": n})
            with fake.lock:
                return self.send(200, {"count": len(fake.violations), "violations": list(fake.violations)})
        if what in ("faults", "fault"):
            if method == "POST":
                return self.send(201, fake.add_rule(spec))
            if method == "DELETE":
                with fake.lock:
                    if "id" in query:
                        before = len(fake.rules)
                        fake.rules = [r for r in fake.rules if str(r["id"]) != query["id"]]
                        return self.send(200, {"removed": before - len(fake.rules)})
                    n = len(fake.rules)
                    fake.rules, fake.fired = [], []
                return self.send(200, {"removed": n})
            with fake.lock:
                return self.send(200, {"rules": [dict(r, remaining=r["times"]) for r in fake.rules]})
        if what == "fired":
            with fake.lock:
                fired = [f for f in fake.fired if not query.get("code") or f["code"] == query["code"]]
            return self.send(200, {"fired": fired})
        if what == "capacity":
            if method == "POST":
                return self.send(200, self.server.arm.set_capacity(spec))
            if method == "DELETE":
                with fake.lock:
                    fake.capacity = []
            with fake.lock:
                return self.send(200, {"limits": list(fake.capacity)})
        if what == "restrictions":
            if method == "POST":
                return self.send(200, self.server.arm.set_restriction(spec))
            if method == "DELETE":
                with fake.lock:
                    fake.restrictions = []
            with fake.lock:
                return self.send(200, {"restrictions": list(fake.restrictions)})
        if what == "settings":
            if method == "POST":
                if not isinstance(spec, dict) or set(spec) - set(DEFAULT_SETTINGS):
                    raise ControlError(400, f"settings are {sorted(DEFAULT_SETTINGS)}")
                with fake.lock:
                    fake.settings.update(spec)
            return self.send(200, dict(fake.settings))
        if what == "machines":
            if method == "POST":
                try:
                    return self.send(200, fake.machines.configure(spec))
                except ValueError as err:
                    raise ControlError(400, str(err))
            if method == "DELETE":
                return self.send(200, {"removed": fake.machines.remove(query.get("subscription", ""))})
            try:
                return self.send(200, fake.machines.view(query.get("subscription", "")))
            except LookupError as err:
                raise ControlError(404, str(err))
        if what == "retail":
            if method == "POST":
                try:
                    return self.send(200, fake.retail.configure(spec))
                except ValueError as err:
                    raise ControlError(400, str(err))
            return self.send(200, fake.retail.view())
        if what == "evict" and method == "POST":
            return self.send(200, self.server.arm.evict(spec))
        if what == "identities":
            if method == "POST":
                for field in ("tenant", "client_id", "client_secret"):
                    if not isinstance((spec or {}).get(field), str):
                        raise ControlError(400, f'"{field}" is required (a string)')
                with fake.lock:
                    fake.identities[(spec["tenant"].lower(), spec["client_id"].lower())] = spec["client_secret"]
            with fake.lock:
                return self.send(200, {"identities": [{"tenant": t, "client_id": c}
                                                      for (t, c) in fake.identities]})
        if what == "state":
            return self.send(200, self.server.arm.state())
        if what == "reset" and method == "POST":
            fake.reset()
            return self.send(200, {"reset": True})
        if what == "kill":
            if method == "POST":
                if not isinstance(spec, dict):
                    raise ControlError(400, "a kill spec is a JSON object")
                return self.send(200, fake.kill.arm(spec))
            if method == "DELETE":
                return self.send(200, {"removed": fake.kill.disarm()})
            return self.send(200, fake.kill.view())
        raise ControlError(404, f"no control endpoint {method} /_fake/{what}")


def serve(args, schema):
    settings = {"op_polls": args.op_polls, "page_size": args.page_size,
                "op_auto_done_s": args.op_auto_done_s, "retry_after": args.retry_after}
    fake = Fake(schema, settings)
    server = Server((args.host, args.port), fake)
    host, port = server.server_address[:2]
    endpoint = f"http://{host}:{port}"
    threading.Thread(target=server.serve_forever, name="serve", daemon=True).start()
    stop = threading.Event()

    def ticker():
        while not stop.wait(0.2):
            try:
                fake.tick()
                fake.machines.tick()
            except Exception:  # keep ticking; say what broke
                log.exception("ticker")
    threading.Thread(target=ticker, name="ticker", daemon=True).start()

    def on_signal(signum, frame):
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.watch_stdin:
        def watch():
            while sys.stdin.buffer.read(65536):
                pass
            stop.set()
        threading.Thread(target=watch, name="stdin", daemon=True).start()
    with urllib.request.urlopen(endpoint + "/_fake/health", timeout=10) as resp:
        resp.read()
    print(f"READY {endpoint}", flush=True)
    while not stop.wait(0.5):
        pass
    server.shutdown()
    fake.machines.reset()
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--watch-stdin", action="store_true", help="exit when stdin reaches end of file")
    parser.add_argument("--verbose", action="store_true", help="log every request and error answer")
    parser.add_argument("--schema", help="arm-schema.json (default: target/azure-venv/arm-schema.json)")
    parser.add_argument("--op-polls", type=int, default=DEFAULT_SETTINGS["op_polls"],
                        help="status polls an operation answers InProgress (0: done at once)")
    parser.add_argument("--op-auto-done-s", type=float, default=DEFAULT_SETTINGS["op_auto_done_s"],
                        help="an operation ends this many seconds after it began, polled or not")
    parser.add_argument("--retry-after", type=int, default=DEFAULT_SETTINGS["retry_after"],
                        help="Retry-After seconds on accepted operations and InProgress polls")
    parser.add_argument("--page-size", type=int, default=DEFAULT_SETTINGS["page_size"],
                        help="items per list page (smaller makes clients follow nextLink)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="azure-fake: %(message)s", stream=sys.stderr)
    if args.verbose:
        log.setLevel(logging.INFO)
    path = arm_schema.find_schema(args.schema, roots=[DEFAULT_VENV])
    if path is None:
        print("azure-fake: FATAL: schema file not found: "
              f"{args.schema or os.path.join(DEFAULT_VENV, 'arm-schema.json')}\n"
              "  run tests/emulators/azure/setup.sh (installs the azure-mgmt-* packages into "
              "target/azure-venv and writes it) or pass --schema PATH", file=sys.stderr)
        return 2
    return serve(args, arm_schema.Schema(path))


if __name__ == "__main__":
    sys.exit(main())
