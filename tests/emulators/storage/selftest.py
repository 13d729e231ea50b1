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
leaves no object; a 503 is retried). Standard library only; ends with
`N passed, N failed` and exits 1 on any failure. Needs rclone, and for the
mounts fuse3 and /dev/fuse (skipped with a line saying so otherwise).
"""

import argparse
import filecmp
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
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
                subprocess.run(["fusermount3", "-u", point], capture_output=True, timeout=60)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
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
