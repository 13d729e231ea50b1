#!/usr/bin/env python3
"""How close is the spot-risk estimate to a replay of real preemptions?

For each 1-node preemption trace in ../shared/traces/preemption whose
instance type gangway knows (p3.2xlarge, the `*_v100_1` AWS traces; the
GCP c3-88 traces, which get the default bucket), replays a job of
JOB_HOURS of work with `gangway sim --policy greedy` (spot whenever the
trace has it, otherwise wait unbilled; a preemption costs the restart,
checkpoints keep all work) from START_EVERY-hour steps through the trace,
at a spot price of 1, so the simulated cost per hour of work is the
multiplier interruptions put on the price. Compares it with the estimate
`resources.spot_risk: expected_cost` uses: 1 / (1 - rate x restart), rate
from the offer's advisor bucket (src/core/catalog/risk.rs HOURLY_RATE), no
checkpoint loss (the simulator keeps all work).

Two sets of traces, reported apart:
  - calibration: the preemption traces (April 2023), the ones the top
    bucket's rate (0.5/h) was set from: in-sample;
  - held out: the 1-node p3.2xlarge availability traces
    (../shared/traces/availability/1-node/*/*_v100_1.json: Oct-Dec 2022 and
    Feb-Apr 2023, 2 and 9 zones, 27 and 45 days), never used to set a rate.
    Running spot while a zone has capacity and losing it when capacity
    drops is the same replay.

Usage: python3 bench/spot_risk.py [path/to/gangway]
Environment: JOB_HOURS (default 10), RESTART_HOURS (default 0.05),
START_EVERY (default 12).
"""
import csv
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
SHARED = os.path.join(os.path.dirname(ROOT), "shared/traces")
SETS = [
    ("calibration (in-sample)", os.path.join(SHARED, "preemption/1-node"), "*.json"),
    ("held out", os.path.join(SHARED, "availability/1-node"), "*_v100_1.json"),
]
JOB = float(os.environ.get("JOB_HOURS", "10"))
RESTART = float(os.environ.get("RESTART_HOURS", "0.05"))
STEP = float(os.environ.get("START_EVERY", "12"))
# Must match HOURLY_RATE and DEFAULT_BUCKET in src/core/catalog/risk.rs.
HOURLY_RATE = [0.042, 0.125, 0.208, 0.292, 0.5]
DEFAULT_BUCKET = 2
LABELS = ["<5%", "5-10%", "10-15%", "15-20%", ">20%"]


def buckets():
    path = os.path.join(ROOT, "src/core/catalog/data/aws-interruption.csv")
    rows = csv.reader(line for line in open(path) if not line.startswith("#"))
    next(rows)
    return {(r[0], r[1]): int(r[2]) for r in rows}


def offer(path):
    """(cloud, region, type) of a trace, or None when its type is unknown."""
    cloud = os.path.basename(os.path.dirname(path)).split("-")[0]
    zone = os.path.basename(path).split("_")[0]
    if cloud == "aws" and path.endswith("_v100_1.json"):
        return cloud, zone[:-1], "p3.2xlarge"
    if cloud == "gcp" and path.endswith("_c3-88.json"):
        return cloud, zone.rsplit("-", 1)[0], "c3-highcpu-88"
    return None


def trace_rate(path):
    d = json.load(open(path))
    x, gap = d["data"], d["metadata"]["gap_seconds"]
    up = sum(1 for v in x if v > 0) * gap / 3600
    drops = sum(1 for a, b in zip(x, x[1:]) if a > 0 and b == 0)
    return drops / up if up else 0.0, len(x) * gap / 3600


def sim(path, start, home):
    p = subprocess.run(
        [BIN, "sim", path, "--job-hours", str(JOB), "--deadline-hours", "100000",
         "--policy", "greedy", "--spot-price", "1", "--restart-hours", str(RESTART),
         "--start-hour", str(start), "-o", "json"],
        cwd=ROOT, env=dict(os.environ, GANGWAY_HOME=home), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"gangway sim {path} exited {p.returncode}: {p.stderr}")
    r = json.loads(p.stdout)["results"][0]
    if r.get("ran_past_trace_end") or r["finish_hours"] is None:
        return None
    return r["cost"] / JOB


def replay(title, root, pattern, table, home):
    print(f"-- {title}: {os.path.relpath(root, SHARED)}")
    print(f"{'trace':45} {'bucket':>8} {'est. x':>7} {'sim x (median, n)':>19} {'error':>7} {'trace rate/h':>12}")
    errors = []
    for path in sorted(glob.glob(os.path.join(root, "*", pattern))):
        o = offer(path)
        if o is None:
            continue
        b = table.get((o[1], o[2]), DEFAULT_BUCKET) if o[0] == "aws" else DEFAULT_BUCKET
        default = o[0] != "aws" or (o[1], o[2]) not in table
        est = 1 / (1 - HOURLY_RATE[b] * RESTART)
        rate, hours = trace_rate(path)
        runs = []
        start = 0.0
        while start + JOB < hours:
            m = sim(path, start, home)
            if m is not None:
                runs.append(m)
            start += STEP
        if not runs:
            continue
        med = statistics.median(runs)
        err = (est - med) / med
        errors.append(abs(err))
        name = os.path.relpath(path, root)
        label = LABELS[b] + ("?" if default else "")
        print(f"{name:45} {label:>8} {est:7.4f} {med:12.4f} ({len(runs):3}) {err:+7.1%} {rate:12.3f}")
    if errors:
        print(f"{title}: median |error| of the expected-cost multiplier {statistics.median(errors):.1%}, "
              f"max {max(errors):.1%} over {len(errors)} traces")


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: run `cargo build --release` first")
    table = buckets()
    print(f"job {JOB} h of work, restart {RESTART} h, starts every {STEP} h, greedy, spot price 1")
    with tempfile.TemporaryDirectory() as home:
        for title, root, pattern in SETS:
            if not os.path.isdir(root):
                print(f"SKIPPED spot_risk {title}: {root} is not there")
                continue
            replay(title, root, pattern, table, home)


if __name__ == "__main__":
    main()
