#!/usr/bin/env python3
"""A 16-node spot gang loses one node without notice: replacing only that
node (`job_recovery.strategy: REPLACE_LOST_NODES`, the default) against
recovering the whole gang (`EAGER_NEXT_REGION`), in the same run, on the
local cloud and on the EC2 emulator with sshd-backed instances.

Usage (as root, with openssh-server installed, e.g. by .ci/run):
    python3 bench/replace.py [path/to/gangway]   (default target/release/gangway)

Environment: SETUP_S (default 10: the task's setup sleeps that long, as
package installs and data staging do), CLOUDS (default "local,aws"),
TRIALS (default 3: each strategy's figures are medians, the strategies
alternating which goes first; BENCH_RUST_LOG=gangway=debug puts the
driver's step times in each job's driver.log, with KEEP=1). The
AWS half needs the EC2 emulator's venv (GANGWAY_TEST_PYTHON, else
target/ec2-venv/bin/python) and port 22 free on 127.0.60.* and 127.0.61.*.

Per cloud and strategy, one managed job: a 16-node spot trainer that
checkpoints every 5 steps; once every rank runs, one node is taken without
notice (the local market's schedule; EC2's interrupt). Measured:
- loss → run resumed: from the node's loss to the last of the next run's
  16 ranks starting (each rank prints its own clock), with the
  provisioning part (RECOVERING → STARTING) and the controller's RUNNING
  event (which trails by up to one 200 ms supervisor tick);
- nodes launched and, on the emulator, RunInstances calls after the loss;
- setup runs after the loss (the task's setup prints a line per run);
- node-seconds paid from the loss to the resume: each instance's lifetime
  (polled every 50 ms) inside that window.

The nodes are processes or loopback sshd addresses of this machine and
moto answers in milliseconds: these are gangway's own costs plus the
setup's SETUP_S, not a cloud's boot time, which a real replacement adds
once and a whole-gang recovery adds for every node.
"""
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import aws_e2e  # noqa: E402  (its sshd and emulator helpers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
aws_e2e.BIN = BIN
NODES = 16
SETUP_S = float(os.environ.get("SETUP_S", "10"))
CLOUDS = os.environ.get("CLOUDS", "local,aws").split(",")
STRATEGIES = ("REPLACE_LOST_NODES", "EAGER_NEXT_REGION")
TRIALS = int(os.environ.get("TRIALS", "3"))

TRAINER = """  ck="$GANGWAY_CHECKPOINT_DIR/step"
  step=0
  [ -f "$ck" ] && step=$(cat "$ck")
  echo "run $GANGWAY_RESTART_COUNT resumes at step $step at $(date +%s%3N)"
  save() {
    t=$(date +%s%3N)
    [ "$GANGWAY_NODE_RANK" = 0 ] && echo "$step" > "$ck.tmp" && mv "$ck.tmp" "$ck"
    while [ "$(cat "$GANGWAY_CHECKPOINT_DIR/.gangway-synced" 2>/dev/null || echo 0)" -lt "$t" ]; do sleep 0.05; done
  }
  while [ "$step" -lt 60 ]; do
    sleep 0.2
    step=$((step + 1))
    [ "$GANGWAY_NODE_RANK" = 0 ] && [ "$GANGWAY_RESTART_COUNT" = 0 ] && [ "$step" = 3 ] && touch {ready}
    if [ $((step % 5)) -eq 0 ]; then save; fi
  done
  echo "done at step $step"
"""


def task(infra, strategy, ready, extra):
    return (f"num_nodes: {NODES}\nresources:\n  infra: {infra}\n  accelerators: A100:8\n"
            f"  use_spot: true\n  job_recovery:\n    strategy: {strategy}\n"
            "checkpoint:\n  sync_interval: 1\n  signal: SIGTERM\n  grace_period: 10\n"
            f"{extra}setup: |\n  echo setup-ran\n  sleep {SETUP_S}\nrun: |\n"
            + TRAINER.replace("{ready}", ready))


class Lifetimes:
    """Polls `live()` (instance ids running now) every 50 ms and keeps
    each instance's first and last time seen running."""

    def __init__(self, live):
        self.live, self.seen, self.stop = live, {}, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            now = time.time()
            try:
                ids = self.live()
            except Exception:  # noqa: BLE001 (a record half-written: next poll)
                ids = []
            for i in ids:
                first, _ = self.seen.get(i, (now, now))
                self.seen[i] = (first, now)
            time.sleep(0.05)

    def finish(self):
        self.stop.set()
        self.thread.join(5)
        return self.seen


def paid(seen, start, end):
    """Node-seconds of instances alive inside [start, end]."""
    return sum(max(0.0, min(last, end) - max(first, start)) for first, last in seen.values())


def events(env):
    return json.loads(aws_e2e.gw(env, "jobs", "events", "1", "-o", "json").stdout)["events"]


def ranks_resumed(log):
    """When the last of the 16 ranks of run 1 started (each rank's own
    first line, in ms): the run resumed. The controller's RUNNING event
    comes up to one supervisor tick (200 ms) after that, which is more
    than the difference between the strategies on the local cloud."""
    times = [int(m.group(1)) for m in re.finditer(r"run 1 resumes at step \d+ at (\d+)", log)]
    if len(times) != NODES:
        sys.exit(f"expected {NODES} ranks resuming in run 1, found {len(times)}:\n{log[-3000:]}")
    return max(times) / 1000


def after_loss(evs, loss):
    def at(state, after, contains=""):
        for e in evs:
            if e["state"] == state and e["at"] / 1000 >= after and contains in e["reason"]:
                return e["at"] / 1000
        sys.exit(f"no {state} event after the loss: {json.dumps(evs, indent=1)}")
    seen = at("PREEMPTED", loss - 1)
    recovering = at("RECOVERING", loss - 1)
    up = at("STARTING", recovering, "cluster up")
    resumed = at("RUNNING", up)
    return seen, recovering, up, resumed


def run_job(env, home, text, ready, lose):
    """Starts managed job 1, waits for run 0 to be past its third step,
    calls lose() (which returns the loss time), waits for the job."""
    path = os.path.join(home, "task.yaml")
    with open(path, "w") as f:
        f.write(text)
    job = subprocess.Popen([BIN, "jobs", "launch", path, "-y", "--wait"], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(job.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 300
    while not os.path.exists(ready):
        if time.time() > deadline or job.poll() is not None:
            job.kill()
            ctl = os.path.join(home, "jobs", "controller.log")
            tail = open(ctl).read()[-3000:] if os.path.exists(ctl) else "(no controller log)"
            evs = aws_e2e.gw(env, "jobs", "events", "1", check=False).stdout
            evs += aws_e2e.gw(env, "jobs", "logs", "1", check=False).stdout[-3000:]
            sys.exit(f"the job did not start:\n{''.join(out)}\n{evs}\ncontroller log:\n{tail}")
        time.sleep(0.05)
    loss = lose()
    if job.wait(timeout=600) != 0:
        reader.join(5)
        sys.exit(f"the job failed:\n{''.join(out)}")
    reader.join(5)
    log = aws_e2e.gw(env, "jobs", "logs", "1").stdout
    return loss, log


def local_trial(work, strategy):
    home = tempfile.mkdtemp(prefix=f"local-{strategy}-", dir=work)
    env = dict(os.environ, GANGWAY_HOME=home)
    ready = os.path.join(home, "ready")
    records = os.path.join(home, "local/instances")

    def live():
        ids = []
        for p in glob.glob(f"{records}/*/*.json"):
            with open(p) as f:
                r = json.load(f)
            if r.get("state") == "running" and not (r.get("preempt_at_ms") or 1e18) <= time.time() * 1000:
                ids.append(r["id"])
        return ids

    watch = Lifetimes(live)
    # The first launch's first node is reclaimed 2 s after the ready mark
    # (its timer runs from the launch: setup, then the run's 3 steps).
    after = SETUP_S + 3.0
    extra = (f"config:\n  local:\n    preempt_nodes: 1\n    preemptions:\n"
             f"      - {{after_s: {after}}}\n")

    def lose():
        recs = []
        for p in glob.glob(f"{records}/*/*.json"):
            with open(p) as f:
                recs.append(json.load(f))
        return min(r["preempt_at_ms"] for r in recs if r.get("preempt_at_ms")) / 1000

    loss, log = run_job(env, home, task("local", strategy, ready, extra), ready, lose)
    # The loss time is the market's schedule; wait for it if the job got
    # there first (it cannot: the run resumes after it).
    seen = watch.finish()
    seen_at, recovering, up, marked = after_loss(events(env), loss)
    resumed = ranks_resumed(log)
    launched = sum(1 for first, _ in seen.values() if first >= loss - 0.1)
    return {
        "resumed": resumed - loss,
        "marked": marked - loss,
        "seen": seen_at - loss,
        "recovery": up - seen_at,
        "start": resumed - up,
        "provisioning": up - recovering,
        "launched": launched,
        "run_instances": None,
        "setups": log.count("setup-ran") - NODES,
        "paid": paid(seen, loss, resumed),
    }


def aws_trial(endpoint, work, keys, strategy):
    aws_e2e.use_block(endpoint, aws_e2e.BLOCKS[0], keys)
    # The "instances" of one sshd share its home: the last trial's
    # checkpoint must not be this one's.
    for block in aws_e2e.BLOCKS:
        shutil.rmtree(os.path.join(work, block, "home", "gangway_checkpoints"), ignore_errors=True)
    home = tempfile.mkdtemp(prefix=f"aws-{strategy}-", dir=work)
    env = aws_e2e.env_for(endpoint, home)
    ready = os.path.join(home, "ready")
    scope = aws_e2e.SCOPE
    aws_e2e.control(endpoint, "DELETE", f"/_gangway/calls?scope={scope}")

    def live():
        return [i["instance_id"] for i in
                aws_e2e.control(endpoint, "GET", f"/_gangway/machines?scope={scope}")["instances"]
                if i["state"] == "running"]

    watch = Lifetimes(live)
    extra = "config:\n  aws:\n    ssh_user: root\n"
    calls_at_loss = {}

    def lose():
        running = sorted(live())
        if len(running) != NODES:
            sys.exit(f"expected {NODES} instances running, found {running}")
        aws_e2e.use_block(endpoint, aws_e2e.BLOCKS[1], keys)
        calls_at_loss.update(
            aws_e2e.control(endpoint, "GET", f"/_gangway/calls?scope={scope}")["calls"])
        t = time.time()
        aws_e2e.control(endpoint, "POST", "/_gangway/interrupt",
                        {"instance_id": running[5], "region": "us-east-1"})
        return t

    loss, log = run_job(env, home, task("aws/us-east-1", strategy, ready, extra), ready, lose)
    seen = watch.finish()
    calls = aws_e2e.control(endpoint, "GET", f"/_gangway/calls?scope={scope}")["calls"]
    seen_at, recovering, up, marked = after_loss(events(env), loss)
    resumed = ranks_resumed(log)
    deadline = time.time() + 120
    while live():
        if time.time() > deadline:
            sys.exit("the job's instances are still there 120 s after it ended")
        time.sleep(0.1)
    return {
        "resumed": resumed - loss,
        "marked": marked - loss,
        "seen": seen_at - loss,
        "recovery": up - seen_at,
        "start": resumed - up,
        "provisioning": up - recovering,
        "launched": sum(1 for first, _ in seen.values() if first >= loss - 0.1),
        "run_instances": calls.get("RunInstances", 0) - calls_at_loss.get("RunInstances", 0),
        "setups": log.count("setup-ran") - NODES,
        "paid": paid(seen, loss, resumed),
    }


def trials(run):
    """TRIALS rounds of both strategies, alternating which goes first:
    {strategy: [result per round]}."""
    out = {s: [] for s in STRATEGIES}
    for t in range(TRIALS):
        for s in (STRATEGIES if t % 2 == 0 else STRATEGIES[::-1]):
            out[s].append(run(s))
    return out


def report(cloud, results):
    """Each strategy's median over the trials (every trial's loss→resumed
    in brackets), and the issue's target: the replacement resumed in less
    than the whole gang's time minus its provisioning."""
    med = {s: {k: (statistics.median(v[k] for v in rs) if rs[0][k] is not None else None)
               for k in rs[0]} for s, rs in results.items()}
    print(f"\n{cloud}: {NODES}-node spot gang, one node lost without notice, setup {SETUP_S:g} s, "
          f"median of {TRIALS} trial(s)")
    print(f"{'strategy':<20} {'loss→resumed':>13} {'= seen':>7} {'+ recover':>10} {'+ setup/start':>14} "
          f"{'provisioning':>13} {'RUNNING event':>14} {'nodes launched':>15} {'RunInstances':>13} "
          f"{'setup runs':>11} {'node-s paid':>12}  trials")
    for strategy, r in med.items():
        ri = "-" if r["run_instances"] is None else f"{r['run_instances']:g}"
        each = ", ".join(f"{x['resumed']:.3f}" for x in results[strategy])
        print(f"{strategy:<20} {r['resumed']:>12.3f}s {r['seen']:>6.2f}s {r['recovery']:>9.2f}s "
              f"{r['start']:>13.2f}s {r['provisioning']:>12.3f}s {r['marked']:>13.2f}s "
              f"{r['launched']:>15g} {ri:>13} {r['setups']:>11g} {r['paid']:>12.1f}  ({each})")
    rep, whole = med["REPLACE_LOST_NODES"], med["EAGER_NEXT_REGION"]
    bar = whole["resumed"] - whole["provisioning"]
    print(f"target: replacement {rep['resumed']:.3f} s < whole gang {whole['resumed']:.3f} s "
          f"- its provisioning {whole['provisioning']:.3f} s = {bar:.3f} s: "
          f"{'met' if rep['resumed'] < bar else 'NOT met'}")
    print("(resumed: the last rank of the next run started, by its own clock; recover: from the "
          "loss seen to the cluster up again: stopping the run, removing or tearing down, "
          "launching; provisioning: RECOVERING to STARTING; setup/start: first contact, files, "
          "setup, every rank started; RUNNING event: when the controller saw it, up to one "
          "200 ms tick later)")


def main():
    if not os.path.exists(BIN):
        sys.exit(f"no gangway binary at {BIN}: cargo build --release, or name one")
    work = tempfile.mkdtemp(prefix="gw-replace-bench-")
    procs = []
    print(f"gangway: {BIN}")
    try:
        if "local" in CLOUDS:
            report("local", trials(lambda s: local_trial(work, s)))
        if "aws" in CLOUDS:
            if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"):
                sys.exit("the aws half needs root and /usr/sbin/sshd (see .ci/run)")
            os.makedirs("/run/sshd", exist_ok=True)
            keys = os.path.join(work, "authorized_keys")
            open(keys, "w").close()
            emu, endpoint = aws_e2e.start_emulator()
            procs.append(emu)
            dirs = []
            for block in aws_e2e.BLOCKS:
                d = os.path.join(work, block)
                os.makedirs(d)
                procs.append(aws_e2e.start_sshd(d, block, keys))
                dirs.append(d)
            aws_e2e.use_block(endpoint, aws_e2e.BLOCKS[1], keys)
            port = aws_e2e.use_block(endpoint, aws_e2e.BLOCKS[0], keys)
            for d in dirs:
                with open(f"{d}/profile.sh", "w") as f:
                    f.write(f'set -- $SSH_CONNECTION; export GANGWAY_IMDS_ENDPOINT="http://$3:{port}"; set --\n')
            report("aws (EC2 emulator)", trials(lambda s: aws_trial(endpoint, work, keys, s)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if not os.environ.get("KEEP"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
