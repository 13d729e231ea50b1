//! How gangway runs commands on nodes and copies files to them.
//!
//! The gang logic only sees [`Transport`]; the local provider's nodes use
//! [`LocalTransport`] (real processes in their own process groups), SSH
//! nodes get their own transport with the same contract.

use std::io::PipeWriter;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::state::NodeRow;

/// A command for one node.
#[derive(Clone, Debug)]
pub struct NodeCommand {
    /// A bash script.
    pub script: String,
    /// Environment on top of the node's own.
    pub env: Vec<(String, String)>,
    /// Working directory on the node (`~/...` or absolute).
    pub cwd: String,
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
    /// path that does not exist on the node copies nothing.
    fn download(&self, node: &NodeRow, path: &str, dest: &Path) -> Result<(), TransportError>;

    /// Writes a small file on the node.
    fn write_file(&self, node: &NodeRow, path: &str, data: &[u8]) -> Result<(), TransportError>;

    /// The provider's advance notice of a preemption, if the node has one
    /// (GCP's `preempted`, AWS's `spot/instance-action`), in its words.
    fn preemption_notice(&self, node: &NodeRow) -> Option<String>;

    /// Whether [`Transport::preemption_notice`] only reads this machine's
    /// files (it cannot block), so a caller may ask on its own thread
    /// rather than hand each question to a blocking pool.
    fn notice_is_local(&self) -> bool {
        false
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
    fn kill_cluster(&self, node: &NodeRow, cluster: &str) {
        let _ = self.probe(
            node,
            &format!(
                "for p in /proc/[0-9]*; do grep -qxz 'GANGWAY_CLUSTER={cluster}' $p/environ 2>/dev/null && \
                 kill -9 ${{p#/proc/}} 2>/dev/null; done; true"
            ),
        );
    }
}

/// Runs `c` to its end with `input` on its stdin, written from a thread
/// (a command that answers before it has read everything cannot deadlock
/// on full pipes); its status and output.
pub(crate) fn output_with_input(
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

/// Commands as local processes in the node's directory.
#[derive(Debug, Default)]
pub struct LocalTransport;

fn node_name(node: &NodeRow) -> String {
    format!("rank {} ({})", node.rank, node.private_ip)
}

pub(crate) fn extra<'a>(node: &'a NodeRow, key: &str) -> &'a str {
    node.extra.get(key).map(String::as_str).unwrap_or("")
}

/// Variables a node's commands keep from the launching machine; everything
/// else is left behind, as on a fresh cloud node (so no credentials leak).
pub(crate) const KEPT_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "TMPDIR"];

pub(crate) fn shell() -> &'static str {
    if Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

#[async_trait::async_trait]
impl Transport for LocalTransport {
    fn spawn(
        &self,
        node: &NodeRow,
        cmd: &NodeCommand,
        output: PipeWriter,
    ) -> Result<NodeProcess, TransportError> {
        let err = |what: &str, source| TransportError {
            node: node_name(node),
            what: what.to_string(),
            source,
        };
        let home = extra(node, "home");
        let cwd = self.node_path(node, &cmd.cwd);
        let cwd = if Path::new(&cwd).is_dir() {
            cwd
        } else {
            home.to_string()
        };
        let mut c = tokio::process::Command::new(shell());
        c.arg("-c").arg(&cmd.script);
        c.env_clear();
        for k in KEPT_ENV {
            if let Some(v) = std::env::var_os(k) {
                c.env(k, v);
            }
        }
        c.env("HOME", home);
        c.env("SHELL", shell());
        for (k, v) in &node.extra {
            if let Some(name) = k.strip_prefix("env.") {
                c.env(name, v);
            }
        }
        for (k, v) in &cmd.env {
            c.env(k, v);
        }
        c.current_dir(&cwd);
        let out2 = output
            .try_clone()
            .map_err(|e| err("cannot duplicate the output pipe", e))?;
        c.stdin(Stdio::null()).stdout(out2).stderr(output);
        c.process_group(0);
        c.kill_on_drop(false);
        let child = c.spawn().map_err(|e| err("cannot start the command", e))?;
        if let Some(pid) = child.id() {
            // Registered so that terminate, stop and preemption kill it.
            let procs = Path::new(extra(node, "procs"));
            if !procs.as_os_str().is_empty() {
                let _ = std::fs::write(procs.join(pid.to_string()), b"");
            }
        }
        Ok(NodeProcess::from_child(child))
    }

    fn signal(&self, _node: &NodeRow, pgid: u32, signal: i32) {
        if pgid > 1 {
            // SAFETY: signalling a process group this transport created.
            unsafe {
                libc::kill(-(pgid as i32), signal);
            }
        }
    }

    fn signal_job(&self, node: &NodeRow, pgid: u32, job: i64, signal: i32) {
        // The group leader carries the job's environment.
        let Ok(env) = std::fs::read(format!("/proc/{pgid}/environ")) else {
            return;
        };
        let want = format!("GANGWAY_RUN={job}");
        if env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
            self.signal(node, pgid, signal);
        }
    }

    fn reaped(&self, node: &NodeRow, pgid: u32) {
        let procs = Path::new(extra(node, "procs"));
        if !procs.as_os_str().is_empty() {
            let _ = std::fs::remove_file(procs.join(pgid.to_string()));
        }
    }

    fn upload(&self, node: &NodeRow, local: &Path, dest: &str) -> Result<(), TransportError> {
        let dest = PathBuf::from(self.node_path(node, dest));
        copy_tree(local, &dest).map_err(|source| TransportError {
            node: node_name(node),
            what: format!("cannot copy {} to {}", local.display(), dest.display()),
            source,
        })
    }

    fn make_dir(&self, node: &NodeRow, path: &str) -> Result<(), TransportError> {
        std::fs::create_dir_all(path).map_err(|source| TransportError {
            node: node_name(node),
            what: format!("cannot create {path}"),
            source,
        })
    }

    fn download(&self, node: &NodeRow, path: &str, dest: &Path) -> Result<(), TransportError> {
        if !Path::new(path).exists() {
            return Ok(());
        }
        merge_newest(Path::new(path), dest).map_err(|source| TransportError {
            node: node_name(node),
            what: format!("cannot copy {path} to {}", dest.display()),
            source,
        })
    }

    fn write_file(&self, node: &NodeRow, path: &str, data: &[u8]) -> Result<(), TransportError> {
        let tmp = format!("{path}.tmp");
        std::fs::write(&tmp, data)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| TransportError {
                node: node_name(node),
                what: format!("cannot write {path}"),
                source,
            })
    }

    fn probe(&self, node: &NodeRow, script: &str) -> Result<String, TransportError> {
        let out = std::process::Command::new(shell())
            .arg("-c")
            .arg(script)
            .current_dir(extra(node, "home"))
            .stdin(Stdio::null())
            .output()
            .map_err(|source| TransportError {
                node: node_name(node),
                what: "cannot run a probe".into(),
                source,
            })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn kill_cluster(&self, _node: &NodeRow, _cluster: &str) {
        // The local provider kills what is registered with the node.
    }

    fn notice_is_local(&self) -> bool {
        true
    }

    fn preemption_notice(&self, node: &NodeRow) -> Option<String> {
        let dir = Path::new(node.extra.get("env.GANGWAY_METADATA_DIR")?);
        if let Ok(action) = std::fs::read_to_string(dir.join("spot-instance-action")) {
            return Some(format!("spot/instance-action: {}", action.trim()));
        }
        let preempted = std::fs::read_to_string(dir.join("preempted")).ok()?;
        (preempted.trim() == "TRUE").then(|| "instance/preempted: TRUE".to_string())
    }

    fn node_path(&self, node: &NodeRow, path: &str) -> String {
        let home = extra(node, "home");
        if path == "~" {
            home.to_string()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{home}/{rest}")
        } else if let Some(rest) = path.strip_prefix('/') {
            // A local node has no root of its own: absolute paths live
            // under the node's directory.
            format!("{}/root/{rest}", extra(node, "dir"))
        } else {
            format!("{home}/{path}")
        }
    }
}

/// Copies `src` (file or directory) to `dest`, skipping files whose size
/// and modification time already match; symlinks are copied as links.
pub fn copy_tree(src: &Path, dest: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    if meta.is_dir() {
        std::fs::create_dir_all(dest)?;
        for entry in std::fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dest.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(src)?;
        let _ = std::fs::remove_file(dest);
        return std::os::unix::fs::symlink(target, dest);
    }
    if let Ok(d) = std::fs::metadata(dest) {
        if d.len() == meta.len() && d.modified().ok() == meta.modified().ok() {
            return Ok(());
        }
    }
    std::fs::copy(src, dest)?;
    if let Ok(m) = meta.modified() {
        let f = std::fs::File::options().write(true).open(dest)?;
        f.set_modified(m)?;
    }
    Ok(())
}

/// Like [`copy_tree`], but a file already at the destination wins when it
/// is at least as new as the source.
pub fn merge_newest(src: &Path, dest: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    if meta.is_dir() {
        std::fs::create_dir_all(dest)?;
        for entry in std::fs::read_dir(src)? {
            let entry = entry?;
            merge_newest(&entry.path(), &dest.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if let (Ok(d), Ok(m)) = (std::fs::metadata(dest), meta.modified()) {
        if d.modified().is_ok_and(|dm| dm >= m) {
            return Ok(());
        }
    }
    copy_tree(src, dest)
}
