#!/usr/bin/env python3
"""Fake Vast.ai API for gangway's Vast.ai provider tests.

Offer search (`POST /api/v0/bundles/` with the CLI's query JSON), renting an
offer (`PUT /api/v0/asks/{id}/`: on-demand, or a bid with `price` for an
interruptible instance), instances (`GET /api/v1/instances/` paginated as
the CLI reads them, the older `GET /api/v0/instances/`, `GET
/api/v0/instances/{id}/`), destroy, account SSH keys and attaching a key to
an instance, with `Authorization: Bearer KEY` or `?api_key=`. An offer that
is gone answers as Vast does ("no_such_ask"); an outbid interruptible
instance shows as stopped; instances are reachable through a real sshd
(ssh_host/ssh_port, public_ipaddr and ports["22/tcp"]). Requests are
checked against vast-api-subset.json (from Vast's OpenAPI document and the
vast-cli; see API-NOTES.md); violations are logged for `GET
/_fake/violations`.

    python server.py --host 127.0.0.1 --port 0 [--watch-stdin] [--verbose]
                     [--api-key KEY] [--rate-scale S] [--boot-seconds S]
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpucloud"))
sys.dont_write_bytecode = True

from fakecore import Fake, Reply, check_query, load_schemas, serve  # noqa: E402

SCHEMAS = load_schemas(os.path.join(HERE, "vast-api-subset.json"))
DEFS = SCHEMAS["defs"]
OPS = SCHEMAS["operations"]

# Machines for rent: (ask id, machine id, gpu_name, num_gpus, gpu_ram MB,
# dph_total on demand, min_bid, geolocation, verified). Prices are of the
# order of the published SkyPilot-format Vast catalog; the rest is made up.
MACHINES = [
    (41001, 9001, "RTX 4090", 1, 24564, 0.40, 0.18, "Washington, US", True),
    (41002, 9002, "RTX 4090", 2, 24564, 0.79, 0.36, "Washington, US", True),
    (41003, 9003, "RTX 5090", 1, 32607, 0.48, 0.25, "Texas, US", True),
    (41004, 9004, "A100 PCIE", 1, 81920, 0.87, 0.45, "Oklahoma, US", True),
    (41005, 9005, "A100 SXM4", 2, 40960, 1.49, 0.80, "Slovenia, SI", True),
    (41006, 9006, "H100 SXM", 8, 81559, 16.00, 9.00, "Vietnam, VN", True),
    (41007, 9007, "L40S", 1, 46068, 0.60, 0.30, "Oregon, US", True),
    (41008, 9008, "RTX A6000", 2, 49140, 0.85, 0.40, "Kansas, US", False),
]

CONTROL_KEYS = {"order", "type", "limit", "allocated_storage"}


def fail(status, error, msg, **extra):
    return Reply(status, dict({"success": False, "error": error, "msg": msg}, **extra))


class VastFake(Fake):
    cloud = "vast"
    synthetic_ssh_port = 0
    routes = [
        ("POST", r"/api/v0/bundles/?", "searchOffers", "search"),
        ("PUT", r"/api/v0/asks/(?P<id>[^/]+)/?", "createInstance", "create"),
        ("GET", r"/api/v1/instances/?", "showInstances", "show_v1"),
        ("GET", r"/api/v0/instances/?", "showInstancesV0", "show_v0"),
        ("GET", r"/api/v0/instances/(?P<id>[^/]+)/?", "showInstance", "show_one"),
        ("DELETE", r"/api/v0/instances/(?P<id>[^/]+)/?", "destroyInstance", "destroy"),
        ("POST", r"/api/v0/instances/(?P<id>[^/]+)/ssh/?", "attachSshKey", "attach"),
        ("POST", r"/api/v0/ssh/?", "createSshKey", "create_key"),
        ("GET", r"/api/v0/ssh/?", "getSshKeysUser", "list_keys"),
        ("DELETE", r"/api/v0/ssh/(?P<id>[^/]+)/?", "deleteSshKey", "delete_key"),
    ]

    def reset_state(self):
        self.offers = {}
        for ask, mid, gpu, n, ram, dph, bid, geo, verified in MACHINES:
            self.offers[ask] = {
                "id": ask, "ask_contract_id": ask, "bundle_id": ask, "machine_id": mid, "host_id": mid + 100000,
                "gpu_name": gpu, "num_gpus": n, "gpu_ram": ram, "gpu_total_ram": ram * n,
                "cpu_cores": 16 * n, "cpu_cores_effective": 8.0 * n, "cpu_ram": 64000 * n,
                "disk_space": 500.0, "dph_base": dph, "dph_total": dph, "min_bid": bid,
                "geolocation": geo, "verified": verified, "verification": "verified" if verified else "unverified",
                "rentable": True, "rented": False, "external": False, "reliability": 0.995,
                "reliability2": 0.995, "inet_up": 800.0, "inet_down": 900.0, "direct_port_count": 100,
                "cuda_max_good": 12.8, "driver_version": "570.124.06", "static_ip": True,
                "datacenter": None, "is_bid": False, "gpu_arch": "nvidia", "compute_cap": 890,
            }
        self.gone = set()           # asks made unavailable by the test
        self.instances = {}
        self.keys = {}
        self.next_id = 7000001
        self.next_key = 1
        self.intervals = {}         # op -> seconds between calls (Vast's per-endpoint limits)

    def handle(self, req):
        if req.path.startswith("/_fake/"):
            return super().handle(req)
        key = self.bearer_key(req)
        if key is None and "api_key" in req.query:
            key = req.query["api_key"][0]
        req.query = {k: v for k, v in req.query.items() if k != "api_key"}
        if key is None or key not in self.api_keys:
            self.violation(req, "auth", ["Authorization: missing or malformed" if key is None
                                         else "Authorization: unknown API key"])
            return fail(401, "invalid_api_key", "Invalid or missing API key.")
        req.api_key = key
        return super().handle(req)

    def not_found(self, req, method_not_allowed=False):
        return fail(404, "not_found", f"no such endpoint {req.path}")

    def limited(self, req):
        interval = self.intervals.get(req.op)
        if interval and not self.limiter.hit(req.api_key, req.op, 1, interval):
            return Reply(429, f"API requests too frequent endpoint threshold={interval}", "text/plain")
        return None

    def checked(self, req):
        spec = OPS[req.op]
        problems = []
        check_query(spec.get("query", {}), req.query, problems)
        body = {}
        if "body" in spec:
            body, more = self.checked_body(req, spec["body"], DEFS)
            problems.extend(more)
        elif req.body.strip() not in (b"", b"{}", b"null"):
            problems.append("body: this call takes none")
        if problems:
            self.violation(req, "request", problems)
            return None, fail(400, "invalid_args", "; ".join(problems))
        return body, None

    # ----- offers ----------------------------------------------------------

    def search(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        bad = self.limited(req)
        if bad:
            return bad
        problems = []
        for field, cond in body.items():
            if field in CONTROL_KEYS or cond is None:
                continue
            if not isinstance(cond, dict) or not cond:
                problems.append(f"{field}: a filter is an object such as {{\"eq\": ...}}")
        if problems:
            self.violation(req, "request", problems)
            return fail(400, "invalid_args", "; ".join(problems))
        bid = body.get("type") == "bid"
        rows = []
        for ask, offer in self.offers.items():
            row = dict(offer)
            row["rented"] = ask in self.rented_asks()
            row["rentable"] = not row["rented"] and ask not in self.gone
            if bid:
                row["is_bid"] = True
                row["dph_total"] = row["min_bid"]
            if all(self.matches(row.get(f), c) for f, c in body.items() if f not in CONTROL_KEYS and c):
                rows.append(row)
        for field, direction in reversed(body.get("order") or []):
            rows.sort(key=lambda r: (r.get(field) is None, r.get(field)), reverse=direction == "desc")
        if body.get("limit"):
            rows = rows[: body["limit"]]
        return Reply(200, {"offers": rows})

    @staticmethod
    def matches(value, cond):
        for op, want in cond.items():
            try:
                ok = {"eq": lambda: value == want, "neq": lambda: value != want,
                      "gt": lambda: value is not None and value > want,
                      "lt": lambda: value is not None and value < want,
                      "gte": lambda: value is not None and value >= want,
                      "lte": lambda: value is not None and value <= want,
                      "in": lambda: value in want, "notin": lambda: value not in want}[op]()
            except TypeError:
                ok = False
            if not ok:
                return False
        return True

    def rented_asks(self):
        # An on-demand rental takes the machine; a bid holds it until outbid.
        return {i["_ask"] for i in self.instances.values() if i["cur_state"] == "running"}

    # ----- instances -------------------------------------------------------

    def create(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        bad = self.limited(req)
        if bad:
            return bad
        try:
            ask = int(req.params["id"])
        except ValueError:
            self.violation(req, "path", [f"id: {req.params['id']!r} is no integer"])
            return fail(400, "invalid_args", f"error 400/3467: Invalid args: 'id' is required and must be a valid offer ID")
        offer = self.offers.get(ask)
        free_slots = self.slots.free()
        if offer is None or ask in self.gone or ask in self.rented_asks() or free_slots == 0:
            if body.get("cancel_unavail"):
                return fail(410, "no_such_ask", f"error 410/3907: no_such_ask Instance type {ask} is no longer available.",
                            ask_id=ask)
            return fail(404, "invalid_args", f"error 404/3603: no_such_ask Instance type by id {ask} is not available.",
                        ask_id=ask)
        price = body.get("price")
        is_bid = price is not None
        if is_bid and price < offer["min_bid"]:
            return fail(400, "invalid_price", f"Bid price {price} is below the minimum bid {offer['min_bid']}.",
                        ask_id=ask)
        iid = self.next_id
        self.next_id += 1
        address, port = self.slots.take(str(iid))
        env = body.get("env") or {}
        if isinstance(env, str):
            env = parse_docker_env(env)
        self.instances[iid] = {
            "id": iid, "machine_id": offer["machine_id"], "host_id": offer["host_id"], "bundle_id": ask,
            "actual_status": None, "intended_status": body.get("target_state") or "running",
            "cur_state": "running", "next_state": "running",
            "label": body.get("label"), "image_uuid": body["image"], "image_runtype": body.get("runtype") or "ssh",
            "onstart": body.get("onstart"), "extra_env": [[k, v] for k, v in env.items() if not k.startswith("-")],
            "gpu_name": offer["gpu_name"], "num_gpus": offer["num_gpus"], "gpu_ram": offer["gpu_ram"],
            "disk_space": body.get("disk") or 10.0, "geolocation": offer["geolocation"],
            "dph_base": offer["dph_base"], "dph_total": price if is_bid else offer["dph_total"],
            "min_bid": offer["min_bid"], "is_bid": is_bid, "start_date": time.time(),
            "ssh_host": None, "ssh_port": None, "public_ipaddr": None, "ports": {},
            "status_msg": None, "template_id": None, "template_hash_id": body.get("template_hash_id"),
            "verification": offer["verification"], "direct_port_count": offer["direct_port_count"],
            "_ask": ask, "_address": address, "_ssh_port": port, "_created": time.monotonic(),
            "_keys": [k["public_key"] for k in self.keys.values()],
        }
        return Reply(200, {"success": True, "new_contract": iid})

    def view(self, inst):
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def show_v1(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        bad = self.limited(req)
        if bad:
            return bad
        rows = [self.view(i) for _, i in sorted(self.instances.items())]
        filters = json.loads(req.query["select_filters"][0]) if "select_filters" in req.query else {}
        rows = [r for r in rows if all(self.matches(r.get(f), c) for f, c in filters.items()
                                       if isinstance(c, dict))]
        start = int(req.query["after_token"][0]) if "after_token" in req.query else 0
        limit = int(req.query.get("limit", ["25"])[0])
        page = rows[start:start + limit]
        more = start + limit < len(rows)
        return Reply(200, {"success": True, "instances_found": len(page), "total_instances": len(rows),
                           "label_counts": {}, "next_token": str(start + limit) if more else None,
                           "instances": page})

    def show_v0(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        return Reply(200, {"instances": [self.view(i) for _, i in sorted(self.instances.items())]})

    def instance(self, req):
        try:
            return self.instances.get(int(req.params["id"]))
        except ValueError:
            return None

    def show_one(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        inst = self.instance(req)
        if inst is None:
            return fail(404, "no_such_instance", f"Instance {req.params['id']} not found.")
        return Reply(200, {"instances": self.view(inst)})

    def destroy(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        inst = self.instance(req)
        if inst is None:
            return fail(404, "no_such_instance", f"Instance {req.params['id']} not found.")
        del self.instances[inst["id"]]
        self.slots.release(str(inst["id"]))
        return Reply(200, {"success": True, "msg": f"Instance {inst['id']} destroyed."})

    def attach(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        inst = self.instance(req)
        if inst is None:
            return fail(404, "no_such_instance", f"Instance {req.params['id']} not found.")
        inst["_keys"].append(body["ssh_key"].strip())
        if inst["actual_status"] == "running":
            self.slots.install_key(body["ssh_key"])
        return Reply(200, {"success": True, "msg": "SSH key attached to the instance."})

    def create_key(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        if not body["ssh_key"].strip():
            return fail(400, "no_ssh_key", "No SSH key given.")
        kid = self.next_key
        self.next_key += 1
        key = {"id": kid, "user_id": 1, "public_key": body["ssh_key"].strip(),
               "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "deleted_at": None}
        self.keys[kid] = key
        return Reply(200, {"success": True, "key": key})

    def list_keys(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        return Reply(200, [{"id": k["id"], "user_id": k["user_id"], "key": k["public_key"],
                            "created_at": k["created_at"], "deleted_at": None} for k in self.keys.values()])

    def delete_key(self, req):
        body, bad = self.checked(req)
        if bad:
            return bad
        try:
            kid = int(req.params["id"])
        except ValueError:
            kid = None
        if kid not in self.keys:
            return fail(400, "invalid_args", "No such SSH key.")
        del self.keys[kid]
        return Reply(200, {"success": True})

    # ----- time and control -----------------------------------------------

    def tick(self):
        now = time.monotonic()
        for inst in self.instances.values():
            if inst["cur_state"] != "running" or inst["intended_status"] != "running":
                continue
            age = now - inst["_created"]
            if inst["actual_status"] is None and age >= self.args.boot_seconds / 2:
                inst["actual_status"] = "loading"
                inst["status_msg"] = "Pulling image"
            if inst["actual_status"] == "loading" and age >= self.args.boot_seconds:
                inst["actual_status"] = "running"
                inst["status_msg"] = "success, running " + str(inst["image_uuid"])
                inst["ssh_host"] = inst["public_ipaddr"] = inst["_address"]
                inst["ssh_port"] = inst["_ssh_port"]
                inst["ports"] = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst["_ssh_port"])}]}
                for key in inst["_keys"]:
                    self.slots.install_key(key)

    def state(self):
        return {
            "instances": [dict(self.view(i), _ssh=[i["_address"], i["_ssh_port"]], _ask=i["_ask"])
                          for i in self.instances.values()],
            "ssh_keys": list(self.keys.values()),
            "gone_offers": sorted(self.gone),
            "rate_intervals": self.intervals,
            "leaks": [{"kind": "instance", "id": i["id"], "name": i["label"],
                       "status": f"{i['actual_status']}/{i['intended_status']}"} for i in self.instances.values()],
        }

    def control(self, what, req):
        b = req.control_body
        if what == "offer" and req.method == "POST":
            ask = int(b["id"])
            if ask not in self.offers:
                raise KeyError(f"no offer {ask}")
            if b.get("gone", True):
                self.gone.add(ask)
            else:
                self.gone.discard(ask)
            return Reply(200, {"gone_offers": sorted(self.gone)})
        if what == "offers" and req.method == "POST":
            # Another machine like offer `like` (a second node for a gang in
            # one location): {"like": ASK, "id": NEW_ASK, "machine_id": M}.
            like = self.offers.get(int(b["like"]))
            if like is None:
                raise KeyError(f"no offer {b['like']}")
            ask, mid = int(b["id"]), int(b["machine_id"])
            if ask in self.offers or any(o["machine_id"] == mid for o in self.offers.values()):
                raise ValueError(f"offer {ask} or machine {mid} exists")
            self.offers[ask] = dict(like, id=ask, ask_contract_id=ask, bundle_id=ask,
                                    machine_id=mid, host_id=mid + 100000)
            return Reply(200, {"offers": sorted(self.offers)})
        if what == "outbid" and req.method == "POST":
            inst = self.instances.get(int(b["id"]))
            if inst is None:
                raise KeyError(f"no instance {b['id']}")
            if not inst["is_bid"] and not b.get("force"):
                raise ValueError("the instance is on demand, not a bid (force: true to stop it anyway)")
            inst.update({"actual_status": "stopped", "cur_state": "stopped", "next_state": "stopped",
                         "status_msg": "Instance stopped: outbid", "ssh_host": None, "ssh_port": None,
                         "public_ipaddr": None, "ports": {}})
            self.slots.release(str(inst["id"]))
            return Reply(200, {"instances": self.view(inst)})
        if what == "rate-intervals" and req.method == "POST":
            for op, seconds in b.items():
                if op not in OPS:
                    raise ValueError(f"{op}: one of {sorted(OPS)}")
                if seconds is None:
                    self.intervals.pop(op, None)
                else:
                    self.intervals[op] = float(seconds)
            return Reply(200, {"rate_intervals": self.intervals})
        return None


def parse_docker_env(text):
    """The document's form of env: "-e K=V -p 8000:8000"."""
    out, words, i = {}, text.split(), 0
    while i < len(words) - 1:
        if words[i] == "-e" and "=" in words[i + 1]:
            k, v = words[i + 1].split("=", 1)
            out[k] = v
            i += 2
        elif words[i] in ("-p", "-v", "-n", "-h"):
            out[f"{words[i]} {words[i + 1]}"] = "1"
            i += 2
        else:
            i += 1
    return out


if __name__ == "__main__":
    sys.exit(serve(VastFake, __doc__.split("\n\n")[0]))
