"""What the EC2 emulator and the GCE fake share for the fault sweep's kill
points: finding gangway's processes by an entry of their environment and
killing them. Both servers import it from the folder above theirs."""

import os
import signal
import time


def pids_with_env(entry):
    """Live processes whose environment has exactly the entry `entry`
    (`KEY=VALUE`); this server never counts. Processes that vanish or
    cannot be read while scanning are left out."""
    needle = entry.encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        # A zombie's environ reads empty: only live processes match.
        if needle in env.split(b"\0"):
            found.append(int(name))
    return found


def kill_marked(entry, timeout=10.0):
    """SIGKILLs every process whose environment has `entry`, again for
    any that appear meanwhile, until none is left alive (or `timeout`);
    returns the pids killed, in order."""
    killed = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = pids_with_env(entry)
        if not live:
            break
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            if pid not in killed:
                killed.append(pid)
        time.sleep(0.02)
    return killed
