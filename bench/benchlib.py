"""What the bench scripts share: running gangway in a home of its own, and
reading a process's memory and CPU time from /proc."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gw(binary, home, *args, check=True):
    """Runs `binary args...` with GANGWAY_HOME=home (and no inherited
    catalog directory); exits the bench if it fails and `check`."""
    env = dict(os.environ, GANGWAY_HOME=home)
    env.pop("GANGWAY_CATALOG_DIR", None)
    p = subprocess.run([binary, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"gangway {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def proc_status(pid):
    """/proc/PID/status as a dict."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def cpu_ticks(pid):
    """User plus system CPU time of PID, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])
