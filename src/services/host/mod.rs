//! A managed-job controller on another machine: `jobs.controller` names an
//! SSH host, and every `gangway jobs` command runs there, in gangway's own
//! binary, over one SSH master connection kept open between commands.
//!
//! The host keeps everything under `~/.gangway-controller`: `bin/gangway`
//! (this machine's own binary when the platforms match, else the build
//! `jobs.controller_binary` names), `bin/stamp` (the SHA-256 of the laptop
//! binary it stands for) and `home/` (its `GANGWAY_HOME`: the state
//! database, job logs, checkpoints kept there). Each command is one `ssh`
//! whose remote shell first compares the stamp with this binary's hash:
//! a mismatch answers [`INSTALL_EXIT`] and the platform, and this side
//! installs (replacing the old binary and stopping its controller, never
//! running two versions on one state) and runs the command again. Nothing
//! of the job is decided here: the host's answer is printed as it comes.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::Error;

pub(crate) mod cloud;

/// What the host's shell exits with when its binary is not this one's.
const INSTALL_EXIT: i32 = 97;
/// The line it prints then, followed by `uname -s` and `uname -m`.
const INSTALL_MARK: &str = "gangway-controller-install-needed";
/// What `ssh` exits with when it could not connect or log in.
const SSH_FAILED: i32 = 255;
/// The environment variable that tells a gangway it is the hosted one.
pub(crate) const HOSTED_ENV: &str = "GANGWAY_HOSTED_CONTROLLER";
/// `jobs.controller`'s value for "on this machine" (the default): a
/// place, not a provider, though the local cloud shares the word.
pub(crate) const THIS_MACHINE: &str = "local";
/// The controller host given in the environment, over config.yaml.
const CONTROLLER_ENV: &str = "GANGWAY_JOBS_CONTROLLER";

/// An SSH host the controller runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Host {
    /// Name or address.
    pub(crate) host: String,
    /// Login user (`ssh`'s default when `None`).
    pub(crate) user: Option<String>,
    /// Port (22 when `None`).
    pub(crate) port: Option<u16>,
    /// Private key (your ssh agent and configuration when `None`).
    pub(crate) identity_file: Option<PathBuf>,
    /// A gangway build for the host's platform, when it is not this
    /// machine's (a macOS laptop driving a Linux host).
    pub(crate) binary: Option<PathBuf>,
}

impl Host {
    /// `user@host:port`, as messages name it.
    pub(crate) fn address(&self) -> String {
        let mut s = String::new();
        if let Some(u) = &self.user {
            s.push_str(u);
            s.push('@');
        }
        s.push_str(&self.host);
        if let Some(p) = self.port {
            s.push_str(&format!(":{p}"));
        }
        s
    }

    /// `[user@]host[:port]`.
    fn parse_address(text: &str) -> Option<Host> {
        let text = text.trim();
        let (user, rest) = match text.split_once('@') {
            Some((u, r)) if !u.is_empty() => (Some(u.to_string()), r),
            Some(_) => return None,
            None => (None, text),
        };
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (h, Some(p.parse::<u16>().ok()?)),
            None => (rest, None),
        };
        if host.is_empty() || host.contains(char::is_whitespace) || host.starts_with('-') {
            return None;
        }
        Some(Host {
            host: host.to_string(),
            user,
            port,
            identity_file: None,
            binary: None,
        })
    }
}

/// Where `jobs.controller` puts the controller.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Place {
    /// An SSH host the user has.
    Ssh(Host),
    /// A cloud VM gangway provisions, stops when idle and starts again.
    Cloud(cloud::CloudHost),
}

/// `jobs.controller`: the task's `config.jobs.controller` (for a job
/// whose task names its own), else the environment, else
/// `$GANGWAY_HOME/config.yaml`; `None` for `local` (the default) and on
/// the hosted side itself.
pub(crate) fn configured_for(
    home: &Path,
    task_config: Option<&Value>,
) -> Result<Option<Place>, Error> {
    if std::env::var_os(HOSTED_ENV).is_some() {
        return Ok(None);
    }
    let bad = |what: String| {
        Error::usage(
            what,
            Some(
                "write jobs: {controller: local} or jobs: {controller: user@host:port}, or \
                 jobs: {controller: {host: H, user: U, port: P, identity_file: KEY}}, or \
                 jobs: {controller: {cloud: aws, remote_identity: NAME}} (docs/managed-jobs.md)",
            ),
        )
    };
    let config = crate::core::config::user_config(home)?;
    let section = config
        .as_ref()
        .map(|c| c["jobs"].clone())
        .unwrap_or(Value::Null);
    let from_env = std::env::var(CONTROLLER_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let from_task = task_config
        .map(|c| c["jobs"]["controller"].clone())
        .filter(|v| !v.is_null());
    let (value, origin) = match (from_task, &from_env, &section["controller"]) {
        (Some(v), _, _) => (v, "the task's config.jobs.controller".to_string()),
        (None, Some(v), _) => (Value::String(v.clone()), CONTROLLER_ENV.to_string()),
        (None, None, v) => (
            v.clone(),
            format!("{}: jobs.controller", home.join("config.yaml").display()),
        ),
    };
    let mut host = match &value {
        Value::Null => return Ok(None),
        Value::String(s) if s.trim() == THIS_MACHINE => return Ok(None),
        Value::String(s) if cloud::is_cloud(s.trim()) => {
            return cloud::CloudHost::from_word(s.trim()).map(|c| Some(Place::Cloud(c)))
        }
        Value::Object(m) if m.contains_key("cloud") => {
            return cloud::CloudHost::from_map(m, &origin)
                .map(|c| Some(Place::Cloud(c)))
                .map_err(bad)
        }
        Value::String(s) if s.contains('/') => {
            let (provider, region) = s.trim().split_once('/').unwrap_or_default();
            let e = crate::core::registry::Providers::new(home)
                .get(provider)
                .and_then(|p| p.configured_host(region))
                .ok_or_else(|| {
                    bad(format!(
                        "{origin}: '{s}' names no machine (PROVIDER/POOL: the first host of an SSH pool in ssh_pools.yaml)"
                    ))
                })?;
            if e.jump.is_some() {
                return Err(bad(format!(
                    "{origin}: the first host of '{s}' is reached through a jump host, which a controller host cannot be yet"
                )));
            }
            Host {
                host: e.host,
                user: (!e.user.is_empty()).then_some(e.user),
                port: Some(e.port),
                identity_file: e.key,
                binary: None,
            }
        }
        Value::String(s) => Host::parse_address(s)
            .ok_or_else(|| bad(format!("{origin}: '{s}' is not local or user@host[:port]")))?,
        Value::Object(m) => {
            for k in m.keys() {
                if !["host", "user", "port", "identity_file"].contains(&k.as_str()) {
                    return Err(bad(format!("{origin}: unknown key '{k}'")));
                }
            }
            let host = m["host"]
                .as_str()
                .and_then(Host::parse_address)
                .ok_or_else(|| bad(format!("{origin}.host: a host name or address is needed")))?;
            let port = match &m.get("port") {
                None => host.port,
                Some(p) => Some(
                    p.as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .ok_or_else(|| bad(format!("{origin}.port: {p} is not a port")))?,
                ),
            };
            Host {
                user: m.get("user").and_then(Value::as_str).map(str::to_string),
                port,
                identity_file: m
                    .get("identity_file")
                    .and_then(Value::as_str)
                    .map(|p| PathBuf::from(gangway_yaml::expand_home(p))),
                ..host
            }
        }
        other => return Err(bad(format!("{origin}: {other} is not a host"))),
    };
    host.binary = section["controller_binary"]
        .as_str()
        .map(|p| PathBuf::from(gangway_yaml::expand_home(p)));
    Ok(Some(Place::Ssh(host)))
}

/// Quotes a word for the remote POSIX shell.
fn sh(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The host, as this machine talks to it.
pub(crate) struct Hosted {
    host: Host,
    /// `$GANGWAY_HOME/ssh` here: known hosts and the master's socket.
    ssh_dir: PathBuf,
    /// SHA-256 of this binary (hex).
    stamp: String,
    /// The host keys it is checked against: `ssh/known_hosts_controller`
    /// for an SSH host, one file per cloud host (a new VM has new keys).
    known_hosts: PathBuf,
    /// Variables the host's gangway runs with (a cloud host's idle time
    /// and how it stops itself).
    remote_env: Vec<(String, String)>,
    /// The cloud host's cluster, when gangway provisioned the host.
    pub(crate) cluster: Option<String>,
    /// This machine's `$GANGWAY_HOME` and the cloud host's configuration,
    /// to reach it again when it went away under a command.
    cloud: Option<(PathBuf, cloud::CloudHost)>,
}

/// What ssh (and gangway's error after it) says of a host key that is not
/// the one recorded.
const CHANGED_KEY: &str = "IDENTIFICATION HAS CHANGED";

/// Writes a remote command's standard input as the command reads it.
pub(crate) type Feed<'a> = &'a dyn Fn(&mut dyn std::io::Write) -> std::io::Result<()>;

/// How a remote command's standard input is fed.
pub(crate) enum Input<'a> {
    /// Nothing (`/dev/null`).
    Nothing,
    /// What this writes as the command reads, then end of file (called
    /// again should the command be tried again).
    Written(Feed<'a>),
}

impl Hosted {
    /// The configured host, or `None` for a local controller.
    /// A cloud host is provisioned, or started when it stopped itself,
    /// before this returns (see [`cloud::reach`]).
    pub(crate) fn configured(home: &Path) -> Result<Option<Hosted>, Error> {
        Hosted::configured_for(home, None)
    }

    /// [`Hosted::configured`] for a job whose task may name its own
    /// controller (`config.jobs.controller`).
    pub(crate) fn configured_for(
        home: &Path,
        task_config: Option<&Value>,
    ) -> Result<Option<Hosted>, Error> {
        match configured_for(home, task_config)? {
            None => Ok(None),
            Some(Place::Ssh(host)) => Ok(Some(Hosted::new(home, host)?)),
            Some(Place::Cloud(c)) => cloud::reach(home, &c).map(Some),
        }
    }

    /// The host `host`, checked against gangway's own known hosts.
    pub(crate) fn new(home: &Path, host: Host) -> Result<Hosted, Error> {
        Ok(Hosted {
            host,
            ssh_dir: home.join("ssh"),
            stamp: self_hash(home)?,
            known_hosts: home.join("ssh").join("known_hosts_controller"),
            remote_env: Vec::new(),
            cluster: None,
            cloud: None,
        })
    }

    /// The same host, its keys kept in `known_hosts`, its gangway run with
    /// `env`, standing for the cluster `cluster`.
    pub(crate) fn for_cluster(
        mut self,
        cluster: &str,
        known_hosts: PathBuf,
        env: Vec<(String, String)>,
    ) -> Hosted {
        self.cluster = Some(cluster.to_string());
        self.known_hosts = known_hosts;
        self.remote_env = env;
        self
    }

    /// The same host, reached again through [`cloud::reach`]
    /// when it goes away under a command.
    pub(crate) fn reached_by(mut self, home: &Path, cloud: &cloud::CloudHost) -> Hosted {
        self.cloud = Some((home.to_path_buf(), cloud.clone()));
        self
    }

    /// Whether this machine's master connection to the host is open (a
    /// local check through its socket, no round trip): a host that
    /// stopped or went away has dropped it.
    pub(crate) fn master_alive(&self) -> bool {
        let mut c = self.ssh();
        c.args(["-O", "check"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c.status().is_ok_and(|s| s.success())
    }

    /// Waits until `true` runs on the host (a VM just started or made),
    /// up to `limit`; the last failure otherwise.
    pub(crate) fn wait_reachable(&self, limit: std::time::Duration) -> Result<(), Error> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let r = self.exchange("true".to_string(), None, Some(&mut Vec::new()));
            match r {
                Ok(_) => return Ok(()),
                // A key that is not the pinned one does not change by waiting.
                Err(e) if e.to_string().contains(CHANGED_KEY) => return Err(e),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(std::time::Duration::from_secs(2)),
            }
        }
    }

    /// `user@host:port`.
    pub(crate) fn address(&self) -> String {
        self.host.address()
    }

    /// `ssh` to the host, options set, ready for the remote command. One
    /// master connection is shared by every command and kept 10 minutes
    /// after the last (`ControlPersist`), so a command costs one round
    /// trip once it is open. `BatchMode`: never a prompt. Host keys: your
    /// `~/.ssh/known_hosts` is checked; a host found in neither it nor
    /// gangway's file (`ssh/known_hosts_controller`, or the cloud host's
    /// own, where its keys were pinned from the provider) is recorded there
    /// on first contact, then checked strictly. A cloud host is looked up
    /// by its cluster's name (`HostKeyAlias`).
    fn ssh(&self) -> Command {
        let ctl = self.ssh_dir.join("ctl");
        let _ = std::fs::create_dir_all(&ctl);
        let mut c = Command::new("ssh");
        c.args(["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15"])
            .args(["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"])
            .args(["-o", "ControlMaster=auto", "-o", "ControlPersist=600"])
            .args(["-o", "StrictHostKeyChecking=accept-new"])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={} %d/.ssh/known_hosts",
                self.known_hosts.display()
            ))
            .arg("-o")
            .arg(format!("ControlPath={}/ctrl-%C", ctl.display()));
        // A cloud host's keys are kept under its cluster's name, not its
        // address (a new one at every start): pinned once, checked at
        // every address it gets.
        if let Some(cluster) = &self.cluster {
            c.arg("-o").arg(format!("HostKeyAlias={cluster}"));
        }
        if let Some(p) = self.host.port {
            c.arg("-p").arg(p.to_string());
        }
        if let Some(u) = &self.host.user {
            c.arg("-l").arg(u);
        }
        if let Some(k) = &self.host.identity_file {
            c.arg("-o").arg("IdentitiesOnly=yes").arg("-i").arg(k);
        }
        c.arg(&self.host.host);
        c
    }

    /// The remote shell command that runs `gangway ARGS` on the host, if
    /// its binary is this one's.
    fn remote(&self, args: &[String]) -> String {
        let words: Vec<String> = args.iter().map(|a| sh(a)).collect();
        format!(
            "D=\"$HOME/.gangway-controller\"; \
             if [ \"$(cat \"$D/bin/stamp\" 2>/dev/null)\" != {stamp} ]; then \
             echo \"{INSTALL_MARK} $(uname -s) $(uname -m)\" >&2; exit {INSTALL_EXIT}; fi; \
             GANGWAY_HOME=\"$D/home\" {HOSTED_ENV}={addr} {env}exec \"$D/bin/gangway\" {args}",
            stamp = sh(&self.stamp),
            addr = sh(&self.address()),
            env = self
                .remote_env
                .iter()
                .map(|(k, v)| format!("{k}={} ", sh(v)))
                .collect::<String>(),
            args = words.join(" "),
        )
    }

    /// Runs `gangway ARGS` on the host: its stdout and stderr are passed
    /// through as they come, its exit code is returned. Installs the binary
    /// first when the host's is not this one's.
    pub(crate) fn run(&self, args: &[String], input: Input<'_>) -> Result<i32, Error> {
        self.run_into(args, &input, None)
    }

    /// Like [`Hosted::run`], with stdout captured instead of printed.
    pub(crate) fn output(
        &self,
        args: &[String],
        input: Input<'_>,
    ) -> Result<(i32, Vec<u8>), Error> {
        let mut out = Vec::new();
        let code = self.run_into(args, &input, Some(&mut out))?;
        Ok((code, out))
    }

    fn run_into(
        &self,
        args: &[String],
        input: &Input<'_>,
        mut out: Option<&mut Vec<u8>>,
    ) -> Result<i32, Error> {
        let first = self.run_here(args, input, out.as_deref_mut());
        // A cloud host that stopped itself while this machine's master
        // connection still looked open (ssh notices within 15 s): ask its
        // provider, start it, and run the command once more. Not for a
        // command fed on stdin (a submission): it may have arrived.
        let (Err(Error::Unreachable { .. }), Some((home, cloud)), Input::Nothing) =
            (&first, &self.cloud, input)
        else {
            return first;
        };
        self.close_master();
        let again = cloud::reach(home, cloud)?;
        again.run_here(args, input, out)
    }

    /// Closes this machine's master connection to the host, if open.
    fn close_master(&self) {
        let mut c = self.ssh();
        c.args(["-O", "exit"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = c.status();
    }

    fn run_here(
        &self,
        args: &[String],
        input: &Input<'_>,
        mut out: Option<&mut Vec<u8>>,
    ) -> Result<i32, Error> {
        for round in 0..2 {
            match self.attempt_into(args, input, out.as_deref_mut())? {
                Attempt::Done(code) => return Ok(code),
                Attempt::Install { os, arch } if round == 0 => self.install(&os, &arch)?,
                Attempt::Install { .. } => break,
            }
        }
        Err(Error::usage(
            format!(
                "the controller host {} still has another gangway after installing this one",
                self.address()
            ),
            Some("check that ~/.gangway-controller on the host is writable"),
        ))
    }

    fn attempt_into(
        &self,
        args: &[String],
        input: &Input<'_>,
        out: Option<&mut Vec<u8>>,
    ) -> Result<Attempt, Error> {
        let stdin = match input {
            Input::Nothing => None,
            Input::Written(f) => Some(*f),
        };
        let (code, install) = self.exchange(self.remote(args), stdin, out)?;
        let code = code.unwrap_or(128 + 2);
        match install {
            Some((os, arch)) if code == INSTALL_EXIT => Ok(Attempt::Install { os, arch }),
            _ => Ok(Attempt::Done(code)),
        }
    }

    /// One `ssh` to the host running `remote`: `stdin` fed to it (else
    /// `/dev/null`), its stdout into `out` (else ours), its stderr relayed
    /// to ours as it comes. Returns its exit code (`None`: killed by a
    /// signal) and the install mark, if the host printed one; ssh's own
    /// failure to connect or log in is the unreachable error.
    fn exchange(
        &self,
        remote: String,
        stdin: Option<Feed<'_>>,
        out: Option<&mut Vec<u8>>,
    ) -> Result<(Option<i32>, Option<Platform>), Error> {
        let mut c = self.ssh();
        c.arg(remote)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(if out.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| {
            Error::usage(
                format!("cannot run ssh to reach the controller host: {e}"),
                Some("install OpenSSH's client (ssh)"),
            )
        })?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let relay = std::thread::spawn(move || relay_stderr(stderr));
        let mut fed = Ok(());
        if let (Some(feed), Some(mut w)) = (stdin, child.stdin.take()) {
            // A host that refuses early closes the pipe: its answer says why.
            fed = feed(&mut w);
            if fed.is_err() {
                // Cut short here: the host refuses what lacks its end.
                drop(w);
            }
        }
        if let (Some(out), Some(mut r)) = (out, child.stdout.take()) {
            r.read_to_end(out)?;
        }
        let status = child.wait()?;
        let (install, held) = relay.join().unwrap_or_default();
        if status.code() == Some(SSH_FAILED) {
            return Err(self.unreachable(&held));
        }
        match fed {
            // What this side could not read says more than the host's
            // refusal of a stream that ended early.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::usage(
                format!("cannot send to the controller host {}: {e}", self.address()),
                None,
            )),
            _ => Ok((status.code(), install)),
        }
    }

    fn unreachable(&self, held: &[String]) -> Error {
        let said = held.join("\n");
        if said.contains(CHANGED_KEY) {
            return Error::Unreachable {
                message: format!(
                    "refusing the managed-job controller at {}: {}",
                    self.address(),
                    crate::core::transport::ssh::changed_key(&said, "it")
                ),
                hint: self.changed_key_hint(),
            };
        }
        let why = if held.is_empty() {
            "ssh failed without saying why".to_string()
        } else {
            held.join("; ")
        };
        Error::Unreachable {
            message: format!(
                "cannot reach the managed-job controller at {}: {why}",
                self.address()
            ),
            hint: format!(
                "check that the host is up and that `ssh{}{} {}` works; jobs.controller in {} names it",
                self.host.port.map(|p| format!(" -p {p}")).unwrap_or_default(),
                self.host
                    .identity_file
                    .as_ref()
                    .map(|k| format!(" -i {}", k.display()))
                    .unwrap_or_default(),
                self.host
                    .user
                    .as_ref()
                    .map(|u| format!("{u}@{}", self.host.host))
                    .unwrap_or_else(|| self.host.host.clone()),
                self.ssh_dir
                    .parent()
                    .map(|h| h.join("config.yaml").display().to_string())
                    .unwrap_or_else(|| "config.yaml".into()),
            ),
        }
    }

    /// What to do about a changed host key: forget the old one (the
    /// command), knowing what it means.
    fn changed_key_hint(&self) -> String {
        let known = self.known_hosts.display();
        match &self.cluster {
            Some(cluster) => format!(
                "gangway pinned this host's key when it made the VM (from the provider's record of \
                 it where it publishes one) and never replaces the VM without saying so: unless it \
                 did, another machine answers at {host}; if the VM was really rebuilt, forget the \
                 old key with `ssh-keygen -R {cluster} -f {known}` and run the command again",
                host = self.host.host,
            ),
            None => format!(
                "unless the host was reinstalled, another machine answers at its address; if it \
                 was, forget the old key with `ssh-keygen -R {} -f {known}` and run the command again",
                self.known_hosts_name(),
            ),
        }
    }

    /// How ssh names the host in a known_hosts file.
    fn known_hosts_name(&self) -> String {
        match self.host.port {
            Some(p) if p != 22 => format!("'[{}]:{p}'", self.host.host),
            _ => self.host.host.clone(),
        }
    }

    /// Puts the gangway for `os arch` on the host as `bin/gangway`, stops
    /// the controller of the binary it replaces, and writes the stamp.
    fn install(&self, os: &str, arch: &str) -> Result<(), Error> {
        let binary = if same_platform(os, arch) {
            std::env::current_exe()?
        } else {
            self.host.binary.clone().ok_or_else(|| {
                Error::usage(
                    format!(
                        "the controller host {} is {os} {arch}, and this gangway is built for {} {}",
                        self.address(),
                        std::env::consts::OS,
                        std::env::consts::ARCH
                    ),
                    Some(&format!(
                        "set jobs.controller_binary in config.yaml to the path of a gangway {} build for {os} {arch}",
                        env!("CARGO_PKG_VERSION")
                    )),
                )
            })?
        };
        let version = format!("gangway {}", env!("CARGO_PKG_VERSION"));
        eprintln!(
            "gangway: installing {version} on the controller host {} ({os} {arch}, from {})",
            self.address(),
            binary.display()
        );
        let script = format!(
            "set -e; umask 077; D=\"$HOME/.gangway-controller\"; mkdir -p \"$D/bin\" \"$D/home\"; \
             N=\"$D/bin/gangway.new.$$\"; trap 'rm -f \"$N\"' EXIT; cat > \"$N\"; chmod 700 \"$N\"; \
             v=$(\"$N\" --version 2>&1) || true; \
             if [ \"$v\" != {version} ]; then echo \"the binary for the host says '$v', not '{version}'\" >&2; exit 98; fi; \
             mv -f \"$N\" \"$D/bin/gangway\"; \
             GANGWAY_HOME=\"$D/home\" {HOSTED_ENV}=1 \"$D/bin/gangway\" __controller-stop; \
             printf '%s\\n' {stamp} > \"$D/bin/stamp\"",
            version = sh(&version),
            stamp = sh(&self.stamp),
        );
        let file = std::fs::File::open(&binary).map_err(|e| {
            Error::usage(
                format!(
                    "cannot read {} for the controller host: {e}",
                    binary.display()
                ),
                None,
            )
        })?;
        // Its stdout (nothing, unless the host's shell talks) is dropped.
        let send = |w: &mut dyn std::io::Write| std::io::copy(&mut &file, w).map(drop);
        let (code, _) = self.exchange(script, Some(&send), Some(&mut Vec::new()))?;
        match code {
            Some(0) => Ok(()),
            Some(98) => Err(Error::usage(
                format!(
                    "{} is not a gangway {} for the controller host {}",
                    binary.display(),
                    env!("CARGO_PKG_VERSION"),
                    self.address()
                ),
                Some("jobs.controller_binary names a build of this very version"),
            )),
            other => Err(Error::usage(
                format!(
                    "installing gangway on the controller host {} failed (exit {})",
                    self.address(),
                    other.map_or("by a signal".to_string(), |c| c.to_string())
                ),
                Some("the lines above are the host's; it needs a writable home and a POSIX shell"),
            )),
        }
    }
}

/// A host's `uname -s` and `uname -m`.
type Platform = (String, String);

enum Attempt {
    Done(i32),
    Install { os: String, arch: String },
}

/// Copies the remote stderr to ours, line by line as it comes, except
/// the install mark (returned as `(os, arch)`) and ssh's own complaints
/// (held back and returned, for the unreachable error to say once).
fn relay_stderr(r: impl Read) -> (Option<Platform>, Vec<String>) {
    let mut install = None;
    let mut held = Vec::new();
    let mut err = std::io::stderr();
    // Inside ssh's changed-key warning: held whole (its fingerprint and
    // the offending file:line are the error's facts).
    let mut warning = false;
    for line in BufReader::new(r).lines().map_while(Result::ok) {
        if warning || line.starts_with("@@@") {
            warning = !line.starts_with("Host key verification failed");
            held.push(line);
        } else if let Some(rest) = line.strip_prefix(INSTALL_MARK) {
            let mut w = rest.split_whitespace();
            install = Some((
                w.next().unwrap_or_default().to_string(),
                w.next().unwrap_or_default().to_string(),
            ));
        } else if line.starts_with("ssh: ")
            || line.contains("Permission denied")
            || line.starts_with("kex_exchange_identification")
            || line.starts_with("Host key verification failed")
        {
            held.push(line);
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
    (install, held)
}

/// Whether `uname -s`/`uname -m` name this binary's own platform.
fn same_platform(os: &str, arch: &str) -> bool {
    let os_ok = os.eq_ignore_ascii_case(std::env::consts::OS)
        || (os == "Darwin" && std::env::consts::OS == "macos");
    let arch_ok = arch == std::env::consts::ARCH
        || (arch == "arm64" && std::env::consts::ARCH == "aarch64")
        || (arch == "amd64" && std::env::consts::ARCH == "x86_64");
    os_ok && arch_ok
}

/// SHA-256 of this binary, kept in `$GANGWAY_HOME/controller/self.sha256`
/// with the path, size and modification time it was computed for (a
/// release binary is tens of MB: hashed once per build, not per command).
fn self_hash(home: &Path) -> Result<String, Error> {
    use sha2::{Digest, Sha256};
    let exe = std::env::current_exe()?;
    let meta = std::fs::metadata(&exe)?;
    let key = format!(
        "{} {} {}.{}",
        exe.display(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    );
    let cache = home.join("controller").join("self.sha256");
    if let Ok(text) = std::fs::read_to_string(&cache) {
        if let Some((k, h)) = text.trim_end().rsplit_once('\n') {
            if k == key && h.len() == 64 {
                return Ok(h.to_string());
            }
        }
    }
    let mut f = std::fs::File::open(&exe)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let hash: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if let Some(dir) = cache.parent() {
        let _ = std::fs::create_dir_all(dir);
        let tmp = cache.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, format!("{key}\n{hash}\n")).is_ok() {
            let _ = std::fs::rename(&tmp, &cache);
        }
    }
    Ok(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_user_and_port_or_not_at_all() {
        let h = Host::parse_address("ops@ctl.example.com:2222").unwrap();
        assert_eq!(
            (h.user.as_deref(), h.host.as_str(), h.port),
            (Some("ops"), "ctl.example.com", Some(2222))
        );
        assert_eq!(h.address(), "ops@ctl.example.com:2222");
        let h = Host::parse_address("10.0.0.5").unwrap();
        assert_eq!((h.user, h.port), (None, None));
        for bad in ["", "@h", "h:port", "h:70000", "-oProxyCommand=x", "a b"] {
            assert!(Host::parse_address(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_config_names_the_host_and_refuses_what_it_cannot_read() {
        let home = tempfile::tempdir().unwrap();
        assert_eq!(configured_for(home.path(), None).unwrap(), None);
        let write = |t: &str| std::fs::write(home.path().join("config.yaml"), t).unwrap();
        write("jobs:\n  controller: local\n");
        assert_eq!(configured_for(home.path(), None).unwrap(), None);
        write("jobs:\n  controller: {host: 127.0.0.9, port: 2200, user: gw, identity_file: /k}\n  controller_binary: /b/gangway\n");
        let Some(Place::Ssh(h)) = configured_for(home.path(), None).unwrap() else {
            panic!("an SSH host")
        };
        assert_eq!(h.address(), "gw@127.0.0.9:2200");
        assert_eq!(h.identity_file.as_deref(), Some(Path::new("/k")));
        assert_eq!(h.binary.as_deref(), Some(Path::new("/b/gangway")));
        write("jobs:\n  controller: {host: h, pot: 1}\n");
        let e = configured_for(home.path(), None).unwrap_err().to_string();
        assert!(e.contains("jobs.controller") && e.contains("'pot'"), "{e}");
        write("jobs:\n  controller: 'a b'\n");
        assert!(configured_for(home.path(), None).is_err());
        // A task's own controller comes first.
        write("jobs:\n  controller: u@file-host\n");
        let task: Value = serde_json::json!({"jobs": {"controller": "u@task-host:2222"}});
        let Some(Place::Ssh(h)) = configured_for(home.path(), Some(&task)).unwrap() else {
            panic!("an SSH host")
        };
        assert_eq!(h.address(), "u@task-host:2222");
        let local = serde_json::json!({"jobs": {"controller": "local"}});
        assert_eq!(configured_for(home.path(), Some(&local)).unwrap(), None);
        let other = serde_json::json!({"aws": {}});
        let Some(Place::Ssh(h)) = configured_for(home.path(), Some(&other)).unwrap() else {
            panic!("the file's host")
        };
        assert_eq!(h.address(), "u@file-host");
    }

    #[test]
    fn remote_words_are_quoted_and_the_stamp_is_checked_first() {
        let h = Hosted {
            host: Host::parse_address("u@h:22").unwrap(),
            ssh_dir: PathBuf::from("/x/ssh"),
            stamp: "ab".repeat(32),
            known_hosts: PathBuf::from("/x/ssh/known_hosts_controller"),
            remote_env: Vec::new(),
            cluster: None,
            cloud: None,
        };
        let r = h.remote(&["jobs".into(), "logs".into(), "it's 1".into()]);
        assert!(r.starts_with("D=\"$HOME/.gangway-controller\"; if"), "{r}");
        assert!(r.contains(&"ab".repeat(32)), "{r}");
        assert!(r.ends_with("jobs logs 'it'\\''s 1'"), "{r}");
        assert!(same_platform(
            if cfg!(target_os = "macos") {
                "Darwin"
            } else {
                "Linux"
            },
            std::env::consts::ARCH
        ));
        assert!(!same_platform("Plan9", std::env::consts::ARCH));
    }
}
