#!/usr/bin/env python3
"""AWS code-path figures for the gangway binary against the EC2 emulator.

Usage: python3 bench/aws.py [path/to/gangway]   (default target/release/gangway)

Starts tests/emulators/ec2/server.py (moto plus gangway's layer) from the
venv that tests/emulators/ec2/setup.sh makes, then, each in a fresh
GANGWAY_HOME:

1. `gangway launch --provision-only -y` of an N-node p4d spot cluster (N =
   1, 4, 16, 64): the whole process, which includes planning, the security
   group, key pair, placement group, AMI lookup, one RunInstances and the
   polls until every node runs, and `gangway down -y` of it (terminate, wait,
   delete the group, placement group and key pair).
2. `gangway check aws` and `gangway down --orphans -y` (a sweep of every
   region the emulator lists).

moto answers on loopback in milliseconds, so these are gangway's own costs
plus moto's, not a cloud's: EC2 itself takes minutes to boot a p4d. They
say how much of a launch is ours. Build first: cargo build --release.
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
TRIALS = int(os.environ.get("TRIALS", "5"))
SIZES = [int(n) for n in os.environ.get("SIZES", "1,4,16,64").split(",")]

TASK = """name: bench
num_nodes: {n}
resources:
  infra: aws/us-east-1
  accelerators: A100:8
  use_spot: true
run: "true"
config:
  aws:
    ami_name: 'Deep Learning AMI Ubuntu*'
    ami_owner: '898082745236'
    poll_ms: 50
"""


def start_emulator():
    py = subprocess.run(
        [os.path.join(ROOT, "tests/emulators/ec2/setup.sh")],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    proc = subprocess.Popen(
        [py, os.path.join(ROOT, "tests/emulators/ec2/server.py"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        sys.exit(f"emulator did not start: {line!r}")
    return proc, line.split()[1]


def run(env, *args):
    t = time.perf_counter()
    out = subprocess.run([BIN, *args], env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    if out.returncode != 0:
        sys.exit(f"gangway {' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
    return took


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: cargo build --release first")
    proc, endpoint = start_emulator()
    base = dict(
        os.environ,
        AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1",
        AWS_MAX_ATTEMPTS="1", AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        GANGWAY_AWS_SSH_CIDR="198.51.100.0/24", USER="bench-aws",
    )
    try:
        print(f"gangway {BIN} against {endpoint}; median of {TRIALS} trials")
        for n in SIZES:
            ups, downs = [], []
            for t in range(TRIALS):
                home = tempfile.mkdtemp(prefix="gw-bench-aws-")
                env = dict(base, GANGWAY_HOME=home)
                task = os.path.join(home, "t.yaml")
                with open(task, "w") as f:
                    f.write(TASK.format(n=n))
                name = f"b{n}-{t}"
                ups.append(run(env, "launch", "--provision-only", "-y", "-c", name, task))
                downs.append(run(env, "down", "-y", name))
                shutil.rmtree(home)
            print(
                f"{n:3d} nodes: launch --provision-only {statistics.median(ups) * 1000:7.0f} ms"
                f"  (min {min(ups) * 1000:.0f}), down {statistics.median(downs) * 1000:6.0f} ms"
            )
        home = tempfile.mkdtemp(prefix="gw-bench-aws-")
        env = dict(base, GANGWAY_HOME=home)
        checks = [run(env, "check", "aws") for _ in range(TRIALS)]
        sweeps = [run(env, "down", "--orphans", "-y") for _ in range(TRIALS)]
        shutil.rmtree(home)
        print(f"check aws: {statistics.median(checks) * 1000:.0f} ms; "
              f"down --orphans (every region): {statistics.median(sweeps) * 1000:.0f} ms")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
