#!/usr/bin/env python3
"""A bucket checkpoint, end to end, against a plain `rclone copy` of the
same data to the same emulator in the same run.

Usage: python3 bench/checkpoint.py [path/to/gangway]   (default target/release/gangway)

For each store (STORES, default "s3 gcs") and each data set:
  big:   BIG_FILES files (default 16) of BIG_MB MiB (default 256: 4 GiB)
  small: SMALL_FILES files (default 10000) of 4 KiB
it times, in ABBA order (rclone, gangway, gangway, rclone), ROUNDS times
(default 1; each side's figure is the median of its 2 × ROUNDS runs, all
of which are printed):
  - rclone: `rclone copy DIR remote:bucket/...` (16 transfers, as gangway's
    nodes use), through the emulator's front;
  - gangway: a managed job on the local provider whose setup puts the data
    set into $GANGWAY_CHECKPOINT_DIR (hard links: no copy) and whose run
    reports each `.gangway-synced` it sees: the first sync is the whole
    checkpoint (every node's upload, its check, the manifests, the
    completion marker), measured from the sync's start (the time
    `.gangway-synced` holds) to the file appearing on the node (pruning
    comes after it); the next ones are checkpoints in which nothing changed;
each run into a fresh prefix that is deleted right after it, so every run
starts just after a deletion, on a store holding the same;
and, for each set in RESTORE_SETS (default both; RESTORE_NODES, default 4;
RESTORE=0 to skip), ROUNDS times in AB order (the median of each side):
  - rclone: RESTORE_NODES `rclone copy remote:bucket/... DIR` at once;
  - gangway: a RESTORE_NODES-node managed job on the same bucket prefix,
    whose storage step restores that checkpoint on every node at once
    (one more, untimed, gangway checkpoint of the set); the slowest
    node's restore, as each reports it.

Needs target/ec2-venv and target/gcs-venv (tests/emulators/*/setup.sh),
rclone, and room for the data set twice in the emulators (moto keeps S3
objects in memory) and RESTORE_NODES + 1 times on disk. Loopback only; what it starts stops at exit.
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchlib import ROOT

BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
STORES = os.environ.get("STORES", "s3 gcs").split()
BIG_FILES = int(os.environ.get("BIG_FILES", "16"))
BIG_MB = int(os.environ.get("BIG_MB", "256"))
SMALL_FILES = int(os.environ.get("SMALL_FILES", "10000"))
SETS = os.environ.get("SETS", "big small").split()
RESTORE_NODES = int(os.environ.get("RESTORE_NODES", "4"))
RESTORE = os.environ.get("RESTORE", "1") != "0"
# The data sets restored on RESTORE_NODES nodes after their upload.
RESTORE_SETS = os.environ.get("RESTORE_SETS", "big small").split() if RESTORE else []
ROUNDS = int(os.environ.get("ROUNDS", "1"))
NO_CHANGE = 3  # checkpoints with nothing changed, after the first
NO_AUTH = '{"disable_oauth":true,"client_email":"","private_key":"","private_key_id":""}'

procs = []


def start(python, server):
    p = subprocess.Popen([python, server, "--port", "0"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs.append(p)
    line = p.stdout.readline()
    if not line.startswith("READY "):
        sys.exit(f"bench: {server} did not start")
    return line.split()[1]


def stop_all():
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait()


def make_bucket(store, url, name):
    if store == "s3":
        req = urllib.request.Request(f"{url}/{name}", method="PUT")
    else:
        req = urllib.request.Request(f"{url}/storage/v1/b?project=test", method="POST",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req).read()


def rclone_env(store, url):
    env = dict(os.environ, RCLONE_CONFIG="/dev/null", AWS_CA_BUNDLE="")
    p = "RCLONE_CONFIG_B_"
    if store == "s3":
        env.update({p + "TYPE": "s3", p + "PROVIDER": "Other", p + "ENV_AUTH": "false",
                    p + "ACCESS_KEY_ID": "testing", p + "SECRET_ACCESS_KEY": "testing",
                    p + "REGION": "us-east-1", p + "ENDPOINT": url, p + "FORCE_PATH_STYLE": "true"})
    else:
        env.update({p + "TYPE": "google cloud storage", p + "ENDPOINT": url + "/storage/v1/",
                    p + "ANONYMOUS": "true", p + "PROJECT_NUMBER": "test",
                    p + "BUCKET_POLICY_ONLY": "true"})
    return env


def gangway_env(store, url, ec2):
    env = dict(os.environ)
    env.pop("GANGWAY_CATALOG_DIR", None)
    if store == "s3":
        env.update(GANGWAY_S3_ENDPOINT=url, AWS_ACCESS_KEY_ID="testing",
                   AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1",
                   AWS_ENDPOINT_URL=ec2, AWS_MAX_ATTEMPTS="1")
    else:
        env.update(GANGWAY_GCS_ENDPOINT=url, GOOGLE_SERVICE_ACCOUNT_KEY=NO_AUTH)
    return env


def listing(store, url, bucket, prefix):
    p = subprocess.run(["rclone", "lsf", "-R", "--files-only", f"b:{bucket}/{prefix}"],
                       env=rclone_env(store, url), capture_output=True, text=True, check=True)
    return [prefix + line for line in p.stdout.splitlines()]


def make_data(root, store, kind):
    d = os.path.join(root, f"{store}-{kind}")
    os.makedirs(d)
    if kind == "big":
        for i in range(BIG_FILES):
            with open(os.path.join(d, f"shard-{i:02}.bin"), "wb") as f:
                for _ in range(BIG_MB):
                    f.write(os.urandom(1 << 20))
    else:
        for i in range(SMALL_FILES):
            sub = os.path.join(d, f"d{i // 1000:02}")
            os.makedirs(sub, exist_ok=True)
            with open(os.path.join(sub, f"f{i:05}"), "wb") as f:
                f.write(os.urandom(4096))
    return d


def rclone_copy(store, url, data, bucket, dest):
    t0 = time.monotonic()
    subprocess.run(["rclone", "copy", data, f"b:{bucket}/{dest}", "--transfers", "16",
                    "--checkers", "16", "--retries", "1"], env=rclone_env(store, url), check=True)
    return time.monotonic() - t0


def rclone_delete(store, url, bucket, dest):
    subprocess.run(["rclone", "purge", f"b:{bucket}/{dest}"], env=rclone_env(store, url), check=True)


def rclone_restore(store, url, bucket, dest, work):
    """RESTORE_NODES downloads of the same prefix at once; seconds for all."""
    dirs = [tempfile.mkdtemp(dir=work) for _ in range(RESTORE_NODES)]
    t0 = time.monotonic()
    ps = [subprocess.Popen(["rclone", "copy", f"b:{bucket}/{dest}", d, "--transfers", "16",
                            "--checkers", "16", "--retries", "1"], env=rclone_env(store, url))
          for d in dirs]
    for p in ps:
        if p.wait() != 0:
            sys.exit("bench: rclone restore failed")
    took = time.monotonic() - t0
    for d in dirs:
        shutil.rmtree(d)
    return took


def gangway_restore(store, url, ec2, bucket, dest, work):
    """A RESTORE_NODES-node managed job restoring the checkpoint at dest;
    the slowest node's restore."""
    home = tempfile.mkdtemp(dir=work)
    s = "s3" if store == "s3" else "gs"
    task = os.path.join(home, "restore.yaml")
    with open(task, "w") as f:
        f.write(f"""num_nodes: {RESTORE_NODES}
resources:
  infra: local
checkpoint:
  storage: {s}://{bucket}/{dest}
  keep: 2
run: echo restored-on-$SKYPILOT_NODE_RANK
""")
    env = gangway_env(store, url, ec2)
    env["GANGWAY_HOME"] = home
    p = subprocess.run([BIN, "jobs", "launch", task, "-y"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench: the restoring job failed: {p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    took = [float(line.split(" in ")[-1].split()[0]) for line in p.stdout.splitlines()
            if "restored checkpoint" in line and " in " in line]
    if len(took) != RESTORE_NODES:
        sys.exit(f"bench: {len(took)} restores reported:\n{p.stdout[-3000:]}")
    shutil.rmtree(home, ignore_errors=True)
    return max(took)


def gangway_checkpoint(store, url, ec2, data, bucket, dest, work):
    home = tempfile.mkdtemp(dir=work)
    s = "s3" if store == "s3" else "gs"
    task = os.path.join(home, "ck.yaml")
    with open(task, "w") as f:
        f.write(f"""resources:
  infra: local
checkpoint:
  storage: {s}://{bucket}/{dest}
  sync_interval: 1
  keep: 2
setup: |
  cp -al {data}/. "$GANGWAY_CHECKPOINT_DIR"/
run: |
  # Builtins only (read, EPOCHREALTIME): the watcher must not compete
  # with rclone for the CPU; it looks every 50 ms.
  seen=""; n=0; f="$GANGWAY_CHECKPOINT_DIR/.gangway-synced"
  while [ $n -lt {NO_CHANGE + 1} ]; do
    now=""; [ -f "$f" ] && read -r now < "$f"
    if [ -n "$now" ] && [ "$now" != "$seen" ]; then
      t=${{EPOCHREALTIME/./}}; echo "synced start=$now seen=${{t:0:13}}"; seen="$now"; n=$((n + 1))
    fi
    sleep 0.05
  done
""")
    env = gangway_env(store, url, ec2)
    env["GANGWAY_HOME"] = home
    p = subprocess.run([BIN, "jobs", "launch", task, "-y"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench: the managed job failed: {p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    took = []
    for line in p.stdout.splitlines():
        if "synced start=" in line:
            kv = dict(w.split("=") for w in line.split() if "=" in w)
            took.append((int(kv["seen"]) - int(kv["start"])) / 1000)
    if len(took) < NO_CHANGE + 1:
        sys.exit(f"bench: saw {len(took)} syncs:\n{p.stdout[-3000:]}")
    return took[0], took[1:]


def main():
    if not os.path.exists(BIN):
        sys.exit(f"bench: no {BIN}; cargo build --release first")
    work = tempfile.mkdtemp(prefix="gangway-bench-ck-", dir="/var/tmp")
    try:
        ec2 = start(os.path.join(ROOT, "target/ec2-venv/bin/python"),
                    "tests/emulators/ec2/server.py")
        rows = []
        restores = []
        for store in STORES:
            py = "target/ec2-venv/bin/python" if store == "s3" else "target/gcs-venv/bin/python"
            url = start(os.path.join(ROOT, py), f"tests/emulators/{store}/server.py")
            for kind in SETS:
                data = make_data(work, store, kind)
                bucket = f"bench-{store}-{kind}"
                make_bucket(store, url, bucket)
                # In ABBA order (rclone, gangway, gangway, rclone), each into
                # a fresh prefix deleted right after it, so every run starts
                # on the same store just after a deletion (a store's work
                # after a purge slowed the next run by seconds) and the
                # machine's drift favours neither; each side's figure is the
                # median of its runs.
                bs, fs, again = [], [], []
                for _ in range(ROUNDS):
                    bs.append(rclone_copy(store, url, data, bucket, "rclone"))
                    rclone_delete(store, url, bucket, "rclone")
                    for _ in range(2):
                        f, a = gangway_checkpoint(store, url, ec2, data, bucket, "gangway", work)
                        rclone_delete(store, url, bucket, "gangway")
                        fs.append(f)
                        again += a
                    bs.append(rclone_copy(store, url, data, bucket, "rclone"))
                    rclone_delete(store, url, bucket, "rclone")
                base, first = statistics.median(bs), statistics.median(fs)
                print(f"  ({store} {kind}: rclone {', '.join(f'{b:.2f}' for b in bs)} s; "
                      f"gangway {', '.join(f'{f:.2f}' for f in fs)} s)", flush=True)
                rows.append((store, kind, base, first, statistics.median(again), max(again)))
                print(f"{store} {kind}: rclone copy {base:.2f} s; gangway checkpoint {first:.2f} s "
                      f"({(first / base - 1) * 100:+.1f}%); nothing changed: median "
                      f"{statistics.median(again):.2f} s, max {max(again):.2f} s", flush=True)
                if kind in RESTORE_SETS:
                    # The checkpoint to restore, made untimed.
                    gangway_checkpoint(store, url, ec2, data, bucket, "gangway", work)
                shutil.rmtree(data)
                if kind in RESTORE_SETS:
                    gen = sorted(k for k in listing(store, url, bucket, "gangway/manifests/")
                                 if k.endswith(".json"))[-1].split("/")[-1][:-5]
                    brs, ors = [], []
                    for _ in range(ROUNDS):
                        brs.append(rclone_restore(store, url, bucket, f"gangway/gen-{gen}/rank-0", work))
                        ors.append(gangway_restore(store, url, ec2, bucket, "gangway", work))
                    base_r, ours_r = statistics.median(brs), statistics.median(ors)
                    print(f"  ({store} {kind} restore: rclone {', '.join(f'{b:.2f}' for b in brs)} s; "
                          f"gangway {', '.join(f'{o:.2f}' for o in ors)} s)", flush=True)
                    restores.append((store, kind, base_r, ours_r))
                    print(f"{store} {kind} restore on {RESTORE_NODES} nodes: rclone copy {base_r:.2f} s; "
                          f"gangway {ours_r:.2f} s ({(ours_r / base_r - 1) * 100:+.1f}%)", flush=True)
        print()
        print("| store | data | rclone copy | gangway checkpoint | vs rclone | nothing changed (median, max) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for store, kind, base, first, med, mx in rows:
            what = (f"{BIG_FILES} × {BIG_MB} MiB" if kind == "big" else f"{SMALL_FILES} × 4 KiB")
            print(f"| {store} | {what} | {base:.2f} s | {first:.2f} s | {(first / base - 1) * 100:+.1f}% "
                  f"| {med:.2f} s, {mx:.2f} s |")
        if restores:
            print()
            print(f"| store | restore on {RESTORE_NODES} nodes at once | rclone copy | gangway (slowest node) | vs rclone |")
            print("| --- | --- | --- | --- | --- |")
            for store, kind, base_r, ours_r in restores:
                what = (f"{BIG_FILES} × {BIG_MB} MiB" if kind == "big" else f"{SMALL_FILES} × 4 KiB")
                print(f"| {store} | {what} | {base_r:.2f} s | {ours_r:.2f} s | {(ours_r / base_r - 1) * 100:+.1f}% |")
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
