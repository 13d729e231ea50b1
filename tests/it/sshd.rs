//! A real OpenSSH server for the SSH tests: one `sshd` of our own, with its
//! own config, keys and log in a temp dir, listening on several loopback
//! addresses that stand in for the nodes of a cluster.
//!
//! ```no_run
//! let Some(sshd) = Sshd::start(2) else { return }; // SKIPPED ssh: why
//! let out = Command::new("ssh")
//!     .args(sshd.ssh_args())
//!     .arg(&sshd.addrs[1])
//!     .arg("echo $HOME")
//!     .output()?;
//! ```
//!
//! Every address is on 127/8, which Linux routes to `lo` without any setup,
//! so nothing on the machine is changed except `/run/sshd` (see
//! [`Sshd::start`]).
// Without the cloud features, the suites that use some of this are not built.
#![cfg_attr(not(all(feature = "aws", feature = "gcp")), allow(dead_code))]

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The server binary; sshd insists on being started by absolute path.
const SSHD: &str = "/usr/sbin/sshd";

/// How long [`Sshd::start`] waits for every address to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The next `127.0.X.*` block to try; each server of a test run gets its own.
static NEXT_BLOCK: AtomicUsize = AtomicUsize::new(0);

/// A running `sshd`, killed by [`Sshd::stop`] or on drop.
///
/// Sessions run as root (the server has to be root to switch users, and
/// tests must not add users), but not in root's real home:
///
/// * `SetEnv HOME=<tempdir>/home` in the config replaces the `HOME` sshd
///   takes from the password file (sshd applies `SetEnv` after its own
///   variables), so bash finds no `~/.bashrc` to read. Bash reads
///   `~/.bashrc` even for `ssh host cmd` when it sees it was started by
///   sshd, and root's on the development machine runs `pyenv init`, which
///   costs 0.3 s a command.
/// * sshd changes into the password-file home before it starts the shell,
///   and no config option changes that, so a `ForceCommand` first `cd`s to
///   `$HOME` and then `eval`s the client's command (`SSH_ORIGINAL_COMMAND`),
///   or starts a login shell when there is none. Relative paths
///   (`rsync dir host:dest`, `scp f host:`) therefore land in the clean
///   home, as they would in a cloud node's home, and never in `/root`. The
///   command's exit status, stdin and output pass through unchanged;
///   `sftp` (used by `scp`) works through the same `eval`.
///
/// No system user, `/root` or `/etc/ssh` file is touched.
pub struct Sshd {
    /// Holds config, keys, log, `known_hosts` and the sessions' home.
    dir: tempfile::TempDir,
    /// The listening `sshd -D`.
    child: Option<Child>,
    /// The loopback addresses it listens on (`127.0.X.1` ..= `127.0.X.n`).
    pub addrs: Vec<String>,
    /// The one port it listens on, on every address.
    pub port: u16,
    /// The user sessions log in as (`root`).
    pub user: String,
    /// The client's private key (ed25519, mode 0600), the only key the
    /// server accepts.
    pub client_key: PathBuf,
    /// `HOME` (and the working directory) of every session.
    pub home: PathBuf,
}

impl Sshd {
    /// Starts one sshd listening on `n` loopback addresses 127.0.30.1..=n
    /// (or another free 127.0.X.* block if taken) on one free port; None
    /// (after `SKIPPED ssh: <reason>`, see tests/support/src/skip.rs) when sshd
    /// is missing or we are not root. Records `ran ssh` when it can start.
    ///
    /// Each server started by a test process takes the next block
    /// (127.0.30.*, 127.0.31.*, ...), skipping a block where the chosen
    /// port is taken on any address. Returns once every address accepts
    /// connections (up to 10 s). Creates `/run/sshd`, sshd's privilege
    /// separation directory, when it is missing: the package's service
    /// normally does that at boot, and sshd refuses to start without it.
    ///
    /// # Panics
    ///
    /// When `n` is not in 1..=254, or the server cannot be started although
    /// sshd is installed and we are root (with the reason and sshd's log).
    pub fn start(n: usize) -> Option<Sshd> {
        Sshd::start_on("ssh", n, None)
    }

    /// Like [`Sshd::start`], on this port (e.g. 22, where a cloud VM's
    /// sshd listens) in the first free block, for a test of `suite` (whose
    /// run or skip it records); None (after `SKIPPED <suite>: ...`) when
    /// no block has it free (another sshd on `0.0.0.0:22`). Where
    /// `unshare` is installed the server and its sessions run in a PID
    /// namespace of their own, like the processes of a machine.
    pub fn start_on_port(suite: &str, n: usize, port: u16) -> Option<Sshd> {
        // First what start_on checks: binding a low port fails for a user
        // as "taken" would.
        if let Err(why) = can_run() {
            return crate::skip::skip(suite, why);
        }
        let free = (0..20).any(|i| {
            let block = 30 + (NEXT_BLOCK.load(Ordering::Relaxed) + i) % 225;
            let addrs: Vec<String> = (1..=n).map(|k| format!("127.0.{block}.{k}")).collect();
            fixed_port_free(&addrs, port)
        });
        if !free {
            return crate::skip::skip(
                suite,
                format_args!(
                    "port {port} is taken on the loopback addresses (an sshd on 0.0.0.0:{port}?)"
                ),
            );
        }
        Sshd::start_on(suite, n, Some(port))
    }

    fn start_on(suite: &str, n: usize, fixed: Option<u16>) -> Option<Sshd> {
        assert!(
            (1..=254).contains(&n),
            "Sshd::start({n}): 1..=254 addresses"
        );
        crate::skip::gate(suite, can_run())?;
        let dir = tempfile::Builder::new()
            .prefix("gw-sshd-")
            .tempdir()
            .expect("temp dir for sshd");
        let path = dir.path().to_path_buf();
        assert!(
            !path.to_string_lossy().contains(char::is_whitespace),
            "sshd_config needs a temp dir without spaces: {path:?}"
        );
        let home = path.join("home");
        std::fs::create_dir(&home).expect("sessions' home");
        let host_key = path.join("host_ed25519");
        let client_key = path.join("client_ed25519");
        keygen(&host_key, "gangway-test-host");
        keygen(&client_key, "gangway-test-client");
        std::fs::set_permissions(&client_key, std::fs::Permissions::from_mode(0o600))
            .expect("chmod client key");
        let authorized = path.join("authorized_keys");
        std::fs::copy(client_key.with_extension("pub"), &authorized).expect("authorized_keys");
        std::fs::set_permissions(&authorized, std::fs::Permissions::from_mode(0o600))
            .expect("chmod authorized_keys");
        ensure_privsep_dir();

        let mut last_failure = String::new();
        for _ in 0..20 {
            let block = 30 + NEXT_BLOCK.fetch_add(1, Ordering::Relaxed) % 225;
            let addrs: Vec<String> = (1..=n).map(|i| format!("127.0.{block}.{i}")).collect();
            let port = match fixed {
                Some(p) if fixed_port_free(&addrs, p) => p,
                Some(_) => continue,
                None => match free_port(&addrs) {
                    Some(p) => p,
                    None => continue,
                },
            };
            let config = path.join("sshd_config");
            std::fs::write(&config, config_text(&path, &home, &addrs, port))
                .expect("write sshd_config");
            let log = path.join("sshd.log");
            // A cloud VM's sshd (a fixed port) runs in a PID namespace of
            // its own, as a VM is a machine of its own: its sessions see
            // only its processes in /proc, so what a node does to "every
            // process of run N" (gangway's signal_job) never reaches
            // another test's machines. sshd, PID 1 there, reaps orphans;
            // when it dies the kernel ends the rest.
            let namespaced = fixed.is_some() && on_path("unshare");
            let mut cmd = if namespaced {
                let mut c = Command::new("unshare");
                c.args(["--pid", "--fork", "--mount-proc", "--kill-child", SSHD]);
                c
            } else {
                Command::new(SSHD)
            };
            cmd.args(["-D", "-e", "-f"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("sshd log"));
            let mut child = spawn_tied_to_process(cmd).expect("spawn sshd");
            match wait_ready(&mut child, &addrs, port) {
                Ok(()) => {
                    let sshd = Sshd {
                        dir,
                        child: Some(child),
                        addrs,
                        port,
                        user: "root".to_string(),
                        client_key,
                        home,
                    };
                    sshd.write_known_hosts(&host_key);
                    return Some(sshd);
                }
                Err(why) => {
                    kill_tree(child);
                    let log = std::fs::read_to_string(&log).unwrap_or_default();
                    last_failure = format!("{why}; sshd log:\n{log}");
                    // Lost a race for the port since free_port: next block.
                    if !(log.contains("already in use") || log.contains("Cannot bind")) {
                        break;
                    }
                }
            }
        }
        panic!("could not start sshd: {last_failure}");
    }

    /// The `authorized_keys` file the server reads at every login (a key
    /// appended to it is let in from then on).
    pub fn authorized_keys(&self) -> PathBuf {
        self.dir.path().join("authorized_keys")
    }

    /// The server's host keys, as OpenSSH public-key lines (what a cloud
    /// publishes of the VM an emulator's instance stands for).
    pub fn host_keys(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.path().join("host_ed25519.pub"))
            .expect("the host key's public half");
        text.lines().map(str::to_string).collect()
    }

    /// Shell code every session runs (sourced by `sh`) before its command,
    /// for what a machine sets up for its logins: e.g. where its metadata
    /// service is, from the address the session came to (`$SSH_CONNECTION`'s
    /// third word).
    pub fn session_profile(&self, script: &str) {
        std::fs::write(self.dir.path().join("session-profile.sh"), script)
            .expect("write the session profile");
    }

    /// Lets the holder of `public_key` (an OpenSSH `.pub` file) in too.
    pub fn authorize(&self, public_key: &Path) {
        use std::io::Write;
        let key = std::fs::read_to_string(public_key).expect("public key");
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("authorized_keys"))
            .and_then(|mut f| f.write_all(key.as_bytes()))
            .expect("append to authorized_keys");
    }

    /// ssh options a client needs (`-p`, `-i`, `-o UserKnownHostsFile=...`,
    /// `-o StrictHostKeyChecking=...`, `-o IdentitiesOnly=yes`, batch mode)
    /// as an argument list.
    ///
    /// Also `-F /dev/null` (no user or system ssh config changes what the
    /// tests see), the user, and quiet logging. Host keys are checked
    /// strictly against a `known_hosts` holding this server's key for every
    /// address. No argument contains a space, so joined with spaces they
    /// also serve `rsync -e "ssh ..."` and `PDSH_SSH_ARGS` (with pdsh's
    /// `%h`).
    pub fn ssh_args(&self) -> Vec<String> {
        let dir = self.dir.path().display();
        vec![
            "-F".into(),
            "/dev/null".into(),
            "-p".into(),
            self.port.to_string(),
            "-i".into(),
            self.client_key.display().to_string(),
            "-o".into(),
            format!("User={}", self.user),
            "-o".into(),
            format!("UserKnownHostsFile={dir}/known_hosts"),
            "-o".into(),
            "GlobalKnownHostsFile=/dev/null".into(),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "ConnectTimeout=10".into(),
            "-o".into(),
            "LogLevel=ERROR".into(),
        ]
    }

    /// An `ssh` command running `remote` on `addr` with [`Sshd::ssh_args`].
    pub fn ssh(&self, addr: &str, remote: &str) -> Command {
        let mut cmd = Command::new("ssh");
        cmd.args(self.ssh_args()).arg(addr).arg(remote);
        cmd
    }

    /// What sshd has logged so far (errors only).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// Kills it (Drop does too).
    ///
    /// Kills the listener and every process under it (per-connection sshd
    /// processes and the sessions' commands), so nothing a test started on
    /// the "nodes" outlives the server. Idempotent.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            kill_tree(child);
        }
    }

    /// Writes `known_hosts` with the host key for `[addr]:port` of every
    /// address.
    fn write_known_hosts(&self, host_key: &Path) {
        let public = std::fs::read_to_string(host_key.with_extension("pub")).expect("host key");
        let public = public
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        let text: String = self
            .addrs
            .iter()
            .map(|a| format!("[{a}]:{} {public}\n", self.port))
            .collect();
        std::fs::write(self.dir.path().join("known_hosts"), text).expect("known_hosts");
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why this machine cannot run the server, if it cannot.
fn can_run() -> Result<(), String> {
    if !Path::new(SSHD).is_file() {
        return Err(format!(
            "{SSHD} is not installed (apt-get install openssh-server)"
        ));
    }
    for tool in ["ssh", "ssh-keygen"] {
        if !on_path(tool) {
            return Err(format!(
                "{tool} is not on PATH (apt-get install openssh-client)"
            ));
        }
    }
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the test sshd must run as root (it logs sessions in as root)".to_string());
    }
    Ok(())
}

/// Whether `tool` is an executable file in a `PATH` directory.
fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            std::fs::metadata(d.join(tool)).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
    })
}

/// `ssh-keygen` a passphrase-less ed25519 key at `path` (and `path.pub`).
fn keygen(path: &Path, comment: &str) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .expect("run ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen {path:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// sshd will not start without its privilege separation directory, which
/// the package's service creates at boot (and a container never boots).
fn ensure_privsep_dir() {
    let dir = Path::new("/run/sshd");
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).expect("create /run/sshd");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .expect("chmod /run/sshd");
    }
}

/// A port free on every address in `addrs` right now (the kernel picks it
/// for the first address), or None if it is taken on another.
fn free_port(addrs: &[String]) -> Option<u16> {
    let first = TcpListener::bind((addrs[0].as_str(), 0)).ok()?;
    let port = first.local_addr().ok()?.port();
    let rest: Option<Vec<TcpListener>> = addrs[1..]
        .iter()
        .map(|a| TcpListener::bind((a.as_str(), port)).ok())
        .collect();
    rest.map(|_| port)
}

/// Whether `port` can be bound on every address in `addrs` right now.
fn fixed_port_free(addrs: &[String], port: u16) -> bool {
    let held: Option<Vec<TcpListener>> = addrs
        .iter()
        .map(|a| TcpListener::bind((a.as_str(), port)).ok())
        .collect();
    held.is_some()
}

/// The server's `(major, minor)` OpenSSH version, if it says.
fn sshd_version() -> Option<(u32, u32)> {
    let out = Command::new(SSHD)
        .arg("-V")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let rest = &text[text.find("OpenSSH_")? + "OpenSSH_".len()..];
    let mut nums = rest.split(|c: char| !c.is_ascii_digit());
    Some((nums.next()?.parse().ok()?, nums.next()?.parse().ok()?))
}

/// The sftp server binary of this distribution, if installed.
fn sftp_server() -> Option<&'static str> {
    [
        "/usr/lib/openssh/sftp-server",
        "/usr/libexec/openssh/sftp-server",
        "/usr/lib/ssh/sftp-server",
        "/usr/libexec/sftp-server",
    ]
    .into_iter()
    .find(|p| Path::new(p).is_file())
}

/// The whole `sshd_config`.
fn config_text(dir: &Path, home: &Path, addrs: &[String], port: u16) -> String {
    let dir = dir.display();
    let mut c = String::from("# Written by tests/it/sshd.rs for one test server.\n");
    for a in addrs {
        c += &format!("ListenAddress {a}:{port}\n");
    }
    c += &format!(
        "HostKey {dir}/host_ed25519
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 200
MaxStartups 200:30:400
ClientAliveInterval 5
ClientAliveCountMax 3
LoginGraceTime 30
UseDNS no
PrintMotd no
PrintLastLog no
PermitUserEnvironment no
LogLevel ERROR
SetEnv HOME={home}
",
        home = home.display()
    );
    if let Some(sftp) = sftp_server() {
        c += &format!("Subsystem sftp {sftp}\n");
    }
    // OpenSSH 9.8 started penalising addresses whose connections close
    // before authenticating (such as the readiness probes); tests hammer
    // one address, so turn that off where it exists.
    if sshd_version().is_some_and(|v| v >= (9, 8)) {
        c += "PerSourcePenalties no\n";
    }
    // A session first reads the server's session profile, when a test
    // wrote one (see [`Sshd::session_profile`]).
    c += &format!(
        "ForceCommand cd \"$HOME\" || exit 1; \
         if [ -r {dir}/session-profile.sh ]; then . {dir}/session-profile.sh; fi; \
         if [ -z \"$SSH_ORIGINAL_COMMAND\" ]; then exec \"$SHELL\" -l; fi; \
         eval \"$SSH_ORIGINAL_COMMAND\"\n"
    );
    c
}

/// Polls every address until it accepts a connection, or the listener
/// exits, or [`READY_TIMEOUT`] passes.
fn wait_ready(child: &mut Child, addrs: &[String], port: u16) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut waiting: Vec<SocketAddr> = addrs
        .iter()
        .map(|a| format!("{a}:{port}").parse().expect("socket address"))
        .collect();
    while !waiting.is_empty() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("sshd exited with {status}"));
        }
        if Instant::now() > deadline {
            return Err(format!("{waiting:?} not accepting after {READY_TIMEOUT:?}"));
        }
        waiting.retain(|a| TcpStream::connect_timeout(a, Duration::from_millis(200)).is_err());
        if !waiting.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Kills `child` and every process under it (per-connection sshd processes
/// and the sessions' commands), then reaps it.
fn kill_tree(mut child: Child) {
    // Find the sessions first: once the listener is gone they are
    // re-parented and no longer found under it.
    let below = descendants(child.id());
    let _ = child.kill();
    for pid in below {
        // SAFETY: kill(2) on a pid just found under our own child.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

/// Every process below `pid` (children, their children, ...), from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // pid (comm) state ppid ...; comm may hold spaces and parens.
            let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(ppid) = after.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` so that it gets SIGTERM when the test process dies, even
/// by SIGKILL (a timed-out CI run), so no listening sshd outlives its test
/// run. (Connections open at that moment have their own sshd processes,
/// which end when their client does, or `ClientAliveInterval` x
/// `ClientAliveCountMax` = 15 s after it vanished.)
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends,
/// and test threads end after every test, so the spawning is done by one
/// thread that lives as long as the process.
fn spawn_tied_to_process(mut cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("sshd-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    });
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .expect("spawner lock")
        .send((cmd, tx))
        .expect("spawner alive");
    rx.recv().expect("spawner replies")
}

/// Reads a child's whole stdout into a string (for the threads below).
fn read_all(mut r: impl Read) -> String {
    let mut s = String::new();
    let _ = r.read_to_string(&mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `cmd`, returning (exit code, stdout, stderr).
    fn run(cmd: &mut Command) -> (i32, String, String) {
        let out = cmd.stdin(Stdio::null()).output().expect("run ssh");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `-o` options that route a client through one ControlMaster at `path`.
    fn mux(path: &Path) -> Vec<String> {
        [
            "ControlMaster=auto".to_string(),
            format!("ControlPath={}", path.display()),
            "ControlPersist=60".to_string(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect()
    }

    /// Opens the master for `path` and returns a guard that closes it.
    struct Master<'a> {
        sshd: &'a Sshd,
        addr: String,
        path: PathBuf,
    }

    impl<'a> Master<'a> {
        fn open(sshd: &'a Sshd, addr: &str, path: &Path) -> Master<'a> {
            let (code, _, err) = run(Command::new("ssh")
                .args(sshd.ssh_args())
                .args(mux(path))
                .arg(addr)
                .arg("true")
                .stdout(Stdio::null()));
            assert_eq!(code, 0, "first session (starts the master): {err}");
            let (code, _, err) = run(Command::new("ssh")
                .args(sshd.ssh_args())
                .args(["-o", &format!("ControlPath={}", path.display())])
                .args(["-O", "check"])
                .arg(addr));
            assert_eq!(code, 0, "ssh -O check: {err}");
            Master {
                sshd,
                addr: addr.to_string(),
                path: path.to_path_buf(),
            }
        }
    }

    impl Drop for Master<'_> {
        fn drop(&mut self) {
            let _ = Command::new("ssh")
                .args(self.sshd.ssh_args())
                .args(["-o", &format!("ControlPath={}", self.path.display())])
                .args(["-O", "exit"])
                .arg(&self.addr)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    #[test]
    fn sshd_runs_a_command_on_every_address() {
        let Some(sshd) = Sshd::start(3) else { return };
        assert_eq!(sshd.addrs.len(), 3);
        let block: Vec<&str> = sshd.addrs[0].rsplitn(2, '.').collect();
        for (i, addr) in sshd.addrs.iter().enumerate() {
            assert_eq!(addr, &format!("{}.{}", block[1], i + 1));
            let (code, out, err) = run(&mut sshd.ssh(addr, "hostname; echo ok"));
            assert_eq!(code, 0, "{addr}: {err}\nsshd log: {}", sshd.log());
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.len(), 2, "{out:?}");
            assert!(!lines[0].is_empty());
            assert_eq!(lines[1], "ok");
        }
        // Exit status and stdin pass through the ForceCommand unchanged.
        let (code, out, _) =
            run(&mut sshd.ssh(&sshd.addrs[0], "printf '%s|' \"a  b\" 'c'; exit 7"));
        assert_eq!((code, out.as_str()), (7, "a  b|c|"));
        let mut cat = sshd.ssh(&sshd.addrs[0], "tr a-z A-Z");
        let mut child = cat
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("ssh");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"piped in\n").unwrap();
        let out = read_all(child.stdout.take().unwrap());
        assert!(child.wait().unwrap().success());
        assert_eq!(out, "PIPED IN\n");
    }

    #[test]
    fn sshd_takes_20_parallel_sessions_over_one_connection() {
        let Some(sshd) = Sshd::start(1) else { return };
        let addr = sshd.addrs[0].clone();
        let control = tempfile::Builder::new().prefix("gw-cm-").tempdir().unwrap();
        let path = control.path().join("cm");
        let _master = Master::open(&sshd, &addr, &path);
        // Every session waits until all 20 are open at once, so the server
        // must allow 20 sessions on the one connection (the default
        // MaxSessions is 10), then reports the count and its client port.
        let script = "d=$HOME/barrier; mkdir -p $d; touch $d/$$; i=0; \
                      while [ $(ls $d | wc -l) -lt 20 ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done; \
                      echo \"$(ls $d | wc -l) $SSH_CLIENT\"";
        let sessions: Vec<Child> = (0..20)
            .map(|_| {
                Command::new("ssh")
                    .args(sshd.ssh_args())
                    .args(mux(&path))
                    .arg(&addr)
                    .arg(script)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("ssh")
            })
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for child in sessions {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{:?}: {}\nsshd log: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                sshd.log()
            );
            let (count, client) = stdout.trim().split_once(' ').expect("count and SSH_CLIENT");
            assert_eq!(count, "20", "sessions open at once: {stdout}");
            seen.insert(client.to_string());
        }
        // One client address and port: every session rode the master's one
        // TCP connection.
        assert_eq!(seen.len(), 1, "{seen:?}");
    }

    #[test]
    fn sshd_sessions_get_a_clean_home_and_are_fast() {
        let Some(sshd) = Sshd::start(1) else { return };
        let addr = &sshd.addrs[0];
        let (code, out, err) = run(&mut sshd.ssh(
            addr,
            "echo \"$HOME\"; pwd; echo \"${PYENV_ROOT:-unset}\"; touch relative.txt",
        ));
        assert_eq!(code, 0, "{err}");
        let home = sshd.home.display().to_string();
        assert_eq!(out, format!("{home}\n{home}\nunset\n"));
        assert!(sshd.home.join("relative.txt").is_file());
        assert!(sshd.home.starts_with(std::env::temp_dir()));

        // A full connection (key exchange, auth) is timed for the record;
        // the shell's own start is timed through a master, where root's
        // ~/.bashrc would add 0.3 s.
        let t = Instant::now();
        let (code, _, err) = run(&mut sshd.ssh(addr, "true"));
        assert_eq!(code, 0, "{err}");
        let full = t.elapsed();
        let control = tempfile::Builder::new().prefix("gw-cm-").tempdir().unwrap();
        let path = control.path().join("cm");
        let _master = Master::open(&sshd, addr, &path);
        let best = (0..5)
            .map(|_| {
                let t = Instant::now();
                let (code, _, err) = run(Command::new("ssh")
                    .args(sshd.ssh_args())
                    .args(mux(&path))
                    .arg(addr)
                    .arg("true"));
                assert_eq!(code, 0, "{err}");
                t.elapsed()
            })
            .min()
            .unwrap();
        eprintln!("ssh true: {full:?} with a new connection, {best:?} over a master");
        assert!(best < Duration::from_millis(150), "a command took {best:?}");
    }

    #[test]
    fn stop_ends_running_sessions() {
        let Some(mut sshd) = Sshd::start(1) else {
            return;
        };
        let mut long = sshd.ssh(&sshd.addrs[0], "echo started; sleep 60");
        let mut child = long
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut first = [0u8; 8];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        assert_eq!(&first, b"started\n");
        let t = Instant::now();
        sshd.stop();
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let (code, _, _) = run(&mut sshd.ssh(&sshd.addrs[0], "true"));
        assert_ne!(code, 0, "a stopped server still answers");
        sshd.stop();
    }
}
