#!/usr/bin/env python3
"""Dashboard figures for the gangway binary on the embedded local provider.

Usage: python3 bench/dashboard.py [path/to/gangway]   (default target/release/gangway)

A state database with 1,000 clusters (2 nodes and a job each) and 1,000
managed jobs (each with the events and ledger rows of a run, a preemption
and a recovery), made as bench/cluster.py makes its 1,000 clusters: one
real cluster and one real managed job launched on the local cloud, their
rows copied. Then `gangway dashboard` serves it and each page is fetched
over HTTP on 127.0.0.1, a new connection each time as the page's own live
update does: the first page (clusters, whole document), its live update
(the `?part=main` fragment the page polls every 2 s), and the other pages.
Median and p90 of RUNS fetches each, client-measured wall time to the last
byte.

Build first: cargo build --release -p gangway --no-default-features.
"""
import http.client
import json
import os
import re
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
RUNS = int(os.environ.get("RUNS", "30"))
COPIES = 999

CLUSTER = """name: seed
num_nodes: 2
resources:
  infra: local
run: sleep 3600
"""

JOB = """name: seed-job
resources:
  infra: local
  use_spot: true
config:
  local:
    preemptions:
      - {after_s: 2}
run: |
  echo "run $GANGWAY_RESTART_COUNT"
  [ "$GANGWAY_RESTART_COUNT" = 0 ] && exec sleep 300
  echo done
"""


def gw(home, *args, check=True):
    return benchlib.gw(BIN, home, *args, check=check)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def copy_rows(db, table, where, args, change):
    """Inserts a copy of each row of `table` matching `where`, changed by
    `change(dict)`; returns the new rowids."""
    cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    rows = db.execute(f"SELECT * FROM {table} WHERE {where}", args).fetchall()
    ids = []
    for r in rows:
        d = dict(zip(cols, r))
        change(d)
        cur = db.execute(f"INSERT INTO {table} ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                         [d[c] for c in cols])
        ids.append(cur.lastrowid)
    return ids


def make_state(home):
    with open(os.path.join(home, "seed.yaml"), "w") as f:
        f.write(CLUSTER)
    with open(os.path.join(home, "job.yaml"), "w") as f:
        f.write(JOB)
    gw(home, "launch", os.path.join(home, "seed.yaml"), "-c", "seed", "-y", "-d")
    gw(home, "jobs", "launch", os.path.join(home, "job.yaml"), "-y")
    db = sqlite3.connect(os.path.join(home, "state.db"))
    for i in range(COPIES):
        name = f"c{i:04d}"

        def cluster(d, name=name):
            d["name"] = name

        def node(d, name=name):
            d["cluster"] = name

        def job(d, name=name):
            d["id"] = None
            d["cluster"] = name

        copy_rows(db, "clusters", "name = 'seed'", (), cluster)
        copy_rows(db, "nodes", "cluster = 'seed'", (), node)
        copy_rows(db, "jobs", "cluster = 'seed'", (), job)

        def managed(d):
            d["id"] = None

        (new,) = copy_rows(db, "managed_jobs", "id = 1", (), managed)

        def of_job(d, new=new):
            d["id"] = None
            d["job"] = new

        def ledger(d, new=new):
            d["id"] = None
            d["managed_job"] = new
            d["cluster"] = f"managed-{new}"

        copy_rows(db, "managed_events", "job = 1", (), of_job)
        copy_rows(db, "ledger", "managed_job = 1", (), ledger)
    db.commit()
    counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
              for t in ("clusters", "nodes", "managed_jobs", "managed_events", "ledger")}
    db.close()
    return counts


def fetch(port, target):
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", target, headers={"Host": f"127.0.0.1:{port}"})
    r = c.getresponse()
    body = r.read()
    c.close()
    ms = (time.perf_counter() - t) * 1000
    if r.status != 200:
        sys.exit(f"GET {target} answered {r.status}: {body[:300]!r}")
    return ms, len(body)


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: run `cargo build --release -p gangway --no-default-features` first")
    print(f"binary: {BIN}")
    home = tempfile.mkdtemp(prefix="gw-dash-bench-")
    counts = make_state(home)
    print("state: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    env = dict(os.environ, GANGWAY_HOME=home)
    env.pop("GANGWAY_CATALOG_DIR", None)
    p = subprocess.Popen([BIN, "dashboard"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/\?t=([0-9a-f]+)", line)
        if not m:
            sys.exit(f"no address from gangway dashboard: {line!r}")
        port, token = int(m.group(1)), m.group(2)
        pages = [
            ("first page: clusters (whole document)", "/"),
            ("live update: clusters (?part=main)", "/?part=main"),
            ("managed jobs (whole document)", "/jobs"),
            ("live update: managed jobs", "/jobs?part=main"),
            ("one job: timeline, events, log", "/jobs/1"),
            ("live update: one job", "/jobs/1?part=main"),
            ("cost chart", "/cost"),
            ("events (newest 200)", "/events"),
        ]
        print(f"\n{RUNS} fetches each over HTTP on 127.0.0.1 (a new connection each)")
        print(f"{'page':42} {'median ms':>10} {'p90 ms':>8} {'KiB':>8}")
        for what, path in pages:
            target = path + ("&" if "?" in path else "?") + "t=" + token
            fetch(port, target)  # warm: the page cache, the first connection
            times, size = [], 0
            for _ in range(RUNS):
                ms, size = fetch(port, target)
                times.append(ms)
            print(f"{what:42} {statistics.median(times):10.1f} {pct(times, 0.9):8.1f} {size / 1024:8.0f}")
        rss = benchlib.proc_status(p.pid).get("VmHWM", "?")
        print(f"\ndashboard peak RSS: {rss}")
    finally:
        p.terminate()
        p.wait()
        gw(home, "down", "seed", "-y", check=False)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
