#!/usr/bin/env python3
"""A request-logging, fault-injecting HTTP front for the storage emulators.

Standard library only. It listens on a loopback port and hands every request
on to one upstream (moto's S3, fake-gcs-server), streaming bodies both ways
in 1 MiB pieces, so a multi-gigabyte upload never sits in its memory. For
each request it records who asked and how many bytes went each way, which
is how a test proves that no checkpoint byte passed through a given process
(by `User-Agent`, or by the `X-Gangway-Caller` header a client adds).

    python3 front.py --upstream http://127.0.0.1:9000 --port 0 [--flavor s3|gcs]

prints `READY http://127.0.0.1:PORT` once it listens. The emulators'
launchers (../s3/server.py, ../gcs/server.py) import it instead and start
their store behind it. The control API, under /_gangway/ on the same port,
is described in README.md beside this file. With the `gcs` flavor it also
answers Google's STS token exchange (POST /v1/token) and holds the
downscoped tokens it issues to their Credential Access Boundary
(gcs_sts.py beside this file).
"""

import argparse
import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import hashlib
import urllib.parse
import http.client
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gcs_sts

# One piece of a streamed body.
PIECE = 1 << 20
def signing_key_id(authorization):
    """The access key id an AWS SigV4 request was signed with (the public
    half: `Credential=AKID/date/...`); for an OAuth bearer token
    `bearer-sha256:` and the first 16 hex digits of its SHA-256 (which
    token, never the token); else None."""
    if authorization and authorization.startswith("Bearer "):
        token = authorization[len("Bearer "):].strip()
        return "bearer-sha256:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    if not authorization or "Credential=" not in authorization:
        return None
    return authorization.split("Credential=", 1)[1].split("/", 1)[0]


# The header a client may add to say who it is; logged as `caller`.
CALLER_HEADER = "X-Gangway-Caller"
# Headers that belong to one connection, never handed on.
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
    "expect",
}
# How long a connection may sit without a byte moving either way.
IDLE_TIMEOUT = 600
# At most this many requests are kept in the log (the oldest go first).
LOG_LIMIT = 1_000_000


class Dropped(Exception):
    """A fault rule closed the client's connection on purpose."""


class ClientGone(Exception):
    """The client closed its connection or sent a malformed body."""


class FaultRules:
    """The fault rules of the control API; thread-safe."""

    FIELDS = {
        "method", "path_contains", "caller", "action", "status", "after_bytes",
        "direction", "times", "body", "content_type", "delay_ms", "code",
        "message", "headers",
    }

    def __init__(self):
        self._lock = threading.Lock()
        self._rules = []
        self._next_id = 1

    def add(self, spec):
        """Validates `spec` and adds it; returns the stored rule."""
        if not isinstance(spec, dict):
            raise ValueError("a fault rule is a JSON object")
        unknown = set(spec) - self.FIELDS
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; known: {sorted(self.FIELDS)}")
        action = spec.get("action", "status")
        if action not in ("drop", "status", "delay"):
            raise ValueError('action is one of "drop", "status", "delay"')
        direction = spec.get("direction", "request")
        if direction not in ("request", "response"):
            raise ValueError('direction is "request" (the request body) or "response" (the response body)')
        if direction == "response" and action != "drop":
            raise ValueError('direction "response" is for action "drop"')
        path_contains = spec.get("path_contains", [])
        if isinstance(path_contains, str):
            path_contains = [path_contains]
        if not all(isinstance(p, str) for p in path_contains):
            raise ValueError("path_contains is a string or a list of strings")
        for key in ("status", "after_bytes", "times", "delay_ms"):
            if key in spec and not isinstance(spec[key], int):
                raise ValueError(f"{key} is an integer")
        headers = spec.get("headers", {})
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise ValueError("headers is an object of header names to string values")
        times = spec.get("times", 1)
        if times == 0 or times < -1:
            raise ValueError("times is a positive count, or -1 for every match")
        rule = {
            "method": (spec.get("method") or "").upper() or None,
            "path_contains": path_contains,
            "caller": spec.get("caller"),
            "action": action,
            "status": spec.get("status", 503),
            "after_bytes": spec.get("after_bytes"),
            "direction": direction,
            "delay_ms": spec.get("delay_ms", 0),
            "body": spec.get("body"),
            "content_type": spec.get("content_type"),
            "code": spec.get("code"),
            "message": spec.get("message"),
            "headers": headers,
            "times": times,
            "remaining": times,
            "fired": 0,
        }
        if action == "delay" and rule["delay_ms"] <= 0:
            raise ValueError('action "delay" needs delay_ms > 0')
        with self._lock:
            rule["id"] = self._next_id
            self._next_id += 1
            self._rules.append(rule)
            return dict(rule)

    def take(self, method, path, caller):
        """The first live rule matching this request, counted as fired."""
        with self._lock:
            for rule in self._rules:
                if rule["remaining"] == 0:
                    continue
                if rule["method"] and rule["method"] != method:
                    continue
                if rule["caller"] is not None and rule["caller"] != caller:
                    continue
                if not all(p in path for p in rule["path_contains"]):
                    continue
                if rule["remaining"] > 0:
                    rule["remaining"] -= 1
                rule["fired"] += 1
                return dict(rule)
        return None

    def list(self):
        with self._lock:
            return [dict(r) for r in self._rules]

    def remove(self, rule_id=None):
        """Removes one rule (or all); returns how many went."""
        with self._lock:
            before = len(self._rules)
            if rule_id is None:
                self._rules = []
            else:
                self._rules = [r for r in self._rules if r["id"] != rule_id]
            return before - len(self._rules)


class RequestLog:
    """Every request the front handled, oldest first; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = []
        self._next_id = 1

    def add(self, entry):
        with self._lock:
            entry["id"] = self._next_id
            self._next_id += 1
            self._entries.append(entry)
            if len(self._entries) > LOG_LIMIT:
                del self._entries[: len(self._entries) - LOG_LIMIT]

    def since(self, after_id=0):
        with self._lock:
            return [dict(e) for e in self._entries if e["id"] > after_id]

    def clear(self):
        with self._lock:
            n = len(self._entries)
            self._entries = []
            return n


def error_body(flavor, rule):
    """The body and content type of an injected error answer."""
    status = rule["status"]
    if rule["body"] is not None:
        return rule["body"].encode(), rule["content_type"] or "text/plain"
    message = rule["message"] or "injected by the gangway test front"
    if flavor == "gcs":
        reason = rule["code"] or {503: "backendError", 500: "backendError",
                                  429: "rateLimitExceeded", 403: "forbidden",
                                  404: "notFound", 401: "required"}.get(status, "invalid")
        body = {"error": {"code": status, "message": message,
                          "errors": [{"message": message, "domain": "global", "reason": reason}]}}
        return json.dumps(body).encode(), "application/json; charset=UTF-8"
    code = rule["code"] or {503: "SlowDown", 500: "InternalError", 403: "AccessDenied",
                            404: "NoSuchKey", 400: "InvalidRequest"}.get(status, "InternalError")
    xml = ('<?xml version="1.0" encoding="UTF-8"?>\n'
           f"<Error><Code>{code}</Code><Message>{message}</Message>"
           "<RequestId>gangway-front</RequestId></Error>")
    return xml.encode(), "application/xml"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gangway-front"

    # Quiet: the log is the control API's, not stderr's.
    def log_message(self, format, *args):
        if self.server.verbose:
            sys.stderr.write("front: " + (format % args) + "\n")

    def setup(self):
        super().setup()
        self.connection.settimeout(IDLE_TIMEOUT)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.upstream = None
        self.prefetched = None

    def finish(self):
        try:
            super().finish()
        finally:
            self.close_upstream()

    def handle_one_request(self):
        try:
            self.raw_requestline = self.rfile.readline(65537)
        except (OSError, ValueError):
            self.close_connection = True
            return
        if not self.raw_requestline:
            self.close_connection = True
            return
        if len(self.raw_requestline) > 65536:
            self.send_error(414)
            return
        if not self.parse_request():
            return
        if self.path.startswith("/_gangway/"):
            self.control()
        else:
            self.proxy()
        try:
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    # ---- the store's requests -------------------------------------------

    def proxy(self):
        server = self.server
        method = self.command
        caller = self.headers.get(CALLER_HEADER)
        entry = {
            "time": time.time(),
            "method": method,
            "path": self.path,
            "bytes_in": 0,
            "bytes_out": 0,
            "status": None,
            "user_agent": self.headers.get("User-Agent"),
            "caller": caller,
            "key_id": signing_key_id(self.headers.get("Authorization")),
            "fault": None,
            "error": None,
            "denied": None,
        }
        started = time.monotonic()
        # A body read before the request went on (see forward); per request.
        self.prefetched = None
        sts = server.sts
        rule = None
        try:
            if sts is not None and sts.is_token_request(self):
                return self.token_exchange(sts, entry)
            # A downscoped token's boundary is checked before any fault rule
            # is taken: a refused request never reaches the store.
            if sts is not None and sts.refuse(self, entry):
                return
            rule = server.faults.take(method, self.path, caller)
            if rule:
                entry["fault"] = rule["id"]
            if rule and rule["action"] == "delay":
                time.sleep(rule["delay_ms"] / 1000)
                rule = None
            if rule and rule["action"] == "status":
                self.answer_fault(rule, entry)
            elif server.adapter is None or not server.adapter(self, rule, entry):
                self.forward(rule, entry)
        except Dropped:
            entry["error"] = "dropped by fault rule"
            self.abort_connection()
        except ClientGone as e:
            entry["error"] = f"client: {e}"
            self.close_connection = True
            self.close_upstream()
        except (OSError, http.client.HTTPException) as e:
            entry["error"] = f"{type(e).__name__}: {e}"
            self.close_connection = True
            self.close_upstream()
            if entry["status"] is None:
                # Nothing was sent yet: say so, as a gateway would.
                try:
                    self.write_simple(502, b"upstream: " + str(e).encode(), "text/plain")
                    entry["status"] = 502
                except OSError:
                    pass
        finally:
            entry["duration_s"] = round(time.monotonic() - started, 6)
            server.log.add(entry)

    def token_exchange(self, sts, entry):
        """POST /v1/token (GCS flavor): fault rules apply as to the store's
        requests (a drop, either direction, closes the connection before
        the answer); otherwise the STS answers."""
        rule = self.server.faults.take(self.command, self.path, entry["caller"])
        if rule:
            entry["fault"] = rule["id"]
            if rule["action"] == "delay":
                time.sleep(rule["delay_ms"] / 1000)
            elif rule["action"] == "status":
                return self.answer_fault(rule, entry)
            else:
                limit = rule["after_bytes"] if rule["direction"] == "request" else None
                for piece in self.body_pieces() if limit != 0 else ():
                    entry["bytes_in"] += len(piece)
                    if limit is not None and entry["bytes_in"] >= limit:
                        break
                raise Dropped()
        sts.exchange(self, entry)

    def read_small_body(self, entry, limit):
        """The whole request body, or None when it is over `limit` bytes
        (then the rest is unread and the connection is to be closed)."""
        data = bytearray()
        for piece in self.body_pieces():
            entry["bytes_in"] += len(piece)
            data += piece
            if len(data) > limit:
                self.close_connection = True
                return None
        return bytes(data)

    def drain_body(self, entry, limit=None):
        """Reads the request body and throws it away; False when it stopped
        after `limit` bytes with more to come."""
        for piece in self.body_pieces():
            entry["bytes_in"] += len(piece)
            if limit is not None and entry["bytes_in"] >= limit:
                return False
        return True

    def body_framing(self):
        """('length', N), ('chunked', None) or ('none', 0) for the request."""
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            return "chunked", None
        length = self.headers.get("Content-Length")
        if length is None:
            return "none", 0
        try:
            n = int(length)
        except ValueError:
            raise ClientGone(f"bad Content-Length {length!r}")
        if n < 0:
            raise ClientGone(f"bad Content-Length {length!r}")
        return "length", n

    def body_pieces(self):
        """The request body, streamed in pieces of up to 1 MiB (chunked
        decoded). A piece is a view of one reused buffer: valid until the
        next one is asked for (copy it to keep it)."""
        kind, n = self.body_framing()
        buf = memoryview(bytearray(PIECE))
        if kind == "length":
            left = n
            while left > 0:
                got = self.rfile.readinto(buf[: min(left, PIECE)])
                if not got:
                    raise ClientGone(f"closed with {left} of {n} body bytes unsent")
                left -= got
                yield buf[:got]
        elif kind == "chunked":
            while True:
                line = self.rfile.readline(1024)
                if not line.endswith(b"\n"):
                    raise ClientGone("bad chunk size line")
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers, up to the blank line.
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                left = size
                while left > 0:
                    got = self.rfile.readinto(buf[: min(left, PIECE)])
                    if not got:
                        raise ClientGone("closed inside a chunk")
                    left -= got
                    yield buf[:got]
                if self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    raise ClientGone("chunk not followed by CRLF")

    def answer_fault(self, rule, entry):
        """Reads the body (up to after_bytes, if set) and answers the rule's status."""
        limit = rule["after_bytes"]
        for piece in self.body_pieces():
            entry["bytes_in"] += len(piece)
            if limit is not None and entry["bytes_in"] >= limit:
                self.close_connection = True
                break
        body, ctype = error_body(self.server.flavor, rule)
        extra = list(rule["headers"].items())
        if self.command == "HEAD":
            body = b""
        self.write_full(rule["status"],
                        [("Content-Type", ctype), ("Server", "gangway-front")] + extra, body)
        entry["status"] = rule["status"]
        entry["bytes_out"] = len(body)

    def write_simple(self, status, body, ctype):
        self.write_full(status, [("Content-Type", ctype), ("Server", "gangway-front")], body)

    def connect_upstream(self):
        if self.upstream is None:
            host, port = self.server.upstream
            self.upstream = http.client.HTTPConnection(host, port, timeout=IDLE_TIMEOUT)
            self.upstream.connect()
            self.upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.upstream

    def close_upstream(self):
        if self.upstream is not None:
            try:
                self.upstream.close()
            except OSError:
                pass
            self.upstream = None

    def abort_connection(self):
        """Closes the client's connection with a reset, as a crash would."""
        self.close_connection = True
        self.close_upstream()
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass

    def forward(self, rule, entry, method=None, path=None, headers=None, body=None,
                transform=None):
        """Hands the request on and streams the answer back, dropping the
        connection where `rule` says. An adapter may change what goes
        upstream: `method`, `path`, `headers` (a list of pairs, instead of
        the client's), `body` (an iterable of pieces, with `headers` giving
        its Content-Length; default: the client's body), and `transform`
        (status, headers, body) -> (status, headers, body) for a small
        answer that it rewrites (read whole)."""
        drop_in = drop_out = None
        if rule and rule["action"] == "drop":
            if rule["direction"] == "request":
                drop_in = rule["after_bytes"] or 0
            else:
                drop_out = rule["after_bytes"] or 0
        if drop_in == 0:
            raise Dropped()
        if body is None and self.prefetched is not None:
            # Read already (a small body the boundary check needed): sent as is.
            body = [self.prefetched]
            if headers is None:
                headers = [(n, v) for n, v in self.headers.items()
                           if n.lower() not in HOP_BY_HOP and n.lower() != "content-length"]
                headers.append(("Content-Length", str(len(self.prefetched))))
        if body is None:
            kind, _ = self.body_framing()
            body = self.body_pieces()
            count_in = True
        else:
            kind, count_in = "length", False
        if headers is None:
            headers = [(n, v) for n, v in self.headers.items() if n.lower() not in HOP_BY_HOP]
            if kind == "chunked":
                headers.append(("Transfer-Encoding", "chunked"))
        method = method or self.command
        # A connection the upstream closed while idle fails at the first
        # send; a request whose body has not started can go again on a new
        # one.
        for attempt in (1, 2):
            conn = self.connect_upstream()
            try:
                conn.putrequest(method, path or self.path, skip_host=True, skip_accept_encoding=True)
                if not any(n.lower() == "host" for n, _ in headers):
                    conn.putheader("Host", self.headers.get("Host", "%s:%d" % self.server.upstream))
                for name, value in headers:
                    conn.putheader(name, value)
                conn.endheaders()
                break
            except (OSError, http.client.HTTPException):
                self.close_upstream()
                if attempt == 2:
                    raise
        sent = 0
        for piece in body:
            if drop_in is not None and sent + len(piece) >= drop_in:
                piece = piece[: drop_in - sent]
                self.send_upstream(conn, piece, kind)
                if count_in:
                    entry["bytes_in"] += len(piece)
                raise Dropped()
            self.send_upstream(conn, piece, kind)
            sent += len(piece)
            if count_in:
                entry["bytes_in"] += len(piece)
        if kind == "chunked":
            conn.send(b"0\r\n\r\n")
        if drop_in is not None:
            # The body was shorter than after_bytes: drop before the answer.
            raise Dropped()

        resp = conn.getresponse()
        if transform is not None:
            data = resp.read()
            if resp.will_close:
                self.close_upstream()
            status, out_headers, data = transform(resp.status, resp.msg, data)
            entry["status"] = status
            self.write_full(status, out_headers, data)
            entry["bytes_out"] = len(data)
            return
        entry["status"] = resp.status
        chunked_out = resp.chunked
        has_body = not (method == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200)
        close_delimited = has_body and not chunked_out and resp.length is None
        head = [f"HTTP/1.1 {resp.status} {resp.reason}"]
        for name, value in resp.msg.items():
            if name.lower() in HOP_BY_HOP:
                continue
            head.append(f"{name}: {value}")
        if has_body and chunked_out:
            head.append("Transfer-Encoding: chunked")
        if close_delimited or resp.will_close:
            # The end of the body is the end of the connection.
            self.close_connection = True
            if close_delimited:
                head.append("Connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if has_body:
            buf = bytearray(PIECE)
            view = memoryview(buf)
            while True:
                n = resp.readinto(view)
                if not n:
                    break
                out = view[:n]
                if drop_out is not None and entry["bytes_out"] + n >= drop_out:
                    out = view[: drop_out - entry["bytes_out"]]
                    self.send_client(out, chunked_out)
                    entry["bytes_out"] += len(out)
                    raise Dropped()
                self.send_client(out, chunked_out)
                entry["bytes_out"] += n
            if chunked_out:
                self.wfile.write(b"0\r\n\r\n")
        if drop_out is not None:
            raise Dropped()
        resp.close()
        if resp.will_close:
            self.close_upstream()

    def write_full(self, status, headers, body):
        """A whole answer: `headers` (pairs) plus Content-Length."""
        head = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}"]
        head += [f"{n}: {v}" for n, v in headers
                 if n.lower() not in HOP_BY_HOP and n.lower() != "content-length"]
        head.append(f"Content-Length: {len(body)}")
        if self.close_connection:
            head.append("Connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    def send_upstream(self, conn, piece, kind):
        if not piece:
            return
        if kind == "chunked":
            conn.send(b"%x\r\n" % len(piece) + bytes(piece) + b"\r\n")
        else:
            conn.send(piece)

    def send_client(self, piece, chunked):
        if not len(piece):
            return
        if chunked:
            self.wfile.write(b"%x\r\n" % len(piece))
            self.wfile.write(piece)
            self.wfile.write(b"\r\n")
        else:
            self.wfile.write(piece)

    # ---- the control API ------------------------------------------------

    def control(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        route = (self.command, url.path.rstrip("/"))
        server = self.server
        try:
            raw = b"".join(bytes(p) for p in self.body_pieces())
            if route == ("GET", "/_gangway/health"):
                return self.reply(200, {"ok": True, "flavor": server.flavor,
                                        "upstream": "http://%s:%d" % server.upstream})
            if route == ("GET", "/_gangway/requests"):
                after = int(query.get("since", "0"))
                return self.reply(200, {"requests": server.log.since(after)})
            if route in (("POST", "/_gangway/reset-log"), ("DELETE", "/_gangway/requests")):
                return self.reply(200, {"cleared": server.log.clear()})
            if route == ("POST", "/_gangway/faults"):
                try:
                    rule = server.faults.add(json.loads(raw or b"{}"))
                except (ValueError, TypeError) as e:
                    return self.reply(400, {"error": str(e)})
                return self.reply(201, rule)
            if route == ("GET", "/_gangway/faults"):
                return self.reply(200, {"rules": server.faults.list()})
            if route == ("DELETE", "/_gangway/faults"):
                rule_id = int(query["id"]) if "id" in query else None
                return self.reply(200, {"removed": server.faults.remove(rule_id)})
            if server.sts is not None and route[1].startswith("/_gangway/sts"):
                answer = server.sts.control(self.command, route[1], raw)
                if answer is not None:
                    return self.reply(*answer)
            return self.reply(404, {"error": f"no control route {self.command} {url.path}"})
        except ClientGone:
            self.close_connection = True
        except ValueError as e:
            return self.reply(400, {"error": str(e)})

    def reply(self, status, obj):
        self.write_simple(status, json.dumps(obj).encode(), "application/json")


class Front(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, upstream, flavor="s3", verbose=False):
        super().__init__(addr, Handler)
        self.upstream = upstream
        self.flavor = flavor
        self.verbose = verbose
        self.log = RequestLog()
        self.faults = FaultRules()
        # The GCS flavor's STS token exchange and downscoped tokens.
        self.sts = gcs_sts.Sts() if flavor == "gcs" else None
        # adapter(handler, rule, entry) -> True when it answered the request
        # itself (the GCS XML API, ../gcs/xml_api.py); None: plain proxy.
        self.adapter = None

    @property
    def url(self):
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def parse_upstream(url):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise SystemExit(f"--upstream {url!r}: expected http://HOST:PORT")
    return parts.hostname, parts.port


# ---- helpers for the launchers (../s3/server.py, ../gcs/server.py) -------

def die_with_parent():
    """In a child's preexec_fn: SIGKILL it when this process dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port(host="127.0.0.1"):
    """A port nothing listens on right now (a child binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_http(url, timeout, ok=lambda status: status < 500, proc=None):
    """Waits until GET `url` answers a status `ok` accepts; raises on timeout."""
    deadline = time.monotonic() + timeout
    parts = urllib.parse.urlsplit(url)
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the store exited ({proc.returncode}) before it answered {url}")
        try:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
            conn.request("GET", parts.path + ("?" + parts.query if parts.query else ""))
            status = conn.getresponse().status
            conn.close()
            if ok(status):
                return
            last = f"status {status}"
        except OSError as e:
            last = str(e)
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s ({last})")


def serve_until_stopped(front, watch_stdin, children=(), check=None, on_stop=lambda: None):
    """Starts serving `front`; runs `check()` (the store answers through the
    front; it raises RuntimeError if not), prints `READY URL`, then serves
    until SIGTERM/SIGINT, stdin's end (with watch_stdin) or a child's exit;
    then stops the children and calls `on_stop`. Returns an exit status."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if watch_stdin:
        def watch():
            try:
                while sys.stdin.buffer.read(65536):
                    pass
            finally:
                stop.set()
        threading.Thread(target=watch, name="stdin", daemon=True).start()
    threading.Thread(target=front.serve_forever, name="front", daemon=True).start()
    rc = 0
    try:
        if check is not None:
            check()
        front.log.clear()
        print(f"READY {front.url}", flush=True)
    except RuntimeError as e:
        sys.stderr.write(f"front: {e}\n")
        rc = 1
        stop.set()
    while not stop.wait(0.5):
        for child in children:
            if child.poll() is not None:
                sys.stderr.write(f"front: the store (pid {child.pid}) exited with {child.returncode}\n")
                rc = 1
                stop.set()
    front.shutdown()
    for child in children:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    on_stop()
    return rc


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="http://HOST:PORT of the store")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--flavor", choices=("s3", "gcs"), default="s3",
                        help="the form of injected error bodies (S3 XML or GCS JSON)")
    parser.add_argument("--watch-stdin", action="store_true",
                        help="exit when standard input reaches end of file")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args()
    front = Front((args.host, args.port), parse_upstream(args.upstream), args.flavor, args.verbose)
    return serve_until_stopped(front, args.watch_stdin)


if __name__ == "__main__":
    sys.exit(main())
