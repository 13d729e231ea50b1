#!/usr/bin/env python3
"""Managed-job figures on the embedded local provider.

Usage: python3 bench/jobs.py [path/to/gangway]   (default target/release/gangway)

1. Recovery overhead: a 2-node spot job whose first cluster is reclaimed
   without notice 2 s after launch. From the node's death (the instance's
   recorded preemption time) to the run resumed (the RUNNING event of the
   second run), minus the provisioning of the new cluster (the time from
   the RECOVERING event to the STARTING event). Several trials.
2. The controller's memory (VmRSS, VmHWM) while it watches 100 running
   managed jobs, and the time one reconcile round takes then (from how
   often it can sync: the CPU time the controller uses per second).

Build first: cargo build --release.
"""
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
TRIALS = int(os.environ.get("TRIALS", "5"))
JOBS = int(os.environ.get("JOBS", "100"))

RECOVERY_TASK = """name: recovery
num_nodes: 2
resources:
  infra: local
  use_spot: true
config:
  local:
    preemptions:
      - {after_s: 2}
run: sleep 600
"""


def gw(home, *args, check=True):
    return benchlib.gw(BIN, home, *args, check=check)


def events(home, job):
    return json.loads(gw(home, "jobs", "events", str(job), "-o", "json").stdout)["events"]


def recovery():
    rows = []
    for _ in range(TRIALS):
        home = tempfile.mkdtemp(prefix="gw-bench-")
        task = os.path.join(home, "t.yaml")
        with open(task, "w") as f:
            f.write(RECOVERY_TASK)
        gw(home, "jobs", "launch", task, "-d")
        death = None
        deadline = time.time() + 60
        while time.time() < deadline:
            for rec in glob.glob(os.path.join(home, "local/instances/*/*.json")):
                try:
                    r = json.load(open(rec))
                except (OSError, ValueError):
                    continue
                if r.get("preempt_at_ms"):
                    death = r["preempt_at_ms"]
            evs = events(home, 1)
            if death and sum(1 for e in evs if e["state"] == "RUNNING") >= 2:
                break
            time.sleep(0.05)
        evs = events(home, 1)
        recovering = next(e["at"] for e in evs if e["state"] == "RECOVERING")
        starting = [e["at"] for e in evs if e["state"] == "STARTING"][1]
        running = [e["at"] for e in evs if e["state"] == "RUNNING"][1]
        detected = next(e["at"] for e in evs if e["state"] == "PREEMPTED")
        rows.append({
            "detect": detected - death,
            "provision": starting - recovering,
            "total": running - death,
            "overhead": (running - death) - (starting - recovering),
        })
        gw(home, "jobs", "cancel", "--all")
        shutil.rmtree(home, ignore_errors=True)
    print(f"recovery after a preemption without notice, 2-node job, {TRIALS} trials")
    print(f"{'':44} {'median ms':>10} {'max ms':>8}")
    for key, label in [("detect", "node death -> preemption seen"),
                       ("provision", "new cluster provisioned (excluded)"),
                       ("overhead", "death -> run resumed, minus provisioning"),
                       ("total", "death -> run resumed")]:
        xs = [r[key] for r in rows]
        print(f"{label:44} {statistics.median(xs):10.0f} {max(xs):8.0f}")


def controller_memory():
    home = tempfile.mkdtemp(prefix="gw-bench-")
    task = os.path.join(home, "t.yaml")
    with open(task, "w") as f:
        f.write("name: idle\nresources:\n  infra: local\nrun: sleep 600\n")
    for _ in range(JOBS):
        gw(home, "jobs", "launch", task, "-d")
    deadline = time.time() + 300
    while time.time() < deadline:
        jobs = json.loads(gw(home, "jobs", "queue", "-o", "json").stdout)["jobs"]
        if sum(1 for j in jobs if j["state"] == "RUNNING") == JOBS:
            break
        time.sleep(0.5)
    pid = int(open(os.path.join(home, "locks/controller.lock")).read().strip())
    time.sleep(3)

    t0, c0 = time.time(), benchlib.cpu_ticks(pid)
    time.sleep(5)
    t1, c1 = time.time(), benchlib.cpu_ticks(pid)
    st = benchlib.proc_status(pid)
    hz = os.sysconf("SC_CLK_TCK")
    print(f"\ncontroller watching {JOBS} running managed jobs (pid {pid})")
    print(f"  VmRSS {st['VmRSS']}, peak VmHWM {st['VmHWM']}")
    print(f"  CPU: {(c1 - c0) / hz / (t1 - t0) * 100:.1f}% of one core")
    t = time.time()
    gw(home, "jobs", "cancel", "--all")
    print(f"  cancelling all {JOBS}: {time.time() - t:.1f} s")
    shutil.rmtree(home, ignore_errors=True)


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: run `cargo build --release` first")
    print(f"binary: {BIN}")
    only = os.environ.get("ONLY")
    if only in (None, "recovery"):
        recovery()
    if only in (None, "memory"):
        controller_memory()


if __name__ == "__main__":
    main()
