#!/usr/bin/env python3
"""Slurm figures for the gangway binary, against a throwaway Slurm cluster
on this machine (tests/emulators/slurm/start.sh: munged, slurmctld, four
slurmd; needs root and Debian's slurm-wlm + munge).

Usage: python3 bench/slurm.py [path/to/gangway]   (default target/release/gangway)

Per trial, a fresh GANGWAY_HOME:
1. `gangway launch` of a 4-node task whose run is `true` (attached, to the
   job's end): the whole process, and its split into the allocation
   (sbatch → RUNNING, Slurm's scheduler included) and the gang (steps
   started on every node → run done).
2. `gangway down` (scancel, then wait until Slurm holds nothing).
3. For scale, Slurm alone on the same cluster: `sbatch --wait -N4 --wrap
   'srun true'` (submit → batch job with one 4-node step → done).

Build first: cargo build --release.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
TRIALS = int(os.environ.get("TRIALS", "7"))
HARNESS = os.path.join(ROOT, "tests/emulators/slurm")

TASK = """name: bench4
num_nodes: 4
resources:
  accelerators: A100:1
run: "true"
"""


def main():
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/slurmctld"):
        print("SKIPPED: needs root and Slurm (tests/emulators/slurm/install.sh)")
        return
    d = "/tmp/gwsl-bench-%d" % os.getpid()
    os.makedirs(d, exist_ok=True)
    start = subprocess.run([os.path.join(HARNESS, "start.sh"), d, "4"], capture_output=True, text=True)
    if start.returncode != 0:
        sys.exit("start.sh failed:\n" + start.stdout + start.stderr)
    env = dict(os.environ, SLURM_CONF=os.path.join(d, "slurm.conf"))
    launch, down, alloc, gang, plain = [], [], [], [], []
    try:
        for _ in range(TRIALS):
            home = tempfile.mkdtemp(prefix="gw-slurm-bench-")
            with open(os.path.join(home, "slurm.yaml"), "w") as f:
                f.write(
                    "clusters:\n  b:\n    conf: %s\n    work_dir: %s/nodes\n    partitions:\n"
                    "      gpu:\n        gpus: A100:2\n        gres: fake\n" % (env["SLURM_CONF"], home)
                )
            with open(os.path.join(home, "t.yaml"), "w") as f:
                f.write(TASK)
            genv = dict(env, GANGWAY_HOME=home)
            t0 = time.monotonic()
            p = subprocess.Popen(
                [BIN, "launch", os.path.join(home, "t.yaml"), "--infra", "slurm/b", "-c", "b4", "-y"],
                env=genv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            up = None
            out = []
            for line in p.stdout:
                out.append(line)
                if up is None and "is up:" in line:
                    up = time.monotonic()
            p.wait()
            t1 = time.monotonic()
            if p.returncode != 0 or up is None:
                sys.exit("launch failed:\n" + "".join(out))
            launch.append(t1 - t0)
            alloc.append(up - t0)
            gang.append(t1 - up)
            t2 = time.monotonic()
            subprocess.run([BIN, "down", "-y", "b4"], env=genv, check=True, capture_output=True)
            down.append(time.monotonic() - t2)
            shutil.rmtree(home, ignore_errors=True)
            t3 = time.monotonic()
            subprocess.run(
                ["sbatch", "--wait", "--quiet", "-N4", "--output=/dev/null", "--wrap", "srun true"],
                env=env, check=True,
            )
            plain.append(time.monotonic() - t3)
    finally:
        subprocess.run([os.path.join(HARNESS, "stop.sh"), d], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)

    def ms(xs):
        return "median %7.0f ms  (min %.0f, max %.0f; %d trials)" % (
            statistics.median(xs) * 1000, min(xs) * 1000, max(xs) * 1000, len(xs))

    print("Slurm 4-node cluster on one host (tests/emulators/slurm); run `true`")
    print("gangway launch, whole process:          ", ms(launch))
    print("  of which: allocation up (sbatch..RUNNING):", ms(alloc))
    print("  of which: gang (steps on 4 nodes, run):   ", ms(gang))
    print("gangway down (scancel, wait until gone):", ms(down))
    print("sbatch --wait -N4 --wrap 'srun true':   ", ms(plain))


if __name__ == "__main__":
    main()
