"""Where the ARM fake's VMs "run": address pairs a real sshd listens on,
the VM's SSH public keys in an authorized_keys file, and an Azure Instance
Metadata Service (IMDS) per VM with Scheduled Events.

A test registers, per subscription (its *scope*: parallel tests use
different subscription ids and never take each other's addresses), a list
of address pairs `[public, private]` and optionally an authorized_keys file
(`POST /_fake/machines`):

* a VM created in that subscription takes the first free pair (free: no VM
  that is not Failed holds it). The pair's public address becomes the
  `ipAddress` of the public IP resource on the VM's first NIC, the private
  one that NIC's `privateIPAddress`. No free pair: the VM's creation
  operation fails with AllocationFailed (ZonalAllocationFailed for a zonal
  VM), as Azure reports running out of capacity. When the VM is running,
  its `osProfile.linuxConfiguration.ssh.publicKeys[].keyData` are appended
  to the authorized_keys file, as the Linux agent puts them into the admin
  user's.
* every public address of the scope gets a metadata listener on one port
  (the scope's `imds_port`, the same on every address). A request is
  answered for the running VM holding the address it came to; an address no
  running VM holds closes connections unanswered.
* IMDS needs the header `Metadata: true` (else 400) and an `api-version`
  (else 400): `GET /metadata/instance` (compute and network),
  `GET /metadata/instance/compute/<field>?format=text` (one leaf),
  `GET /metadata/scheduledevents` (the events document),
  `POST /metadata/scheduledevents` (`{"StartRequests": [{"EventId"}]}`:
  approving a Preempt event evicts at once), and
  `GET /metadata/identity/oauth2/token?resource=...` (a managed identity
  token, for the credential chain).
"""

import http.server
import json
import socket
import threading
import time
import urllib.parse
import uuid
from email.utils import formatdate

IMDS_API_VERSIONS = {"2017-03-01", "2017-04-02", "2017-08-01", "2017-10-01", "2017-11-01",
                     "2017-12-01", "2018-02-01", "2018-04-02", "2018-10-01", "2019-02-01",
                     "2019-03-11", "2019-04-30", "2019-06-01", "2019-06-04", "2019-08-01",
                     "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-01", "2020-07-15",
                     "2020-09-01", "2020-10-01", "2020-12-01", "2021-01-01", "2021-02-01",
                     "2021-03-01", "2021-05-01", "2021-10-01", "2021-11-01", "2021-11-15",
                     "2021-12-13", "2023-07-01", "2023-11-15", "2024-03-15"}
SCHEDULED_EVENTS_API_VERSIONS = {"2017-03-01", "2017-11-01", "2019-01-01", "2019-08-01",
                                 "2020-07-01"}


class MetadataServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, machines, scope):
        self.machines = machines
        self.scope = scope
        super().__init__(address, MetadataHandler)


class MetadataHandler(http.server.BaseHTTPRequestHandler):
    server_version = "Microsoft-IIS/10.0"
    sys_version = ""

    def log_message(self, *args):
        pass

    def _reply(self, code, body, ctype="application/json; charset=utf-8"):
        raw = body if isinstance(body, bytes) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _vm(self):
        return self.server.machines.vm_at(self.server.scope, self.connection.getsockname()[0])

    def _common(self):
        """(vm, path, query) or None when answered already."""
        vm = self._vm()
        if vm is None:
            self.close_connection = True  # nothing runs there
            return None
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if self.headers.get("X-Forwarded-For"):
            self._reply(400, {"error": "Bad request. X-Forwarded-For header is not allowed"})
            return None
        if (self.headers.get("Metadata") or "").lower() != "true":
            self._reply(400, {"error": "Bad request. Required metadata header not specified"})
            return None
        path = url.path.rstrip("/")
        versions = SCHEDULED_EVENTS_API_VERSIONS if path == "/metadata/scheduledevents" \
            else IMDS_API_VERSIONS
        if "api-version" not in query:
            self._reply(400, {"error": "Bad request. api-version was not specified in the request",
                              "newest-versions": sorted(versions)[-3:][::-1]})
            return None
        if query["api-version"] not in versions:
            self._reply(400, {"error": "Bad request. api-version is invalid or was not specified "
                              "in the request.", "newest-versions": sorted(versions)[-3:][::-1]})
            return None
        return vm, path, query

    def do_GET(self):
        got = self._common()
        if got is None:
            return
        vm, path, query = got
        machines = self.server.machines
        if path == "/metadata/scheduledevents":
            return self._reply(200, machines.events_doc(vm))
        if path == "/metadata/identity/oauth2/token":
            resource = query.get("resource")
            if not resource:
                return self._reply(400, {"error": "invalid_request",
                                         "error_description": "Required query variable "
                                                              "'resource' is missing"})
            expires = int(time.time()) + 86399
            return self._reply(200, {"access_token": machines.fake_token(vm),
                                     "client_id": vm["vm_id"], "expires_in": "86399",
                                     "expires_on": str(expires), "ext_expires_in": "86399",
                                     "not_before": str(expires - 86399), "resource": resource,
                                     "token_type": "Bearer"})
        if path == "/metadata/instance" or path.startswith("/metadata/instance/"):
            doc = machines.instance_doc(vm)
            value = doc
            for part in [p for p in path[len("/metadata/instance"):].split("/") if p]:
                if isinstance(value, dict) and part in value:
                    value = value[part]
                elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                    value = value[int(part)]
                else:
                    return self._reply(404, {"error": "Not found"})
            if query.get("format") == "text":
                if isinstance(value, (dict, list)):
                    if isinstance(value, dict):
                        text = "\n".join(k + ("/" if isinstance(v, (dict, list)) else "")
                                         for k, v in value.items())
                    else:
                        text = "\n".join(str(i) + "/" for i in range(len(value)))
                    return self._reply(200, text, "text/plain; charset=utf-8")
                return self._reply(200, str(value), "text/plain; charset=utf-8")
            if not isinstance(value, (dict, list)) and path != "/metadata/instance":
                return self._reply(400, {"error": "Bad request. Leaf nodes support only "
                                                  "format=text"})
            return self._reply(200, value)
        return self._reply(404, {"error": "Not found"})

    def do_POST(self):
        got = self._common()
        if got is None:
            return
        vm, path, query = got
        if path != "/metadata/scheduledevents":
            return self._reply(405, {"error": "Method not allowed"})
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            ids = [r["EventId"] for r in body["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return self._reply(400, {"error": "Bad request. The body is "
                                              "{\"StartRequests\": [{\"EventId\": ...}]}"})
        unknown = self.server.machines.approve(vm, ids)
        if unknown:
            return self._reply(400, {"error": f"Bad request. Unknown EventId(s): {', '.join(unknown)}"})
        self._reply(200, b"", "text/plain")


class Machines:
    def __init__(self, fake):
        self.fake = fake
        self._lock = threading.RLock()
        self.scopes = {}

    def reset(self):
        for scope in list(self.scopes):
            self.remove(scope)
        with self._lock:
            self.events = {}       # VM id (lower) -> [event]
            self.incarnation = {}  # VM id (lower) -> DocumentIncarnation
            self.due = []          # (monotonic time, VM res, event id)
            self.approved = []     # (monotonic time, VM res)

    # ----- control ------------------------------------------------------------

    def configure(self, spec):
        if not isinstance(spec, dict):
            raise ValueError("a machines spec is a JSON object")
        unknown = set(spec) - {"subscription", "addresses", "authorized_keys"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; known: addresses, "
                             "authorized_keys, subscription")
        scope = spec.get("subscription")
        if not isinstance(scope, str) or not scope:
            raise ValueError('"subscription" (the subscription id of the launches) is required')
        pairs = spec.get("addresses")
        if (not isinstance(pairs, list) or not pairs or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(a, str) for a in p)
                for p in pairs)):
            raise ValueError('"addresses" is a list of [public, private] address pairs')
        for pair in pairs:
            for a in pair:
                try:
                    socket.inet_aton(a)
                except OSError:
                    raise ValueError(f"{a!r} is not an IPv4 address") from None
        keys = spec.get("authorized_keys")
        if keys is not None and not isinstance(keys, str):
            raise ValueError('"authorized_keys" is a file path')
        with self._lock:
            state = self.scopes.setdefault(scope.lower(), {
                "pairs": [], "authorized_keys": None, "imds_port": 0, "servers": {}})
            state["pairs"] = [tuple(p) for p in pairs]
            if keys is not None:
                state["authorized_keys"] = keys
            for public, _private in state["pairs"]:
                if public in state["servers"]:
                    continue
                server = MetadataServer((public, state["imds_port"]), self, scope.lower())
                state["imds_port"] = server.server_address[1]
                state["servers"][public] = server
                threading.Thread(target=server.serve_forever, name=f"imds-{public}",
                                 daemon=True).start()
        return self.view(scope)

    def view(self, scope):
        with self._lock:
            state = self.scopes.get(scope.lower())
            if state is None:
                raise LookupError(f"subscription {scope!r} has no machines")
            held = [{"vm": vm["id"], "public": vm["pair"][0], "private": vm["pair"][1],
                     "power": vm.get("power")} for vm in self.fake.live_vms()
                    if vm.get("pair") and vm["sub"].lower() == scope.lower()]
            return {"subscription": scope, "addresses": [list(p) for p in state["pairs"]],
                    "authorized_keys": state["authorized_keys"], "imds_port": state["imds_port"],
                    "held": held}

    def remove(self, scope):
        with self._lock:
            state = self.scopes.pop(scope.lower(), None)
        if state is None:
            return 0
        for server in state["servers"].values():
            server.shutdown()
            server.server_close()
        return 1

    # ----- the VMs' life ---------------------------------------------------------

    def take(self, vm):
        """A free pair for a new VM (placed on its NIC and public IP), None
        when its subscription has no machines, False when none is free."""
        with self._lock:
            state = self.scopes.get(vm["sub"].lower())
            if state is None:
                return None
            taken = {tuple(v["pair"]) for v in self.fake.live_vms()
                     if v is not vm and v.get("pair") and v["state"] != "Failed"}
            free = [p for p in state["pairs"] if p not in taken]
            if not free:
                return False
            pair = free[0]
        self.fake_arm().place(vm, pair)
        return pair

    def fake_arm(self):
        return self.fake.arm

    def boot(self, vm):
        """A VM is running: its keys go into authorized_keys."""
        with self._lock:
            state = self.scopes.get(vm["sub"].lower())
            path = state and state["authorized_keys"]
        if not path or not vm.get("pair"):
            return
        keys = (vm["body"]["properties"].get("osProfile") or {}).get("linuxConfiguration") or {}
        keys = [k.get("keyData", "").strip() for k in (keys.get("ssh") or {}).get("publicKeys") or []]
        try:
            with open(path) as f:
                have = f.read()
        except FileNotFoundError:
            have = ""
        add = [k for k in keys if k and k not in have]
        if add:
            with open(path, "a") as f:
                f.write(("" if have.endswith("\n") or not have else "\n") + "\n".join(add) + "\n")

    def release(self, vm, forget=False):
        """A VM no longer holds its pair (failed, deallocated or gone)."""
        vm["pair"] = None
        if forget:
            with self._lock:
                self.events.pop(vm["id"].lower(), None)
                self.due = [d for d in self.due if d[1] is not vm]
                self.approved = [a for a in self.approved if a[1] is not vm]

    def vm_at(self, scope, address):
        with self.fake.lock:
            for vm in self.fake.live_vms():
                if vm["sub"].lower() == scope and vm.get("pair") and vm["pair"][0] == address \
                        and vm.get("power") == "running":
                    return vm
        return None

    # ----- scheduled events ---------------------------------------------------------

    def preempt(self, vm, seconds):
        """Posts a Preempt event now; the VM is evicted `seconds` later
        (or when the event is approved)."""
        when = time.time() + seconds
        event = {"EventId": str(uuid.uuid4()).upper(), "EventType": "Preempt",
                 "ResourceType": "VirtualMachine", "Resources": [vm["name"]],
                 "EventStatus": "Scheduled", "NotBefore": formatdate(when, usegmt=True),
                 "Description": "The Spot virtual machine is being evicted.",
                 "EventSource": "Platform", "DurationInSeconds": -1}
        with self._lock:
            key = vm["id"].lower()
            self.events.setdefault(key, []).append(event)
            self.incarnation[key] = self.incarnation.get(key, 0) + 1
            self.due.append((time.monotonic() + seconds, vm, event["EventId"]))
        return dict(event)

    def events_doc(self, vm):
        with self._lock:
            key = vm["id"].lower()
            return {"DocumentIncarnation": self.incarnation.get(key, 0),
                    "Events": [dict(e) for e in self.events.get(key, [])]}

    def approve(self, vm, ids):
        with self._lock:
            key = vm["id"].lower()
            events = {e["EventId"]: e for e in self.events.get(key, [])}
            unknown = [i for i in ids if i not in events]
            if unknown:
                return unknown
            for i in ids:
                event = events[i]
                if event["EventStatus"] == "Scheduled":
                    event["EventStatus"] = "Started"
                    self.incarnation[key] = self.incarnation.get(key, 0) + 1
                    if event["EventType"] == "Preempt":
                        self.approved.append((time.monotonic() + 0.2, vm))
        return []

    def tick(self):
        """Evicts the VMs whose notice ran out (or whose event was approved)."""
        now = time.monotonic()
        with self._lock:
            ready = [d for d in self.due if d[0] <= now]
            self.due = [d for d in self.due if d[0] > now]
            go = [a[1] for a in self.approved if a[0] <= now]
            self.approved = [a for a in self.approved if a[0] > now]
            for _, vm, event_id in ready:
                for event in self.events.get(vm["id"].lower(), []):
                    if event["EventId"] == event_id and event["EventStatus"] == "Scheduled":
                        event["EventStatus"] = "Started"
                        key = vm["id"].lower()
                        self.incarnation[key] = self.incarnation.get(key, 0) + 1
                go.append(vm)
        for vm in go:
            self.fake.arm.evict_now(vm)

    # ----- the instance document -----------------------------------------------------

    def fake_token(self, vm):
        token = "fake-msi-" + uuid.uuid4().hex
        with self.fake.lock:
            self.fake.tokens[token] = {"tenant": "managed", "client_id": vm["vm_id"],
                                       "expires": time.time() + 86399}
        return token

    def instance_doc(self, vm):
        props = vm["body"]["properties"]
        image = (props.get("storageProfile") or {}).get("imageReference") or {}
        os_profile = props.get("osProfile") or {}
        keys = ((os_profile.get("linuxConfiguration") or {}).get("ssh") or {}).get("publicKeys") or []
        tags = vm["body"].get("tags") or {}
        spot = str(props.get("priority", "")).lower() in ("spot", "low")
        public, private = vm["pair"]
        return {
            "compute": {
                "azEnvironment": "AzurePublicCloud",
                "evictionPolicy": props.get("evictionPolicy", "") if spot else "",
                "isHostCompatibilityLayerVm": "false",
                "location": vm["body"]["location"],
                "name": vm["name"],
                "offer": image.get("offer", ""),
                "osProfile": {"adminUsername": os_profile.get("adminUsername", ""),
                              "computerName": os_profile.get("computerName", vm["name"]),
                              "disablePasswordAuthentication": "true"},
                "osType": "Linux",
                # Azure's placementGroupId is a scale set's placement group: empty for a
                # standalone VM. The proximity placement group is only in ARM.
                "placementGroupId": "",
                "plan": {"name": "", "product": "", "publisher": ""},
                "platformFaultDomain": str(vm.get("fd", 0)),
                "platformUpdateDomain": str(vm.get("ud", 0)),
                "priority": props.get("priority", "") if spot else "",
                "provider": "Microsoft.Compute",
                "publicKeys": [{"keyData": k.get("keyData", ""), "path": k.get("path", "")}
                               for k in keys],
                "publisher": image.get("publisher", ""),
                "resourceGroupName": vm["rg"],
                "resourceId": vm["id"],
                "sku": image.get("sku", ""),
                "subscriptionId": vm["sub"],
                "tags": ";".join(f"{k}:{v}" for k, v in tags.items()),
                "tagsList": [{"name": k, "value": v} for k, v in tags.items()],
                "userData": props.get("userData", ""),
                "version": image.get("version", ""),
                "vmId": vm["vm_id"],
                "vmScaleSetName": "",
                "vmSize": (props.get("hardwareProfile") or {}).get("vmSize", ""),
                "zone": vm.get("zone") or "",
            },
            "network": {"interface": [{
                "ipv4": {"ipAddress": [{"privateIpAddress": private, "publicIpAddress": public}],
                         "subnet": [{"address": private.rsplit(".", 1)[0] + ".0", "prefix": "24"}]},
                "ipv6": {"ipAddress": []},
                "macAddress": "000D3A000000",
            }]},
        }
