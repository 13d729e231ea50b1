#!/usr/bin/env python3
"""Checks both storage emulators with rclone, through the front.

    python3 tests/emulators/storage/selftest.py [--s3-python PY] [--gcs-python PY] [--only s3|gcs] [--no-mount]

Starts the S3 emulator (moto) and the GCS emulator (fake-gcs-server), each
behind its front, and for each: rclone configured only through environment
variables (the recipe in README.md) copies a directory up and down,
`lsjson -R --hash --files-only` (the hashes each store reports are printed),
`rcat`, `copy --files-from`, a multipart upload, `mount` with
`--vfs-cache-mode off` and `full` (reading and writing through the mount),
and the front's request log and fault injection (an upload dropped midway
leaves no object; a 503 is retried); for GCS also the front's STS token
exchange and the Credential Access Boundary it holds downscoped tokens to
(raw requests on both APIs, and rclone given such a token). Standard
library only; ends with
`N passed, N failed` and exits 1 on any failure. Needs rclone, and for the
mounts fuse3 and /dev/fuse (skipped with a line saying so otherwise).
"""

import argparse
import filecmp
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
MiB = 1024 * 1024

results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    if ok:
        results["passed"] += 1
        print(f"ok     {name}")
    else:
        results["failed"] += 1
        print(f"FAILED {name}: {detail}")
    return ok


def start(python, server):
    proc = subprocess.Popen([python, server, "--port", "0", "--watch-stdin"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"{server} did not start: {line!r}")
    return proc, line.split()[1]


def control(url, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def rclone_env(kind, url, remote="store"):
    """The recipe of README.md: everything through the environment."""
    r = remote.upper()
    env = {"RCLONE_CONFIG": "/dev/null"}
    if kind == "s3":
        env.update({
            # rclone 1.60's S3 backend fails on any AWS_CA_BUNDLE.
            "AWS_CA_BUNDLE": "",
            f"RCLONE_CONFIG_{r}_TYPE": "s3",
            f"RCLONE_CONFIG_{r}_PROVIDER": "Other",
            f"RCLONE_CONFIG_{r}_ENV_AUTH": "false",
            f"RCLONE_CONFIG_{r}_ACCESS_KEY_ID": "testing",
            f"RCLONE_CONFIG_{r}_SECRET_ACCESS_KEY": "testing",
            f"RCLONE_CONFIG_{r}_REGION": "us-east-1",
            f"RCLONE_CONFIG_{r}_ENDPOINT": url,
            f"RCLONE_CONFIG_{r}_FORCE_PATH_STYLE": "true",
        })
    else:
        env.update({
            f"RCLONE_CONFIG_{r}_TYPE": "google cloud storage",
            f"RCLONE_CONFIG_{r}_ENDPOINT": url + "/storage/v1/",
            f"RCLONE_CONFIG_{r}_ANONYMOUS": "true",
            f"RCLONE_CONFIG_{r}_PROJECT_NUMBER": "test",
            f"RCLONE_CONFIG_{r}_BUCKET_POLICY_ONLY": "true",
        })
    return env


class Rclone:
    def __init__(self, kind, url):
        self.env = dict(os.environ)
        self.env.update(rclone_env(kind, url))

    def run(self, *args, input=None, timeout=120, caller="selftest"):
        cmd = ["rclone", "--header", f"X-Gangway-Caller: {caller}", *args]
        return subprocess.run(cmd, env=self.env, input=input, capture_output=True, timeout=timeout)

    def ok(self, *args, **kw):
        r = self.run(*args, **kw)
        if r.returncode != 0:
            raise AssertionError(f"rclone {' '.join(args)}: exit {r.returncode}: {r.stderr.decode()[-600:]}")
        return r.stdout


def unmount(point, proc):
    """Unmounts an rclone mount at `point` and waits for its process (the
    cache's uploads end first), killing it after a minute."""
    subprocess.run(["fusermount3", "-u", point], capture_output=True, timeout=60)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(MiB), b""):
            h.update(piece)
    return h.hexdigest()


def make_tree(root):
    os.makedirs(os.path.join(root, "sub", "deeper"))
    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(300_000),
             "sub/deeper/c.bin": os.urandom(12 * MiB + 17), "empty": b""}
    for rel, data in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return sorted(files)


def same_tree(a, b):
    cmp = filecmp.dircmp(a, b)
    def walk(c):
        if c.left_only or c.right_only or c.diff_files or c.funny_files:
            return False
        _, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files, shallow=False)
        return not mismatch and not errors and all(walk(s) for s in c.subdirs.values())
    return walk(cmp)


def step(name, fn):
    started = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - one failed step is reported, the rest go on
        check(name, False, f"{type(e).__name__}: {e}")
    print(f"       {name}: {time.monotonic() - started:.1f} s")


def test_store(kind, url, work, mount):
    rc = Rclone(kind, url)
    bucket = f"selftest-{kind}"
    src = os.path.join(work, kind, "src")
    files = make_tree(src)
    tag = f"[{kind}]"

    def up_down():
        rc.ok("mkdir", f"store:{bucket}")
        control(url, "POST", "/_gangway/reset-log")
        rc.ok("copy", src, f"store:{bucket}/tree", caller="node-0")
        down = os.path.join(work, kind, "down")
        rc.ok("copy", f"store:{bucket}/tree", down)
        # rclone does not create empty directories' objects; the files matter.
        check(f"{tag} copy up and down: same files, same bytes", same_tree(src, down))
        log = control(url, "GET", "/_gangway/requests")["requests"]
        by_node = sum(r["bytes_in"] for r in log if r["caller"] == "node-0")
        total = sum(os.path.getsize(os.path.join(src, f)) for f in files)
        check(f"{tag} the front logged the upload's bytes under the caller's tag ({by_node} >= {total})",
              by_node >= total, json.dumps(log[-3:]))
        check(f"{tag} the front logged rclone's User-Agent",
              all((r["user_agent"] or "").startswith("rclone/") for r in log), log[:1])

    def hashes():
        listed = json.loads(rc.ok("lsjson", "-R", "--hash", "--files-only", f"store:{bucket}/tree"))
        got = {e["Path"]: e.get("Hashes", {}) for e in listed}
        check(f"{tag} lsjson lists every file", sorted(got) == files, sorted(got))
        kinds = sorted({k for h in got.values() for k in h})
        print(f"       {tag} lsjson --hash reports: {kinds}")
        want = {f: md5(os.path.join(src, f)) for f in files}
        check(f"{tag} lsjson's md5 of every file is the file's",
              all(got[f].get("md5") == want[f] for f in files), {f: got[f] for f in files})

    def multipart():
        big = os.path.join(work, kind, "multi.bin")
        # S3: parts of 5 MiB above a 5 MiB cutoff; GCS: rclone 1.60 sends
        # one request up to 16 MiB (its client's chunk size, not settable),
        # then a resumable upload in 16 MiB pieces.
        size = 11 * MiB + 3 if kind == "s3" else 17 * MiB + 3
        with open(big, "wb") as f:
            f.write(os.urandom(size))
        flags = ["--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M"] if kind == "s3" else []
        control(url, "POST", "/_gangway/reset-log")
        rc.ok("copyto", big, f"store:{bucket}/multi.bin", *flags)
        log = control(url, "GET", "/_gangway/requests")["requests"]
        pieces = [r for r in log if r["bytes_in"] > 0 and "multi" in r["path"]]
        check(f"{tag} a large file goes up in several requests ({len(pieces)})", len(pieces) >= 2,
              [(r["method"], r["path"], r["bytes_in"]) for r in log])
        listed = json.loads(rc.ok("lsjson", "--hash", f"store:{bucket}/multi.bin"))
        print(f"       {tag} multipart object's hashes: {listed[0].get('Hashes')}")
        check(f"{tag} the multipart upload's md5 is the file's",
              listed[0].get("Hashes", {}).get("md5") == md5(big), listed)
        back = os.path.join(work, kind, "multi.back")
        rc.ok("copyto", f"store:{bucket}/multi.bin", back)
        check(f"{tag} the multipart upload reads back whole", md5(back) == md5(big))

    def rcat():
        data = os.urandom(70_000)
        rc.ok("rcat", f"store:{bucket}/rcat/piped.bin", input=data)
        check(f"{tag} rcat then cat gives the same bytes",
              rc.ok("cat", f"store:{bucket}/rcat/piped.bin") == data)

    def files_from():
        listing = os.path.join(work, kind, "files-from.txt")
        with open(listing, "w") as f:
            f.write("a.txt\nsub/deeper/c.bin\n")
        rc.ok("copy", "--files-from", listing, src, f"store:{bucket}/some")
        listed = json.loads(rc.ok("lsjson", "-R", "--files-only", f"store:{bucket}/some"))
        check(f"{tag} copy --files-from copies exactly the listed files",
              sorted(e["Path"] for e in listed) == ["a.txt", "sub/deeper/c.bin"], listed)

    def faults():
        victim = os.path.join(work, kind, "victim.bin")
        with open(victim, "wb") as f:
            f.write(os.urandom(3 * MiB))
        method = "PUT" if kind == "s3" else "POST"
        # One upload dropped after 1 MiB: the client retries, and the
        # object is whole, never a part of it.
        rule = control(url, "POST", "/_gangway/faults",
                       {"method": method, "path_contains": "victim", "after_bytes": MiB,
                        "action": "drop", "times": 1})
        r = rc.run("copyto", victim, f"store:{bucket}/victim.bin", timeout=120)
        log = control(url, "GET", "/_gangway/requests")["requests"]
        dropped = [x for x in log if x["fault"] == rule["id"]]
        check(f"{tag} the log shows the dropped upload stopped at 1 MiB, unanswered",
              len(dropped) == 1 and dropped[0]["bytes_in"] == MiB and dropped[0]["status"] is None,
              dropped)
        check(f"{tag} the retried upload is whole",
              r.returncode == 0 and rc.ok("cat", f"store:{bucket}/victim.bin") == open(victim, "rb").read(),
              r.stderr.decode()[-300:])
        rc.ok("deletefile", f"store:{bucket}/victim.bin")
        if kind == "s3":
            # Every attempt dropped: rclone gives up and nothing is stored.
            # (Not for GCS: Google's Go client retries a reset upload for
            # about half a minute per attempt before rclone sees it.)
            rule = control(url, "POST", "/_gangway/faults",
                           {"method": method, "path_contains": "victim", "after_bytes": MiB,
                            "action": "drop", "times": -1})
            r = rc.run("copyto", victim, f"store:{bucket}/victim.bin", "--retries", "1",
                       "--low-level-retries", "2", timeout=120)
            control(url, "DELETE", f"/_gangway/faults?id={rule['id']}")
            check(f"{tag} an upload dropped on every attempt fails", r.returncode != 0,
                  r.stderr.decode()[-300:])
            listed = json.loads(rc.ok("lsjson", f"store:{bucket}/"))
            check(f"{tag} a dropped upload leaves no object",
                  "victim.bin" not in [e["Path"] for e in listed], listed)
        # A download cut after 100,000 bytes of the answer.
        rc.ok("copyto", victim, f"store:{bucket}/victim.bin")
        download = ["victim"] if kind == "s3" else ["victim", "alt=media"]
        cut = control(url, "POST", "/_gangway/faults",
                      {"method": "GET", "path_contains": download, "direction": "response",
                       "after_bytes": 100_000, "action": "drop"})
        r = rc.run("cat", f"store:{bucket}/victim.bin", "--low-level-retries", "1", "--retries", "1")
        cut_log = [x for x in control(url, "GET", "/_gangway/requests")["requests"] if x["fault"] == cut["id"]]
        check(f"{tag} a download is cut after 100,000 bytes of its answer",
              len(cut_log) == 1 and cut_log[0]["bytes_out"] == 100_000 and cut_log[0]["status"] == 200
              and (r.returncode != 0 or len(r.stdout) == 3 * MiB), (cut_log, r.returncode, len(r.stdout)))
        control(url, "DELETE", f"/_gangway/faults?id={cut['id']}")
        rc.ok("deletefile", f"store:{bucket}/victim.bin")
        rule = control(url, "POST", "/_gangway/faults",
                       {"method": method, "path_contains": "victim", "status": 503, "times": 1})
        rc.ok("copyto", victim, f"store:{bucket}/victim.bin")
        fired = [x for x in control(url, "GET", "/_gangway/faults")["rules"] if x["id"] == rule["id"]]
        check(f"{tag} a 503 is retried and the upload then succeeds",
              fired[0]["fired"] == 1 and rc.ok("cat", f"store:{bucket}/victim.bin") == open(victim, "rb").read(),
              fired)

    def mounts():
        for mode in ("off", "full"):
            point = os.path.join(work, kind, f"mnt-{mode}")
            os.makedirs(point)
            proc = subprocess.Popen(
                ["rclone", "mount", f"store:{bucket}", point, "--vfs-cache-mode", mode,
                 "--cache-dir", os.path.join(work, kind, f"cache-{mode}"), "--dir-cache-time", "1s",
                 "--vfs-write-back", "1s",
                 "-v", "--log-file", os.path.join(work, f"mount-{kind}-{mode}.log")],
                env=rc.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                deadline = time.monotonic() + 20
                while not os.path.ismount(point) and time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.2)
                if not check(f"{tag} rclone mount --vfs-cache-mode {mode} mounts", os.path.ismount(point),
                             proc.stderr.read().decode()[-400:] if proc.poll() is not None else "timeout"):
                    continue
                with open(os.path.join(point, "tree", "sub", "deeper", "c.bin"), "rb") as f:
                    got = f.read()
                check(f"{tag} [{mode}] a file reads whole through the mount",
                      got == open(os.path.join(src, "sub", "deeper", "c.bin"), "rb").read())
                data = os.urandom(2 * MiB + 5)
                with open(os.path.join(point, f"written-{mode}.bin"), "wb") as f:
                    f.write(data)
                if mode == "full":
                    # Random access writes need the cache.
                    with open(os.path.join(point, f"written-{mode}.bin"), "r+b") as f:
                        f.seek(MiB)
                        f.write(b"patched")
                    data = data[:MiB] + b"patched" + data[MiB + 7:]
                    # The cache uploads a closed file after --vfs-write-back
                    # (1 s here), and rclone 1.60 exits at unmount without
                    # uploading what is still queued: wait for the upload.
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        r = rc.run("cat", f"store:{bucket}/written-{mode}.bin")
                        if r.returncode == 0 and r.stdout == data:
                            break
                        time.sleep(0.5)
            finally:
                unmount(point, proc)
            # Unmounting waits for the cache's uploads.
            check(f"{tag} [{mode}] a file written through the mount is in the bucket",
                  rc.ok("cat", f"store:{bucket}/written-{mode}.bin") == data)

    step(f"{tag} copy up and down", up_down)
    step(f"{tag} lsjson --hash", hashes)
    step(f"{tag} multipart", multipart)
    step(f"{tag} rcat", rcat)
    step(f"{tag} copy --files-from", files_from)
    step(f"{tag} faults", faults)
    if mount:
        step(f"{tag} mount", mounts)
    if kind == "gcs":
        test_sts(url, work, bucket, rc, mount)


# ---- GCS: the STS token exchange and downscoped tokens -------------------

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS = "urn:ietf:params:oauth:token-type:access_token"
LIST_PREFIX = "storage.googleapis.com/objectListPrefix"


def call(url, method, path, token=None, body=None, headers=None):
    """One request to the front: (status, headers, body)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        h = {"X-Gangway-Caller": "selftest-sts"}
        h.update(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        return resp.status, resp.msg, resp.read()
    finally:
        conn.close()


def rule(bucket, role="objectAdmin", prefix=None):
    """An access boundary rule as gangway writes one: `role` on `bucket`,
    with a prefix, on the objects under it and listings of it."""
    r = {"availableResource": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
         "availablePermissions": [f"inRole:roles/storage.{role}"]}
    if prefix is not None:
        r["availabilityCondition"] = {
            "expression": f"resource.name.startsWith('projects/_/buckets/{bucket}/objects/{prefix}')"
                          f" || api.getAttribute('{LIST_PREFIX}', '').startsWith('{prefix}')",
            "title": "gangway task prefix", "description": f"objects under {prefix}"}
    return r


def token_form(rules, subject="ya29.selftest-user-token", **over):
    form = {"grant_type": GRANT, "subject_token_type": ACCESS, "requested_token_type": ACCESS,
            "subject_token": subject,
            "options": json.dumps({"accessBoundary": {"accessBoundaryRules": rules}})}
    form.update(over)
    return {k: v for k, v in form.items() if v is not None}


def exchange(url, form):
    """POST /v1/token with `form` (a dict, or a ready body): (status, JSON)."""
    body = form if isinstance(form, str) else urllib.parse.urlencode(form)
    status, _, data = call(url, "POST", "/v1/token", body=body.encode(),
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


def downscoped(url, rules, **kw):
    status, answer = exchange(url, token_form(rules, **kw))
    if status != 200:
        raise AssertionError(f"token exchange: {status} {answer}")
    return answer["access_token"]


def sha16(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gcs_error(data):
    """(code, message, reason) of a JSON API error body."""
    try:
        e = json.loads(data)["error"]
        return e.get("code"), e.get("message", ""), (e.get("errors") or [{}])[0].get("reason")
    except (ValueError, KeyError, TypeError, IndexError):
        return None, data[:200], None


def test_sts(url, work, bucket, rc, mount):
    tag = "[gcs] [sts]"
    other = "selftest-gcs-other"
    q = lambda s: urllib.parse.quote(s, safe="")  # noqa: E731

    def upload(name, data, token=None, target=bucket):
        return call(url, "POST", f"/upload/storage/v1/b/{target}/o?uploadType=media&name={q(name)}",
                    token, data, {"Content-Type": "application/octet-stream"})

    def get_media(name, token=None, target=bucket):
        return call(url, "GET", f"/storage/v1/b/{target}/o/{q(name)}?alt=media", token)

    def list_names(token=None, prefix=None, target=bucket):
        path = f"/storage/v1/b/{target}/o" + (f"?prefix={q(prefix)}" if prefix is not None else "")
        status, _, data = call(url, "GET", path, token)
        names = [o["name"] for o in json.loads(data).get("items", [])] if status == 200 else None
        return status, names, data

    def refused(name, got, permission):
        status, _, data = got
        code, message, reason = gcs_error(data)
        return check(f"{tag} {name}: 403 storage's JSON error naming {permission}",
                     status == 403 and code == 403 and reason == "forbidden"
                     and f"does not have {permission} access to the Google Cloud " in message,
                     (status, data[:300]))

    def errors():
        rules = [rule(bucket, prefix="sts/in/")]
        cases = [
            ("no grant_type", token_form(rules, grant_type=None)),
            ("another grant_type", token_form(rules, grant_type="authorization_code")),
            ("a JWT subject_token_type", token_form(rules, subject_token_type="urn:ietf:params:oauth:token-type:jwt")),
            ("an id_token requested_token_type",
             token_form(rules, requested_token_type="urn:ietf:params:oauth:token-type:id_token")),
            ("an empty subject_token", token_form(rules, subject="")),
            ("no options", token_form(rules, options=None)),
            ("options that are not JSON", token_form(rules, options="{accessBoundary:")),
            ("options without accessBoundary", token_form(rules, options="{}")),
            ("no rules", token_form([])),
            ("11 rules", token_form([rule(bucket)] * 11)),
            ("an object as availableResource",
             token_form([dict(rule(bucket), availableResource=f"//storage.googleapis.com/projects/_/buckets/{bucket}/objects/x")])),
            ("another service's resource",
             token_form([dict(rule(bucket), availableResource="//cloudresourcemanager.googleapis.com/projects/p")])),
            ("a permission that is not inRole:",
             token_form([dict(rule(bucket), availablePermissions=["storage.objects.get"])])),
            ("no permissions", token_form([dict(rule(bucket), availablePermissions=[])])),
            ("a condition outside the CEL gangway writes",
             token_form([dict(rule(bucket), availabilityCondition={"expression": "resource.name.endsWith('.bin')"})])),
            ("conditions joined with &&",
             token_form([dict(rule(bucket), availabilityCondition={
                 "expression": "resource.name.startsWith('a') && resource.name.startsWith('b')"})])),
            ("another attribute",
             token_form([dict(rule(bucket), availabilityCondition={
                 "expression": "api.getAttribute('storage.googleapis.com/objectName', '').startsWith('a')"})])),
        ]
        for name, form in cases:
            status, answer = exchange(url, form)
            check(f"{tag} exchange with {name}: 400 {{error, error_description}}",
                  status == 400 and isinstance(answer, dict) and answer.get("error") == "invalid_request"
                  and isinstance(answer.get("error_description"), str) and answer["error_description"],
                  (status, answer))
        status, answer = exchange(url, token_form([rule(bucket)] * 10))
        check(f"{tag} exchange with 10 rules (Google's limit) succeeds", status == 200, (status, answer))

    def issue():
        subject = "ya29.selftest-user-token-" + os.urandom(6).hex()
        rules = [rule(bucket, prefix="sts/in/")]
        status, answer = exchange(url, token_form(rules, subject=subject))
        check(f"{tag} exchange answers access_token, issued_token_type, token_type Bearer, expires_in 3600",
              status == 200 and answer.get("access_token", "").startswith("ya29.")
              and answer.get("issued_token_type") == ACCESS and answer.get("token_type") == "Bearer"
              and answer.get("expires_in") == 3600 and len(answer) == 4, (status, answer))
        token = answer["access_token"]
        last = control(url, "GET", "/_gangway/sts")["exchanges"][-1]
        check(f"{tag} /_gangway/sts records the exchange: subject and token by SHA-256, the boundary as sent",
              last["subject_sha256"] == sha16(subject) and last["token_sha256"] == sha16(token)
              and last["boundary"] == {"accessBoundaryRules": rules} and last["expired"] is False, last)
        seen = json.dumps(control(url, "GET", "/_gangway/sts")) + json.dumps(
            control(url, "GET", "/_gangway/requests"))
        check(f"{tag} the subject token is nowhere in the control API in clear", subject not in seen)
        status, answer = exchange(url, token_form(rules, subject=token))
        check(f"{tag} a downscoped token cannot be downscoped again (400)",
              status == 400 and answer.get("error") in ("invalid_request", "invalid_grant"), (status, answer))
        # google-auth-library-python percent-encodes options once more
        # before form-encoding them; Google takes both.
        body = urllib.parse.urlencode(dict(token_form(rules), options=urllib.parse.quote(
            json.dumps({"accessBoundary": {"accessBoundaryRules": rules}}))))
        status, answer = exchange(url, body)
        check(f"{tag} options percent-encoded twice (as google-auth-library-python sends them) are taken",
              status == 200, (status, answer))
        # Fault rules apply to the exchange as to the store's requests.
        fault = control(url, "POST", "/_gangway/faults", {"path_contains": "/v1/token", "status": 503})
        first, _ = exchange(url, token_form(rules))
        second, _ = exchange(url, token_form(rules))
        control(url, "DELETE", f"/_gangway/faults?id={fault['id']}")
        check(f"{tag} a fault rule on /v1/token answers 503 once, then the exchange works",
              (first, second) == (503, 200), (first, second))
        # Google leaves expires_in out for a token derived from a user's.
        control(url, "POST", "/_gangway/sts/settings", {"send_expires_in": False})
        status, answer = exchange(url, token_form(rules))
        control(url, "POST", "/_gangway/sts/settings", {"send_expires_in": True})
        check(f"{tag} with send_expires_in false the answer has no expires_in",
              status == 200 and "expires_in" not in answer and answer.get("access_token"), answer)
        return token

    def enforce():
        admin = issue()
        rc.ok("mkdir", f"store:{other}")
        check(f"{tag} anonymous seeding works (no bearer passes as before)",
              upload("sts/out/seed.txt", b"seed")[0] == 200 and upload("sts/in/seed.txt", b"seed", target=other)[0] == 200)
        data = os.urandom(50_000)
        check(f"{tag} objectAdmin in the prefix: a JSON API upload", upload("sts/in/a.bin", data, admin)[0] == 200)
        status, _, got = get_media("sts/in/a.bin", admin)
        check(f"{tag} objectAdmin in the prefix: a download gives the bytes", status == 200 and got == data, status)
        status, _, meta = call(url, "GET", f"/storage/v1/b/{bucket}/o/{q('sts/in/a.bin')}", admin)
        check(f"{tag} objectAdmin in the prefix: object metadata", status == 200, status)
        status, names, raw = list_names(admin, "sts/in/")
        check(f"{tag} objectAdmin: a listing with the prefix", status == 200 and names == ["sts/in/a.bin"], raw[:300])
        status, _, _ = call(url, "PUT", f"/{bucket}/sts/in/x.xml", admin, b"xml body")
        status2, _, got = call(url, "GET", f"/{bucket}/sts/in/x.xml", admin)
        status3, _, listing = call(url, "GET", f"/{bucket}?list-type=2&prefix=sts/in/", admin)
        check(f"{tag} objectAdmin on the XML API: PUT, GET and list-type=2 with the prefix",
              status == 200 and status2 == 200 and got == b"xml body" and status3 == 200
              and b"sts/in/x.xml" in listing, (status, status2, status3))
        status, _, body = call(url, "POST", f"/{bucket}/sts/in/mp.bin?uploads", admin, b"")
        upload_id = body.split(b"<UploadId>")[-1].split(b"</UploadId>")[0].decode()
        part = os.urandom(100_000)
        status2, headers, _ = call(url, "PUT", f"/{bucket}/sts/in/mp.bin?partNumber=1&uploadId={upload_id}",
                                   admin, part)
        done = (f'<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{headers.get("ETag")}</ETag>'
                "</Part></CompleteMultipartUpload>").encode()
        status3, _, _ = call(url, "POST", f"/{bucket}/sts/in/mp.bin?uploadId={upload_id}", admin, done)
        check(f"{tag} objectAdmin on the XML API: a multipart upload in the prefix",
              (status, status2, status3) == (200, 200, 200) and get_media("sts/in/mp.bin")[2] == part,
              (status, status2, status3))
        compose = json.dumps({"sourceObjects": [{"name": "sts/in/a.bin"}, {"name": "sts/in/mp.bin"}]}).encode()
        status, _, _ = call(url, "POST", f"/storage/v1/b/{bucket}/o/{q('sts/in/composed')}/compose", admin,
                            compose, {"Content-Type": "application/json"})
        check(f"{tag} objectAdmin: a compose of objects in the prefix (its body read to check the sources)",
              status == 200 and get_media("sts/in/composed")[2] == data + part, status)
        # fake-gcs-server answers a delete 200 (GCS: 204).
        check(f"{tag} objectAdmin in the prefix: a delete",
              call(url, "DELETE", f"/storage/v1/b/{bucket}/o/{q('sts/in/x.xml')}", admin)[0] in (200, 204))
        # An entry is logged when its request ends, which may be after the
        # client has its answer: the window starts at the delete's entry.
        deadline = time.monotonic() + 10
        while True:
            deleted = [r["id"] for r in control(url, "GET", "/_gangway/requests")["requests"]
                       if r["method"] == "DELETE" and "sts%2Fin%2Fx.xml" in r["path"]]
            if deleted or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        before = deleted[-1]
        refused("an upload outside the prefix", upload("sts/out/a.bin", data, admin), "storage.objects.create")
        check(f"{tag} the refused upload stored nothing", get_media("sts/out/a.bin")[0] == 404)
        refused("a read outside the prefix", get_media("sts/out/seed.txt", admin), "storage.objects.get")
        refused("a listing without a prefix", call(url, "GET", f"/storage/v1/b/{bucket}/o", admin),
                "storage.objects.list")
        refused("a listing of the prefix's parent", call(url, "GET", f"/storage/v1/b/{bucket}/o?prefix=sts/", admin),
                "storage.objects.list")
        refused("a read in another bucket", get_media("sts/in/seed.txt", admin, target=other), "storage.objects.get")
        refused("a listing in another bucket",
                call(url, "GET", f"/storage/v1/b/{other}/o?prefix=sts/in/", admin), "storage.objects.list")
        refused("a bucket delete", call(url, "DELETE", f"/storage/v1/b/{other}", admin), "storage.buckets.delete")
        check(f"{tag} the bucket is still there", call(url, "GET", f"/storage/v1/b/{other}")[0] == 200)
        refused("a bucket's metadata (objectAdmin has no storage.buckets.get)",
                call(url, "GET", f"/storage/v1/b/{bucket}", admin), "storage.buckets.get")
        refused("a bucket create", call(url, "POST", "/storage/v1/b?project=test", admin,
                                        json.dumps({"name": "selftest-sts-new"}).encode(),
                                        {"Content-Type": "application/json"}), "storage.buckets.create")
        refused("a copy from outside the prefix into it",
                call(url, "POST", f"/storage/v1/b/{bucket}/o/{q('sts/out/seed.txt')}/copyTo/b/{bucket}/o/{q('sts/in/copy')}",
                     admin, b"", {"Content-Type": "application/json"}), "storage.objects.get")
        refused("a compose with a source outside the prefix",
                call(url, "POST", f"/storage/v1/b/{bucket}/o/{q('sts/in/composed2')}/compose", admin,
                     json.dumps({"sourceObjects": [{"name": "sts/out/seed.txt"}]}).encode(),
                     {"Content-Type": "application/json"}), "storage.objects.get")
        status, _, body = call(url, "POST", f"/{bucket}/sts/out/mp.bin?uploads", admin, b"")
        check(f"{tag} an XML multipart upload outside the prefix: 403 at its start",
              status == 403 and b"storage.multipartUploads.create" in body, (status, body[:300]))
        status, _, body = call(url, "PUT", f"/{bucket}/sts/out/x.xml", admin, b"xml body")
        check(f"{tag} an XML API PUT outside the prefix: 403 AccessDenied in XML",
              status == 403 and b"<Code>AccessDenied</Code>" in body and b"storage.objects.create" in body,
              (status, body[:300]))
        big = os.urandom(20 * MiB)
        status, _, _ = upload("sts/out/big.bin", big, admin)
        # The answer goes before the rest of the body is read; the entry is
        # logged once it has been.
        deadline = time.monotonic() + 10
        while True:
            log = control(url, "GET", f"/_gangway/requests?since={before}")["requests"]
            entry = [r for r in log if "big.bin" in r["path"]]
            if entry or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        check(f"{tag} a refused 20 MiB upload is answered 403, its body read and thrown away",
              status == 403 and entry and entry[0]["status"] == 403 and entry[0]["bytes_in"] == len(big)
              and get_media("sts/out/big.bin")[0] == 404, (status, entry))
        logged = [r for r in log if r["key_id"] == "bearer-sha256:" + sha16(admin)]
        check(f"{tag} each refusal is logged with status 403 and what was denied",
              len(logged) == 14 and all(r["status"] == 403 and r["denied"] for r in logged),
              [(r["method"], r["path"], r["status"], r["denied"]) for r in logged])
        status, names, _ = list_names("ya29.selftest-user-token")
        check(f"{tag} a bearer that is not a downscoped token passes as before",
              status == 200 and "sts/out/seed.txt" in names, status)
        return admin

    def roles():
        viewer = downscoped(url, [rule(bucket, "objectViewer", "sts/in/")])
        check(f"{tag} objectViewer reads and lists in the prefix",
              get_media("sts/in/a.bin", viewer)[0] == 200 and list_names(viewer, "sts/in/")[0] == 200)
        refused("objectViewer writing", upload("sts/in/v.bin", b"v", viewer), "storage.objects.create")
        refused("objectViewer deleting", call(url, "DELETE", f"/storage/v1/b/{bucket}/o/{q('sts/in/a.bin')}", viewer),
                "storage.objects.delete")
        creator = downscoped(url, [rule(bucket, "objectCreator", "sts/in/")])
        check(f"{tag} objectCreator creates a new object in the prefix", upload("sts/in/c.bin", b"c", creator)[0] == 200)
        refused("objectCreator overwriting an object", upload("sts/in/c.bin", b"c2", creator), "storage.objects.delete")
        refused("objectCreator reading", get_media("sts/in/c.bin", creator), "storage.objects.get")
        unconditioned = downscoped(url, [rule(bucket, "objectViewer")])
        check(f"{tag} a rule without a condition covers the whole bucket",
              list_names(unconditioned)[0] == 200 and get_media("sts/out/seed.txt", unconditioned)[0] == 200)
        two = downscoped(url, [rule(bucket, "objectViewer", "sts/in/"), rule(other, "objectAdmin", "sts/in/")])
        check(f"{tag} two rules: each bucket gets its rule's role",
              get_media("sts/in/seed.txt", two, target=other)[0] == 200
              and upload("sts/in/two.bin", b"2", two, target=other)[0] == 200
              and upload("sts/in/two.bin", b"2", two)[0] == 403)

    def expiry(admin):
        got = control(url, "POST", "/_gangway/sts/expire", {})
        status, _, data = get_media("sts/in/a.bin", admin)
        code, message, reason = gcs_error(data)
        check(f"{tag} after /_gangway/sts/expire ({got['expired']} tokens) a token gets 401 authError",
              got["expired"] >= 1 and status == 401 and code == 401 and reason == "authError", (status, data[:200]))
        status, _, body = call(url, "GET", f"/{bucket}/sts/in/a.bin", admin)
        check(f"{tag} ... and 401 on the XML API", status == 401, (status, body[:200]))
        check(f"{tag} /_gangway/sts shows the exchanges expired",
              all(e["expired"] for e in control(url, "GET", "/_gangway/sts")["exchanges"]))
        renewed = downscoped(url, [rule(bucket, prefix="sts/in/")])
        check(f"{tag} a renewed token works", get_media("sts/in/a.bin", renewed)[0] == 200)

    def with_rclone():
        token = downscoped(url, [rule(bucket, prefix="sts/rclone/")])
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        env = dict(rc.env)
        env.pop("RCLONE_CONFIG_STORE_ANONYMOUS", None)
        env["RCLONE_CONFIG_STORE_TOKEN"] = json.dumps(
            {"access_token": token, "token_type": "Bearer", "expiry": expiry})
        small = os.path.join(work, "gcs", "sts-src")
        os.makedirs(os.path.join(small, "sub"))
        # 17 MiB: a resumable upload, whose later pieces go to the session
        # URI (no boundary check after the session starts, as in GCS).
        for rel, data in (("a.txt", b"alpha\n"), ("sub/b.bin", os.urandom(300_000)),
                          ("sub/big.bin", os.urandom(17 * MiB))):
            with open(os.path.join(small, rel), "wb") as f:
                f.write(data)

        def run(*args, extra=None):
            cmd = ["rclone", "--header", "X-Gangway-Caller: selftest-sts", "--retries", "1",
                   "--low-level-retries", "1", *args]
            return subprocess.run(cmd, env=dict(env, **(extra or {})), capture_output=True, timeout=120)

        # Before its first write to a bucket that it has not listed yet,
        # rclone checks that the bucket exists by listing one object with
        # no prefix, which the boundary refuses (copy lists the destination
        # prefix first, which spares it the check; copyto, rcat, mkdir and
        # a mount's writes do not).
        r = run("copyto", os.path.join(small, "a.txt"), f"store:{bucket}/sts/rclone/one.txt")
        check(f"{tag} rclone copyto into the prefix fails without no_check_bucket "
              "(its bucket check lists the bucket without a prefix: 403)",
              r.returncode != 0 and b"failed to get bucket" in r.stderr and b"403" in r.stderr,
              r.stderr.decode()[-300:])
        nocheck = {"RCLONE_CONFIG_STORE_NO_CHECK_BUCKET": "true"}
        r = run("copy", small, f"store:{bucket}/sts/rclone", extra=nocheck)
        r2 = run("copyto", os.path.join(small, "a.txt"), f"store:{bucket}/sts/rclone/one.txt", extra=nocheck)
        back = os.path.join(work, "gcs", "sts-back")
        ok = r.returncode == 0 and r2.returncode == 0
        if ok:
            rc.ok("copy", f"store:{bucket}/sts/rclone", back, "--exclude", "one.txt")
        check(f"{tag} rclone with the token and no_check_bucket: copy and copyto into the prefix, same bytes",
              ok and same_tree(small, back), (r.stderr + r2.stderr).decode()[-300:])
        r = run("lsf", "-R", f"store:{bucket}/sts/rclone", extra=nocheck)
        check(f"{tag} rclone lists the prefix", r.returncode == 0 and b"sub/b.bin" in r.stdout,
              r.stderr.decode()[-300:])
        r = run("copy", small, f"store:{bucket}/sts/elsewhere", extra=nocheck)
        status, names, _ = list_names(prefix="sts/elsewhere/")
        check(f"{tag} rclone copy outside the prefix fails (403) and stores nothing",
              r.returncode != 0 and b"403" in r.stderr and names == [], (r.stderr.decode()[-300:], names))
        r = run("lsf", f"store:{bucket}", extra=nocheck)
        check(f"{tag} rclone cannot list the bucket's root", r.returncode != 0, r.stdout[-200:])
        if mount:
            point = os.path.join(work, "gcs", "sts-mnt")
            os.makedirs(point)
            proc = subprocess.Popen(
                ["rclone", "mount", f"store:{bucket}/sts/rclone", point, "--vfs-cache-mode", "off",
                 "--dir-cache-time", "1s", "-v", "--log-file", os.path.join(work, "mount-gcs-sts.log")],
                env=dict(env, **nocheck), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            written = os.urandom(1 * MiB + 3)
            try:
                deadline = time.monotonic() + 20
                while not os.path.ismount(point) and time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.2)
                with open(os.path.join(point, "sub", "b.bin"), "rb") as f:
                    read_ok = f.read() == open(os.path.join(small, "sub", "b.bin"), "rb").read()
                with open(os.path.join(point, "from-mount.bin"), "wb") as f:
                    f.write(written)
            finally:
                unmount(point, proc)
            check(f"{tag} rclone mount of the prefix with the token: a file reads, a file written lands",
                  read_ok and get_media("sts/rclone/from-mount.bin")[2] == written)
        control(url, "POST", "/_gangway/sts/expire", {"token_sha256": sha16(token)})
        r = run("cat", f"store:{bucket}/sts/rclone/a.txt", extra=nocheck)
        check(f"{tag} rclone with the expired token fails (401)",
              r.returncode != 0 and b"401" in r.stderr, r.stderr.decode()[-300:])

    step(f"{tag} exchange errors", errors)
    admin = []
    step(f"{tag} enforcement", lambda: admin.append(enforce()))
    step(f"{tag} roles", roles)
    if admin:
        step(f"{tag} expiry", lambda: expiry(admin[0]))
    step(f"{tag} rclone with a downscoped token", with_rclone)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--s3-python", default=os.environ.get("GANGWAY_TEST_S3_PYTHON")
                        or os.path.join(ROOT, "target", "ec2-venv", "bin", "python"))
    parser.add_argument("--gcs-python", default=os.environ.get("GANGWAY_TEST_GCS_PYTHON")
                        or os.path.join(ROOT, "target", "gcs-venv", "bin", "python"))
    parser.add_argument("--only", choices=("s3", "gcs"))
    parser.add_argument("--no-mount", action="store_true")
    args = parser.parse_args()
    if not shutil.which("rclone"):
        print("SKIPPED storage selftest: rclone is not installed (apt-get install rclone fuse3)")
        return 1
    mount = not args.no_mount
    if mount and not (os.path.exists("/dev/fuse") and shutil.which("fusermount3")):
        print("SKIPPED mounts: no /dev/fuse or fusermount3 (apt-get install fuse3)")
        mount = False
    print(subprocess.run(["rclone", "version"], capture_output=True).stdout.decode().splitlines()[0])
    work = tempfile.mkdtemp(prefix="gangway-storage-selftest-")
    procs = []
    try:
        for kind, python in (("s3", args.s3_python), ("gcs", args.gcs_python)):
            if args.only and args.only != kind:
                continue
            proc, url = start(python, os.path.join(ROOT, "tests", "emulators", kind, "server.py"))
            procs.append(proc)
            print(f"== {kind}: {url}")
            test_store(kind, url, work, mount)
    finally:
        for proc in procs:
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
