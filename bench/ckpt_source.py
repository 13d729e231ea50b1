#!/usr/bin/env python3
"""Where a replacement node should get the kept checkpoint from (issue 36):
the bucket, as every new node restores it today, or a surviving node over
the cluster's network. In the same run, on this machine:

  bucket:  `rclone copy b:bucket/prefix DIR` from the S3 emulator (moto) or
           the GCS fake, 16 transfers: what a new node's storage step runs;
  rsync:   `rsync -a --whole-file` from the "survivor" to the new node over
           ssh (one stream, the cluster's network: here loopback);
  relay:   `ssh survivor tar c | ssh new tar x`, streamed through the
           controller, which needs no key between the nodes.

Usage: python3 bench/ckpt_source.py
Environment: BIG_FILES (default 8) of BIG_MB MiB (default 128: 1 GiB);
SMALL_FILES (default 4000) of 4 KiB; STORES (default "s3 gcs"); ROUNDS
(default 2, in ABC CBA order; each figure the median). Needs the emulators'
venvs (target/ec2-venv, target/gcs-venv; tests/emulators/*/setup.sh, or
GANGWAY_TEST_S3_PYTHON / GANGWAY_TEST_GCS_PYTHON), rclone, rsync, and root
for an sshd on 127.0.62.1-2 port 22.

Everything is on one machine's loopback: the figures are each path's own
cost (a Python object store, ssh's cipher, rsync's and tar's work), not a
cloud's network, where a bucket's per-node bandwidth and a placement
group's node-to-node bandwidth decide.
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint as ck  # noqa: E402  (its emulator and rclone helpers)
from benchlib import ROOT, write_sshd_config  # noqa: E402

BIG_FILES = int(os.environ.get("BIG_FILES", "8"))
BIG_MB = int(os.environ.get("BIG_MB", "128"))
SMALL_FILES = int(os.environ.get("SMALL_FILES", "4000"))
STORES = os.environ.get("STORES", "s3 gcs").split()
ROUNDS = int(os.environ.get("ROUNDS", "2"))
HOSTS = ("127.0.62.1", "127.0.62.2")


def venv(store):
    env = {"s3": "GANGWAY_TEST_S3_PYTHON", "gcs": "GANGWAY_TEST_GCS_PYTHON"}[store]
    default = {"s3": "target/ec2-venv/bin/python", "gcs": "target/gcs-venv/bin/python"}[store]
    return os.environ.get(env) or os.path.join(ROOT, default)


def start_sshd(d):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/host"], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/client"], check=True)
    shutil.copy(f"{d}/client.pub", f"{d}/authorized_keys")
    os.makedirs(f"{d}/home", exist_ok=True)
    with open(f"{d}/sshd_config", "w") as f:
        write_sshd_config(f, [f"{h}:22" for h in HOSTS], d, f"{d}/sshd.pid",
                          f"{d}/authorized_keys", f"{d}/home",
                          'cd "$HOME" || exit 1; eval "$SSH_ORIGINAL_COMMAND"')
    p = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", f"{d}/sshd_config"],
                         stderr=open(f"{d}/sshd.log", "w"))
    ssh = ["ssh", "-F", "/dev/null", "-i", f"{d}/client", "-o", "IdentitiesOnly=yes",
           "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={d}/known",
           "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
    deadline = time.time() + 10
    while subprocess.run(ssh + [HOSTS[1], "true"], capture_output=True).returncode != 0:
        if time.time() > deadline or p.poll() is not None:
            sys.exit(f"bench: sshd did not come up: see {d}/sshd.log")
        time.sleep(0.1)
    return p, ssh


def timed(cmd, **kw):
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, **kw)
    return time.monotonic() - t0


def main():
    if os.geteuid() != 0:
        sys.exit("bench: needs root (an sshd on 127.0.62.1-2:22)")
    work = tempfile.mkdtemp(prefix="gangway-bench-cksrc-", dir="/var/tmp")
    sshd = None
    try:
        sshd, ssh = start_sshd(work)
        # checkpoint.py's data sets, at this bench's sizes.
        ck.BIG_FILES, ck.BIG_MB, ck.SMALL_FILES = BIG_FILES, BIG_MB, SMALL_FILES
        sets = {k: ck.make_data(work, "src", k) for k in ("big", "small")}
        size = {k: sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
                for k, d in sets.items()}
        print(f"data: big {BIG_FILES} x {BIG_MB} MiB, small {SMALL_FILES} x 4 KiB; "
              f"{ROUNDS} round(s), medians")
        print(f"{'set':<6} {'source':<20} {'seconds':>8} {'MiB/s':>8}")
        for kind, data in sets.items():
            dest = os.path.join(work, "new")
            rsync_cmd = ["rsync", "-a", "--whole-file", "-e", " ".join(ssh), f"{data}/",
                         f"{HOSTS[1]}:{dest}/"]
            relay = (f"{' '.join(ssh)} {HOSTS[0]} tar -C {data} -cf - . | "
                     f"{' '.join(ssh)} {HOSTS[1]} 'mkdir -p {dest} && tar -C {dest} -xf -'")
            runs = {"rsync (survivor)": [], "relay (controller)": []}
            buckets = {}
            for store in STORES:
                url = ck.start(venv(store), f"tests/emulators/{store}/server.py")
                bucket = f"cksrc-{store}-{kind}"
                ck.make_bucket(store, url, bucket)
                ck.rclone_copy(store, url, data, bucket, "kept")
                buckets[store] = (url, bucket)
                runs[f"bucket ({store})"] = []

            def bucket_run(store):
                url, bucket = buckets[store]
                return timed(["rclone", "copy", f"b:{bucket}/kept", dest, "--transfers", "16",
                              "--checkers", "16", "--retries", "1"], env=ck.rclone_env(store, url))

            order = list(runs)
            for r in range(ROUNDS):
                for name in (order if r % 2 == 0 else order[::-1]):
                    shutil.rmtree(dest, ignore_errors=True)
                    if name.startswith("bucket"):
                        runs[name].append(bucket_run(name.split("(")[1].rstrip(")")))
                    elif name.startswith("rsync"):
                        runs[name].append(timed(rsync_cmd))
                    else:
                        runs[name].append(timed(["sh", "-c", relay]))
                    got = sum(os.path.getsize(os.path.join(r_, f))
                              for r_, _, fs in os.walk(dest) for f in fs)
                    if got != size[kind]:
                        sys.exit(f"bench: {name} copied {got} bytes of {size[kind]}")
            for name, ts in runs.items():
                m = statistics.median(ts)
                print(f"{kind:<6} {name:<20} {m:>8.2f} {size[kind] / m / (1 << 20):>8.0f}"
                      f"   ({', '.join(f'{t:.2f}' for t in ts)})", flush=True)
            ck.stop_all()
            ck.procs.clear()
    finally:
        if sshd is not None:
            sshd.send_signal(signal.SIGTERM)
            sshd.wait()
        if ck.procs:
            ck.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
