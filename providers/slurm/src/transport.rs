//! Commands on Slurm nodes: each is a job step of the cluster's
//! allocation, `srun --jobid=J --overlap -w NODE -N1 -n1`, started from
//! this machine (the login node). The step inherits srun's environment,
//! which gangway builds from scratch as for local nodes (so nothing of the
//! launcher's leaks), and Slurm's own (`SLURM_*`, `CUDA_VISIBLE_DEVICES`
//! for the GPUs of the allocation). Files travel as tar streams through a
//! step's stdin and stdout, so compute nodes need not share a filesystem
//! with the login node.

use std::collections::HashMap;
use std::io::{PipeWriter, Write};
use std::path::Path;
use std::process::Stdio;
use std::sync::Mutex;

use gangway_provider::{
    output_with_input, shell, signal_token, NodeCommand, NodeProcess, NodeRow, Transport,
    TransportError, KEPT_ENV, TOKEN_VAR,
};

use crate::{keys, remote_command, sh_quote, Login};

fn extra<'a>(node: &'a NodeRow, key: &str) -> &'a str {
    node.fact(key)
}

/// The Slurm transport.
#[derive(Debug, Default)]
pub struct SlurmTransport {
    /// srun's pid → token of its task on the node.
    tokens: Mutex<HashMap<u32, String>>,
    /// gangway's ssh directory (control sockets, login nodes' host keys).
    ssh_dir: std::path::PathBuf,
}

impl SlurmTransport {
    /// A transport that reaches login nodes with gangway's ssh directory
    /// (`$GANGWAY_HOME/ssh`), as the provider does.
    pub fn new(home: &Path) -> SlurmTransport {
        SlurmTransport {
            tokens: Mutex::default(),
            ssh_dir: home.join("ssh"),
        }
    }

    /// `prog args...` where Slurm's commands run for `node`: here, or on
    /// its login node over ssh.
    fn slurm_command(&self, node: &NodeRow, prog: &str, args: &[String]) -> std::process::Command {
        self.with_env(node, prog, args, &[], false).0
    }

    /// Like [`Self::slurm_command`] with `env` for the command. Over ssh,
    /// with `env_on_stdin` the variables travel on stdin (the returned
    /// bytes, to be written there first), never on a command line.
    fn with_env(
        &self,
        node: &NodeRow,
        prog: &str,
        args: &[String],
        env: &[(String, String)],
        env_on_stdin: bool,
    ) -> (std::process::Command, Option<Vec<u8>>) {
        let conf = node.extra.get(keys::CONF);
        let Some(login) = Login::from_extra(&node.extra) else {
            let mut c = std::process::Command::new(prog);
            c.args(args);
            c.env_clear();
            for k in KEPT_ENV {
                if let Some(v) = std::env::var_os(k) {
                    c.env(k, v);
                }
            }
            if let Some(v) = std::env::var_os("HOME") {
                c.env("HOME", v);
            }
            match conf {
                Some(conf) => {
                    c.env("SLURM_CONF", conf);
                }
                None => {
                    if let Some(v) = std::env::var_os("SLURM_CONF") {
                        c.env("SLURM_CONF", v);
                    }
                }
            }
            c.envs(env.iter().map(|(k, v)| (k, v)));
            return (c, None);
        };
        let mut all: Vec<(String, String)> = Vec::new();
        if let Some(conf) = conf {
            all.push(("SLURM_CONF".into(), conf.clone()));
        }
        all.extend(env.iter().cloned());
        let (remote, stdin) = if env_on_stdin {
            let exports: String = all
                .iter()
                .map(|(k, v)| format!("export {k}={}\n", sh_quote(v)))
                .collect();
            (
                format!(". /dev/stdin; {}", remote_command(prog, args, &[])),
                Some(exports.into_bytes()),
            )
        } else {
            (remote_command(prog, args, &all), None)
        };
        let mut c = login.ssh(&self.ssh_dir);
        c.arg(remote);
        (c, stdin)
    }
}

fn name(node: &NodeRow) -> String {
    format!(
        "rank {} ({})",
        node.rank,
        node.extra.get(keys::NODE).map_or("?", String::as_str)
    )
}

fn fail(node: &NodeRow, what: impl Into<String>, source: std::io::Error) -> TransportError {
    TransportError {
        node: name(node),
        what: what.into(),
        source,
    }
}

/// `srun` arguments running `script` with bash as a one-task step on `node`.
fn srun_args(node: &NodeRow, script: &str) -> Vec<String> {
    let bash = if Login::from_extra(&node.extra).is_some() {
        "bash"
    } else {
        shell()
    };
    vec![
        format!("--jobid={}", extra(node, keys::JOB)),
        "--overlap".into(),
        "--nodes=1".into(),
        "--ntasks=1".into(),
        format!("--nodelist={}", extra(node, keys::NODE)),
        "--quiet".into(),
        "--kill-on-bad-exit=1".into(),
        bash.into(),
        "-c".into(),
        script.into(),
    ]
}

/// Runs a short step; its stdout, or an error with its stderr.
fn run(
    t: &SlurmTransport,
    node: &NodeRow,
    script: &str,
    input: Option<&[u8]>,
) -> Result<Vec<u8>, TransportError> {
    let mut c = t.slurm_command(node, "srun", &srun_args(node, script));
    let out = output_with_input(&mut c, input).map_err(|e| fail(node, "cannot run srun", e))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(fail(
            node,
            format!(
                "a step on {} failed ({})",
                extra(node, keys::NODE),
                out.status
            ),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        ))
    }
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[async_trait::async_trait]
impl Transport for SlurmTransport {
    async fn connect(&self, nodes: &[NodeRow]) -> Result<(), TransportError> {
        // Each node's home for gangway, made by one step per node at once.
        let mut children = Vec::new();
        for n in nodes {
            let mut c = tokio::process::Command::from(self.slurm_command(
                n,
                "srun",
                &srun_args(n, &format!("mkdir -p {}", sh_quote(extra(n, "home")))),
            ));
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let child = c.spawn().map_err(|e| fail(n, "cannot start srun", e))?;
            children.push((n, child));
        }
        for (n, child) in children {
            let out = child
                .wait_with_output()
                .await
                .map_err(|e| fail(n, "srun failed", e))?;
            if !out.status.success() {
                return Err(fail(
                    n,
                    format!("cannot run a step in Slurm job {}", extra(n, keys::JOB)),
                    std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
                ));
            }
        }
        Ok(())
    }

    fn spawn(
        &self,
        node: &NodeRow,
        cmd: &NodeCommand,
        output: PipeWriter,
    ) -> Result<NodeProcess, TransportError> {
        let token = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let cwd = self.node_path(node, &cmd.cwd);
        let script = format!(
            "cd {} 2>/dev/null || cd {}\n{}",
            sh_quote(&cwd),
            sh_quote(extra(node, "home")),
            cmd.script
        );
        let mut env: Vec<(String, String)> = node
            .extra
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("env.").map(|n| (n.to_string(), v.clone())))
            .collect();
        env.extend(cmd.env.iter().cloned());
        env.push((TOKEN_VAR.to_string(), token.clone()));
        let (std_cmd, pre) = self.with_env(node, "srun", &srun_args(node, &script), &env, true);
        let mut c = tokio::process::Command::from(std_cmd);
        let out2 = output
            .try_clone()
            .map_err(|e| fail(node, "cannot duplicate the output pipe", e))?;
        match pre {
            // The environment (secrets included) goes over ssh's stdin.
            Some(bytes) => {
                let (r, mut w) =
                    std::io::pipe().map_err(|e| fail(node, "cannot make a pipe", e))?;
                w.write_all(&bytes)
                    .map_err(|e| fail(node, "cannot pass the environment", e))?;
                drop(w);
                c.stdin(r);
            }
            None => {
                c.stdin(Stdio::null());
            }
        }
        c.stdout(out2).stderr(output);
        c.process_group(0);
        c.kill_on_drop(false);
        let child = c.spawn().map_err(|e| fail(node, "cannot start srun", e))?;
        if let (Some(pid), Ok(mut m)) = (child.id(), self.tokens.lock()) {
            m.insert(pid, token);
        }
        Ok(NodeProcess::from_child(child))
    }

    fn signal(&self, node: &NodeRow, pgid: u32, signal: i32) {
        let token = self.tokens.lock().ok().and_then(|m| m.get(&pgid).cloned());
        if let Some(token) = token {
            // On the node, to the task's process group: srun would turn a
            // SIGTERM into a cancelled step, not a signal the job can catch.
            let _ = run(self, node, &signal_token(&token, signal), None);
        }
        if signal == libc::SIGKILL && pgid > 1 {
            // SAFETY: signalling the srun process group this transport made.
            unsafe {
                libc::kill(-(pgid as i32), signal);
            }
        }
    }

    fn signal_job(&self, node: &NodeRow, _pgid: u32, job: i64, signal: i32) {
        let script = gangway_provider::kill_where(
            &[
                ("GANGWAY_RUN", &job.to_string()),
                ("SLURM_JOB_ID", extra(node, keys::JOB)),
            ],
            &gangway_provider::kill_option(signal),
        );
        let _ = run(self, node, &script, None);
    }

    fn reaped(&self, _node: &NodeRow, pgid: u32) {
        if let Ok(mut m) = self.tokens.lock() {
            m.remove(&pgid);
        }
    }

    fn upload(&self, node: &NodeRow, local: &Path, dest: &str) -> Result<(), TransportError> {
        let dest = self.node_path(node, dest);
        let (dir, name) = if local.is_dir() {
            (local.to_path_buf(), ".".to_string())
        } else {
            let parent = local.parent().unwrap_or(Path::new("."));
            let file = local
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            (parent.to_path_buf(), file)
        };
        let tar = std::process::Command::new("tar")
            .arg("-C")
            .arg(&dir)
            .arg("-cf")
            .arg("-")
            .arg(&name)
            .output()
            .map_err(|e| fail(node, format!("cannot pack {}", local.display()), e))?;
        if !tar.status.success() {
            return Err(fail(
                node,
                format!("cannot pack {}", local.display()),
                std::io::Error::other(String::from_utf8_lossy(&tar.stderr).trim().to_string()),
            ));
        }
        let script = if local.is_dir() {
            format!("mkdir -p {d} && tar -C {d} -xf -", d = sh_quote(&dest))
        } else {
            // A file lands at dest itself.
            let parent = dest.rsplit_once('/').map_or(".", |(p, _)| p);
            format!(
                "mkdir -p {p} && t=$(mktemp -d {p}/.gw.XXXXXX) && tar -C \"$t\" -xf - && mv -f \"$t\"/{f} {d}; rm -rf \"$t\"",
                p = sh_quote(if parent.is_empty() { "/" } else { parent }),
                f = sh_quote(&name),
                d = sh_quote(&dest)
            )
        };
        run(self, node, &script, Some(&tar.stdout)).map(|_| ())
    }

    fn node_path(&self, node: &NodeRow, path: &str) -> String {
        let home = extra(node, "home");
        if let Some(rest) = path.strip_prefix("~/") {
            format!("{home}/{rest}")
        } else if path == "~" {
            home.to_string()
        } else if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{home}/{path}")
        }
    }

    fn make_dir(&self, node: &NodeRow, path: &str) -> Result<(), TransportError> {
        run(self, node, &format!("mkdir -p {}", sh_quote(path)), None).map(|_| ())
    }

    fn download(
        &self,
        node: &NodeRow,
        path: &str,
        dest: &Path,
    ) -> Result<gangway_provider::Skipped, TransportError> {
        use gangway_provider::tree::{unpack_from_command, CommandTarError};
        let script = format!(
            "if [ -d {p} ]; then tar -C {p} -cf - .; fi",
            p = sh_quote(path)
        );
        // Unpacked as the step sends it (a checkpoint can be larger than
        // memory), merged only once the step ended well.
        let c = self.slurm_command(node, "srun", &srun_args(node, &script));
        match unpack_from_command(c, dest) {
            Ok(skipped) => Ok(skipped),
            Err(CommandTarError::Spawn(e)) => Err(fail(node, "cannot run srun", e)),
            Err(CommandTarError::Failed(status, said)) => Err(fail(
                node,
                format!("a step on {} failed ({status})", extra(node, keys::NODE)),
                std::io::Error::other(said),
            )),
            Err(CommandTarError::Unpack(e)) => Err(fail(
                node,
                format!("cannot copy {path} to {}", dest.display()),
                e,
            )),
        }
    }

    fn write_file(&self, node: &NodeRow, path: &str, data: &[u8]) -> Result<(), TransportError> {
        run(
            self,
            node,
            &format!("cat > {p}.tmp && mv -f {p}.tmp {p}", p = sh_quote(path)),
            Some(data),
        )
        .map(|_| ())
    }

    fn preemption_notice(&self, node: &NodeRow) -> Option<String> {
        // Slurm signals the steps itself when it preempts with GraceTime,
        // and marks the job with the time it will take it back; a job it
        // already requeued or took shows in its state.
        let mut c = self.slurm_command(
            node,
            "scontrol",
            &[
                "-o".into(),
                "show".into(),
                "job".into(),
                extra(node, keys::JOB).into(),
            ],
        );
        let out = c.stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let f = crate::parse::fields(text.lines().next()?);
        let preempt = f.get("PreemptTime").copied().unwrap_or("None");
        let state = f.get("JobState").copied().unwrap_or("");
        let restarts = f.get("Restarts").copied().unwrap_or("0");
        if preempt != "None" && !preempt.is_empty() {
            Some(format!(
                "Slurm preempts job {} at {preempt}",
                extra(node, keys::JOB)
            ))
        } else if matches!(state, "PREEMPTED" | "NODE_FAIL") || restarts != "0" {
            Some(format!(
                "Slurm job {}: {state}, restarts {restarts}",
                extra(node, keys::JOB)
            ))
        } else {
            None
        }
    }

    fn probe(&self, node: &NodeRow, script: &str) -> Result<String, TransportError> {
        run(self, node, script, None).map(|o| String::from_utf8_lossy(&o).into_owned())
    }
}
