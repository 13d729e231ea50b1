//! The local cloud's transport: commands as process groups on this
//! machine, in each node's directory, registered with the node so that
//! terminate, stop and preemption kill them.

use std::io::PipeWriter;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use gangway_provider::{
    copy_tree, merge_newest, shell, NodeCommand, NodeProcess, NodeRow, Transport, TransportError,
    KEPT_ENV,
};

/// The variable naming the cluster job a command belongs to (the gang sets
/// it on every setup and run).
const RUN_VAR: &str = "GANGWAY_RUN";

/// A number no other registration this process makes has.
fn next_serial() -> u64 {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

/// Commands as local processes in the node's directory.
#[derive(Debug, Default)]
pub struct LocalTransport {
    /// What the user is told once ([`Transport::take_notes`]).
    notes: std::sync::Mutex<Notes>,
}

#[derive(Debug, Default)]
struct Notes {
    new: Vec<String>,
    said: std::collections::HashSet<String>,
}

impl LocalTransport {
    /// Queues `note` unless it was said before.
    fn say_once(&self, note: String) {
        let mut n = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        if n.said.insert(note.clone()) {
            n.new.push(note);
        }
    }

    /// The view a task's command of `node` needs to see its absolute paths
    /// where the task wrote them (crate::view), if it has any and this
    /// machine allows one; otherwise the paths stay under the node's
    /// `root/`, and the user is told once.
    #[cfg(target_os = "linux")]
    fn view(&self, node: &NodeRow, cwd: &str) -> Option<crate::view::View> {
        let dir = Path::new(node.fact("dir"));
        if dir.as_os_str().is_empty() || !has_entries(&dir.join("root")) {
            return None;
        }
        let stays = |why: String| {
            format!(
                "the task's absolute paths stay under each local node's root/ \
                 (here {}/root): {why}",
                dir.display()
            )
        };
        if let Err(why) = crate::view::usable() {
            self.say_once(stays(format!(
                "this machine lets gangway make no mount namespace ({why})"
            )));
            return None;
        }
        match crate::view::plan(dir, Path::new(cwd), Path::new("/")) {
            Ok(v) => v,
            Err(e) => {
                self.say_once(stays(format!("cannot plan the node's view of them ({e})")));
                None
            }
        }
    }

    /// Elsewhere (macOS) a node has no mount namespace: the user is told.
    #[cfg(not(target_os = "linux"))]
    fn view(&self, node: &NodeRow, _cwd: &str) -> Option<std::convert::Infallible> {
        let dir = Path::new(node.fact("dir"));
        if !dir.as_os_str().is_empty() && has_entries(&dir.join("root")) {
            self.say_once(format!(
                "the task's absolute paths stay under each local node's root/ (here {}/root): \
                 only Linux gives a local node a mount namespace that puts them in place",
                dir.display()
            ));
        }
        None
    }
}

/// Whether `dir` is a directory with something in it.
fn has_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
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
            node: node.label(),
            what: what.to_string(),
            source,
        };
        let home = node.fact("home");
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
        for (name, v) in node.env() {
            c.env(name, v);
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
        let view = if cmd.task_view {
            self.view(node, &cwd)
        } else {
            None
        };
        let starting = match &view {
            #[cfg(target_os = "linux")]
            Some(v) => format!(
                "cannot start the command in the node's view of {} (a mount namespace)",
                v.paths.join(", ")
            ),
            #[cfg(not(target_os = "linux"))]
            Some(_) => unreachable!(),
            None => "cannot start the command".to_string(),
        };
        #[cfg(target_os = "linux")]
        if let Some(v) = view {
            // SAFETY: `enter` makes only system calls on data prepared
            // here, as the child of a fork must.
            unsafe { c.pre_exec(move || v.enter()) };
        }
        // Registered so that terminate, stop and preemption kill it: a file
        // named by its process group, naming its run, whose lock the
        // command's processes hold while any of them lives (crate::held).
        let procs = Path::new(node.fact("procs"));
        let hold = if procs.as_os_str().is_empty() {
            None
        } else {
            let run = cmd
                .env
                .iter()
                .find(|(k, _)| k == RUN_VAR)
                .map_or(String::new(), |(_, v)| format!("{RUN_VAR}={v}\n"));
            let tmp = procs.join(format!(".new-{}-{}", std::process::id(), next_serial()));
            let file = crate::held::create(&tmp, run.as_bytes())
                .map_err(|e| err("cannot register the command with its node", e))?;
            crate::held::inherit_tokio(&mut c, file.as_raw_fd());
            Some((tmp, file))
        };
        let child = c.spawn();
        let child = match (child, hold) {
            (Ok(child), Some((tmp, file))) => {
                if let Some(pid) = child.id() {
                    let _ = std::fs::rename(&tmp, procs.join(pid.to_string()));
                }
                // The child's copy holds the lock from here on.
                drop(file);
                child
            }
            (Ok(child), None) => child,
            (Err(e), hold) => {
                if let Some((tmp, _)) = hold {
                    let _ = std::fs::remove_file(tmp);
                }
                return Err(err(&starting, e));
            }
        };
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
        // The group's registration names its run, and its lock is held
        // while any process of the group that started it lives: a group id
        // the system reused for someone else holds no lock.
        let procs = Path::new(node.fact("procs"));
        if procs.as_os_str().is_empty() {
            return;
        }
        let reg = procs.join(pgid.to_string());
        let Ok(text) = std::fs::read_to_string(&reg) else {
            return;
        };
        let want = format!("{RUN_VAR}={job}");
        if text.lines().any(|l| l == want) && crate::held::is_held(&reg) {
            self.signal(node, pgid, signal);
        }
    }

    fn reaped(&self, node: &NodeRow, pgid: u32) {
        let procs = Path::new(node.fact("procs"));
        if !procs.as_os_str().is_empty() {
            let _ = std::fs::remove_file(procs.join(pgid.to_string()));
        }
    }

    fn upload(&self, node: &NodeRow, local: &Path, dest: &str) -> Result<(), TransportError> {
        let dest = PathBuf::from(self.node_path(node, dest));
        copy_tree(local, &dest).map_err(|source| TransportError {
            node: node.label(),
            what: format!("cannot copy {} to {}", local.display(), dest.display()),
            source,
        })
    }

    fn make_dir(&self, node: &NodeRow, path: &str) -> Result<(), TransportError> {
        std::fs::create_dir_all(path).map_err(|source| TransportError {
            node: node.label(),
            what: format!("cannot create {path}"),
            source,
        })
    }

    fn download(
        &self,
        node: &NodeRow,
        path: &str,
        dest: &Path,
    ) -> Result<gangway_provider::Skipped, TransportError> {
        if !Path::new(path).exists() {
            return Ok(Vec::new());
        }
        merge_newest(Path::new(path), dest).map_err(|source| TransportError {
            node: node.label(),
            what: format!("cannot copy {path} to {}", dest.display()),
            source,
        })
    }

    fn write_file(&self, node: &NodeRow, path: &str, data: &[u8]) -> Result<(), TransportError> {
        let tmp = format!("{path}.tmp");
        std::fs::write(&tmp, data)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| TransportError {
                node: node.label(),
                what: format!("cannot write {path}"),
                source,
            })
    }

    fn probe(&self, node: &NodeRow, script: &str) -> Result<String, TransportError> {
        let out = std::process::Command::new(shell())
            .arg("-c")
            .arg(script)
            .current_dir(node.fact("home"))
            .stdin(Stdio::null())
            .output()
            .map_err(|source| TransportError {
                node: node.label(),
                what: "cannot run a probe".into(),
                source,
            })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn take_notes(&self) -> Vec<String> {
        let mut n = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut n.new)
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
        let home = node.fact("home");
        if path == "~" {
            home.to_string()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{home}/{rest}")
        } else if let Some(rest) = path.strip_prefix('/') {
            // A local node has no root of its own: absolute paths live
            // under the node's directory.
            format!("{}/root/{rest}", node.fact("dir"))
        } else {
            format!("{home}/{path}")
        }
    }
}
