#!/usr/bin/env python3
"""AWS end to end on the EC2 emulator, with instances that are real sshd
addresses (tests/emulators/ec2/machines.py): how long gangway takes.

Usage (as root, with openssh-server installed, e.g. by .ci/run):
    python3 bench/aws_e2e.py [path/to/gangway]   (default target/release/gangway)

Needs the emulator's venv: GANGWAY_TEST_PYTHON, else target/ec2-venv/bin/python
(tests/emulators/ec2/setup.sh makes it). Port 22 must be free on
127.0.60.* and 127.0.61.* (where the "instances" listen, as a node's sshd).

1. `gangway launch` of a 16-node spot p4d gang (default AMI lookup, security
   group, key pair, placement group, RunInstances, polls, first SSH contact
   with every node, setup, the run started on every rank): from the command's
   start to its `all 16 rank(s) running` line. TRIALS fresh homes, each torn
   down after.
2. A 2-node managed spot job interrupted, with notice (EC2 posts it in the
   instance's metadata; the job checkpoints on it) and without (the
   instance is just terminated): from the interruption to the run resumed
   on the new cluster (its RUNNING event), minus the provisioning of the
   new cluster (RECOVERING to STARTING), with the parts in between.

The instances are loopback addresses of this machine and moto answers in
milliseconds, so these are gangway's own costs plus SSH on loopback, not a
cloud's: EC2 takes minutes to boot a p4d, and an SSH handshake across a
network takes round trips this does not.
"""
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from benchlib import write_sshd_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
TRIALS = int(os.environ.get("TRIALS", "3"))
NODES = 16
SCOPE = "AKBENCHE2E"
BLOCKS = ("127.0.60", "127.0.61")


def emulator_python():
    p = os.environ.get("GANGWAY_TEST_PYTHON") or os.path.join(ROOT, "target/ec2-venv/bin/python")
    if not os.path.exists(p):
        sys.exit("no venv for the EC2 emulator: run tests/emulators/ec2/setup.sh or set GANGWAY_TEST_PYTHON")
    return p


def sshd_version():
    out = subprocess.run(["/usr/sbin/sshd", "-V"], capture_output=True, text=True)
    text = out.stderr + out.stdout
    try:
        v = text.split("OpenSSH_", 1)[1]
        major, minor = v.split(".", 1)[0], v.split(".", 1)[1][:1]
        return int(major), int(minor)
    except (IndexError, ValueError):
        return (0, 0)


def start_sshd(d, block, keys):
    """One sshd on port 22 of block.1 .. block.NODES, sessions in a clean
    HOME, sourcing `d/profile.sh` (where the instance's metadata is)."""
    os.makedirs(f"{d}/home", exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/host"], check=True)
    cfg = f"{d}/sshd_config"
    with open(cfg, "w") as f:
        write_sshd_config(
            f, [f"{block}.{i}:22" for i in range(1, NODES + 1)], d, f"{d}/sshd.pid", keys,
            f"{d}/home",
            f'cd "$HOME" || exit 1; . {d}/profile.sh; if [ -z "$SSH_ORIGINAL_COMMAND" ]; '
            'then exec "$SHELL" -l; fi; eval "$SSH_ORIGINAL_COMMAND"')
        if sshd_version() >= (9, 8):
            f.write("PerSourcePenalties no\n")
        for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server"):
            if os.path.exists(p):
                f.write(f"Subsystem sftp {p}\n")
                break
    server = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", cfg],
                              stderr=open(f"{d}/sshd.log", "w"))
    deadline = time.time() + 10
    for i in range(1, NODES + 1):
        while True:
            try:
                socket.create_connection((f"{block}.{i}", 22), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    sys.exit(f"sshd did not come up on {block}.{i}:22: see {d}/sshd.log")
                time.sleep(0.05)
    return server


def start_emulator():
    """The EC2 emulator on a free port: (its process, its endpoint)."""
    emu = subprocess.Popen([emulator_python(), os.path.join(ROOT, "tests/emulators/ec2/server.py"),
                            "--host", "127.0.0.1", "--port", "0", "--watch-stdin",
                            "--warm-regions", "us-east-1"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
    line = emu.stdout.readline().strip()
    if not line.startswith("READY "):
        emu.kill()
        sys.exit(f"the EC2 emulator said {line!r}")
    return emu, line.split(" ", 1)[1]


def control(endpoint, method, path, body=None):
    req = urllib.request.Request(endpoint + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def use_block(endpoint, block, keys):
    pairs = [[f"{block}.{i}", f"127.1.{block.rsplit('.', 1)[1]}.{i}"] for i in range(1, NODES + 1)]
    return control(endpoint, "POST", "/_gangway/machines",
                   {"scope": SCOPE, "addresses": pairs, "authorized_keys": keys})["imds_port"]


def env_for(endpoint, home):
    env = dict(os.environ, GANGWAY_HOME=home, AWS_ENDPOINT_URL_EC2=endpoint, AWS_ENDPOINT_URL=endpoint,
               AWS_ACCESS_KEY_ID=SCOPE, AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
               AWS_MAX_ATTEMPTS="1", AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE="/dev/null",
               AWS_SHARED_CREDENTIALS_FILE="/dev/null", GANGWAY_AWS_SSH_CIDR="127.0.0.0/8")
    env.pop("GANGWAY_CATALOG_DIR", None)
    env.pop("RUST_LOG", None)
    # BENCH_RUST_LOG: gangway's own log filter for these runs (e.g.
    # gangway=debug: the driver's step times in each job's driver.log).
    if os.environ.get("BENCH_RUST_LOG"):
        env["RUST_LOG"] = os.environ["BENCH_RUST_LOG"]
    return env


def gw(env, *args, check=True):
    p = subprocess.run([BIN, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"gangway {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


GANG = """num_nodes: {n}
resources:
  infra: aws/us-east-1
  accelerators: A100:8
  use_spot: true
config:
  aws:
    ssh_user: root
setup: echo ready > setup-done
run: echo "rank $GANGWAY_NODE_RANK of $GANGWAY_NUM_NODES"
"""

JOB = """num_nodes: 2
resources:
  infra: aws/us-east-1
  accelerators: A100:8
  use_spot: true
  job_recovery:
    strategy: FAILOVER
checkpoint:
  sync_interval: 1
  signal: SIGTERM
  grace_period: 30
config:
  aws:
    ssh_user: root
run: |
  if [ "$GANGWAY_RESTART_COUNT" = 0 ]; then
    echo 1 > "$GANGWAY_CHECKPOINT_DIR/step"
    [ "$GANGWAY_NODE_RANK" = 0 ] && touch {ready}
    trap 'exit 0' TERM
    while :; do sleep 0.1; done
  fi
  echo "resumed at step $(cat "$GANGWAY_CHECKPOINT_DIR/step")"
  sleep 2  # long enough for the controller to see every rank running
"""


def launch_trial(endpoint, work, trial):
    home = tempfile.mkdtemp(prefix="home-", dir=work)
    env = env_for(endpoint, home)
    task = os.path.join(home, "gang.yaml")
    with open(task, "w") as f:
        f.write(GANG.format(n=NODES))
    start = time.perf_counter()
    p = subprocess.Popen([BIN, "launch", task, "-c", f"bench{trial}", "-y"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    running = None
    lines = []
    for line in p.stdout:
        lines.append(line)
        if running is None and f"all {NODES} rank(s) running" in line:
            running = time.perf_counter() - start
    rc = p.wait()
    if rc != 0 or running is None:
        sys.exit(f"launch exited {rc}:\n{''.join(lines)}")
    gw(env, "down", "-y", f"bench{trial}")
    return running


def recovery_trial(endpoint, work, keys, notice):
    use_block(endpoint, BLOCKS[0], keys)
    home = tempfile.mkdtemp(prefix="job-", dir=work)
    env = env_for(endpoint, home)
    ready = os.path.join(home, "ready")
    task = os.path.join(home, "job.yaml")
    with open(task, "w") as f:
        f.write(JOB.format(ready=ready))
    job = subprocess.Popen([BIN, "jobs", "launch", task, "-y", "--wait"], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(job.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 120
    while not os.path.exists(ready):
        if time.time() > deadline or job.poll() is not None:
            job.kill()
            sys.exit(f"the job did not start:\n{''.join(out)}")
        time.sleep(0.05)
    placed = control(endpoint, "GET", f"/_gangway/machines?scope={SCOPE}")["instances"]
    live = [i["instance_id"] for i in placed if i["state"] == "running"]
    if len(live) != 2:
        sys.exit(f"expected the job's 2 instances running, found {placed}")
    victim = sorted(live)[-1]
    use_block(endpoint, BLOCKS[1], keys)
    spec = {"instance_id": victim, "region": "us-east-1"}
    if notice:
        spec["notice_seconds"] = 60
    t0 = time.time()
    control(endpoint, "POST", "/_gangway/interrupt", spec)
    if job.wait(timeout=180) != 0:
        reader.join(5)
        sys.exit(f"the job failed:\n{''.join(out)}")
    reader.join(5)
    evs = json.loads(gw(env, "jobs", "events", "1", "-o", "json").stdout)["events"]

    def at(state, after=0.0, contains=""):
        for e in evs:
            if e["state"] == state and e["at"] / 1000 >= after and contains in e["reason"]:
                return e["at"] / 1000
        sys.exit(f"no {state} event after the interruption: {evs}")

    seen = at("NOTICE" if notice else "PREEMPTED", t0 - 1)
    recovering = at("RECOVERING", t0 - 1)
    up = at("STARTING", recovering, "cluster up")
    resumed = at("RUNNING", up)
    # Nothing left of either cluster before the next trial.
    deadline = time.time() + 120
    while any(i["state"] != "terminated"
              for i in control(endpoint, "GET", f"/_gangway/machines?scope={SCOPE}")["instances"]):
        if time.time() > deadline:
            sys.exit("the job's instances are still there 120 s after it ended")
        time.sleep(0.1)
    return {
        "seen": seen - t0,
        "to_recovering": recovering - seen,
        "provisioning": up - recovering,
        "start": resumed - up,
        "total_minus_provisioning": (resumed - t0) - (up - recovering),
    }


def main():
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"):
        sys.exit("needs root and /usr/sbin/sshd (see .ci/run)")
    if not os.path.exists(BIN):
        sys.exit(f"no gangway binary at {BIN}: cargo build --release, or name one")
    os.makedirs("/run/sshd", exist_ok=True)
    work = tempfile.mkdtemp(prefix="gw-aws-e2e-bench-")
    keys = os.path.join(work, "authorized_keys")
    open(keys, "w").close()
    procs = []
    try:
        emu, endpoint = start_emulator()
        procs.append(emu)
        sshds = []
        for block in BLOCKS:
            d = os.path.join(work, block)
            os.makedirs(d)
            sshds.append((d, start_sshd(d, block, keys)))
            procs.append(sshds[-1][1])
        port = use_block(endpoint, BLOCKS[1], keys)
        port = use_block(endpoint, BLOCKS[0], keys)
        for d, _ in sshds:
            with open(f"{d}/profile.sh", "w") as f:
                f.write(f'set -- $SSH_CONNECTION; export GANGWAY_IMDS_ENDPOINT="http://$3:{port}"; set --\n')

        print(f"gangway: {BIN}")
        times = [launch_trial(endpoint, work, t) for t in range(TRIALS)]
        print(f"launch of {NODES} spot nodes to all ranks running (SSH first contact, setup included), "
              f"{TRIALS} trials: median {statistics.median(times):.2f} s, "
              f"min {min(times):.2f} s, max {max(times):.2f} s")
        for notice in (True, False):
            runs = [recovery_trial(endpoint, work, keys, notice) for _ in range(TRIALS)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            what = "with notice" if notice else "without notice"
            print(f"2-node managed job, interruption {what}, {TRIALS} trials (medians): "
                  f"interruption to run resumed minus provisioning {med['total_minus_provisioning']:.2f} s "
                  f"(max {max(r['total_minus_provisioning'] for r in runs):.2f} s); parts: "
                  f"{'notice' if notice else 'loss'} seen {med['seen']:.2f} s, "
                  f"{'checkpoint + ' if notice else ''}teardown to RECOVERING {med['to_recovering']:.2f} s, "
                  f"[provisioning {med['provisioning']:.2f} s], setup + start {med['start']:.2f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
