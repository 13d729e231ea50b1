"""What the bench scripts share: running gangway in a home of its own,
reading a process's memory and CPU time from /proc, and the configuration
of the throwaway sshds that stand in for nodes."""
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


def write_sshd_config(f, listen, key_dir, pid_file, authorized_keys, home, force_command):
    """The throwaway sshd's configuration, written to the open file `f`:
    `listen` (host:port each), the host key `key_dir/host`, root by key
    only, many sessions, sessions in `home` running `force_command`. The
    caller may write more lines after it."""
    for a in listen:
        f.write(f"ListenAddress {a}\n")
    f.write(f"""HostKey {key_dir}/host
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 200
MaxStartups 400:30:800
UseDNS no
LogLevel ERROR
SetEnv HOME={home}
ForceCommand {force_command}
""")
