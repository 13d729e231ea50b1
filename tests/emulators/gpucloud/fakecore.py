"""What the Lambda Cloud, RunPod and Vast.ai fakes share: the HTTP server
and its command line, request checks against a vendored JSON schema subset,
the violation log, rate limiting, and the (address, ssh_port) slots that
make instances reachable through a real sshd.

Each fake (`../lambda/server.py`, `../runpod/server.py`, `../vast/server.py`)
subclasses `Fake`, declares its routes and answers them; everything here is
standard-library Python 3.9+.

Conventions (the same in all three fakes, see each README):

* `python server.py --host 127.0.0.1 --port 0 [--watch-stdin] [--verbose]`
  prints one line `READY http://HOST:PORT` once it answers, then serves until
  SIGTERM/SIGINT or, with --watch-stdin, end of file on stdin.
* The control API lives under `/_fake/` on the same port (no auth).
* Every request that breaks the recorded request shapes (unknown field,
  wrong type, missing required field, value outside an enum or range,
  missing or wrong credentials) is answered the way the real API answers it
  *and* logged as a violation; `GET /_fake/violations` lists them, so a test
  asserts `count == 0` at its end.
"""

import argparse
import base64
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("gpucloud-fake")


def now_iso():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ----- schema checks ----------------------------------------------------------

def load_schemas(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _type_ok(value, kind):
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    raise ValueError(f"schema type {kind!r} unknown")


def check_value(schema, value, where, problems, defs):
    """Appends to `problems` what is wrong with `value` under `schema` (a
    subset of JSON Schema: type (or a list of types), properties,
    required, additionalProperties (false: unknown fields refused, the
    default here; a schema: a map), items, enum, minimum, maximum,
    minLength, maxLength, pattern, minItems, maxItems, anyOf, nullable, $ref
    into `defs`)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].split("/")[-1]]
    if value is None and (schema.get("nullable") or "null" in _types(schema)):
        return
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            trial = []
            check_value(option, value, where, trial, defs)
            if not trial:
                return
        problems.append(f"{where}: matches none of the allowed shapes")
        return
    kinds = _types(schema)
    if kinds and not any(_type_ok(value, k) for k in kinds):
        problems.append(f"{where}: expected {' or '.join(kinds)}, got {json.dumps(value)[:60]}")
        return
    if "enum" in schema and value not in schema["enum"]:
        shown = ", ".join(map(str, schema["enum"][:12])) + (", ..." if len(schema["enum"]) > 12 else "")
        problems.append(f"{where}: {json.dumps(value)[:60]} is not one of {shown}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{where}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{where}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            problems.append(f"{where}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.append(f"{where}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append(f"{where}: {value[:60]!r} does not match {schema['pattern']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            problems.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"{where}: more than {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                check_value(schema["items"], item, f"{where}[{i}]", problems, defs)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                problems.append(f"{where + '.' if where else ''}{name}: required field missing")
        extra = schema.get("additionalProperties", False)
        for name, item in value.items():
            sub = f"{where}.{name}" if where else name
            if name in props:
                check_value(props[name], item, sub, problems, defs)
            elif extra is True:
                pass
            elif isinstance(extra, dict):
                check_value(extra, item, sub, problems, defs)
            else:
                problems.append(f"{sub}: unknown field")


def _types(schema):
    kind = schema.get("type")
    if kind is None:
        return []
    return kind if isinstance(kind, list) else [kind]


def check_query(spec, query, problems):
    """`spec`: {name: schema} of the query parameters (values arrive as
    strings; integer/number/boolean ones must parse; `"json": true` ones
    must be JSON). Unknown parameters are problems too."""
    for name, values in query.items():
        if name not in spec:
            problems.append(f"query parameter {name}: unknown")
            continue
        schema = spec[name]
        for raw in values:
            kind = schema.get("type", "string")
            try:
                if schema.get("json"):
                    value = json.loads(raw)
                elif kind == "integer":
                    value = int(raw)
                elif kind == "number":
                    value = float(raw)
                elif kind == "boolean":
                    if raw not in ("true", "false"):
                        raise ValueError
                    value = raw == "true"
                else:
                    value = raw
            except ValueError:
                problems.append(f"query parameter {name}: {raw[:40]!r} is no {kind}")
                continue
            sub = dict(schema)
            sub.pop("json", None)
            if schema.get("json"):
                sub.pop("type", None)
            check_value(sub, value, f"query parameter {name}", problems, {})
    for name, schema in spec.items():
        if schema.get("required") is True and name not in query:
            problems.append(f"query parameter {name}: required, missing")


# ----- rate limits ------------------------------------------------------------

class RateLimiter:
    """At most `count` calls per `window` seconds per (identity, bucket),
    sliding; `scale` multiplies every window (0 turns limits off)."""

    def __init__(self, scale=1.0):
        self.scale = scale
        self._lock = threading.Lock()
        self._seen = {}
        self.refused = 0

    def hit(self, identity, bucket, count, window):
        """True when the call may go ahead (and records it)."""
        window = window * self.scale
        if window <= 0 or count <= 0:
            return True
        now = time.monotonic()
        with self._lock:
            times = [t for t in self._seen.get((identity, bucket), []) if now - t < window]
            if len(times) >= count:
                self._seen[(identity, bucket)] = times
                self.refused += 1
                return False
            times.append(now)
            self._seen[(identity, bucket)] = times
            return True

    def forget_windows(self):
        with self._lock:
            self._seen.clear()

    def reset(self):
        with self._lock:
            self._seen.clear()
            self.refused = 0


# ----- reachable instances ----------------------------------------------------

class Slots:
    """(address, ssh_port) pairs a test has an sshd listening on. A created
    instance takes the first free one; its public key is appended to the
    `authorized_keys` file (as these clouds put it into root's on boot).
    Without slots, instances get made-up addresses (TEST-NET-2,
    198.51.100.0/24) that nothing listens on."""

    def __init__(self, synthetic_port):
        self._lock = threading.Lock()
        self.slots = []
        self.authorized_keys = None
        self.held = {}          # instance id -> (address, port)
        self.synthetic_port = synthetic_port
        self._next = 0

    def configure(self, spec):
        if not isinstance(spec, dict):
            raise ValueError("a machines spec is a JSON object")
        unknown = set(spec) - {"slots", "authorized_keys"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; known: authorized_keys, slots")
        slots = spec.get("slots", [])
        if not isinstance(slots, list) or not all(
                isinstance(s, list) and len(s) == 2 and isinstance(s[0], str)
                and isinstance(s[1], int) and not isinstance(s[1], bool) for s in slots):
            raise ValueError('"slots" is a list of [address, ssh_port] pairs')
        keys = spec.get("authorized_keys")
        if keys is not None and not isinstance(keys, str):
            raise ValueError('"authorized_keys" is a file path')
        with self._lock:
            self.slots = [tuple(s) for s in slots]
            if "authorized_keys" in spec:
                self.authorized_keys = keys
            return self.view()

    def view(self):
        return {"slots": [list(s) for s in self.slots], "authorized_keys": self.authorized_keys,
                "held": {k: list(v) for k, v in self.held.items()}}

    def free(self):
        with self._lock:
            if not self.slots:
                return None     # unlimited (synthetic addresses)
            taken = set(self.held.values())
            return sum(1 for s in self.slots if s not in taken)

    def take(self, instance_id):
        """The slot for a new instance, or None when slots are set and all
        are taken (the caller checked `free()` first, so this is a race)."""
        with self._lock:
            if instance_id in self.held:
                return self.held[instance_id]
            if self.slots:
                taken = set(self.held.values())
                for s in self.slots:
                    if s not in taken:
                        self.held[instance_id] = s
                        return s
                return None
            self._next += 1
            n = self._next
            port = self.synthetic_port if self.synthetic_port else 20000 + n
            slot = (f"198.51.100.{1 + (n - 1) % 254}", port)
            self.held[instance_id] = slot
            return slot

    def release(self, instance_id):
        with self._lock:
            self.held.pop(instance_id, None)

    def install_key(self, public_key):
        path = self.authorized_keys
        key = (public_key or "").strip()
        if not path or not key:
            return False
        with self._lock:
            try:
                with open(path) as f:
                    have = f.read()
            except FileNotFoundError:
                have = ""
            if key not in have.splitlines():
                with open(path, "a") as f:
                    f.write(("" if have.endswith("\n") or not have else "\n") + key + "\n")
        return True

    def reset(self):
        with self._lock:
            self.slots = []
            self.authorized_keys = None
            self.held.clear()
            self._next = 0


# ----- HTTP -------------------------------------------------------------------

class Request:
    def __init__(self, method, path, query, headers, body, client):
        self.method = method
        self.path = path
        self.query = query          # {name: [values]}
        self.headers = headers
        self.body = body            # bytes
        self.client = client
        self.params = {}            # from the route's path pattern
        self.op = None

    def json(self):
        """The body as JSON; raises ValueError when it is not."""
        if not self.body.strip():
            return None
        return json.loads(self.body)


class Reply:
    def __init__(self, status, body=None, ctype="application/json", headers=None):
        self.status = status
        self.body = body
        self.ctype = ctype
        self.headers = headers or {}

    def encode(self):
        if self.body is None:
            return b""
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body).encode()


class Fake:
    """One cloud's fake. Subclasses set `cloud`, `routes` ([(method, regex,
    op name, handler method name)]) and the answers."""

    cloud = "?"
    routes = []
    synthetic_ssh_port = 22

    def __init__(self, args):
        self.args = args
        self.lock = threading.RLock()
        self.violations = []
        self.calls = {}
        self.limiter = RateLimiter(args.rate_scale)
        self.slots = Slots(self.synthetic_ssh_port)
        self.api_keys = set(args.api_key or ["test-key"])
        self._compiled = [(m, re.compile("^" + rx + "$"), op, h) for m, rx, op, h in self.routes]

    # --- hooks for subclasses ---
    def reset_state(self):
        raise NotImplementedError

    def state(self):
        raise NotImplementedError

    def tick(self):
        """Called four times a second: time-driven state changes."""

    def control(self, what, req):
        """Cloud-specific `/_fake/WHAT` calls; None when unknown."""
        return None

    # --- the violation log ---
    def violation(self, req, kind, problems):
        entry = {"time": now_iso(), "method": req.method, "path": req.path, "op": req.op,
                 "kind": kind, "problems": list(problems)}
        with self.lock:
            self.violations.append(entry)
        log.info("violation %s %s: %s", req.method, req.path, "; ".join(problems))

    # --- dispatch ---
    def handle(self, req):
        if req.path.startswith("/_fake/"):
            return self._control(req)
        for method, rx, op, handler in self._compiled:
            m = rx.match(req.path)
            if m and method == req.method:
                req.params = m.groupdict()
                req.op = op
                with self.lock:
                    self.calls[op] = self.calls.get(op, 0) + 1
                return getattr(self, handler)(req)
        for method, rx, op, handler in self._compiled:
            if rx.match(req.path):
                req.op = op
                self.violation(req, "method", [f"{req.method} is not a method of {req.path}"])
                return self.not_found(req, method_not_allowed=True)
        self.violation(req, "path", [f"no such endpoint: {req.method} {req.path}"])
        return self.not_found(req)

    def not_found(self, req, method_not_allowed=False):
        return Reply(405 if method_not_allowed else 404, {"error": "not found"})

    # --- auth helpers ---
    def bearer_key(self, req):
        auth = req.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer "):].strip()
        return None

    def basic_key(self, req):
        """Lambda's two Basic forms: base64 of `KEY:` (curl -u KEY:) or the
        bare key."""
        auth = req.headers.get("Authorization", "")
        if not auth.startswith("Basic "):
            return None
        raw = auth[len("Basic "):].strip()
        try:
            decoded = base64.b64decode(raw, validate=True).decode()
            if decoded.endswith(":"):
                return decoded[:-1]
        except (ValueError, UnicodeDecodeError):
            pass
        return raw

    # --- body checks ---
    def checked_body(self, req, schema, defs):
        """(body, problems): the JSON body and what breaks `schema`."""
        try:
            body = req.json()
        except ValueError:
            return None, ["body: not JSON"]
        problems = []
        if body is None:
            body = {}
            if schema.get("required"):
                problems.append("body: missing (a JSON object is required)")
                return body, problems
        check_value(schema, body, "", problems, defs)
        return body, problems

    # --- control API ---
    def _control(self, req):
        what = req.path[len("/_fake/"):].strip("/")
        try:
            body = req.json() if req.body.strip() else {}
        except ValueError:
            return Reply(400, {"error": "control body is not JSON"})
        req.control_body = body if body is not None else {}
        if what == "health" and req.method == "GET":
            return Reply(200, {"ok": True, "cloud": self.cloud})
        if what == "violations":
            if req.method == "GET":
                with self.lock:
                    return Reply(200, {"count": len(self.violations), "violations": list(self.violations)})
            if req.method == "DELETE":
                with self.lock:
                    n = len(self.violations)
                    self.violations.clear()
                return Reply(200, {"cleared": n})
        if what == "state" and req.method == "GET":
            with self.lock:
                state = self.state()
                state.update({"cloud": self.cloud, "violations": len(self.violations),
                              "calls": dict(self.calls), "rate_limited": self.limiter.refused,
                              "rate_scale": self.limiter.scale, "machines": self.slots.view()})
                return Reply(200, state)
        if what == "reset" and req.method == "POST":
            with self.lock:
                self.violations.clear()
                self.calls.clear()
                self.limiter.reset()
                self.slots.reset()
                self.reset_state()
            return Reply(200, {"reset": True})
        if what == "machines" and req.method in ("POST", "GET"):
            if req.method == "GET":
                return Reply(200, self.slots.view())
            try:
                return Reply(200, self.slots.configure(req.control_body))
            except ValueError as err:
                return Reply(400, {"error": str(err)})
        if what == "rate-limit":
            if req.method == "POST":
                b = req.control_body
                if "scale" in b:
                    if not isinstance(b["scale"], (int, float)) or b["scale"] < 0:
                        return Reply(400, {"error": '"scale" is a number >= 0 (0: no limits)'})
                    self.limiter.scale = float(b["scale"])
                self.limiter.forget_windows()
            return Reply(200, {"scale": self.limiter.scale, "refused": self.limiter.refused})
        if what == "api-keys":
            if req.method == "POST":
                keys = req.control_body.get("keys")
                if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
                    return Reply(400, {"error": '"keys" is a list of non-empty strings'})
                self.api_keys = set(keys)
            return Reply(200, {"keys": sorted(self.api_keys)})
        try:
            reply = self.control(what, req)
        except (ValueError, KeyError, TypeError) as err:
            return Reply(400, {"error": str(err)})
        if reply is None:
            return Reply(404, {"error": f"no control call {req.method} /_fake/{what}"})
        return reply


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpucloud-fake"
    sys_version = ""

    def log_message(self, fmt, *args):
        log.info("%s %s", self.address_string(), fmt % args)

    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        req = Request(self.command, url.path, query, self.headers, body, self.client_address[0])
        try:
            reply = self.server.fake.handle(req)
        except Exception:   # an emulator bug: say so loudly
            log.exception("emulator bug on %s %s", self.command, self.path)
            reply = Reply(500, {"error": "fake emulator bug; see its stderr"})
        data = reply.encode()
        if reply.status >= 400:
            log.info("-> %d %s", reply.status, data[:300])
        self.send_response(reply.status)
        if reply.status != 204:
            self.send_header("Content-Type", reply.ctype)
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, fake):
        self.fake = fake
        super().__init__(address, Handler)


def arg_parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--watch-stdin", action="store_true", help="exit when standard input reaches end of file")
    p.add_argument("--verbose", action="store_true", help="log every request, answer and violation to stderr")
    p.add_argument("--api-key", action="append",
                   help="an API key the fake accepts (repeatable; default: test-key)")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="multiplies every rate-limit window (1: the documented limits, 0: none, "
                        "0.01: a hundred times looser)")
    p.add_argument("--boot-seconds", type=float, default=1.0,
                   help="how long a new instance takes to become reachable / running")
    return p


def serve(fake_class, description):
    args = arg_parser(description).parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format=f"{fake_class.cloud}-fake: %(message)s", stream=sys.stderr)
    fake = fake_class(args)
    fake.reset_state()
    server = Server((args.host, args.port), fake)
    host, port = server.server_address[:2]
    endpoint = f"http://{host}:{port}"
    threading.Thread(target=server.serve_forever, name="serve", daemon=True).start()
    stop = threading.Event()

    def ticker():
        while not stop.wait(0.25):
            try:
                with fake.lock:
                    fake.tick()
            except Exception:
                log.exception("emulator bug in tick")
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
    server.server_close()
    return 0


def _here():
    return os.path.dirname(os.path.abspath(__file__))
