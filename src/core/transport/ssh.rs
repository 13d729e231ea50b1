//! Commands on nodes over SSH: one multiplexed master connection per node
//! (the `openssh` crate drives OpenSSH's ControlMaster), reused for every
//! command, copy and signal.
//!
//! This is the generic transport for every node whose provider brings no
//! transport of its own: a node is reached at its [`SshEndpoint`] (which
//! falls back to its public, then private, address), and what differs per
//! provider (how long a refused key is retried, the command that reads a
//! preemption notice) is handed in by the provider. Host keys go to a known_hosts file per cluster: new
//! keys are accepted while the cluster is being provisioned (first contact)
//! and verified strictly afterwards, so a changed key stops the job with an
//! error naming the node. Keepalives every 3 s, 3 missed: a node that stops
//! answering is noticed after 12 s, within the 15 s the design asks for.

use std::collections::HashMap;
use std::io::{PipeWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openssh::{KnownHosts, Session, SessionBuilder};

use gangway_provider::{
    output_with_input, parse_notice, signal_token, NodeCommand, NodeProcess, NodeRow, Provider,
    SshEndpoint, Transport, TransportError, TOKEN_VAR,
};

/// Most master connections opened at once.
pub const MAX_HANDSHAKES: usize = 16;
/// Keepalive interval. OpenSSH gives up once 3 probes go unanswered, when
/// the 4th is due: a node that stops answering is noticed after 12 s.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(3);

/// Where a node (or a jump host) is reached.
pub(crate) type SshTarget = SshEndpoint;

/// Errors about keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file can be read by others.
    #[error(
        "refusing to use {path}: it can be read by others (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Readable {
        /// The file.
        path: String,
        /// Its mode.
        mode: u32,
    },
    /// ssh-keygen failed or is missing.
    #[error("cannot create an ssh key at {path}: {why}")]
    Create {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
}

/// Refuses a private key that others can read.
pub(crate) fn check_key_mode(path: &Path) -> Result<(), KeyError> {
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o777)
        .map_err(|e| KeyError::Create {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
    if mode & 0o077 != 0 {
        return Err(KeyError::Readable {
            path: path.display().to_string(),
            mode,
        });
    }
    Ok(())
}

/// gangway's own key pair, `$GANGWAY_HOME/ssh/id_ed25519`, created (mode
/// 0600) on first use.
pub(crate) fn ensure_key(home: &Path) -> Result<PathBuf, KeyError> {
    let dir = home.join("ssh");
    let path = dir.join("id_ed25519");
    if path.exists() {
        check_key_mode(&path)?;
        return Ok(path);
    }
    let err = |why: String| KeyError::Create {
        path: path.display().to_string(),
        why,
    };
    std::fs::create_dir_all(&dir).map_err(|e| err(e.to_string()))?;
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "gangway", "-f"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| err(format!("ssh-keygen: {e}")))?;
    if !out.status.success() {
        return Err(err(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| err(e.to_string()))?;
    Ok(path)
}

/// Quotes `s` for a POSIX shell.
pub(crate) fn sq(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A node path for the remote shell: `~/x` expands there, the rest is quoted.
fn remote_path(p: &str) -> String {
    if p == "~" {
        "\"$HOME\"".into()
    } else if let Some(rest) = p.strip_prefix("~/") {
        format!("\"$HOME\"/{}", sq(rest))
    } else {
        sq(p)
    }
}

/// Ids of the commands this process started over SSH (they are not pids).
static NEXT_PROCESS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1 << 24);

/// Variables gangway sets to paths on the node.
const NODE_PATH_VARS: &[&str] = &["GANGWAY_CHECKPOINT_DIR", "GANGWAY_WORKDIR"];

/// Node fact marking a node nobody has connected to yet: its host key is
/// accepted on first contact, then verified strictly.
pub(crate) const FIRST_CONTACT: &str = "ssh.first_contact";

/// A provider's command reading a preemption notice on a node
/// ([`Provider::notice_probe`]).
pub(crate) type NoticeProbe = Arc<dyn Fn(&NodeRow) -> Option<String> + Send + Sync>;

/// How a first contact goes, node by node, for whoever shows the wait:
/// who has answered, and what each silent node last said.
#[derive(Debug, Default)]
pub(crate) struct ContactBoard(Mutex<std::collections::BTreeMap<String, Option<String>>>);

/// What [`ContactBoard::snapshot`] saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ContactState {
    /// Nodes that answered.
    pub(crate) answered: usize,
    /// Nodes waited for.
    pub(crate) total: usize,
    /// Each silent node and the last thing its connection said.
    pub(crate) silent: Vec<(String, String)>,
}

impl ContactBoard {
    fn set(&self, who: &str, state: Option<String>) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(who.to_string(), state);
        }
    }

    /// Where the wait stands now.
    pub(crate) fn snapshot(&self) -> ContactState {
        let Ok(m) = self.0.lock() else {
            return ContactState::default();
        };
        ContactState {
            answered: m.values().filter(|v| v.is_none()).count(),
            total: m.len(),
            silent: m
                .iter()
                .filter_map(|(k, v)| v.as_ref().map(|e| (k.clone(), e.clone())))
                .collect(),
        }
    }
}

/// The SSH transport for one cluster.
pub struct SshTransport {
    notices: Option<NoticeProbe>,
    denied_grace: Duration,
    known_hosts: PathBuf,
    /// The user's own `~/.ssh/known_hosts`, also read (never written) for
    /// machines that outlive their clusters.
    user_known_hosts: Option<PathBuf>,
    control_dir: PathBuf,
    key: PathBuf,
    accept_new_hosts: bool,
    connect_timeout: Duration,
    max_handshakes: usize,
    sessions: Mutex<HashMap<SshTarget, Arc<Session>>>,
    /// Command id → (target, token naming the remote process group).
    remote: Mutex<HashMap<u32, (SshTarget, String)>>,
    /// Whether each machine has rsync (asked once per machine).
    rsync_on: Mutex<HashMap<SshTarget, bool>>,
    /// What to tell the user ([`Transport::take_notes`]).
    notes: Mutex<Vec<String>>,
    /// Where connections report how they go, when someone shows the wait.
    board: Option<Arc<ContactBoard>>,
    /// `<owner id>/<cluster>`, in the environment of everything this
    /// transport starts (`GANGWAY_SCOPE`): what finds a cluster's processes
    /// on a machine that other clusters and other installations (another
    /// user, or one logged in as the same `ubuntu`) share.
    scope: String,
}

/// The known_hosts file (under `ssh/known_hosts/`, beside one per cloud
/// cluster) of machines that outlive their clusters; cluster names cannot
/// start with `_`, so no cluster's file is this one.
const LASTING_HOSTS: &str = "_lasting-hosts";

/// The environment variable holding [`SshTransport`]'s scope.
const SCOPE_VAR: &str = "GANGWAY_SCOPE";

impl SshTransport {
    /// A command's environment, as the script its wrapper reads from stdin
    /// (not the command line, which other users of the node can read): the
    /// token by which `signal` finds it, the node's own variables, then the
    /// command's, with gangway's paths on the node made absolute there.
    fn command_env(&self, node: &NodeRow, cmd: &NodeCommand, token: &str) -> String {
        let mut env = format!(
            "export {TOKEN_VAR}={token}\nexport {SCOPE_VAR}={}\n",
            sq(&self.scope)
        );
        for (k, v) in &node.extra {
            if let Some(n) = k.strip_prefix("env.") {
                env.push_str(&format!("export {n}={}\n", sq(v)));
            }
        }
        for (k, v) in &cmd.env {
            // As on every other cloud: `~/x` would stay a literal `~` in
            // "$VAR/f".
            let value = match v.strip_prefix("~/") {
                Some(_)
                    if NODE_PATH_VARS.contains(&k.as_str()) || k.starts_with("GANGWAY_MOUNT_") =>
                {
                    remote_path(v)
                }
                _ => sq(v),
            };
            env.push_str(&format!("export {k}={value}\n"));
        }
        env
    }

    /// A transport for `cluster`, with state under `home`. `first_contact`:
    /// accept host keys not seen before (while provisioning).
    pub fn new(home: &Path, cluster: &str, first_contact: bool) -> Result<SshTransport, KeyError> {
        let key = ensure_key(home)?;
        let known = home.join("ssh").join("known_hosts");
        let control_dir = control_dir(home);
        let _ = std::fs::create_dir_all(&known);
        let _ = std::fs::create_dir_all(&control_dir);
        // The owner id (made on first use); a home that cannot hold one
        // still gets a scope of its own.
        let owner = crate::core::state::owner(home).unwrap_or_else(|_| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            home.hash(&mut h);
            format!("gw-{:016x}", h.finish())
        });
        Ok(SshTransport {
            scope: format!("{owner}/{cluster}"),
            known_hosts: known.join(cluster),
            user_known_hosts: None,
            control_dir,
            key,
            notices: None,
            denied_grace: DENIED_GRACE,
            accept_new_hosts: first_contact,
            connect_timeout: Duration::from_secs(60),
            max_handshakes: MAX_HANDSHAKES,
            sessions: Mutex::new(HashMap::new()),
            remote: Mutex::new(HashMap::new()),
            rsync_on: Mutex::new(HashMap::new()),
            notes: Mutex::new(Vec::new()),
            board: None,
        })
    }

    /// The transport for `provider`'s nodes: its notice probe and its
    /// grace for a refused key.
    pub(crate) fn for_provider(self, provider: Arc<dyn Provider>) -> SshTransport {
        let grace = provider.key_refusal_grace();
        let lasting = provider.hosts_outlive_clusters();
        let t = if lasting {
            self.with_lasting_hosts()
        } else {
            self
        };
        t.with_key_refusal_grace(grace)
            .with_notice_probe(Arc::new(move |n: &NodeRow| provider.notice_probe(n)))
    }

    /// Host keys for machines that outlive their clusters: one file for
    /// every cluster ([`LASTING_HOSTS`] under `ssh/known_hosts/`, where new
    /// keys are learnt), read after the user's own `~/.ssh/known_hosts` when there
    /// is one. A key that changed since any cluster met the machine is
    /// refused.
    pub fn with_lasting_hosts(mut self) -> SshTransport {
        let dir = self
            .known_hosts
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        self.known_hosts = dir.join(LASTING_HOSTS);
        self.user_known_hosts = std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".ssh/known_hosts"))
            .filter(|p| p.is_file());
        self
    }

    /// Reads preemption notices with `probe` (default: none are read).
    pub fn with_notice_probe(mut self, probe: NoticeProbe) -> SshTransport {
        self.notices = Some(probe);
        self
    }

    /// How long a node that refuses gangway's key is asked again (default
    /// 90 s: a cloud VM's key may arrive after its sshd). Jump hosts get
    /// none.
    pub fn with_key_refusal_grace(mut self, d: Duration) -> SshTransport {
        self.denied_grace = d;
        self
    }

    /// How long to keep retrying a node whose sshd does not answer yet.
    pub fn with_connect_timeout(mut self, d: Duration) -> SshTransport {
        self.connect_timeout = d;
        self
    }

    /// At most `n` master connections opened at once (default
    /// [`MAX_HANDSHAKES`]).
    pub fn with_max_handshakes(mut self, n: usize) -> SshTransport {
        self.max_handshakes = n.max(1);
        self
    }

    /// Connections report to `board` how they go.
    pub(crate) fn with_board(mut self, board: Arc<ContactBoard>) -> SshTransport {
        self.board = Some(board);
        self
    }

    fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.connect_timeout
    }

    /// The key offered to `t` and the known_hosts file, for error hints;
    /// `node`: a node (whose key may arrive after its sshd), not a jump
    /// host (up before).
    fn facts(&self, t: &SshTarget, node: bool) -> ConnectFacts {
        ConnectFacts {
            key: t.key.clone().unwrap_or_else(|| self.key.clone()),
            known_hosts: self.known_hosts.clone(),
            denied_grace: if node {
                self.denied_grace
            } else {
                Duration::ZERO
            },
        }
    }

    /// Whether a node's host key may be new: while provisioning, or for a
    /// node provisioned without contact (`--provision-only`), met here for
    /// the first time.
    fn accepts(&self, node: &NodeRow) -> bool {
        self.accept_new_hosts
            || node
                .extra
                .get(FIRST_CONTACT)
                .is_some_and(|v| v == "pending")
    }

    /// The master connection's settings for `t`; `via`: the control socket
    /// of the jump host to go through.
    fn builder(
        &self,
        t: &SshTarget,
        accept_new: bool,
        via: Option<&Path>,
    ) -> Result<SessionBuilder, TransportError> {
        let mut b = SessionBuilder::default();
        if !t.user.is_empty() {
            b.user(t.user.clone());
        }
        b.port(t.port)
            .keyfile(t.key.clone().unwrap_or_else(|| self.key.clone()))
            .user_known_hosts_file(self.known_hosts_files())
            .known_hosts_check(if accept_new {
                KnownHosts::Add
            } else {
                KnownHosts::Strict
            })
            .connect_timeout(Duration::from_secs(10))
            .server_alive_interval(KEEPALIVE)
            .control_directory(&self.control_dir);
        if let Some(via) = via {
            b.config_file(self.proxy_config(via).map_err(|e| TransportError {
                node: t.label(),
                what: "cannot write the jump host's ssh configuration".into(),
                source: e,
            })?);
        }
        Ok(b)
    }

    /// `UserKnownHostsFile`'s value: gangway's file first (where ssh
    /// writes a new key), then the user's own when it is read too. ssh
    /// splits the value at spaces, so a path with one is left out (and
    /// gangway's own file is always there).
    fn known_hosts_files(&self) -> PathBuf {
        match &self.user_known_hosts {
            Some(user)
                if !user.to_string_lossy().contains(' ')
                    && !self.known_hosts.to_string_lossy().contains(' ') =>
            {
                PathBuf::from(format!("{} {}", self.known_hosts.display(), user.display()))
            }
            _ => self.known_hosts.clone(),
        }
    }

    /// An ssh configuration file whose `ProxyCommand` goes through the
    /// master connection at `via` (a jump host's). With `-F`, the user's
    /// own configuration is not read for nodes behind a jump host.
    fn proxy_config(&self, via: &Path) -> std::io::Result<PathBuf> {
        let via = via.display().to_string();
        let path = self
            .control_dir
            .join(format!("proxy-{:016x}.conf", fnv1a(via.as_bytes())));
        let text = format!(
            "# gangway: reach the node through the jump host's master connection\n\
             ProxyCommand ssh -S {} -o ControlMaster=no -o BatchMode=yes -W '[%h]:%p' jump-host\n",
            sq(&via.replace('%', "%%"))
        );
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &text)?;
            std::fs::rename(&tmp, &path)?;
        }
        Ok(path)
    }

    fn session(&self, t: &SshTarget) -> Option<Arc<Session>> {
        self.sessions.lock().ok()?.get(t).cloned()
    }

    /// The control socket of a node's master connection.
    fn control(&self, node: &NodeRow) -> Result<(SshTarget, PathBuf), TransportError> {
        let t = SshTarget::of(node);
        let s = self.session(&t).ok_or_else(|| TransportError {
            node: name(node),
            what: "not connected".into(),
            source: std::io::Error::other("connect() was not called for this node"),
        })?;
        Ok((t, s.control_socket().to_path_buf()))
    }

    /// `ssh` through the node's master connection, with `remote` as the
    /// command. Bounded ([`BOUNDED`]): should the master be gone (the node
    /// stopped answering), ssh connects on its own and gives up in seconds
    /// rather than after the kernel's minutes of retries.
    fn ssh_command(&self, ctl: &Path, t: &SshTarget, remote: &str) -> std::process::Command {
        let mut c = std::process::Command::new("ssh");
        c.arg("-S")
            .arg(ctl)
            .args(["-o", "ControlMaster=no", "-o", "BatchMode=yes", "-T"])
            .args(BOUNDED)
            .arg("-p")
            .arg(t.port.to_string())
            .arg("-l")
            .arg(&t.user)
            .arg(&t.host)
            .arg("--")
            .arg(remote);
        c
    }

    /// Runs a short command on the node and returns its stdout.
    fn run(
        &self,
        node: &NodeRow,
        remote: &str,
        input: Option<&[u8]>,
    ) -> Result<Vec<u8>, TransportError> {
        let (t, ctl) = self.control(node)?;
        let err = |what: String, source: std::io::Error| TransportError {
            node: name(node),
            what,
            source,
        };
        let mut c = self.ssh_command(&ctl, &t, remote);
        let out = output_with_input(&mut c, input).map_err(|e| err("cannot run ssh".into(), e))?;
        if !out.status.success() {
            return Err(err(
                format!("`{remote}` failed"),
                std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            ));
        }
        Ok(out.stdout)
    }

    /// Uploads with `rsync -a` (the user's files, modes and links as they
    /// are), skipping files whose size and time match.
    fn rsync(&self, node: &NodeRow, from: &str, to: &str) -> Result<(), TransportError> {
        self.rsync_with(node, &["-a"], from, to)
    }

    /// Downloads with `rsync -rlt`: no owner, group, mode bits, devices or
    /// special files come from the node.
    fn rsync_down(&self, node: &NodeRow, from: &str, to: &str) -> Result<(), TransportError> {
        self.rsync_with(node, &["-rlt"], from, to)
    }

    /// Whether files go to and from `node` with rsync: it must be on this
    /// machine (looked up once per process) and on the node (asked once
    /// per machine). Minimal images lack it; then files go as tar streams
    /// over the node's connection instead, and the user is told so once.
    fn has_rsync(&self, node: &NodeRow) -> bool {
        static HERE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let here = *HERE.get_or_init(|| gangway_provider::on_path("rsync"));
        let t = SshTarget::of(node);
        let cached = self.rsync_on.lock().ok().and_then(|m| m.get(&t).copied());
        let there = match cached {
            Some(there) => there,
            None if !here => false,
            None => {
                let said = self.run(
                    node,
                    "command -v rsync >/dev/null 2>&1 && echo yes || echo no",
                    None,
                );
                // A node that cannot be asked is not told apart here: the
                // copy itself will say what went wrong.
                let there = !matches!(&said, Ok(out) if out.starts_with(b"no"));
                if let Ok(mut m) = self.rsync_on.lock() {
                    m.insert(t, there);
                }
                there
            }
        };
        if !(here && there) {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                let missing = if here {
                    format!("on {}", name(node))
                } else {
                    "on this machine".to_string()
                };
                if let Ok(mut notes) = self.notes.lock() {
                    notes.push(format!(
                        "rsync is not installed {missing}: files go as tar streams over SSH \
                         instead (whole files, no skipping of unchanged ones)"
                    ));
                }
            }
        }
        here && there
    }

    /// Uploads `local` as a tar stream into `ssh ... tar -x` (rsync -a's
    /// modes, times and links as links): a directory's contents into
    /// `dest`, a file as `dest` (its directory `parent` exists).
    fn tar_up(
        &self,
        node: &NodeRow,
        local: &Path,
        dest: &str,
        parent: &str,
    ) -> Result<(), TransportError> {
        let (t, ctl) = self.control(node)?;
        let fail = |what: String, source: std::io::Error| TransportError {
            node: name(node),
            what,
            source,
        };
        let (into, member) = if local.is_dir() {
            (dest, None)
        } else {
            let base = dest.rsplit('/').next().unwrap_or(dest);
            (parent, Some(base.to_string()))
        };
        let remote = format!("tar -xpf - -C {}", remote_path(into));
        let mut c = self.ssh_command(&ctl, &t, &remote);
        c.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| fail("cannot run ssh".into(), e))?;
        let stdin = child.stdin.take();
        let local_path = local.to_path_buf();
        let writer = std::thread::spawn(move || -> std::io::Result<()> {
            let Some(stdin) = stdin else {
                return Ok(());
            };
            let mut b = tar::Builder::new(std::io::BufWriter::new(stdin));
            // Links stay links, as with rsync -a.
            b.follow_symlinks(false);
            match member {
                Some(m) => b.append_path_with_name(&local_path, m)?,
                None => b.append_dir_all(".", &local_path)?,
            }
            b.into_inner()?.into_inner().map_err(|e| e.into_error())?;
            Ok(())
        });
        let out = child
            .wait_with_output()
            .map_err(|e| fail("cannot run ssh".into(), e))?;
        let sent = writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the tar writer panicked")));
        if !out.status.success() {
            return Err(fail(
                format!("tar of {} into {dest} failed", local.display()),
                std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            ));
        }
        sent.map_err(|e| fail(format!("cannot pack {}", local.display()), e))
    }

    /// Downloads `path` as a tar stream from `tar -c` on the node, unpacked
    /// by the rules for what a node may send back (no links out, devices
    /// or `..`); a directory the node does not have copies nothing.
    fn tar_down(
        &self,
        node: &NodeRow,
        path: &str,
        dest: &Path,
    ) -> Result<gangway_provider::Skipped, TransportError> {
        use gangway_provider::tree::{unpack_from_command, CommandTarError};
        let p = remote_path(path);
        let remote = format!("if [ -d {p} ]; then tar -cf - -C {p} .; fi");
        let (t, ctl) = self.control(node)?;
        let err = |what: String, source: std::io::Error| TransportError {
            node: name(node),
            what,
            source,
        };
        // Unpacked as it arrives (a checkpoint can be larger than memory),
        // merged only once ssh said the node's tar ended well.
        match unpack_from_command(self.ssh_command(&ctl, &t, &remote), dest) {
            Ok(skipped) => Ok(skipped),
            Err(CommandTarError::Spawn(e)) => Err(err("cannot run ssh".into(), e)),
            Err(CommandTarError::Failed(_, said)) => Err(err(
                format!("`{remote}` failed"),
                std::io::Error::other(said),
            )),
            Err(CommandTarError::Unpack(e)) => {
                Err(err(format!("cannot copy {path} to {}", dest.display()), e))
            }
        }
    }

    fn rsync_with(
        &self,
        node: &NodeRow,
        mode: &[&str],
        from: &str,
        to: &str,
    ) -> Result<(), TransportError> {
        let (t, ctl) = self.control(node)?;
        let rsh = format!(
            "ssh -S {} -o ControlMaster=no -o BatchMode=yes {} -p {} -l {}",
            sq(&ctl.display().to_string()),
            BOUNDED.join(" "),
            t.port,
            sq(&t.user)
        );
        let mut c = std::process::Command::new("rsync");
        // Times kept, so unchanged files are skipped next time. The remote
        // path is quoted by rsync_path for every rsync alike.
        c.args(mode).args(["-e", &rsh]).env("RSYNC_OLD_ARGS", "1");
        let out = c
            .arg(from)
            .arg(to)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| TransportError {
                node: name(node),
                what: "cannot run rsync (is it installed here and on the node?)".into(),
                source: e,
            })?;
        if !out.status.success() {
            return Err(TransportError {
                node: name(node),
                what: format!("rsync {from} {to} failed"),
                source: std::io::Error::other(
                    String::from_utf8_lossy(&out.stderr).trim().to_string(),
                ),
            });
        }
        Ok(())
    }
}

/// FNV-1a, for short stable file names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

/// One hop of a `ProxyJump` value: `[ssh://][user@]host[:port]` or
/// `[user@][v6]:port`. Without a user, ssh's own default applies (the
/// user's ssh configuration, else the local user), as with `ssh -J`; the
/// node's key is offered too. `via`: the hop before, if any.
fn parse_hop(hop: &str, key: Option<PathBuf>, via: Option<&PathBuf>) -> SshTarget {
    let hop = hop.strip_prefix("ssh://").unwrap_or(hop);
    let (user, rest) = match hop.rsplit_once('@') {
        Some((u, h)) => (u.to_string(), h),
        None => (String::new(), hop),
    };
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, after)) => (
                h.to_string(),
                after
                    .strip_prefix(':')
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(22),
            ),
            None => (rest.to_string(), 22),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) if !p.contains(':') => (h.to_string(), p.parse().unwrap_or(22)),
            _ => (rest.to_string(), 22),
        }
    };
    SshTarget {
        host,
        port,
        user,
        key,
        // Hops are told apart by the path that reaches them.
        jump: via.map(|v| v.display().to_string()),
    }
}

/// How long a cloud node that refuses gangway's key is asked again: a
/// fresh VM's guest agent may add the key a little after sshd starts.
/// Machines that were up before (pool hosts, jump hosts) get none.
const DENIED_GRACE: Duration = Duration::from_secs(90);

/// Opens a master connection, retrying with backoff (a booting node's
/// sshd is not up yet) until `deadline`. A host key that does not match,
/// a name that does not resolve, and a key refused for longer than the
/// node's grace ([`DENIED_GRACE`] for cloud VMs) are final. The error says
/// what ssh said and what to do.
async fn connect_with_retry(
    b: SessionBuilder,
    t: SshTarget,
    who: String,
    deadline: tokio::time::Instant,
    facts: ConnectFacts,
    board: Option<Arc<ContactBoard>>,
) -> Result<(SshTarget, Arc<Session>), TransportError> {
    let mut pause = Duration::from_millis(200);
    let mut denied_since: Option<tokio::time::Instant> = None;
    loop {
        // Native multiplexing: commands are sent to the master over its
        // control socket by this process, with no ssh client per command.
        match b.connect_mux(&t.host).await {
            Ok(s) => {
                if let Some(b) = &board {
                    b.set(&who, None);
                }
                return Ok((t, Arc::new(s)));
            }
            Err(e) => {
                let (failure, said) = classify_connect(&e);
                if let Some(b) = &board {
                    b.set(&who, Some(said.clone()));
                }
                let now = tokio::time::Instant::now();
                let fatal = match failure {
                    ConnectFailure::HostKeyChanged
                    | ConnectFailure::HostKeyUnknown
                    | ConnectFailure::NoSuchHost => true,
                    ConnectFailure::Denied => {
                        now.duration_since(*denied_since.get_or_insert(now)) >= facts.denied_grace
                    }
                    _ => false,
                };
                if fatal || now + pause > deadline {
                    let hint = connect_hint(failure, &t, &facts);
                    let why = match hint {
                        Some(h) => format!("{said} (hint: {h})"),
                        None => said,
                    };
                    return Err(TransportError {
                        node: who,
                        what: format!("cannot connect to {}", t.label()),
                        source: std::io::Error::other(why),
                    });
                }
                tracing::info!("waiting for sshd on {}: {said}", t.label());
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

fn name(node: &NodeRow) -> String {
    format!("rank {} ({})", node.rank, SshTarget::of(node).host)
}

/// `host:path` for rsync, the path quoted for the remote shell (relative
/// paths are the home's). rsync before 3.2.4 (and macOS's) hands the remote
/// path to the node's shell, where spaces split it and `$(...)` runs;
/// newer ones protect it unless `RSYNC_OLD_ARGS` is set, which
/// [`SshTransport::rsync_with`] sets: every version then reads the quoted
/// path the same way.
fn rsync_path(t: &SshTarget, p: &str) -> String {
    match p.strip_prefix("~/").unwrap_or(p) {
        // The home itself: rsync's empty remote path.
        "~" | "" => format!("{}:", t.host),
        p => format!("{}:{}", t.host, sq(p)),
    }
}

/// What the hints of a failed connection name (the key gangway offered,
/// the cluster's known_hosts file), and how long a refused key is retried.
#[derive(Clone, Debug)]
struct ConnectFacts {
    key: PathBuf,
    known_hosts: PathBuf,
    denied_grace: Duration,
}

/// Why ssh could not connect, from what it said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnectFailure {
    /// The server refused the key or the user (`Permission denied`).
    Denied,
    /// The host key differs from the one recorded.
    HostKeyChanged,
    /// No host key recorded, and strict checking asked for.
    HostKeyUnknown,
    /// Nothing listens on the port.
    Refused,
    /// No answer in time, or no route.
    Unreachable,
    /// The host name does not resolve.
    NoSuchHost,
    /// Anything else.
    Other,
}

/// Classifies a failed connection and says, in ssh's own words (its
/// stderr, without the banner and the "Permanently added" notices), what
/// happened.
fn classify_connect(e: &openssh::Error) -> (ConnectFailure, String) {
    let full = match e {
        // ssh's stderr is the io error's message.
        openssh::Error::Connect(io) | openssh::Error::Master(io) => io.to_string(),
        other => gangway_provider::error_chain(other),
    };
    let lines: Vec<&str> = full
        .lines()
        .map(|l| l.trim().trim_start_matches("ssh: "))
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with('@')
                && !l.starts_with("Warning: Permanently added")
                && !l.starts_with("Pseudo-terminal")
        })
        .collect();
    let has = |p: &str| full.contains(p);
    let pick = |p: &str| {
        lines
            .iter()
            .find(|l| l.contains(p))
            .map(|l| l.to_string())
            .unwrap_or_else(|| p.to_string())
    };
    let (failure, said) = if has("IDENTIFICATION HAS CHANGED") {
        (
            ConnectFailure::HostKeyChanged,
            changed_key(&full, "the node"),
        )
    } else if has("Host key verification failed") {
        let said = lines
            .iter()
            .find(|l| l.contains("host key is known"))
            .map(|l| format!("{l} Host key verification failed."))
            .unwrap_or_else(|| pick("Host key verification failed"));
        (ConnectFailure::HostKeyUnknown, said)
    } else if has("Permission denied") && !has("connect to host") {
        (ConnectFailure::Denied, pick("Permission denied"))
    } else if has("Connection refused") {
        (ConnectFailure::Refused, pick("Connection refused"))
    } else if has("Could not resolve hostname") || has("Name or service not known") {
        (
            ConnectFailure::NoSuchHost,
            pick("Could not resolve hostname"),
        )
    } else if has("timed out") || has("No route to host") || has("Network is unreachable") {
        let p = ["timed out", "No route to host", "Network is unreachable"]
            .into_iter()
            .find(|p| has(p))
            .unwrap_or("timed out");
        (ConnectFailure::Unreachable, pick(p))
    } else {
        let said = if lines.is_empty() {
            e.to_string()
        } else {
            lines.join("; ")
        };
        (ConnectFailure::Other, said)
    };
    (failure, said)
}

/// What ssh said of a changed host key, with both fingerprints: the one
/// `who` sent (ssh prints it) and the one recorded in the file and line
/// ssh names ("Offending ED25519 key in FILE:LINE"), read back with
/// `ssh-keygen -l`.
pub(crate) fn changed_key(said: &str, who: &str) -> String {
    let sent = said
        .split_whitespace()
        .find(|w| w.starts_with("SHA256:"))
        .map(|w| w.trim_end_matches('.').to_string());
    let offending = said.lines().find_map(|l| {
        let (_, at) = l.split_once(" key in ")?;
        let (file, line) = at.trim().rsplit_once(':')?;
        Some((file.to_string(), line.trim().parse::<usize>().ok()?))
    });
    let recorded = offending.as_ref().and_then(|(file, line)| {
        let text = std::fs::read_to_string(file).ok()?;
        let entry = text.lines().nth(line - 1)?.to_string();
        let mut c = std::process::Command::new("ssh-keygen")
            .args(["-l", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        use std::io::Write as _;
        c.stdin.take()?.write_all(entry.as_bytes()).ok()?;
        let out = c.wait_with_output().ok()?;
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find(|w| w.starts_with("SHA256:"))
            .map(str::to_string)
    });
    let mut out = format!("REMOTE HOST IDENTIFICATION HAS CHANGED: {who} sent a host key");
    if let Some(f) = sent {
        out.push_str(&format!(" with fingerprint {f}"));
    }
    match (&offending, recorded) {
        (Some((file, line)), Some(r)) => {
            out.push_str(&format!(", not the key {r} recorded in {file}:{line}"))
        }
        (Some((file, line)), None) => {
            out.push_str(&format!(", not the key recorded in {file}:{line}"))
        }
        _ => out.push_str(", not the one recorded"),
    }
    out.push_str("; Host key verification failed");
    out
}

/// What to do about a failed connection.
fn connect_hint(failure: ConnectFailure, t: &SshTarget, facts: &ConnectFacts) -> Option<String> {
    let key = facts.key.display();
    let known = facts.known_hosts.display();
    let user = if t.user.is_empty() {
        "ssh's default user".to_string()
    } else {
        format!("user '{}'", t.user)
    };
    Some(match failure {
        ConnectFailure::Denied => format!(
            "the node refused gangway's key for {user}: gangway offers {key}; add its public half \
             ({key}.pub) to that user's ~/.ssh/authorized_keys on the node, or give the key and user \
             that work there (`key:` and `user:` in ssh_pools.yaml, `ssh_user` in the task's config); \
             a locked account or a user the image does not have is refused the same way"
        ),
        ConnectFailure::HostKeyChanged => format!(
            "the node's host key is not the one recorded when a cluster first met it (gangway \
             keeps them in {known}); if the node was really replaced, remove the old entry \
             (`ssh-keygen -R '[{}]:{}' -f FILE`, FILE the one named above) and launch again; \
             otherwise another machine answers at that address",
            t.host, t.port
        ),
        ConnectFailure::HostKeyUnknown => format!(
            "gangway has no host key of this node in {known} and checks strictly after first \
             contact; if the file was lost and the node is yours, `ssh-keyscan -p {} {}` adds it \
             (compare the key with the node's own first)",
            t.port, t.host
        ),
        ConnectFailure::Refused => format!(
            "nothing accepts connections on {}:{}: the node is not up yet (a fresh VM starts sshd \
             late), sshd is not running there, or the port is wrong",
            t.host, t.port
        ),
        ConnectFailure::Unreachable => format!(
            "no answer from {}:{}: the node is not up yet, or a firewall (security group, firewall \
             rule) drops SSH from this machine's address",
            t.host, t.port
        ),
        ConnectFailure::NoSuchHost => format!(
            "the name '{}' does not resolve: check the node's address (ssh_pools.yaml) or your DNS",
            t.host
        ),
        ConnectFailure::Other => return None,
    })
}

#[async_trait::async_trait]
impl Transport for SshTransport {
    async fn connect(&self, nodes: &[NodeRow]) -> Result<(), TransportError> {
        // Jump hosts first: one master per hop, shared by every node
        // behind it, so a bastion sees one connection, not one per node
        // (its sshd's MaxStartups would refuse a crowd of handshakes).
        let mut proxies: HashMap<String, PathBuf> = HashMap::new();
        for node in nodes {
            let t = SshTarget::of(node);
            let Some(spec) = t.jump.clone() else { continue };
            if proxies.contains_key(&spec) || self.session(&t).is_some() {
                continue;
            }
            let mut via: Option<PathBuf> = None;
            for hop in spec.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                let hop_target = parse_hop(hop, t.key.clone(), via.as_ref());
                let session = match self.session(&hop_target) {
                    Some(s) => s,
                    None => {
                        let b = self.builder(&hop_target, self.accepts(node), via.as_deref())?;
                        let who = format!("jump host {hop} (for {})", name(node));
                        let facts = self.facts(&hop_target, false);
                        let (k, s) =
                            connect_with_retry(b, hop_target, who, self.deadline(), facts, None)
                                .await?;
                        if let Ok(mut m) = self.sessions.lock() {
                            m.insert(k, Arc::clone(&s));
                        }
                        s
                    }
                };
                via = Some(session.control_socket().to_path_buf());
            }
            if let Some(v) = via {
                proxies.insert(spec, v);
            }
        }

        let sem = Arc::new(tokio::sync::Semaphore::new(self.max_handshakes));
        let mut tasks = tokio::task::JoinSet::new();
        for node in nodes {
            let t = SshTarget::of(node);
            if self.session(&t).is_some() {
                continue;
            }
            let via = t.jump.as_ref().and_then(|j| proxies.get(j));
            let b = self.builder(&t, self.accepts(node), via.map(PathBuf::as_path))?;
            let who = name(node);
            let sem = Arc::clone(&sem);
            let deadline = self.deadline();
            let facts = self.facts(&t, true);
            let board = self.board.clone();
            if let Some(b) = &board {
                b.set(&who, Some("no answer yet".into()));
            }
            tasks.spawn(async move {
                let _permit = sem.acquire_owned().await;
                connect_with_retry(b, t, who, deadline, facts, board).await
            });
        }
        let mut first_err = None;
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok((t, s))) => {
                    if let Ok(mut m) = self.sessions.lock() {
                        m.insert(t, s);
                    }
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert(TransportError {
                        node: "?".into(),
                        what: "connecting".into(),
                        source: std::io::Error::other(e.to_string()),
                    });
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn spawn(
        &self,
        node: &NodeRow,
        cmd: &NodeCommand,
        output: PipeWriter,
    ) -> Result<NodeProcess, TransportError> {
        let t = SshTarget::of(node);
        let session = self.session(&t).ok_or_else(|| TransportError {
            node: name(node),
            what: "not connected".into(),
            source: std::io::Error::other("connect() was not called for this node"),
        })?;
        let err = |what: &str, source| TransportError {
            node: name(node),
            what: what.to_string(),
            source,
        };
        let token = format!(
            "{}-{}",
            std::process::id(),
            crate::core::state::now_ms() ^ (node.rank as i64) << 40
        );
        let env = self.command_env(node, cmd, &token);
        let wrapper = wrapper(cmd);
        let (env_r, mut env_w) = std::io::pipe().map_err(|e| err("cannot make a pipe", e))?;
        env_w
            .write_all(env.as_bytes())
            .map_err(|e| err("cannot pass the environment", e))?;
        drop(env_w);
        // The wrapper is plain POSIX sh: it runs in the login shell as is.
        // It goes straight to the master over its control socket (the
        // multiplexing protocol, with our pipes passed along): no local
        // ssh process per command.
        //
        // The master gets a pipe of ours, not the caller's: the mux client
        // returns at the exit message and hangs up, and the master then
        // drops whatever output of that session it had not yet written
        // (a command that exits right after printing could lose all of
        // it). So the pump below copies to the caller until the master
        // closes the pipe (the channel drained and closed), and only then
        // is the exit status read.
        let (pump_r, pump_w) = std::io::pipe().map_err(|e| err("cannot make a pipe", e))?;
        let pump_w2 = pump_w
            .try_clone()
            .map_err(|e| err("cannot duplicate the output pipe", e))?;
        let mut c = Arc::clone(&session).arc_raw_command(wrapper);
        c.stdin(openssh::Stdio::from(std::os::fd::OwnedFd::from(env_r)))
            .stdout(openssh::Stdio::from(std::os::fd::OwnedFd::from(pump_w2)))
            .stderr(openssh::Stdio::from(std::os::fd::OwnedFd::from(pump_w)));
        let id = NEXT_PROCESS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut m) = self.remote.lock() {
            m.insert(id, (t.clone(), token));
        }
        let who = t.label();
        // Started now, on the caller's runtime, not when first awaited.
        let rt = tokio::runtime::Handle::try_current().map_err(|e| {
            err(
                "no async runtime to start the command on",
                std::io::Error::other(e),
            )
        })?;
        let started = rt.spawn(run_session(c, pump_r, output, who));
        Ok(NodeProcess::new(id, async move {
            started.await.map_err(std::io::Error::other)?
        }))
    }

    fn signal(&self, node: &NodeRow, pgid: u32, signal: i32) {
        let entry = self.remote.lock().ok().and_then(|m| m.get(&pgid).cloned());
        let Some((_, token)) = entry else {
            return;
        };
        let _ = self.run(node, &signal_token(&token, signal), None);
    }

    fn signal_job(&self, node: &NodeRow, _pgid: u32, job: i64, signal: i32) {
        // Another process started these: find them by their environment,
        // this cluster's of this installation only (run numbers repeat
        // across clusters and installations on a shared machine).
        let remote = gangway_provider::kill_where(
            &[("GANGWAY_RUN", &job.to_string()), (SCOPE_VAR, &self.scope)],
            &gangway_provider::kill_option(signal),
        );
        let _ = self.run(node, &remote, None);
    }

    fn kill_cluster(&self, node: &NodeRow, _cluster: &str) {
        // This cluster's bucket mounts first (listed by scope in
        // ~/.gangway-mounts), so that killing their rclone leaves no dead
        // mount; then every process of the scope.
        let scope = &self.scope;
        let _ = self.probe(
            node,
            &format!(
                "{} {}",
                gangway_provider::release_mounts(scope),
                gangway_provider::kill_where(&[(SCOPE_VAR, scope)], "-9")
            ),
        );
    }

    fn reaped(&self, _node: &NodeRow, pgid: u32) {
        if let Ok(mut m) = self.remote.lock() {
            m.remove(&pgid);
        }
    }

    fn upload(&self, node: &NodeRow, local: &Path, dest: &str) -> Result<(), TransportError> {
        let t = SshTarget::of(node);
        let is_dir = local.is_dir();
        let parent = if is_dir {
            dest.to_string()
        } else {
            dest.rsplit_once('/')
                .map(|(p, _)| p.to_string())
                .unwrap_or_else(|| "~".into())
        };
        self.make_dir(node, &parent)?;
        let from = if is_dir {
            format!("{}/", local.display())
        } else {
            local.display().to_string()
        };
        if !self.has_rsync(node) {
            return self.tar_up(node, local, dest, &parent);
        }
        let to = if is_dir {
            format!("{}/", rsync_path(&t, dest))
        } else {
            rsync_path(&t, dest)
        };
        self.rsync(node, &from, &to)
    }

    fn download(
        &self,
        node: &NodeRow,
        path: &str,
        dest: &Path,
    ) -> Result<gangway_provider::Skipped, TransportError> {
        let t = SshTarget::of(node);
        let fail = |what: String, source: std::io::Error| TransportError {
            node: name(node),
            what,
            source,
        };
        std::fs::create_dir_all(dest)
            .map_err(|e| fail(format!("cannot create {}", dest.display()), e))?;
        if !self.has_rsync(node) {
            return self.tar_down(node, path, dest);
        }
        // The node's tree lands in a staging directory of its own first
        // (rsync -rlt: links as links, no owner, mode bits or devices),
        // then the merge applies the rules for what a node may send back.
        let staging = gangway_provider::tree::tempdir_beside(dest)
            .map_err(|e| fail("cannot make a temporary directory".into(), e))?;
        let copied = self
            .rsync_down(
                node,
                &format!("{}/", rsync_path(&t, path)),
                &format!("{}/", staging.display()),
            )
            .or_else(|e| {
                // A directory the job never made (on this node) copies
                // nothing.
                let p = remote_path(path);
                let asked = format!("if [ -e {p} ]; then echo present; else echo absent; fi");
                match self.run(node, &asked, None) {
                    Ok(out) if out.starts_with(b"absent") => Ok(()),
                    _ => Err(e),
                }
            })
            .and_then(|()| {
                gangway_provider::merge_newest(&staging, dest)
                    .map_err(|e| fail(format!("cannot merge into {}", dest.display()), e))
            });
        let _ = std::fs::remove_dir_all(&staging);
        copied
    }

    fn write_file(&self, node: &NodeRow, path: &str, data: &[u8]) -> Result<(), TransportError> {
        let p = remote_path(path);
        self.run(
            node,
            &format!("cat > {p}.tmp && mv {p}.tmp {p}"),
            Some(data),
        )
        .map(|_| ())
    }

    fn take_notes(&self) -> Vec<String> {
        self.notes
            .lock()
            .map(|mut n| std::mem::take(&mut *n))
            .unwrap_or_default()
    }

    fn explain_exit(&self, status: &std::process::ExitStatus) -> Option<String> {
        (status.code() == Some(255)).then(|| {
            "exited with code 255: the SSH connection was lost (the node stopped answering \
             keepalives, or its sshd went away), unless the command itself exits 255"
                .to_string()
        })
    }

    fn probe(&self, node: &NodeRow, script: &str) -> Result<String, TransportError> {
        let out = self.run(node, script, None)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn preemption_notice(&self, node: &NodeRow) -> Option<String> {
        // Only nodes whose provider has a command for them are asked
        // (spot nodes of a cloud with notices): nothing else costs an SSH
        // call. A probe that fails reads as no notice.
        let remote = self.notices.as_ref().and_then(|probe| probe(node))?;
        parse_notice(&self.probe(node, &remote).ok()?)
    }

    fn make_dir(&self, node: &NodeRow, path: &str) -> Result<(), TransportError> {
        self.run(node, &format!("mkdir -p {}", remote_path(path)), None)
            .map(|_| ())
    }

    fn node_path(&self, _node: &NodeRow, path: &str) -> String {
        if path.starts_with('/') || path.starts_with('~') {
            path.to_string()
        } else {
            format!("~/{path}")
        }
    }
}

/// The command line a node runs for a command: the environment from stdin,
/// the working directory, then the script as its own session and process
/// group (`setsid` in a background child, which is never a group leader,
/// so no fork). No pid file: a command is one fork and two execs on the
/// node, and nothing is left behind when the connection drops. Plain
/// POSIX sh: it runs in the login shell as is.
fn wrapper(cmd: &NodeCommand) -> String {
    format!(
        ". /dev/stdin; cd {cwd} 2>/dev/null || cd; \
         setsid bash -c {script} </dev/null & wait $!",
        cwd = remote_path(&cmd.cwd),
        script = sq(&cmd.script),
    )
}

/// Starts a command over the master and waits for it: its output copied to
/// `output` until the master closes the pipe, then its exit status (255
/// when the connection went away, 127 for a command not found).
async fn run_session(
    mut c: openssh::OwningCommand<Arc<openssh::Session>>,
    pump_r: std::io::PipeReader,
    output: PipeWriter,
    who: String,
) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let code = |c: i32| std::process::ExitStatus::from_raw(c << 8);
    let spawned = c.spawn().await;
    // Our copies of the pipe's write end go with the command: from here
    // only the master holds it.
    drop(c);
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            tracing::debug!("{who}: cannot start the command: {e}");
            return Ok(code(255));
        }
    };
    let pumped = tokio::task::spawn_blocking(move || {
        let (mut from, mut to) = (pump_r, output);
        let _ = std::io::copy(&mut from, &mut to);
    });
    let _ = pumped.await;
    match child.wait().await {
        Ok(status) => Ok(status),
        // The crate reads exit code 127 as "not found": give it back.
        Err(openssh::Error::Remote(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(code(127)),
        // No exit status: the connection (or the master) went away.
        Err(e) => {
            tracing::debug!("{who}: the command's session ended without a status: {e}");
            Ok(code(255))
        }
    }
}

/// What ssh adds to the control directory for a master's socket:
/// openssh's `/.ssh-connectionXXXXXX/master`, and the `.` and 16 random
/// characters ssh binds first and renames.
const SOCKET_SUFFIX: usize = "/.ssh-connectionXXXXXX/master.XXXXXXXXXXXXXXXX".len();
/// The longest path a Unix socket address holds (`sun_path` less its NUL;
/// 104 on macOS, 108 on Linux).
const SOCKET_PATH_MAX: usize = 103;

/// Where the master connections' sockets go: `$GANGWAY_HOME/ssh/ctl`, or,
/// when that is too long for a socket address (ssh then fails every
/// connection with "ControlPath too long", and a first contact would wait
/// out its whole timeout), a private directory of this home's own under
/// `/tmp/gangway-<uid>/`, made 0700 and used only when it is this user's
/// and nobody else's.
/// Options of every ssh command run beside a master connection: when it
/// connects on its own (the master went with its node), it gives up after
/// 10 s, and a connection that stops answering ends after 3 missed
/// keepalives 5 s apart, so a checkpoint copy or a signal to a node that
/// is gone never holds up a recovery for the kernel's minutes of retries.
const BOUNDED: &[&str] = &[
    "-o",
    "ConnectTimeout=10",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
];

fn control_dir(home: &Path) -> PathBuf {
    let own = home.join("ssh").join("ctl");
    if own.as_os_str().len() + SOCKET_SUFFIX <= SOCKET_PATH_MAX {
        return own;
    }
    short_control_dir(Path::new("/tmp"), home).unwrap_or(own)
}

/// `<base>/gangway-<uid>/<hash of home>`, private to this user (0700,
/// owned by them, not a link); `None` where it cannot be made so.
fn short_control_dir(base: &Path, home: &Path) -> Option<PathBuf> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::path::absolute(home)
        .unwrap_or_else(|_| home.to_path_buf())
        .hash(&mut h);
    let user_dir = base.join(format!("gangway-{uid}"));
    let dir = user_dir.join(format!("{:016x}", h.finish()));
    for d in [&user_dir, &dir] {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(d);
        let m = std::fs::symlink_metadata(d).ok()?;
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
            return None;
        }
    }
    Some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_and_tildes() {
        assert_eq!(sq("a'b"), r"'a'\''b'");
        assert_eq!(remote_path("~/x y"), "\"$HOME\"/'x y'");
        assert_eq!(remote_path("/abs"), "'/abs'");
    }

    #[test]
    fn a_key_others_can_read_is_refused_and_a_new_one_is_0600() {
        let d = tempfile::tempdir().unwrap();
        let key = ensure_key(d.path()).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // The same key comes back.
        assert_eq!(ensure_key(d.path()).unwrap(), key);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ensure_key(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("can be read by others") && e.contains("chmod 600"),
            "{e}"
        );
    }

    fn node_with(facts: &[(&str, &str)]) -> NodeRow {
        NodeRow {
            rank: 0,
            instance_id: "i-0".into(),
            private_ip: "10.0.0.1".into(),
            public_ip: None,
            zone: "us-east-1a".into(),
            topology: String::new(),
            state: "running".into(),
            extra: facts
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn only_nodes_the_provider_has_a_probe_for_are_asked_for_a_notice() {
        // Not connected to anything: a probe would be an error, which also
        // reads as no notice; the counter shows whether one was asked for.
        let home = tempfile::tempdir().unwrap();
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::clone(&asked);
        let t = SshTransport::new(home.path(), "c", false)
            .unwrap()
            .with_notice_probe(Arc::new(move |n: &NodeRow| {
                seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (n.fact("market") == "spot").then(|| "true".to_string())
            }));
        assert_eq!(
            t.preemption_notice(&node_with(&[("market", "on-demand")])),
            None
        );
        assert_eq!(t.preemption_notice(&node_with(&[("market", "spot")])), None);
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 2);
        // Without a provider's probe nothing is asked.
        let plain = SshTransport::new(home.path(), "c", false).unwrap();
        assert_eq!(
            plain.preemption_notice(&node_with(&[("market", "spot")])),
            None
        );
    }

    #[test]
    fn jump_hops_parse_like_ssh_does() {
        let k = Some(PathBuf::from("/k"));
        let h = parse_hop("bastion", k.clone(), None);
        assert_eq!(
            (
                h.user.as_str(),
                h.host.as_str(),
                h.port,
                h.key.clone(),
                h.jump.clone()
            ),
            ("", "bastion", 22, k.clone(), None)
        );
        assert_eq!(h.label(), "bastion:22");
        let via = PathBuf::from("/ctl/master");
        let h = parse_hop("ssh://ops@10.0.0.5:2222", None, Some(&via));
        assert_eq!(
            (h.user.as_str(), h.host.as_str(), h.port),
            ("ops", "10.0.0.5", 2222)
        );
        assert_eq!(h.jump.as_deref(), Some("/ctl/master"));
        let h = parse_hop("me@[fd00::1]:2200", None, None);
        assert_eq!((h.host.as_str(), h.port), ("fd00::1", 2200));
        let h = parse_hop("fd00::2", None, None);
        assert_eq!((h.host.as_str(), h.port), ("fd00::2", 22));
    }

    #[test]
    fn a_proxy_config_goes_through_the_jump_hosts_master() {
        let home = tempfile::tempdir().unwrap();
        let t = SshTransport::new(home.path(), "c", false).unwrap();
        let p = t.proxy_config(Path::new("/x/it's 100%/master")).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.contains(r"ProxyCommand ssh -S '/x/it'\''s 100%%/master' -o ControlMaster=no"),
            "{text}"
        );
        assert!(text.contains("-W '[%h]:%p'"), "{text}");
        // The same socket, the same file.
        assert_eq!(t.proxy_config(Path::new("/x/it's 100%/master")).unwrap(), p);
    }

    #[test]
    fn targets_come_from_the_nodes_facts() {
        let mut n = NodeRow {
            rank: 0,
            instance_id: "i".into(),
            private_ip: "10.0.0.1".into(),
            public_ip: Some("1.2.3.4".into()),
            zone: "z".into(),
            topology: String::new(),
            state: "running".into(),
            extra: Default::default(),
        };
        let t = SshTarget::of(&n);
        assert_eq!(
            (t.host.as_str(), t.port, t.user.as_str()),
            ("1.2.3.4", 22, "root")
        );
        n.extra.insert("ssh.host".into(), "gpu7".into());
        n.extra.insert("ssh.port".into(), "2222".into());
        n.extra.insert("ssh.user".into(), "ubuntu".into());
        n.extra.insert("ssh.jump".into(), "bastion".into());
        let t = SshTarget::of(&n);
        assert_eq!(
            (t.host.as_str(), t.port, t.user.as_str()),
            ("gpu7", 2222, "ubuntu")
        );
        assert_eq!(t.jump.as_deref(), Some("bastion"));
    }

    /// A connect error as the openssh crate builds it from ssh's stderr.
    fn connect_err(stderr: &str) -> openssh::Error {
        openssh::Error::Connect(std::io::Error::other(stderr.to_string()))
    }

    #[test]
    fn what_ssh_said_is_kept_and_classified() {
        let cases = [
            (
                "Warning: Permanently added '[127.0.30.1]:2222' (ED25519) to the list of known hosts.\r\n\
                 root@127.0.30.1: Permission denied (publickey).",
                ConnectFailure::Denied,
                "root@127.0.30.1: Permission denied (publickey).",
            ),
            (
                "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n\
                 @    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n\
                 @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n\
                 IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n\
                 Host key verification failed.",
                ConnectFailure::HostKeyChanged,
                "REMOTE HOST IDENTIFICATION HAS CHANGED: the node sent a host key, not the one recorded; Host key verification failed",
            ),
            (
                "No ED25519 host key is known for [10.0.0.5]:22 and you have requested strict checking.\n\
                 Host key verification failed.",
                ConnectFailure::HostKeyUnknown,
                "No ED25519 host key is known for [10.0.0.5]:22 and you have requested strict checking. Host key verification failed.",
            ),
            (
                "ssh: connect to host 127.0.30.1 port 2222: Connection refused",
                ConnectFailure::Refused,
                "connect to host 127.0.30.1 port 2222: Connection refused",
            ),
            (
                "ssh: connect to host 10.1.2.3 port 22: Connection timed out",
                ConnectFailure::Unreachable,
                "connect to host 10.1.2.3 port 22: Connection timed out",
            ),
            (
                "ssh: connect to host 10.1.2.3 port 22: Permission denied",
                ConnectFailure::Other,
                "connect to host 10.1.2.3 port 22: Permission denied",
            ),
            (
                "ssh: Could not resolve hostname gpu9: Name or service not known",
                ConnectFailure::NoSuchHost,
                "Could not resolve hostname gpu9: Name or service not known",
            ),
        ];
        for (stderr, failure, said) in cases {
            assert_eq!(
                classify_connect(&connect_err(stderr)),
                (failure, said.to_string()),
                "{stderr}"
            );
        }
    }

    #[test]
    fn each_failure_gets_the_hint_that_fits() {
        let t = SshTarget {
            host: "10.0.0.5".into(),
            port: 22,
            user: "ubuntu".into(),
            key: None,
            jump: None,
        };
        let facts = ConnectFacts {
            key: "/h/ssh/id_ed25519".into(),
            known_hosts: "/h/ssh/known_hosts/c1".into(),
            denied_grace: Duration::ZERO,
        };
        let hint = |f| connect_hint(f, &t, &facts).unwrap_or_default();
        let denied = hint(ConnectFailure::Denied);
        assert!(
            denied.contains("/h/ssh/id_ed25519.pub") && denied.contains("user 'ubuntu'"),
            "{denied}"
        );
        assert!(hint(ConnectFailure::HostKeyChanged).contains("/h/ssh/known_hosts/c1"));
        assert!(hint(ConnectFailure::HostKeyUnknown).contains("/h/ssh/known_hosts/c1"));
        assert!(hint(ConnectFailure::Refused).contains("not up yet"));
        assert!(hint(ConnectFailure::Unreachable).contains("firewall"));
        assert!(hint(ConnectFailure::NoSuchHost).contains("does not resolve"));
        for f in [
            ConnectFailure::Denied,
            ConnectFailure::HostKeyChanged,
            ConnectFailure::Refused,
        ] {
            assert!(!hint(f).contains("zone"), "no capacity talk: {}", hint(f));
        }
        assert_eq!(connect_hint(ConnectFailure::Other, &t, &facts), None);
    }

    #[test]
    fn a_long_home_gets_a_short_private_control_directory() {
        let short = Path::new("/home/ada/.gangway");
        assert_eq!(control_dir(short), short.join("ssh").join("ctl"));
        let long = Path::new("/tmp/gw-replace-bench-abcdefgh/aws-REPLACE_LOST_NODES-abcdefgh");
        let dir = control_dir(long);
        assert!(
            dir.as_os_str().len() + SOCKET_SUFFIX <= SOCKET_PATH_MAX,
            "{}",
            dir.display()
        );
        assert_ne!(
            dir,
            control_dir(Path::new("/tmp/another-long-home-of-the-same-user/x"))
        );
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // A directory someone else could write into is not used.
        let base = tempfile::tempdir().unwrap();
        // SAFETY: getuid(2) cannot fail.
        let uid = unsafe { libc::getuid() };
        let open = base.path().join(format!("gangway-{uid}"));
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(short_control_dir(base.path(), long), None);
    }
}
