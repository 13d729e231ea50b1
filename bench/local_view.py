"""What a local node's mount namespace costs (docs/local.md, "Absolute
paths"): `gangway exec` of one command on a 1-node local cluster whose task
puts a directory at an absolute path the machine lacks (each command starts
in the node's view: a mount namespace, a bind of each of `/`'s entries into
the node's mirror, a chroot), against the same on a cluster whose task puts
it under the home (no namespace). Whole-process wall time, median and p90
of N runs each, interleaved.

Usage: python3 bench/local_view.py [BINARY] [N]   (Linux; root or
unprivileged user namespaces)
"""
import os
import statistics
import sys
import tempfile
import time

from benchlib import gw


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/gangway")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    tag = f"gw-bench-view-{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        home = os.path.join(tmp, "home")
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        with open(os.path.join(data, "x"), "w") as f:
            f.write("x\n")
        cases = {
            "absolute (namespace)": f"/{tag}",
            "under ~ (none)": f"~/{tag}",
        }
        for i, (name, dest) in enumerate(cases.items()):
            task = os.path.join(tmp, f"t{i}.yaml")
            with open(task, "w") as f:
                f.write(f"resources:\n  infra: local\nfile_mounts:\n  {dest}: {data}\nrun: 'true'\n")
            gw(binary, home, "launch", task, "-c", f"v{i}", "-y")
        times = {name: [] for name in cases}
        for _ in range(n):
            for i, (name, dest) in enumerate(cases.items()):
                path = dest.replace("~", "$HOME", 1)
                t = time.perf_counter()
                p = gw(binary, home, "exec", f"v{i}", f"cat {path}/x")
                times[name].append(time.perf_counter() - t)
                if "x" not in p.stdout:
                    sys.exit(f"{name}: the node did not read its file: {p.stdout}{p.stderr}")
        for i in range(len(cases)):
            gw(binary, home, "down", f"v{i}", "-y")
        if os.path.exists(f"/{tag}"):
            sys.exit(f"/{tag} appeared on this machine")
    print(f"gangway exec of `cat PATH/x` on a 1-node local cluster, {n} runs each ({binary})")
    for name, ts in times.items():
        ts.sort()
        p90 = ts[int(0.9 * (len(ts) - 1))]
        print(f"  {name:22} median {statistics.median(ts) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
