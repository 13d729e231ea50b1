#!/usr/bin/env python3
"""Managed jobs with the controller on an SSH host (`jobs.controller`)
against the controller on this machine, in one run.

Usage: python3 bench/hosted.py [path/to/gangway]   (default target/release/gangway)

Starts a throwaway sshd on 127.0.60.1 (sessions get a home of their own:
the host's ~/.gangway-controller), points a laptop-side GANGWAY_HOME at it,
and a second GANGWAY_HOME runs the controller locally. In each: submits
JOBS managed jobs (default 100) of one local node running `sleep`, then
measures
- `gangway jobs queue -o json` with every job listed, REPEAT times (warm:
  the SSH master connection is open), median and p90; beside it `ssh HOST
  true` over the same master (the floor: one round trip);
- submit-to-RUNNING: `jobs launch -d` of one more job until `jobs queue`
  says RUNNING (polled every 50 ms), SUBMITS times, median.

Target (issue 19): hosted `jobs queue` with 100 jobs at most 100 ms.
Build first: cargo build --release --no-default-features (the local
provider is all it uses). Needs root and /usr/sbin/sshd.
"""
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway"))
JOBS = int(os.environ.get("JOBS", "100"))
REPEAT = int(os.environ.get("REPEAT", "30"))
SUBMITS = int(os.environ.get("SUBMITS", "5"))
ADDR = "127.0.60.1"

TASK = """name: hosted-bench
resources:
  infra: local
  cpus: 4
config:
  local:
    capacity: 100000
run: sleep 900
"""


def free_port():
    s = socket.socket()
    s.bind((ADDR, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def queue(home):
    p = benchlib.gw(BIN, home, "jobs", "queue", "-o", "json")
    return json.loads(p.stdout)["jobs"]


def submit_to_running(home, task):
    t = time.perf_counter()
    p = benchlib.gw(BIN, home, "jobs", "launch", task, "-y", "-d", "-o", "json")
    job = json.loads(p.stdout)["job_id"]
    while True:
        if any(j["id"] == job and j["state"] == "RUNNING" for j in queue(home)):
            return time.perf_counter() - t
        time.sleep(0.05)


def fmt(xs):
    xs = sorted(xs)
    return f"median {statistics.median(xs) * 1000:.1f} ms, p90 {xs[min(len(xs) - 1, math.ceil(0.9 * len(xs)) - 1)] * 1000:.1f} ms"


def measure(label, home, task, floor=None):
    for _ in range(JOBS):
        benchlib.gw(BIN, home, "jobs", "launch", task, "-y", "-d")
    deadline = time.time() + 300
    while sum(j["state"] == "RUNNING" for j in queue(home)) < JOBS:
        if time.time() > deadline:
            states = {}
            for j in queue(home):
                states[j["state"]] = states.get(j["state"], 0) + 1
            sys.exit(f"{label}: the {JOBS} jobs did not all reach RUNNING in 300 s: {states}")
        time.sleep(0.5)
    assert len(queue(home)) == JOBS
    q = [timed(lambda: queue(home)) for _ in range(REPEAT)]
    print(f"{label}: jobs queue -o json with {JOBS} jobs: {fmt(q)}")
    if floor:
        f = [timed(floor) for _ in range(REPEAT)]
        print(f"{label}: ssh HOST true over the same master connection: {fmt(f)}")
    s = [submit_to_running(home, task) for _ in range(SUBMITS)]
    print(f"{label}: submit-to-RUNNING (launch -d, then queue every 50 ms): {fmt(s)}")
    benchlib.gw(BIN, home, "jobs", "cancel", "--all", check=False)


def main():
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"):
        sys.exit("needs root and /usr/sbin/sshd (see .ci/run)")
    if not os.path.exists(BIN):
        sys.exit(f"{BIN}: build it first (cargo build --release --no-default-features)")
    d = tempfile.mkdtemp(prefix="gw-hosted-bench-")
    host_home = os.path.join(d, "host-home")
    os.makedirs(host_home)
    os.makedirs("/run/sshd", exist_ok=True)
    for k in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/{k}"], check=True)
    shutil.copy(f"{d}/client.pub", f"{d}/authorized_keys")
    port = free_port()
    cfg = f"{d}/sshd_config"
    with open(cfg, "w") as f:
        benchlib.write_sshd_config(f, [f"{ADDR}:{port}"], d, f"{d}/sshd.pid", f"{d}/authorized_keys",
                                   host_home, 'cd "$HOME" || exit 1; eval "$SSH_ORIGINAL_COMMAND"')
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", cfg], stderr=open(f"{d}/sshd.log", "w"))
    laptop = os.path.join(d, "laptop")
    local = os.path.join(d, "local")
    try:
        deadline = time.time() + 10
        while True:
            try:
                socket.create_connection((ADDR, port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit(f"sshd did not come up: see {d}/sshd.log")
                time.sleep(0.05)
        for h in (laptop, local):
            os.makedirs(h)
        with open(os.path.join(laptop, "config.yaml"), "w") as f:
            f.write(f"jobs:\n  controller: {{host: {ADDR}, port: {port}, user: root, "
                    f"identity_file: {d}/client}}\n")
        task = os.path.join(d, "task.yaml")
        with open(task, "w") as f:
            f.write(TASK)
        # The first command installs the binary on the host.
        t = timed(lambda: benchlib.gw(BIN, laptop, "jobs", "queue"))
        size = os.path.getsize(BIN) / 1e6
        print(f"first command (installs the {size:.0f} MB binary on the host): {t * 1000:.0f} ms")
        ctl = os.path.join(laptop, "ssh/ctl")
        sock = os.path.join(ctl, os.listdir(ctl)[0])
        floor = lambda: subprocess.run(["ssh", "-S", sock, "-o", "BatchMode=yes", "x", "true"], check=True)
        measure(f"hosted ({ADDR}:{port})", laptop, task, floor)
        measure("local controller", local, task)
    finally:
        env_home = [os.path.join(host_home, ".gangway-controller/home"), laptop, local]
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if any(e == f"GANGWAY_HOME={h}".encode() for h in env_home for e in env):
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
        sshd.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
