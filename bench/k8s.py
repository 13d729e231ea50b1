#!/usr/bin/env python3
"""A 64-pod gang on the Kubernetes harness (tests/emulators/k8s: real
kube-apiserver, kube-scheduler and kube-controller-manager v1.37.2, node
agents that run pods as local processes), in one run of one harness:

1. `gangway launch` of a 64-node task (A100:1 per node, run `sleep`) from
   the command to its "all 64 rank(s) running" line: pods created,
   scheduled, running, each pod's $HOME asked through exec, the gang's
   setup and run started in every pod through exec.
2. For scale, Kubernetes alone: `kubectl apply` of the same 64 pods (same
   requests, same command) plus `kubectl wait --for=condition=Ready`.

Usage: python3 bench/k8s.py [path/to/gangway]   (default target/release/gangway)
The harness binary: GANGWAY_TEST_K8S_HARNESS, else
tests/emulators/k8s/build.sh builds it (minutes cold). PODS=N changes 64.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
PODS = int(os.environ.get("PODS", "64"))
NODES = 8


def harness_binary():
    b = os.environ.get("GANGWAY_TEST_K8S_HARNESS")
    if b:
        return b
    out = os.path.join(tempfile.gettempdir(), "gangway-bench-k8s-harness")
    p = subprocess.run([os.path.join(ROOT, "tests/emulators/k8s/build.sh"), out],
                       capture_output=True, text=True)
    if p.returncode == 3:
        print("SKIPPED: no Go to build the k8s harness (tests/emulators/k8s/build.sh)")
        sys.exit(0)
    if p.returncode != 0:
        sys.exit("build.sh failed:\n" + p.stderr)
    return p.stdout.strip()


def main():
    hb = harness_binary()
    d = tempfile.mkdtemp(prefix="gw-k8s-bench-")
    per = -(-PODS // NODES)
    nodes = [{
        "name": f"node-{i}",
        "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
        "capacity": {"cpu": str(4 * per), "memory": f"{16 * per}Gi",
                     "nvidia.com/gpu": str(per), "pods": "110"},
    } for i in range(NODES)]
    with open(os.path.join(d, "nodes.json"), "w") as f:
        json.dump(nodes, f)
    serve = subprocess.Popen([hb, "serve", "--dir", os.path.join(d, "state"), "--nodes",
                              os.path.join(d, "nodes.json")],
                             stdout=subprocess.PIPE, stderr=open(os.path.join(d, "serve.log"), "w"),
                             text=True)
    try:
        line = ""
        while not line.startswith("READY "):
            line = serve.stdout.readline()
            if not line:
                sys.exit("the harness did not start; see " + os.path.join(d, "serve.log"))
        kubeconfig = dict(f.split("=", 1) for f in line.split()[1:])["kubeconfig"]

        def kubectl(*args, check=True):
            p = subprocess.run([hb, "kubectl", "--kubeconfig", kubeconfig, *args],
                               capture_output=True, text=True)
            if check and p.returncode != 0:
                sys.exit(f"kubectl {' '.join(args)}: {p.stderr}")
            return p.stdout

        home = os.path.join(d, "home")
        os.makedirs(home)
        with open(os.path.join(home, "kubernetes.yaml"), "w") as f:
            f.write(f"kubeconfig: {kubeconfig}\nimage: ignored\nlaunch_timeout: 10m\n")
        with open(os.path.join(home, "t.yaml"), "w") as f:
            f.write(f"num_nodes: {PODS}\nresources:\n  accelerators: A100:1\nrun: sleep 600\n")
        env = dict(os.environ, GANGWAY_HOME=home)
        env.pop("GANGWAY_CATALOG_DIR", None)
        t0 = time.monotonic()
        g = subprocess.Popen([BIN, "launch", os.path.join(home, "t.yaml"), "--infra", "k8s/harness",
                              "-c", "bench", "-y"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        want = f"all {PODS} rank(s) running"
        seen = []
        for out in g.stdout:
            seen.append(out)
            if want in out:
                break
        else:
            sys.exit("gangway launch ended without all ranks running:\n" + "".join(seen[-30:]))
        gang = time.monotonic() - t0
        g.send_signal(signal.SIGINT)
        try:
            g.wait(60)
        except subprocess.TimeoutExpired:
            g.kill()
        t1 = time.monotonic()
        subprocess.run([BIN, "down", "-y", "bench"], cwd=ROOT, env=env, capture_output=True)
        down = time.monotonic() - t1

        shape = [o for o in seen if "x1-" in o]
        pods = {"apiVersion": "v1", "kind": "List", "items": [{
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"plain-{i}", "labels": {"bench": "plain"}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "ignored",
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 86400 & wait $!; done"],
                "resources": {"requests": {"cpu": "3600m", "memory": "14745Mi", "nvidia.com/gpu": "1"},
                              "limits": {"nvidia.com/gpu": "1"}}}]}} for i in range(PODS)]}
        with open(os.path.join(d, "pods.json"), "w") as f:
            json.dump(pods, f)
        t2 = time.monotonic()
        kubectl("apply", "-f", os.path.join(d, "pods.json"))
        kubectl("wait", "--for=condition=Ready", "pod", "-l", "bench=plain", "--timeout=600s")
        plain = time.monotonic() - t2
        kubectl("delete", "pod", "-l", "bench=plain", "--wait=true")
        print(f"{PODS} pods on {NODES} nodes, one harness ({hb})")
        print(f"gangway launch to all {PODS} ranks running: {gang:.1f} s")
        print(f"kubectl apply + kubectl wait Ready, same {PODS} pods: {plain:.1f} s")
        print(f"gangway down (every pod gone): {down:.1f} s")
        if shape:
            print("shape: " + shape[0].strip())
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()


if __name__ == "__main__":
    main()
