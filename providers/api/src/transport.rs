//! How gangway runs commands on nodes and copies files to them.
//!
//! The gang logic only sees [`Transport`]. Nodes whose provider answers
//! [`crate::Provider::transport`] with `None` are reached over SSH, at
//! their [`SshEndpoint`], by the core's generic transport; a provider whose
//! nodes are something else (the local cloud's process groups, Slurm's job
//! steps) implements this trait in its own crate and returns it there.

use std::io::PipeWriter;
use std::path::Path;
use std::process::Stdio;

use serde::Serialize;

/// One node of a cluster as gangway recorded it, in rank order: what every
/// transport is handed.
#[derive(Clone, Debug, Serialize)]
pub struct NodeRow {
    /// Rank (0 = head).
    pub rank: u32,
    /// Provider id.
    pub instance_id: String,
    /// Address the other nodes reach it on.
    pub private_ip: String,
    /// Address gangway reaches it on.
    pub public_ip: Option<String>,
    /// Zone.
    pub zone: String,
    /// Topology path, `/`-joined.
    pub topology: String,
    /// Last known state.
    pub state: String,
    /// Provider facts (JSON map), as in [`crate::Node::extra`]. Only the
    /// node's own port range is shown (as `ports`, where nodes share an
    /// address); the rest is the provider's business.
    #[serde(
        rename = "ports",
        serialize_with = "port_range_only",
        skip_serializing_if = "no_port_range"
    )]
    pub extra: std::collections::BTreeMap<String, String>,
}

fn no_port_range(extra: &std::collections::BTreeMap<String, String>) -> bool {
    !extra.contains_key(crate::PORT_RANGE_FACT)
}

fn port_range_only<S: serde::Serializer>(
    extra: &std::collections::BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(extra.get(crate::PORT_RANGE_FACT).map_or("", String::as_str))
}

impl NodeRow {
    /// The fact `key`, or `""`.
    pub fn fact(&self, key: &str) -> &str {
        self.extra.get(key).map(String::as_str).unwrap_or("")
    }

    /// `rank N (private address)`, how errors name a node.
    pub fn label(&self) -> String {
        format!("rank {} ({})", self.rank, self.address())
    }

    /// The private address, with the node's own port range where nodes
    /// share one address: `127.0.0.1 ports 20100-20149`.
    pub fn address(&self) -> String {
        match self.extra.get(crate::PORT_RANGE_FACT) {
            Some(ports) => format!("{} ports {ports}", self.private_ip),
            None => self.private_ip.clone(),
        }
    }

    /// The variables every command on the node gets (its `env.*` facts).
    pub fn env(&self) -> impl Iterator<Item = (&str, &str)> {
        self.extra
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("env.").map(|n| (n, v.as_str())))
    }
}

/// A command for one node.
#[derive(Clone, Debug)]
pub struct NodeCommand {
    /// A bash script.
    pub script: String,
    /// Environment on top of the node's own.
    pub env: Vec<(String, String)>,
    /// Working directory on the node (`~/...` or absolute).
    pub cwd: String,
    /// Whether this is the task's own command (setup, run, an `exec`),
    /// which must find the task's absolute paths where the task wrote
    /// them, rather than one of gangway's steps (the storage step, a
    /// checkpoint upload), whose script and environment name paths as
    /// [`Transport::node_path`] spells them. A transport whose spelling
    /// differs (the local cloud keeps absolute paths under a node's
    /// directory) runs the task's commands in a view that puts them in
    /// place, and gangway's where its spellings hold.
    pub task_view: bool,
}

/// Errors running things on nodes.
#[derive(Debug, thiserror::Error)]
#[error("node {node}: {what}: {source}")]
pub struct TransportError {
    /// `rank N (address)`.
    pub node: String,
    /// What was attempted.
    pub what: String,
    /// Why it failed.
    pub source: std::io::Error,
}

/// A command started on a node by [`Transport::spawn`]: an id (for the
/// local transport the pid, which is also its process group) and its end.
pub struct NodeProcess {
    id: u32,
    end: std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<std::process::ExitStatus>> + Send>,
    >,
}

impl NodeProcess {
    /// A process whose end is `end`.
    pub fn new(
        id: u32,
        end: impl std::future::Future<Output = std::io::Result<std::process::ExitStatus>>
            + Send
            + 'static,
    ) -> NodeProcess {
        NodeProcess {
            id,
            end: Box::pin(end),
        }
    }

    /// A local child process.
    pub fn from_child(mut child: tokio::process::Child) -> NodeProcess {
        let id = child.id().unwrap_or(0);
        NodeProcess::new(id, async move { child.wait().await })
    }

    /// Its id, for [`Transport::signal`] and [`Transport::reaped`].
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Waits until it ends.
    pub async fn wait(self) -> std::io::Result<std::process::ExitStatus> {
        self.end.await
    }
}

/// Runs commands on nodes and copies files to them.
#[async_trait::async_trait]
pub trait Transport: Send + Sync {
    /// Makes sure every node can be reached (opens connections where the
    /// transport has them). Local nodes need nothing.
    async fn connect(&self, nodes: &[NodeRow]) -> Result<(), TransportError> {
        let _ = nodes;
        Ok(())
    }

    /// Starts `cmd` on `node` in a process group of its own; stdout and
    /// stderr both go to `output`. Returns its handle, whose id names it
    /// to `signal` and `reaped`.
    fn spawn(
        &self,
        node: &NodeRow,
        cmd: &NodeCommand,
        output: PipeWriter,
    ) -> Result<NodeProcess, TransportError>;

    /// Sends `signal` to the process group started by `spawn`.
    fn signal(&self, node: &NodeRow, pgid: u32, signal: i32);

    /// Sends `signal` to a process group a driver started for cluster job
    /// `job`, only if it still belongs to that job (pids are reused): its
    /// leader's environment has `GANGWAY_RUN=<job>`.
    fn signal_job(&self, node: &NodeRow, pgid: u32, job: i64, signal: i32);

    /// Forgets a process group that has exited.
    fn reaped(&self, node: &NodeRow, pgid: u32);

    /// Copies a local file or directory to `dest` on the node, skipping
    /// files whose size and modification time already match.
    fn upload(&self, node: &NodeRow, local: &Path, dest: &str) -> Result<(), TransportError>;

    /// Where a node path (`~/x`, `/x`, `x`) really is, as the node's
    /// commands see it.
    fn node_path(&self, node: &NodeRow, path: &str) -> String;

    /// Creates a directory (and its parents) on the node; `path` is one
    /// [`Transport::node_path`] returned.
    fn make_dir(&self, node: &NodeRow, path: &str) -> Result<(), TransportError>;

    /// Copies `path` on the node (a [`Transport::node_path`]) into the
    /// local directory `dest`, merging with what is there: a file already
    /// in `dest` with a newer modification time is kept (several nodes'
    /// checkpoint directories merge into one, and a stale restored copy on
    /// one node must not win over the file another node just wrote). A
    /// path that does not exist on the node copies nothing. What comes back
    /// is the node's and not trusted: the copy follows [`crate::tree`]'s
    /// rules (no link out of `dest`, no device, no setuid bit) and returns
    /// what it left out, one line each, for the job's events.
    fn download(
        &self,
        node: &NodeRow,
        path: &str,
        dest: &Path,
    ) -> Result<crate::tree::Skipped, TransportError>;

    /// Writes a small file on the node.
    fn write_file(&self, node: &NodeRow, path: &str, data: &[u8]) -> Result<(), TransportError>;

    /// The provider's advance notice of a preemption, if the node has one
    /// (GCP's `preempted`, AWS's `spot/instance-action`), in its words. The
    /// core's SSH transport runs the provider's
    /// [`crate::Provider::notice_probe`] over the connection; a provider's
    /// own transport answers for itself. A check that fails reads as no
    /// notice: it never fails a job.
    fn preemption_notice(&self, node: &NodeRow) -> Option<String>;

    /// Whether [`Transport::preemption_notice`] only reads this machine's
    /// files (it cannot block), so a caller may ask on its own thread
    /// rather than hand each question to a blocking pool.
    fn notice_is_local(&self) -> bool {
        false
    }

    /// What the transport has to tell the user since it was last asked
    /// (each thing once: e.g. that files go as tar streams because a
    /// machine lacks rsync); the job's log shows it.
    fn take_notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// A transport's own reading of how a command ended (an SSH client's
    /// 255 is a lost connection, not the command's code).
    fn explain_exit(&self, status: &std::process::ExitStatus) -> Option<String> {
        let _ = status;
        None
    }

    /// Runs a short shell command on the node and returns its stdout.
    fn probe(&self, node: &NodeRow, script: &str) -> Result<String, TransportError>;

    /// Kills every process on the node that belongs to `cluster` (found by
    /// its environment), for teardowns where no driver is left to do it.
    /// Transports on machines that clusters share scope this further (the
    /// SSH transport: by installation, and unmounts the cluster's bucket
    /// mounts first).
    fn kill_cluster(&self, node: &NodeRow, cluster: &str) {
        let _ = self.probe(
            node,
            &format!(
                "{} {}",
                release_mounts(cluster),
                kill_where(&[("GANGWAY_CLUSTER", cluster)], "-9")
            ),
        );
    }
}

/// The remote command (ending in `;`) that releases what a cluster's
/// storage step left on a node for `scope` (its `GANGWAY_SCOPE`, else its
/// name): the bucket mounts listed for it in `~/.gangway-mounts`, unmounted
/// (lazily: killing their rclone next leaves no dead mount), and its mounts'
/// credentials, `~/.gangway/creds/<scope>`, removed.
pub fn release_mounts(scope: &str) -> String {
    // The storage step names the directory with `tr -c 'A-Za-z0-9._-' _`.
    let dir: String = scope
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "f=\"$HOME/.gangway-mounts\"; if [ -f \"$f\" ]; then \
         awk -F'\\t' '$1 == \"{scope}\" {{ print $2 }}' \"$f\" | while IFS= read -r m; do \
         fusermount3 -u -z \"$m\" 2>/dev/null || fusermount -u -z \"$m\" 2>/dev/null || umount -l \"$m\" 2>/dev/null; done; \
         awk -F'\\t' '$1 != \"{scope}\"' \"$f\" > \"$f.tmp\" && mv -f \"$f.tmp\" \"$f\"; fi; \
         rm -rf \"$HOME/.gangway/creds/{dir}\";"
    )
}

/// Runs `c` to its end with `input` on its stdin, written from a thread
/// (a command that answers before it has read everything cannot deadlock
/// on full pipes); its status and output.
pub fn output_with_input(
    c: &mut std::process::Command,
    input: Option<&[u8]>,
) -> std::io::Result<std::process::Output> {
    c.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn()?;
    if let (Some(data), Some(mut w)) = (input, child.stdin.take()) {
        let data = data.to_vec();
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = w.write_all(&data);
        });
    }
    child.wait_with_output()
}

/// Variables a node's commands keep from the launching machine when a
/// transport builds their environment from scratch (local processes, Slurm
/// steps); everything else is left behind, as on a fresh cloud node (so no
/// credentials leak).
pub const KEPT_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "TMPDIR"];

/// Whether an executable file named `program` is in one of `$PATH`'s
/// directories on this machine.
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The shell commands run with here: bash where there is one.
pub fn shell() -> &'static str {
    if Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

/// The variable naming a command's processes on its node. The shell that
/// sets it by `export` does not carry it in `/proc/PID/environ` (that is
/// the environment a process was started with), so only the command's own
/// processes match, never the wrapper that waits for them.
pub const TOKEN_VAR: &str = "GANGWAY_TOKEN";

/// The remote command that runs `kill OPTION` on every process of the
/// node whose environment, as it was started, has each of `env`'s
/// `NAME=value` exactly: fixed strings, never patterns (a `.` in one
/// cluster's name matched another's processes when they were regexes),
/// quoted for the shell.
pub fn kill_where(env: &[(&str, &str)], option: &str) -> String {
    let tests: Vec<String> = env
        .iter()
        .map(|(var, value)| {
            format!(
                "grep -qxzF -- {} \"$p/environ\" 2>/dev/null",
                crate::sh_quote(&format!("{var}={value}"))
            )
        })
        .collect();
    format!(
        "for p in /proc/[0-9]*; do {} && kill {option} ${{p#/proc/}} 2>/dev/null; done; true",
        tests.join(" && ")
    )
}

/// The remote command that sends `signal` to the processes started with
/// `token`: the group of each (the command's `setsid` made its first
/// process a group leader), else the process alone.
pub fn signal_token(token: &str, signal: i32) -> String {
    let sig = kill_option(signal);
    format!(
        "for p in $(grep -lzxF -- {TOKEN_VAR}={token} /proc/[0-9]*/environ 2>/dev/null); do \
         p=${{p#/proc/}}; p=${{p%/environ}}; \
         kill {sig} -- -$p 2>/dev/null || kill {sig} $p 2>/dev/null; done; true"
    )
}

/// `kill`'s option for `signal` (a number of this machine's) in a command
/// run on a node: the signal's name, `-s USR1`, since the numbers differ
/// between the laptop and the node (SIGUSR1 is 30 on macOS, 10 on Linux;
/// 30 on Linux is SIGPWR). A signal without a name here goes as its number.
pub fn kill_option(signal: i32) -> String {
    let name = match signal {
        libc::SIGTERM => "TERM",
        libc::SIGKILL => "KILL",
        libc::SIGINT => "INT",
        libc::SIGHUP => "HUP",
        libc::SIGQUIT => "QUIT",
        libc::SIGUSR1 => "USR1",
        libc::SIGUSR2 => "USR2",
        libc::SIGCONT => "CONT",
        libc::SIGSTOP => "STOP",
        other => return format!("-{other}"),
    };
    format!("-s {name}")
}

#[cfg(test)]
mod tests;
