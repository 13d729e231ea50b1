#!/usr/bin/env python3
"""The managed-job controller at scale, on the embedded local provider.

Usage: python3 bench/controller.py [path/to/gangway]   (default target/release/gangway)

Submits JOBS managed jobs (default 1000) of one local.cpu node each to one
GANGWAY_HOME. A share of them (SPOT_SHARE, default 0.2) runs on spot and
is reclaimed with notice: the local cloud posts the notice NOTICE_AT s
after the cluster's launch and takes the node NOTICE_S s later; each such
run traps the checkpoint signal and writes the notice file's time and the
time it was signalled, then exits 0 to be recovered onto a new node, where
it runs briefly and succeeds. The others sleep RUN_S s and succeed.

Prints:
- how long submitting and getting every job to RUNNING took;
- the controller's CPU (percent of one core) and RSS while every job runs
  and nothing happens ("idle": no notice, no transition);
- notice-to-signal latency over every noticed job (from the notice file's
  modification time on the node to the signal's arrival in the run):
  median, p90, p99, max;
- the controller's peak RSS (VmHWM) over the whole run, and whether every
  job ended SUCCEEDED with nothing left in the local cloud.

Targets (issue 16): RSS at most 50 MB, p99 at most 1 s, idle CPU at most
5 % of a core. Build first: cargo build --release (--no-default-features is
enough: only the local provider is used).
"""
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
JOBS = int(os.environ.get("JOBS", "1000"))
SPOT_SHARE = float(os.environ.get("SPOT_SHARE", "0.2"))
NOTICE_AT = float(os.environ.get("NOTICE_AT", "150"))
NOTICE_S = float(os.environ.get("NOTICE_S", "60"))
RUN_S = float(os.environ.get("RUN_S", "240"))

PLAIN = """name: plain
resources:
  infra: local
  cpus: 4
config:
  local:
    capacity: 100000
run: sleep {run_s}
"""

NOTICED = """name: noticed
resources:
  infra: local
  cpus: 4
  use_spot: true
checkpoint:
  signal: SIGUSR1
  grace_period: 30
config:
  local:
    capacity: 100000
    preemptions:
      - {{after_s: {after}, notice_s: {notice}}}
run: |
  if [ "$GANGWAY_RESTART_COUNT" != 0 ]; then sleep 2; exit 0; fi
  out="{signals}/$GANGWAY_JOB_ID"
  trap 'echo "$(stat -c %.3Y "$GANGWAY_METADATA_DIR/preempted") $(date +%s.%3N)" > "$out"; exit 0' USR1
  # `wait` returns at once when a trapped signal arrives.
  while true; do sleep 3600 & wait $!; done
"""


def gw(home, *args, check=True):
    return benchlib.gw(BIN, home, *args, check=check)


def queue(home):
    return json.loads(gw(home, "jobs", "queue", "-o", "json").stdout)["jobs"]


proc_status = benchlib.proc_status
cpu_ticks = benchlib.cpu_ticks


def kib(text):
    return int(text.split()[0])


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: run `cargo build --release` first")
    home = tempfile.mkdtemp(prefix="gw-ctl-bench-")
    signals = os.path.join(home, "signals")
    os.makedirs(signals)
    plain = os.path.join(home, "plain.yaml")
    noticed = os.path.join(home, "noticed.yaml")
    with open(plain, "w") as f:
        f.write(PLAIN.format(run_s=RUN_S))
    with open(noticed, "w") as f:
        f.write(NOTICED.format(after=NOTICE_AT + NOTICE_S, notice=NOTICE_S, signals=signals))
    spot_every = max(1, round(1 / SPOT_SHARE)) if SPOT_SHARE > 0 else 0
    spot_ids = set()
    print(f"binary: {BIN}")
    print(f"{JOBS} managed jobs, every {spot_every}th on spot with {NOTICE_S:.0f} s of notice "
          f"{NOTICE_AT:.0f} s after launch; the others run {RUN_S:.0f} s")
    t0 = time.time()
    pid = None
    peak = 0
    for i in range(1, JOBS + 1):
        spot = spot_every and i % spot_every == 0
        out = gw(home, "jobs", "launch", noticed if spot else plain, "-d", "-o", "json").stdout
        if spot:
            spot_ids.add(json.loads(out)["job_id"])
        if pid is None:
            try:
                pid = int(open(os.path.join(home, "locks/controller.lock")).read().strip())
            except (OSError, ValueError):
                pass
    submitted = time.time() - t0
    print(f"submitted in {submitted:.1f} s (one `gangway jobs launch -d` process per job)")
    while pid is None:
        pid = int(open(os.path.join(home, "locks/controller.lock")).read().strip())

    def sample():
        nonlocal peak
        try:
            peak = max(peak, kib(proc_status(pid)["VmHWM"]))
        except OSError:
            pass

    deadline = time.time() + 900
    while time.time() < deadline:
        jobs = queue(home)
        running = sum(1 for j in jobs if j["state"] == "RUNNING")
        sample()
        if running == JOBS:
            break
        time.sleep(1)
    else:
        sys.exit(f"only {running} of {JOBS} running after 900 s")
    all_running = time.time() - t0
    print(f"all {JOBS} RUNNING {all_running:.1f} s after the first submission")
    first_notice = t0 + NOTICE_AT
    window = min(10.0, first_notice - time.time() - 5)
    if window < 3:
        print(f"  (idle window too short: {window:.1f} s before the first notice; raise NOTICE_AT)")
    else:
        time.sleep(2)
        hz = os.sysconf("SC_CLK_TCK")
        t1, c1 = time.time(), cpu_ticks(pid)
        time.sleep(window)
        t2, c2 = time.time(), cpu_ticks(pid)
        st = proc_status(pid)
        print(f"controller watching {JOBS} running jobs, nothing happening, {window:.0f} s:")
        print(f"  CPU {(c2 - c1) / hz / (t2 - t1) * 100:.1f}% of one core, "
              f"VmRSS {kib(st['VmRSS']) / 1024:.1f} MiB")
    # Notices, recoveries, the end.
    deadline = time.time() + NOTICE_AT + NOTICE_S + RUN_S + 300
    while time.time() < deadline:
        jobs = queue(home)
        sample()
        if all(j["state"] in ("SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_NO_RESOURCE",
                              "CANCELLED") for j in jobs):
            break
        time.sleep(2)
    ended = time.time() - t0
    latencies = []
    missing = []
    for jid in sorted(spot_ids):
        try:
            notice, got = open(os.path.join(signals, str(jid))).read().split()
            latencies.append((float(got) - float(notice)) * 1000)
        except (OSError, ValueError):
            missing.append(jid)
    states = {}
    for j in queue(home):
        states[j["state"]] = states.get(j["state"], 0) + 1
    print(f"every job ended {ended:.0f} s after the first submission: {states}")
    for j in queue(home):
        if j["state"] != "SUCCEEDED":
            print(f"  job {j['id']} {j['state']}: {j.get('detail')}")
    if latencies:
        print(f"notice -> signal over {len(latencies)} noticed jobs: "
              f"median {statistics.median(latencies):.0f} ms, p90 {pct(latencies, 0.9):.0f} ms, "
              f"p99 {pct(latencies, 0.99):.0f} ms, max {max(latencies):.0f} ms")
    if missing:
        print(f"  {len(missing)} noticed job(s) recorded no signal: {missing[:10]}")
    print(f"controller peak RSS (VmHWM): {peak / 1024:.1f} MiB")
    left = []
    inst = os.path.join(home, "local", "instances")
    for d in os.listdir(inst) if os.path.isdir(inst) else []:
        left.extend(os.listdir(os.path.join(inst, d)))
    print(f"instances left in the local cloud: {len(left)}")
    gw(home, "jobs", "cancel", "--all", check=False)
    if os.environ.get("KEEP"):
        print(f"kept {home}")
    else:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
