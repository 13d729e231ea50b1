"""Where the EC2 emulator's instances "run": addresses a real sshd listens
on, the key pair installed there, and an instance metadata service per
instance (IMDSv2-shaped), so gangway's SSH steps, its spot notice reader
and its controller meet real protocols.

A test gives a *scope* (the SigV4 access key id its gangway signs with, so
parallel tests sharing one emulator never take each other's addresses) a
list of address pairs, `[public, private]`, and optionally an
`authorized_keys` file:

* RunInstances of that scope takes free pairs in order (a pair is free when
  no instance that is not `terminated` holds it) and gives each new
  instance the pair as its public and private address; asking for more
  instances than there are free pairs is EC2's
  `InsufficientInstanceCapacity`, before anything is made. A stopped
  instance keeps its pair; StartInstances puts it back at the pair's
  addresses (moto gives a started instance a new public one). The instance's
  key pair (the OpenSSH public key gangway imported) is appended to the
  `authorized_keys` file, as EC2 puts it into the default user's on boot.
* Every public address of the scope gets a metadata service on one port
  (the scope's `imds_port`, the same on every address). A request is
  answered for the live instance holding the address it arrived on; an
  address no live instance holds closes connections unanswered. The
  service speaks IMDSv2: `PUT /latest/api/token` with
  `X-aws-ec2-metadata-token-ttl-seconds` (1-21600) hands out a token, every
  `GET /latest/meta-data/...` needs a live one in
  `X-aws-ec2-metadata-token` (else 401). Paths: `instance-id`,
  `instance-type`, `ami-id`, `local-ipv4`, `public-ipv4`,
  `instance-life-cycle` (`spot` / `on-demand`),
  `placement/availability-zone`, `placement/region`,
  `placement/group-name` (in a group only), `spot/instance-action` and
  `spot/termination-time` (404 until a notice is posted), and for an
  instance launched with an IAM instance profile `iam/info`,
  `iam/security-credentials/` and `iam/security-credentials/ROLE` (the
  role's temporary keys, EC2's JSON; 404 without a profile).
* An interruption with notice posts `{"action": "terminate", "time": T}`
  at once and terminates the instance at T (the emulator's
  `--spot-notice-seconds`, 120 as on EC2, or the request's
  `notice_seconds`), with EC2's spot state reason, unless it is gone by
  then.
* With `host_keys` (the OpenSSH public key lines of the sshd behind the
  scope's addresses), the scope's instances answer GetConsoleOutput with a
  boot log as an EC2 instance's cloud-init writes it: boot noise, the
  `ec2:` fingerprints block and the `-----BEGIN SSH HOST KEY KEYS-----`
  block, once the instance is running (and `console_delay_s` after its
  boot); a client can then pin the host key from what the API published
  instead of trusting the first key its SSH connection is shown. POSTing
  other `host_keys` later is a host key replaced (the next console output
  shows the new ones).
"""

import base64
import binascii
import hashlib
import http.server
import json
import secrets
import socket
import threading
import time
from datetime import datetime, timedelta, timezone

# The longest token TTL IMDSv2 accepts.
MAX_TOKEN_TTL = 21600

# Host key types cloud-init prints, with the name `ssh-keygen -l` puts in
# parentheses after a fingerprint.
HOST_KEY_TYPES = {
    "ssh-ed25519": "ED25519",
    "ecdsa-sha2-nistp256": "ECDSA",
    "ecdsa-sha2-nistp384": "ECDSA",
    "ecdsa-sha2-nistp521": "ECDSA",
    "ssh-rsa": "RSA",
}


def _ssh_strings(blob):
    """The length-prefixed strings of an SSH public key blob (RFC 4253
    section 6.6), in order; ValueError when the blob is cut short."""
    fields, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise ValueError("the key blob ends inside a length")
        size = int.from_bytes(blob[at:at + 4], "big")
        at += 4
        if at + size > len(blob):
            raise ValueError("the key blob ends inside a field")
        fields.append(blob[at:at + size])
        at += size
    return fields


def parse_host_key(line):
    """One OpenSSH public key line (`TYPE BASE64 [comment]`) as a dict
    with `type`, `base64`, `bits` and `fingerprint` (`SHA256:` and the
    unpadded base64 of the SHA-256 of the blob, as `ssh-keygen -l` shows
    it); ValueError saying what is wrong with it."""
    if not isinstance(line, str):
        raise ValueError(f"a host key is an OpenSSH public key line, not {line!r}")
    parts = line.split()
    if len(parts) < 2:
        raise ValueError(f"host key {line!r} is not `TYPE BASE64 [comment]`")
    key_type, text = parts[0], parts[1]
    if key_type not in HOST_KEY_TYPES:
        raise ValueError(f"host key {line!r}: unknown key type {key_type!r}; known: "
                         + ", ".join(sorted(HOST_KEY_TYPES)))
    try:
        blob = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"host key {line!r}: {text!r} is not base64") from None
    try:
        fields = _ssh_strings(blob)
    except ValueError as err:
        raise ValueError(f"host key {line!r}: {err}") from None
    if not fields or fields[0] != key_type.encode():
        raise ValueError(f"host key {line!r}: the blob is not a {key_type} key "
                         f"(it names {fields[0][:40]!r} as its type)" if fields else
                         f"host key {line!r}: the blob is empty")
    if key_type == "ssh-ed25519":
        bits = 256
    elif key_type.startswith("ecdsa-sha2-nistp"):
        bits = int(key_type[len("ecdsa-sha2-nistp"):])
    else:
        # ssh-rsa: the exponent, then the modulus (mpints).
        if len(fields) < 3:
            raise ValueError(f"host key {line!r}: an ssh-rsa blob has an exponent and a modulus")
        bits = int.from_bytes(fields[2], "big").bit_length()
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return {"type": key_type, "base64": text, "bits": bits,
            "fingerprint": "SHA256:" + digest}


def parse_host_keys(lines):
    """A `host_keys` spec: a list of OpenSSH public key lines, checked."""
    if not isinstance(lines, list):
        raise ValueError('"host_keys" is a list of OpenSSH public key lines '
                         '("ssh-ed25519 AAAA... comment")')
    return [parse_host_key(line) for line in lines]


# The console of a booting instance before cloud-init's key block: made-up
# kernel and cloud-init lines of the usual kind. {host} is the hostname.
BOOT_NOISE = (
    "[    0.000000] Linux version 6.8.0-1021-aws (gangway-ec2-emulator) #1 SMP",
    "[    0.000000] Command line: BOOT_IMAGE=/vmlinuz root=LABEL=cloudimg-rootfs ro "
    "console=tty1 console=ttyS0",
    "[    0.010000] BIOS-provided physical RAM map: usable",
    "[    1.402113] nvme nvme0: 2/0/0 default/read/poll queues",
    "[    2.118406] EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode",
    "[    4.310221] cloud-init[480]: Cloud-init v. 24.4 running 'init-local'. Up 4.21 seconds.",
    "[    6.004512] cloud-init[611]: Cloud-init v. 24.4 running 'init'. Up 5.95 seconds.",
    "[    6.120007] cloud-init[611]: ci-info: +++++++++++Net device info++++++++++++",
    "[    6.125310] cloud-init[611]: Generating public/private ssh host keys.",
    "[    8.700045] cloud-init[702]: Cloud-init v. 24.4 running 'modules:config'. Up 8.61 seconds.",
)


def console_text(host, keys, with_keys):
    """An EC2 instance's console output as cloud-init leaves it: boot
    noise, then (`with_keys`) the `ec2:` fingerprints block and the keys
    block exactly as cloud-init prints them, then its closing lines. Lines
    end with CRLF, as a serial console's do."""
    lines = list(BOOT_NOISE)
    if with_keys:
        who = f"root@{host}"
        rule = "ec2: " + "#" * 61
        lines += ["ec2: ", rule, "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----"]
        lines += [f"ec2: {k['bits']} {k['fingerprint']} {who} ({HOST_KEY_TYPES[k['type']]})"
                  for k in keys]
        lines += ["ec2: -----END SSH HOST KEY FINGERPRINTS-----", rule]
        lines += ["-----BEGIN SSH HOST KEY KEYS-----"]
        lines += [f"{k['type']} {k['base64']} {who}" for k in keys]
        lines += ["-----END SSH HOST KEY KEYS-----"]
        lines += ["[   10.918345] cloud-init[745]: Cloud-init v. 24.4 running 'modules:final'. "
                  "Up 10.83 seconds.",
                  "[   11.002967] cloud-init[745]: Cloud-init v. 24.4 finished. "
                  "Datasource DataSourceEc2Local.  Up 10.99 seconds"]
    return "".join(line + "\r\n" for line in lines)


class MetadataServer(http.server.ThreadingHTTPServer):
    """One listening socket of a scope's metadata service."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, machines, scope):
        self.machines = machines
        self.scope = scope
        super().__init__(address, MetadataHandler)


class MetadataHandler(http.server.BaseHTTPRequestHandler):
    server_version = "EC2ws"
    sys_version = ""

    def log_message(self, *args):
        pass

    def _instance(self):
        """The live instance holding the address this request came to."""
        address = self.connection.getsockname()[0]
        return self.server.machines.instance_at(self.server.scope, address)

    def _reply(self, code, body=b"", ctype="text/plain"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _gone(self):
        # No instance there: nothing answers, as on a machine that is gone.
        self.close_connection = True

    def do_PUT(self):
        held = self._instance()
        if held is None:
            return self._gone()
        if self.path != "/latest/api/token":
            return self._reply(404, b"Not Found")
        try:
            ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= MAX_TOKEN_TTL:
            return self._reply(400, b"Bad Request")
        token = self.server.machines.new_token(held["instance_id"], ttl)
        self.send_response(200)
        self.send_header("X-aws-ec2-metadata-token-ttl-seconds", str(ttl))
        self.send_header("Content-Length", str(len(token)))
        self.end_headers()
        self.wfile.write(token.encode())

    def do_GET(self):
        held = self._instance()
        if held is None:
            return self._gone()
        token = self.headers.get("X-aws-ec2-metadata-token", "")
        if not self.server.machines.token_ok(held["instance_id"], token):
            return self._reply(401, b"Unauthorized")
        prefix = "/latest/meta-data/"
        if not self.path.startswith(prefix):
            return self._reply(404, b"Not Found")
        key = self.path[len(prefix):].rstrip("/")
        value = self.server.machines.metadata(held, key)
        if value is None:
            return self._reply(404, b"Not Found")
        self._reply(200, value.encode())

    do_HEAD = do_GET


class Machines:
    """The scopes' address pools, their metadata services, and notices."""

    def __init__(self, emulator, notice_seconds=120.0):
        self.emulator = emulator
        self.notice_seconds = notice_seconds
        self._lock = threading.RLock()
        # scope -> {"pairs": [(public, private)], "authorized_keys": path,
        #           "imds_port": int, "servers": {public: MetadataServer}}
        self.scopes = {}
        # instance id -> {"instance_id", "scope", "region", "public", "private"}
        self.held = {}
        # instance id -> the notice JSON, once posted
        self.notices = {}
        # token -> (instance id, expiry as time.monotonic())
        self.tokens = {}
        # instance id -> the role credentials its metadata service hands out
        self.role_keys = {}

    # ----- control ----------------------------------------------------------

    def configure(self, spec):
        """`POST /_gangway/machines`: sets a scope's address pairs (added to
        the ones it had; addresses still held keep serving), and optionally
        its `authorized_keys` file, `host_keys` and `console_delay_s`. For a
        scope that exists `addresses` may be left out (the pairs stay), so
        `{"scope", "host_keys"}` alone replaces the host keys; a field left
        out keeps its value, `"host_keys": []` removes them."""
        if not isinstance(spec, dict):
            raise ValueError("a machines spec is a JSON object")
        known = {"scope", "addresses", "authorized_keys", "host_keys", "console_delay_s"}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; known: {', '.join(sorted(known))}")
        scope = spec.get("scope")
        if not isinstance(scope, str) or not scope:
            raise ValueError('"scope" (the access key id of the launches) is required')
        pairs = spec.get("addresses")
        if pairs is None and scope in self.scopes:
            pairs = [list(p) for p in self.scopes[scope]["pairs"]]
        if (
            not isinstance(pairs, list)
            or not pairs
            or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(a, str) for a in p)
                for p in pairs
            )
        ):
            raise ValueError('"addresses" is a list of [public, private] address pairs')
        for public, private in pairs:
            for a in (public, private):
                try:
                    socket.inet_aton(a)
                except OSError:
                    raise ValueError(f"{a!r} is not an IPv4 address") from None
        keys = spec.get("authorized_keys")
        if keys is not None and not isinstance(keys, str):
            raise ValueError('"authorized_keys" is a file path')
        host_keys = spec.get("host_keys")
        if host_keys is not None:
            parse_host_keys(host_keys)
        delay = spec.get("console_delay_s")
        if delay is not None and (
            isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0
        ):
            raise ValueError('"console_delay_s" is a number of seconds, 0 or more')
        with self._lock:
            state = self.scopes.setdefault(
                scope, {"pairs": [], "authorized_keys": None, "imds_port": 0, "servers": {},
                        "host_keys": [], "console_delay_s": 0}
            )
            state["pairs"] = [tuple(p) for p in pairs]
            if keys is not None:
                state["authorized_keys"] = keys
            if host_keys is not None:
                state["host_keys"] = [line.strip() for line in host_keys]
            if delay is not None:
                state["console_delay_s"] = delay
            self._serve(scope, state, [p[0] for p in pairs])
            return self.view(scope)

    def view(self, scope):
        with self._lock:
            state = self.scopes.get(scope)
            if state is None:
                raise LookupError(f"scope {scope!r} has no machines")
            return {
                "scope": scope,
                "addresses": [list(p) for p in state["pairs"]],
                "authorized_keys": state["authorized_keys"],
                "imds_port": state["imds_port"],
                "host_keys": list(state["host_keys"]),
                "console_delay_s": state["console_delay_s"],
                "instances": sorted(
                    (dict(h, state=self._state(h)) for h in self.held.values()
                     if h["scope"] == scope),
                    key=lambda h: h["instance_id"],
                ),
            }

    def _serve(self, scope, state, publics):
        """A metadata listener on every new public address, on the scope's
        port (picked on the first address when the scope has none)."""
        for public in publics:
            if public in state["servers"]:
                continue
            server = MetadataServer((public, state["imds_port"]), self, scope)
            state["imds_port"] = server.server_address[1]
            state["servers"][public] = server
            threading.Thread(
                target=server.serve_forever, name=f"imds-{public}", daemon=True
            ).start()

    def remove(self, scope):
        """`DELETE /_gangway/machines?scope=`: stops its listeners."""
        with self._lock:
            state = self.scopes.pop(scope, None)
        if state is None:
            return 0
        for server in state["servers"].values():
            server.shutdown()
            server.server_close()
        return 1

    def reset(self):
        for scope in list(self.scopes):
            self.remove(scope)
        with self._lock:
            self.held.clear()
            self.notices.clear()
            self.tokens.clear()
            self.role_keys.clear()

    # ----- RunInstances -----------------------------------------------------

    def _state(self, held):
        instance = self.emulator.backend(held["region"]).get_instance_by_id(held["instance_id"])
        return instance.state if instance is not None else "gone"

    def _live(self, instance_id, region):
        instance = self.emulator.backend(region).get_instance_by_id(instance_id)
        return instance is not None and instance.state != "terminated"

    def _free_pairs(self, scope):
        state = self.scopes[scope]
        taken = {
            (h["public"], h["private"])
            for iid, h in self.held.items()
            if h["scope"] == scope and self._live(iid, h["region"])
        }
        return [p for p in state["pairs"] if p not in taken]

    def shortfall(self, scope, count):
        """Why `count` new instances of `scope` would not all get an
        address (EC2's capacity message), or None when they would."""
        with self._lock:
            if scope not in self.scopes:
                return None
            free = len(self._free_pairs(scope))
        if free >= count:
            return None
        return (
            "We currently do not have sufficient capacity in the Availability Zone you "
            f"requested ({free} free of {count} asked for)."
        )

    def place(self, scope, region, instance_ids):
        """Gives each new instance of `scope` a free address pair and
        installs its key pair's public key."""
        with self._lock:
            if scope not in self.scopes:
                return
            state = self.scopes[scope]
            free = self._free_pairs(scope)
            backend = self.emulator.backend(region)
            for instance_id, (public, private) in zip(instance_ids, free):
                instance = backend.get_instance_by_id(instance_id)
                if instance is None:
                    continue
                nic = instance.nics[0]
                nic.public_ip = public
                nic.private_ip_address = private
                self.held[instance_id] = {
                    "instance_id": instance_id,
                    "scope": scope,
                    "region": region,
                    "public": public,
                    "private": private,
                    # When it (last) booted, for its console output.
                    "booted": time.time(),
                }
                self._install_key(state, backend, instance)

    def restore(self, region, instance_ids):
        """Puts started instances back at their machines' addresses."""
        with self._lock:
            backend = self.emulator.backend(region)
            for instance_id in instance_ids:
                held = self.held.get(instance_id)
                instance = backend.get_instance_by_id(instance_id)
                if held is None or instance is None:
                    continue
                nic = instance.nics[0]
                nic.public_ip = held["public"]
                nic.private_ip_address = held["private"]
                held["booted"] = time.time()

    @staticmethod
    def _install_key(state, backend, instance):
        path = state["authorized_keys"]
        pair = backend.key_pairs.get(instance.key_name) if instance.key_name else None
        if not path or pair is None:
            return
        key = pair.material_public
        key = (key.decode() if isinstance(key, bytes) else str(key)).strip()
        try:
            with open(path) as f:
                have = f.read()
        except FileNotFoundError:
            have = ""
        if key and key not in have:
            with open(path, "a") as f:
                f.write(("" if have.endswith("\n") or not have else "\n") + key + "\n")

    # ----- the console ------------------------------------------------------

    def console_output(self, region, instance_id):
        """GetConsoleOutput of an instance placed in a scope with
        `host_keys`: (timestamp, console text or None for no output yet),
        or None when the instance is no such one (moto answers). Running
        and `console_delay_s` past its boot: the whole log, keys and all;
        running before that: boot noise only; pending: nothing yet, as EC2
        has nothing before the console posts; stopped (or going): the boot
        noise of a machine that is no longer up, no key block."""
        with self._lock:
            held = self.held.get(instance_id)
            if held is None or held["region"] != region:
                return None
            state = self.scopes.get(held["scope"])
            if state is None or not state["host_keys"]:
                return None
            keys = parse_host_keys(state["host_keys"])
            delay = state["console_delay_s"]
            booted = held.get("booted", time.time())
        instance = self.emulator.backend(region).get_instance_by_id(instance_id)
        if instance is None:
            return None
        posted = booted
        if instance.state == "pending":
            text = None
        else:
            ready = instance.state == "running" and time.time() >= booted + delay
            if ready:
                posted = booted + delay
            host = "ip-" + held["private"].replace(".", "-")
            text = console_text(host, keys, ready)
        stamp = datetime.fromtimestamp(posted, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        return stamp, text

    # ----- the metadata service ---------------------------------------------

    def instance_at(self, scope, address):
        with self._lock:
            for iid, h in self.held.items():
                if h["scope"] == scope and h["public"] == address and self._live(iid, h["region"]):
                    return dict(h)
        return None

    def new_token(self, instance_id, ttl):
        token = secrets.token_urlsafe(32)
        with self._lock:
            self.tokens[token] = (instance_id, time.monotonic() + ttl)
        return token

    def token_ok(self, instance_id, token):
        with self._lock:
            held = self.tokens.get(token)
        return held is not None and held[0] == instance_id and held[1] > time.monotonic()

    def metadata(self, held, key):
        """The value at meta-data/KEY for the instance, or None (404)."""
        instance = self.emulator.backend(held["region"]).get_instance_by_id(held["instance_id"])
        if instance is None:
            return None
        with self._lock:
            notice = self.notices.get(held["instance_id"])
        group = instance.placement.group_name or None
        values = {**self._iam(held)}
        values.update({
            "instance-id": instance.id,
            "instance-type": instance.instance_type,
            "ami-id": instance.image_id,
            "local-ipv4": held["private"],
            "public-ipv4": held["public"],
            "instance-life-cycle": "spot" if instance.lifecycle == "spot" else "on-demand",
            "placement/availability-zone": instance.placement.zone,
            "placement/region": held["region"],
            "placement/group-name": group,
            "spot/instance-action": json.dumps(notice) if notice else None,
            "spot/termination-time": notice["time"] if notice else None,
        })
        if values.get(key) is not None:
            return values[key]
        # A directory (the root, `iam/`): its entries, sub-directories
        # with a trailing slash.
        under = key + "/" if key else ""
        entries = set()
        for k, v in values.items():
            if v is None or not k.startswith(under):
                continue
            rest = k[len(under):]
            entries.add(rest.split("/")[0] + ("/" if "/" in rest else ""))
        entries -= {e[:-1] for e in entries if e.endswith("/")}
        return "\n".join(sorted(entries)) if entries else None

    def _iam(self, held):
        """The `iam/` keys of an instance launched with an instance profile
        (none without one, so they answer 404): `iam/info`,
        `iam/security-credentials/` (the role's name) and
        `iam/security-credentials/ROLE`, in EC2's JSON shapes. The role's
        keys are the instance's own (`ASIAIMDS...`), made once and valid
        for six hours from then, as EC2 rotates them well before they end."""
        profile = self.emulator.instance_profile(held["region"], held["instance_id"])
        if profile is None:
            return {}
        roles = [r.name for r in getattr(profile, "roles", [])]
        now = datetime.now(timezone.utc)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        values = {
            "iam/info": json.dumps({
                "Code": "Success",
                "LastUpdated": stamp,
                "InstanceProfileArn": profile.arn,
                "InstanceProfileId": profile.id,
            }, indent=2),
            "iam/security-credentials": "\n".join(roles),
        }
        for role in roles:
            with self._lock:
                keys = self.role_keys.get(held["instance_id"])
                if keys is None:
                    digest = hashlib.sha256(held["instance_id"].encode()).hexdigest().upper()
                    keys = {
                        "AccessKeyId": "ASIAIMDS" + digest[:12],
                        "SecretAccessKey": secrets.token_urlsafe(30),
                        "Token": secrets.token_urlsafe(96),
                        "LastUpdated": stamp,
                        "Expiration": (now + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                    self.role_keys[held["instance_id"]] = keys
            values[f"iam/security-credentials/{role}"] = json.dumps({
                "Code": "Success",
                "LastUpdated": keys["LastUpdated"],
                "Type": "AWS-HMAC",
                "AccessKeyId": keys["AccessKeyId"],
                "SecretAccessKey": keys["SecretAccessKey"],
                "Token": keys["Token"],
                "Expiration": keys["Expiration"],
            }, indent=2)
        return values

    # ----- interruptions with notice ----------------------------------------

    def notice(self, region, instance_id, seconds, state, terminate):
        """Posts the notice now and calls `terminate()` `seconds` later
        (once, and only if the instance is still there)."""
        seconds = self.notice_seconds if seconds is None else float(seconds)
        if seconds < 0:
            raise ValueError('"notice_seconds" is not negative')
        when = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        action = {"action": "terminate" if state == "terminated" else "stop",
                  "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        with self._lock:
            self.notices[instance_id] = action

        def fire():
            if self._live(instance_id, region):
                terminate()

        timer = threading.Timer(seconds, fire)
        timer.daemon = True
        timer.start()
        return action
