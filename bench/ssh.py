#!/usr/bin/env python3
"""Fan-out of a trivial command (`true`) to 64 nodes over SSH on loopback:
gangway's transport cold (new master connections) and warm (connections
up), against `pdsh -R ssh` on the same hosts in the same run.

Usage (as root, with openssh-server and pdsh installed, e.g. by .ci/run):
    python3 bench/ssh.py

Starts its own sshd servers on 127.0.50.1..64 (own config and keys, sessions get a
clean HOME so root's shell start-up, pyenv here, does not count), runs
`cargo bench --bench ssh_fanout`, then pdsh, and prints the figures.
"""
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import write_sshd_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = int(os.environ.get("NODES", "64"))
ADDRS = [f"127.0.50.{i}" for i in range(1, N + 1)]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd") or not shutil.which("pdsh"):
        sys.exit("needs root, /usr/sbin/sshd and pdsh (see .ci/run)")
    d = tempfile.mkdtemp(prefix="gw-ssh-bench-")
    home = os.path.join(d, "home")
    os.makedirs(home)
    os.makedirs("/run/sshd", exist_ok=True)
    for k in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/{k}"], check=True)
    shutil.copy(f"{d}/client.pub", f"{d}/authorized_keys")
    port = free_port()
    # sshd listens on at most 16 sockets: one server per 16 addresses.
    servers = []
    for g in range(0, N, 16):
        cfg = f"{d}/sshd_config.{g}"
        with open(cfg, "w") as f:
            write_sshd_config(f, [f"{a}:{port}" for a in ADDRS[g:g + 16]], d,
                              f"{d}/sshd.{g}.pid", f"{d}/authorized_keys", home,
                              'cd "$HOME" || exit 1; eval "$SSH_ORIGINAL_COMMAND"')
        servers.append(subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", cfg],
                                        stderr=open(f"{d}/sshd.{g}.log", "w")))
    try:
        deadline = time.time() + 10
        for a in ADDRS:
            while True:
                try:
                    socket.create_connection((a, port), timeout=1).close()
                    break
                except OSError:
                    if time.time() > deadline:
                        sys.exit(f"sshd did not come up on {a}: see {d}/sshd.*.log")
                    time.sleep(0.05)
        env = dict(os.environ, GW_SSH_ADDRS=",".join(ADDRS), GW_SSH_PORT=str(port),
                   GW_SSH_KEY=f"{d}/client", GW_SSH_USER="root")
        print(f"{N} nodes on loopback, one sshd, command `true`; sessions with a clean HOME")
        subprocess.run(["cargo", "bench", "-q", "--bench", "ssh_fanout"], cwd=ROOT, env=env, check=True)
        ssh_args = (f"-p {port} -i {d}/client -o IdentitiesOnly=yes -o BatchMode=yes "
                    f"-o StrictHostKeyChecking=no -o UserKnownHostsFile={d}/known -o LogLevel=ERROR -l root")
        penv = dict(os.environ, PDSH_SSH_ARGS_APPEND=ssh_args, PDSH_RCMD_TYPE="ssh")
        times = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run(["pdsh", "-R", "ssh", "-f", "64", "-w", ",".join(ADDRS), "true"],
                           env=penv, check=True, stdout=subprocess.DEVNULL)
            times.append((time.perf_counter() - t) * 1000)
        print(f"pdsh -R ssh -f 64 (new connections):  median {statistics.median(times):7.1f} ms")
    finally:
        for s in servers:
            s.terminate()
            s.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
