#!/usr/bin/env python3
"""Cluster figures for the gangway binary on the embedded local provider.

Usage: python3 bench/cluster.py [path/to/gangway]   (default target/release/gangway)

1. `gangway launch` of a 64-node local cluster with a trivial run: time from
   the process start to every rank running (the job's `started_at`, stamped
   by the driver once all 64 ranks are spawned), split into provisioning and
   gang startup, plus the whole attached launch. Each trial uses a fresh
   GANGWAY_HOME and tears the cluster down afterwards.
2. `gangway status` with 1,000 clusters in the state database, as a whole
   process (median and p90 over many runs, and peak RSS from GNU time).

Build first: cargo build --release.
"""
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
TRIALS = int(os.environ.get("TRIALS", "7"))
STATUS_RUNS = int(os.environ.get("STATUS_RUNS", "50"))

TASK64 = """name: bench64
num_nodes: 64
resources:
  infra: local
run: "true"
"""


def gw(home, *args, check=True):
    return benchlib.gw(BIN, home, *args, check=check)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def launch64():
    rows = []
    for _ in range(TRIALS):
        home = tempfile.mkdtemp(prefix="gw-bench-")
        task = os.path.join(home, "bench64.yaml")
        with open(task, "w") as f:
            f.write(TASK64)
        t0 = time.time()
        gw(home, "launch", task, "-c", "b64", "-y")
        t_end = time.time()
        q = json.loads(gw(home, "queue", "b64", "-o", "json").stdout)
        job = q["jobs"][0]
        assert job["status"] == "SUCCEEDED", job
        db = sqlite3.connect(os.path.join(home, "state.db"))
        (prov_at,) = db.execute(
            "SELECT at FROM events WHERE kind = 'provision' ORDER BY id LIMIT 1").fetchone()
        db.close()
        rows.append({
            "provisioned": prov_at / 1000 - t0,
            "running": job["started_at"] / 1000 - t0,
            "attached": t_end - t0,
        })
        gw(home, "down", "--all", "-y")
        left = os.listdir(os.path.join(home, "local", "instances"))
        assert not left, f"instances left after down: {left}"
        shutil.rmtree(home, ignore_errors=True)
    print(f"launch of 64 local nodes, trivial run, {TRIALS} trials (fresh GANGWAY_HOME each)")
    print(f"{'from process start to':40} {'median ms':>10} {'max ms':>8}")
    for key, label in [("provisioned", "64 nodes provisioned"),
                       ("running", "all 64 ranks running"),
                       ("attached", "attached launch returns (run done)")]:
        xs = [r[key] * 1000 for r in rows]
        print(f"{label:40} {statistics.median(xs):10.1f} {max(xs):8.1f}")


def peak_rss_kib(home, args):
    if not os.path.exists("/usr/bin/time"):
        return float("nan")
    env = dict(os.environ, GANGWAY_HOME=home)
    p = subprocess.run(["/usr/bin/time", "-f", "%M", BIN, *args], cwd=ROOT, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return int(p.stderr.strip().splitlines()[-1])


def status1000():
    home = tempfile.mkdtemp(prefix="gw-bench-")
    task = os.path.join(home, "one.yaml")
    with open(task, "w") as f:
        f.write("name: one\nnum_nodes: 2\nresources:\n  infra: local\nrun: \"true\"\n")
    gw(home, "launch", task, "-c", "seed", "-y")
    # 999 more rows shaped like the real one (nodes and a finished job each).
    db = sqlite3.connect(os.path.join(home, "state.db"))
    cols = [r[1] for r in db.execute("PRAGMA table_info(clusters)")]
    row = db.execute("SELECT * FROM clusters WHERE name = 'seed'").fetchone()
    nodes = db.execute("SELECT * FROM nodes WHERE cluster = 'seed'").fetchall()
    jcols = [r[1] for r in db.execute("PRAGMA table_info(jobs)")]
    job = db.execute("SELECT * FROM jobs WHERE cluster = 'seed'").fetchone()
    for i in range(999):
        name = f"c{i:04d}"
        r = list(row)
        r[cols.index("name")] = name
        db.execute(f"INSERT INTO clusters VALUES ({','.join('?' * len(r))})", r)
        for n in nodes:
            n = list(n)
            n[0] = name
            db.execute(f"INSERT INTO nodes VALUES ({','.join('?' * len(n))})", n)
        j = list(job)
        j[jcols.index("id")] = None
        j[jcols.index("cluster")] = name
        db.execute(f"INSERT INTO jobs VALUES ({','.join('?' * len(j))})", j)
    db.commit()
    db.close()
    n = len(json.loads(gw(home, "status", "-o", "json").stdout)["clusters"])
    assert n == 1000, n
    print(f"\nstatus with {n} clusters, whole process, {STATUS_RUNS} runs")
    print(f"{'command':40} {'median ms':>10} {'p90 ms':>8} {'peak RSS MiB':>13}")
    env = dict(os.environ, GANGWAY_HOME=home)
    for args in (["status"], ["status", "-o", "json"]):
        times = []
        for _ in range(STATUS_RUNS):
            t = time.perf_counter()
            subprocess.run([BIN, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True)
            times.append((time.perf_counter() - t) * 1000)
        rss = max(peak_rss_kib(home, args) for _ in range(3)) / 1024
        print(f"{'gangway ' + ' '.join(args):40} {statistics.median(times):10.2f} "
              f"{pct(times, 0.9):8.2f} {rss:13.1f}")
    # The seed cluster is real; the copies point at the same (now gone) nodes.
    gw(home, "down", "seed", "-y")
    shutil.rmtree(home, ignore_errors=True)


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: run `cargo build --release` first")
    print(f"binary: {BIN}")
    only = os.environ.get("ONLY")  # "launch" or "status" to run one part
    if only in (None, "launch"):
        launch64()
    if only in (None, "status"):
        status1000()


if __name__ == "__main__":
    main()
