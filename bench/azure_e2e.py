#!/usr/bin/env python3
"""Azure end to end on the Azure Resource Manager fake, with VMs that are
real sshd addresses (tests/emulators/azure/machines.py): how long gangway
takes.

Usage (as root, with openssh-server installed, e.g. by .ci/run):
    python3 bench/azure_e2e.py [path/to/gangway]   (default target/release/gangway)

Needs the fake's schema file (tests/emulators/azure/setup.sh writes it):
GANGWAY_TEST_AZURE_SCHEMA, else target/azure-venv/arm-schema.json. Port 22
must be free on 127.0.60.* and 127.0.61.* (where the VMs listen, as a
node's sshd). The fake answers every long-running operation after one poll
with no wait (`--op-polls 1 --retry-after 0`), as the tests run it.

1. `gangway launch` of a 16-node spot gang of Standard_ND96amsr_A100_v4 in
   eastus (resource group, security group, network, proximity placement
   group, 16 public addresses, NICs and VMs, each through its long-running
   operation, first SSH contact with every node, setup, the run started on
   every rank): from the command's start to its `all 16 rank(s) running`
   line. TRIALS fresh homes, each torn down after.
2. A 2-node managed spot job (EAGER_NEXT_REGION) evicted, with notice (a
   Preempt event in the VM's Scheduled Events; the job checkpoints on it)
   and without (the VM is just deleted, as eviction policy Delete does):
   from the eviction to the run resumed on the new cluster in westus2 (its
   RUNNING event), minus the provisioning of the new cluster (RECOVERING to
   STARTING), with the parts in between.

The VMs are loopback addresses of this machine and the fake answers in
milliseconds, so these are gangway's own costs (plus the fake's Python and
SSH on loopback), not Azure's: Azure takes minutes to allocate and boot an
ND96amsr, and an SSH handshake across a network takes round trips this
does not.
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from aws_e2e import NODES, start_sshd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
TRIALS = int(os.environ.get("TRIALS", "3"))
SUB = "be0c4000-0000-4000-8000-0000000a2e2e"
BLOCKS = ("127.0.60", "127.0.61")
# The published catalog's price in eastus, and westus2 dearer: the job
# starts in eastus and EAGER_NEXT_REGION moves it to westus2.
CATALOG = """InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,Generation
Standard_ND96amsr_A100_v4,A100-80GB,8,96,1800,A100-80GB,32.77,8.52,eastus,V2
Standard_ND96amsr_A100_v4,A100-80GB,8,96,1800,A100-80GB,32.77,9.10,westus2,V2
"""


def schema():
    p = os.environ.get("GANGWAY_TEST_AZURE_SCHEMA") or os.path.join(ROOT, "target/azure-venv/arm-schema.json")
    if not os.path.isfile(p):
        sys.exit(f"no schema file for the Azure fake at {p} (run tests/emulators/azure/setup.sh)")
    return p


def start_fake():
    """The ARM fake on a free port: (its process, its endpoint)."""
    fake = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests/emulators/azure/server.py"),
                             "--host", "127.0.0.1", "--port", "0", "--watch-stdin",
                             "--op-polls", "1", "--retry-after", "0", "--schema", schema()],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    line = fake.stdout.readline().strip()
    if not line.startswith("READY "):
        fake.kill()
        sys.exit(f"the Azure fake said {line!r}")
    return fake, line.split(" ", 1)[1]


def control(endpoint, method, path, body=None):
    req = urllib.request.Request(endpoint + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def use_block(endpoint, block, keys):
    pairs = [[f"{block}.{i}", f"{block}.{i}"] for i in range(1, NODES + 1)]
    return control(endpoint, "POST", "/_fake/machines",
                   {"subscription": SUB, "addresses": pairs, "authorized_keys": keys})["imds_port"]


def env_for(endpoint, home):
    catalog = os.path.join(home, "catalog-dir")
    os.makedirs(os.path.join(catalog, "azure"), exist_ok=True)
    with open(os.path.join(catalog, "azure", "vms.csv"), "w") as f:
        f.write(CATALOG)
    env = dict(os.environ, GANGWAY_HOME=home, GANGWAY_AZURE_ENDPOINT=endpoint,
               AZURE_SUBSCRIPTION_ID=SUB, AZURE_CONFIG_DIR=os.path.join(home, "no-az"),
               GANGWAY_AZURE_SSH_CIDR="127.0.0.0/8", GANGWAY_CATALOG_DIR=catalog)
    for v in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "RUST_LOG"):
        env.pop(v, None)
    return env


def gw(env, *args, check=True):
    p = subprocess.run([BIN, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"gangway {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


GANG = """num_nodes: {n}
resources:
  infra: azure/eastus
  accelerators: A100-80GB:8
  use_spot: true
config:
  azure:
    ssh_user: root
setup: echo ready > setup-done
run: echo "rank $GANGWAY_NODE_RANK of $GANGWAY_NUM_NODES"
"""

JOB = """num_nodes: 2
resources:
  infra: azure
  accelerators: A100-80GB:8
  use_spot: true
  job_recovery:
    strategy: EAGER_NEXT_REGION
checkpoint:
  sync_interval: 1
  signal: SIGTERM
  grace_period: 30
config:
  azure:
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


def nothing_left(endpoint, within=120):
    deadline = time.time() + within
    while True:
        state = control(endpoint, "GET", "/_fake/state")
        if not state["resource_groups"] and not state["resources"]:
            return
        if time.time() > deadline:
            sys.exit(f"still in the fake {within} s after the end: "
                     f"{[r['id'] for r in state['resources']]}")
        time.sleep(0.1)


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
    nothing_left(endpoint)
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
    held = control(endpoint, "GET", f"/_fake/machines?subscription={SUB}")["held"]
    live = sorted(h["vm"].rsplit("/", 1)[1] for h in held if h["power"] == "running")
    if len(live) != 2:
        sys.exit(f"expected the job's 2 VMs running, found {held}")
    victim = live[-1]
    use_block(endpoint, BLOCKS[1], keys)
    spec = {"vm": victim, "subscription": SUB}
    if notice:
        spec["notice_s"] = 60
    else:
        spec["notice"] = False
    t0 = time.time()
    control(endpoint, "POST", "/_fake/evict", spec)
    if job.wait(timeout=180) != 0:
        reader.join(5)
        sys.exit(f"the job failed:\n{''.join(out)}")
    reader.join(5)
    evs = json.loads(gw(env, "jobs", "events", "1", "-o", "json").stdout)["events"]

    def at(state, after=0.0, contains=""):
        for e in evs:
            if e["state"] == state and e["at"] / 1000 >= after and contains in e["reason"]:
                return e["at"] / 1000
        sys.exit(f"no {state} event after the eviction: {evs}")

    seen = at("NOTICE" if notice else "PREEMPTED", t0 - 1)
    recovering = at("RECOVERING", t0 - 1)
    up = at("STARTING", recovering, "cluster up")
    resumed = at("RUNNING", up)
    nothing_left(endpoint)
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
    work = tempfile.mkdtemp(prefix="gw-azure-e2e-bench-")
    keys = os.path.join(work, "authorized_keys")
    open(keys, "w").close()
    procs = []
    try:
        fake, endpoint = start_fake()
        procs.append(fake)
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
                f.write(f'set -- $SSH_CONNECTION; export GANGWAY_AZURE_IMDS_ENDPOINT="http://$3:{port}"; '
                        'set --\n')

        print(f"gangway: {BIN}")
        times = [launch_trial(endpoint, work, t) for t in range(TRIALS)]
        print(f"launch of {NODES} Azure spot nodes to all ranks running (ARM operations, SSH first "
              f"contact, setup included), {TRIALS} trials: median {statistics.median(times):.2f} s, "
              f"min {min(times):.2f} s, max {max(times):.2f} s")
        for notice in (True, False):
            runs = [recovery_trial(endpoint, work, keys, notice) for _ in range(TRIALS)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            what = "with a Preempt notice" if notice else "without notice"
            print(f"2-node managed job, eviction {what}, {TRIALS} trials (medians): "
                  f"eviction to run resumed minus provisioning {med['total_minus_provisioning']:.2f} s "
                  f"(max {max(r['total_minus_provisioning'] for r in runs):.2f} s); parts: "
                  f"{'notice' if notice else 'loss'} seen {med['seen']:.2f} s, "
                  f"{'checkpoint + ' if notice else ''}teardown to RECOVERING {med['to_recovering']:.2f} s, "
                  f"[provisioning {med['provisioning']:.2f} s], setup + start {med['start']:.2f} s")
        v = control(endpoint, "GET", "/_fake/violations")
        print(f"requests against the API specification: {v['count']} violations")
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
