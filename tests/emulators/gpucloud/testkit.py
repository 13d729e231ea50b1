"""Helpers for the three fakes' selftest.py: start a fake, call it with
urllib, count checks, and run a real sshd on loopback (as
tests/it/sshd.rs does: its own config, host key and authorized_keys file in
a temp dir; root sessions; nothing in /etc/ssh or /root touched) so a
created instance can be reached with ssh."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SSHD = "/usr/sbin/sshd"

results = []


def check(name, condition, detail=""):
    results.append(bool(condition))
    print(f"{'ok  ' if condition else 'FAIL'} {name}{'' if condition else ': ' + str(detail)[:400]}", flush=True)
    return bool(condition)


def summary():
    passed = sum(results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def start(server_py, *extra):
    """Starts `server_py --port 0 --watch-stdin EXTRA...`; (process, url)."""
    proc = subprocess.Popen([sys.executable, server_py, "--host", "127.0.0.1", "--port", "0",
                             "--watch-stdin", *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"server did not say READY: {line!r}")
    return proc, line.split(" ", 1)[1]


def stop(proc):
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def call(url, method="GET", body=None, headers=None, raw=None):
    """(status, parsed JSON or text, headers)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    h = {"Content-Type": "application/json"} if data is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            payload, status, hdrs = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as err:
        payload, status, hdrs = err.read(), err.code, err.headers
    try:
        return status, json.loads(payload) if payload else None, hdrs
    except ValueError:
        return status, payload.decode(errors="replace"), hdrs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    """One sshd on 127.0.0.1:PORT; `why_not()` says why none can start."""

    @staticmethod
    def why_not():
        if not os.path.exists(SSHD):
            return f"{SSHD} is missing (Debian: apt-get install openssh-server)"
        if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
            return "ssh or ssh-keygen is missing (Debian: openssh-client)"
        if os.geteuid() != 0:
            return "sshd must run as root to open root sessions"
        return None

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gpucloud-sshd-")
        self.port = free_port()
        self.authorized_keys = os.path.join(self.dir, "authorized_keys")
        open(self.authorized_keys, "w").close()
        self.client_key = os.path.join(self.dir, "client")
        host_key = os.path.join(self.dir, "host_ed25519")
        for path in (self.client_key, host_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
        with open(self.client_key + ".pub") as f:
            self.public_key = f.read().strip()
        config = os.path.join(self.dir, "sshd_config")
        with open(config, "w") as f:
            f.write(f"""Port {self.port}
ListenAddress 127.0.0.1
HostKey {host_key}
AuthorizedKeysFile {self.authorized_keys}
PidFile {self.dir}/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
""")
        os.makedirs("/run/sshd", exist_ok=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", config], stderr=open(os.path.join(self.dir, "log"), "w"))
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError("sshd did not listen within 10 s")

    def ssh(self, address, port, command):
        return subprocess.run(
            ["ssh", "-i", self.client_key, "-p", str(port), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", f"root@{address}", command],
            capture_output=True, text=True, timeout=30)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for(fn, timeout=10, interval=0.1):
    deadline = time.time() + timeout
    while True:
        value = fn()
        if value or time.time() > deadline:
            return value
        time.sleep(interval)
