//! Commands in pods through the API's `pods/exec` (websocket, protocol
//! v5 where the server has it, so stdin can be closed).
//!
//! A command's script and environment travel on the exec stream's stdin,
//! never in the pod spec or on a command line: the pod side writes them to
//! a fresh temporary file that the script removes first thing, and runs
//! it in a session of its own (`setsid -w`, where util-linux has it) with
//! `GANGWAY_TOKEN` in its starting environment, so a second exec finds and
//! signals its process group ([`gangway_provider::signal_token`]).
//! stdout and stderr both go to the caller's pipe; the exit status comes
//! from the stream's status channel. Files travel as tar streams (`tar`
//! in the image).

use std::collections::HashMap;
use std::io::{PipeWriter, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use gangway_provider::{
    sh_quote, signal_token, NodeCommand, NodeProcess, NodeRow, Transport, TransportError, TOKEN_VAR,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{keys, rt, Shared, CONTAINER};

/// What a short exec gave back.
pub(crate) struct Collected {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) code: i32,
}

/// The exit code reported when the stream broke before the command's
/// status came (the pod or its node went away, the connection dropped).
const LOST: i32 = 255;

/// The exit code in an exec's final status.
fn exit_code(status: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>) -> i32 {
    let Some(s) = status else { return LOST };
    if s.status.as_deref() == Some("Success") {
        return 0;
    }
    s.details
        .and_then(|d| d.causes)
        .into_iter()
        .flatten()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message?.parse().ok())
        .unwrap_or(LOST)
}

/// Reads from `r`; never ends without one (a closed stream's branch).
async fn read_some(
    r: Option<&mut tokio::io::ReadHalf<tokio::io::SimplexStream>>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

/// What a command in a pod reads: bytes at hand, or a stream read as it
/// is sent (a tar of a checkpoint larger than memory).
pub(crate) enum Input {
    Bytes(Vec<u8>),
    Stream(Box<dyn std::io::Read + Send>),
}

/// Writes `input` to an exec's stdin, then closes it. A stream is read on
/// the blocking pool, a few chunks ahead of the connection.
async fn feed(input: Input, mut w: impl tokio::io::AsyncWrite + Unpin) {
    match input {
        Input::Bytes(data) => {
            let _ = w.write_all(&data).await;
        }
        Input::Stream(mut r) => {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
            let reading = tokio::task::spawn_blocking(move || loop {
                let mut chunk = vec![0u8; 64 * 1024];
                match r.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        chunk.truncate(n);
                        if tx.blocking_send(chunk).is_err() {
                            break;
                        }
                    }
                }
            });
            while let Some(chunk) = rx.recv().await {
                if w.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            // A write that failed leaves the reader to stop at its next
            // chunk (the channel is closed).
            drop(rx);
            let _ = reading.await;
        }
    }
    let _ = w.shutdown().await;
}

/// Runs `command` in `pod`'s container with `stdin` (then closed), sending
/// stdout and stderr to `out` as they come; the exit code.
async fn exec_stream(
    api: &Api<Pod>,
    pod: &str,
    command: Vec<String>,
    stdin: Option<Input>,
    mut out: impl FnMut(bool, &[u8]) + Send,
) -> Result<i32, String> {
    let ap = AttachParams::default()
        .container(CONTAINER)
        .stdin(stdin.is_some())
        .stdout(true)
        .stderr(true)
        .max_stdin_buf_size(64 * 1024)
        .max_stdout_buf_size(64 * 1024)
        .max_stderr_buf_size(64 * 1024);
    let mut p = api
        .exec(pod, command, &ap)
        .await
        .map_err(|e| gangway_provider::error_chain(&e))?;
    let status = p.take_status();
    let feeder = match (stdin, p.stdin()) {
        (Some(input), Some(w)) => Some(tokio::spawn(feed(input, w))),
        _ => None,
    };
    let mut so = p.stdout();
    let mut se = p.stderr();
    let mut b1 = vec![0u8; 32 * 1024];
    let mut b2 = vec![0u8; 32 * 1024];
    while so.is_some() || se.is_some() {
        tokio::select! {
            r = read_some(so.as_mut(), &mut b1), if so.is_some() => match r {
                Ok(0) | Err(_) => so = None,
                Ok(n) => out(false, &b1[..n]),
            },
            r = read_some(se.as_mut(), &mut b2), if se.is_some() => match r {
                Ok(0) | Err(_) => se = None,
                Ok(n) => out(true, &b2[..n]),
            },
        }
    }
    if let Some(f) = feeder {
        f.abort();
    }
    let code = match status {
        Some(s) => exit_code(s.await),
        None => LOST,
    };
    let _ = p.join().await;
    Ok(code)
}

/// Runs `command` in `pod` and collects its output.
pub(crate) async fn exec_collect(
    api: &Api<Pod>,
    pod: &str,
    command: Vec<String>,
    stdin: Option<Input>,
) -> Result<Collected, String> {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let code = exec_stream(api, pod, command, stdin, |err, b| {
        if err {
            stderr.extend_from_slice(b)
        } else {
            stdout.extend_from_slice(b)
        }
    })
    .await?;
    Ok(Collected {
        stdout,
        stderr,
        code,
    })
}

/// The exec transport.
pub struct ExecTransport {
    shared: Arc<Shared>,
    /// The label selector of the cluster's pods.
    selector: String,
    /// Process id → token of its command in the pod.
    tokens: Mutex<HashMap<u32, String>>,
    /// The last reading of every pod's notice per (context, namespace):
    /// one list of the cluster's pods and one read of each of their nodes
    /// answers every node's question for [`NOTICE_TTL`] (the controller
    /// asks each node twice a second).
    notices: Mutex<HashMap<(String, String), (std::time::Instant, Notices)>>,
}

/// Pod name → its notice (`None`: none).
type Notices = HashMap<String, Option<String>>;

/// How long one reading of the cluster's pods answers notice questions.
const NOTICE_TTL: std::time::Duration = std::time::Duration::from_secs(2);

impl ExecTransport {
    pub(crate) fn new(shared: Arc<Shared>, selector: String) -> ExecTransport {
        ExecTransport {
            shared,
            selector,
            tokens: Mutex::default(),
            notices: Mutex::default(),
        }
    }

    fn api(&self, node: &NodeRow) -> impl std::future::Future<Output = Result<Api<Pod>, String>> {
        let shared = self.shared.clone();
        let context = node.fact(keys::CONTEXT).to_string();
        let namespace = node.fact(keys::NAMESPACE).to_string();
        async move {
            let c = shared.client(&context).await.map_err(|e| e.to_string())?;
            Ok(Api::namespaced(c, &namespace))
        }
    }

    /// Runs a short `sh -c script` in the node's pod: its output, or an
    /// error naming the node.
    fn run(
        &self,
        node: &NodeRow,
        what: &str,
        script: &str,
        stdin: Option<Input>,
    ) -> Result<Collected, TransportError> {
        let api = self.api(node);
        let pod = node.instance_id.clone();
        let command = vec!["/bin/sh".to_string(), "-c".to_string(), script.to_string()];
        let got = rt::block(async move {
            let api = api.await?;
            exec_collect(&api, &pod, command, stdin).await
        })
        .and_then(|r| r);
        match got {
            Ok(c) if c.code == 0 => Ok(c),
            Ok(c) => Err(exited(node, what, c.code, &c.stderr)),
            Err(e) => Err(fail(node, what, std::io::Error::other(e))),
        }
    }
}

/// A command in the pod that exited `code`, with what it said on stderr.
fn exited(node: &NodeRow, what: impl Into<String>, code: i32, stderr: &[u8]) -> TransportError {
    let said = String::from_utf8_lossy(stderr);
    fail(
        node,
        what,
        std::io::Error::other(format!("exit {code}: {}", said.trim())),
    )
}

fn fail(node: &NodeRow, what: impl Into<String>, source: std::io::Error) -> TransportError {
    TransportError {
        node: format!("rank {} (pod {})", node.rank, node.instance_id),
        what: what.into(),
        source,
    }
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// The pod side of a spawned command: the wrapper arrives on stdin and is
/// run from a temporary file, by a bash that leads a process group of its
/// own with `GANGWAY_TOKEN` in its starting environment (only it, not a
/// `setsid` waiting for it), so a signal reaches the command's group and
/// the exec still reports how it ended. Where the exec already leads its
/// group (the bash keeps that pid) nothing more is done; elsewhere
/// `setsid -w` makes one. (The harness kills an exec's group with its pod,
/// and only that group: a command moved out of it by `setsid` outlived its
/// pod there. In a real container the container's end takes everything.)
fn launcher(token: &str) -> String {
    format!(
        "t=$(mktemp) || exit 125; cat > \"$t\" || exit 125; \
         g=; read -r _ _ _ _ g _ < /proc/$$/stat 2>/dev/null; \
         if [ \"$g\" != \"$$\" ] && command -v setsid >/dev/null 2>&1 && setsid -w true 2>/dev/null; then \
         exec setsid -w env {TOKEN_VAR}={token} bash \"$t\" </dev/null; \
         else exec env {TOKEN_VAR}={token} bash \"$t\" </dev/null; fi"
    )
}

/// The variable naming the cluster (its pods' label selector) in the
/// environment of every command this transport starts: what a signal to a
/// run started by another process ([`Transport::signal_job`]) matches
/// besides the run's number (where pods share one process table, as the
/// test harness's do, run numbers repeat across clusters).
const SCOPE_VAR: &str = "GANGWAY_K8S_SCOPE";

/// The script a spawned command's bash runs: remove itself, set the
/// environment, go to its directory, and become a bash that runs the
/// script (`exec`: the same process, group leader and exit status, now
/// with the environment in its starting one, which is what
/// [`Transport::signal_job`] finds a run's processes by, the script's own
/// shell included: it is what traps `checkpoint.signal`).
fn wrapper(env: &[(String, String)], cwd: &str, script: &str) -> String {
    let mut s = String::from("rm -f \"$0\"\n");
    for (k, v) in env {
        s.push_str(&format!("export {k}={}\n", sh_quote(v)));
    }
    s.push_str(&format!(
        "cd {} 2>/dev/null || cd \"$HOME\"\nexec bash -c {}\n",
        sh_quote(cwd),
        sh_quote(script)
    ));
    s
}

#[async_trait::async_trait]
impl Transport for ExecTransport {
    fn spawn(
        &self,
        node: &NodeRow,
        cmd: &NodeCommand,
        output: PipeWriter,
    ) -> Result<NodeProcess, TransportError> {
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = format!("gw{}-{id}", std::process::id());
        let mut env: Vec<(String, String)> = node
            .env()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.extend(cmd.env.iter().cloned());
        env.push((SCOPE_VAR.to_string(), self.selector.clone()));
        let body = wrapper(&env, &self.node_path(node, &cmd.cwd), &cmd.script);
        if let Ok(mut m) = self.tokens.lock() {
            m.insert(id, token.clone());
        }
        // The pipe is written from a thread of its own: a slow reader
        // never stalls the provider's runtime.
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let mut output = output;
        std::thread::Builder::new()
            .name("gangway-k8s-output".into())
            .spawn(move || {
                for chunk in rx {
                    if output.write_all(&chunk).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| fail(node, "cannot start an output thread", e))?;
        let api = self.api(node);
        let pod = node.instance_id.clone();
        let command = vec!["/bin/sh".to_string(), "-c".to_string(), launcher(&token)];
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let label = format!("pod {pod}");
        rt::spawn(async move {
            let r = async {
                let api = api.await?;
                exec_stream(
                    &api,
                    &pod,
                    command,
                    Some(Input::Bytes(body.into_bytes())),
                    |_, b| {
                        let _ = tx.send(b.to_vec());
                    },
                )
                .await
            }
            .await;
            let _ = done_tx.send(r);
        });
        Ok(NodeProcess::new(id, async move {
            match done_rx.await {
                Ok(Ok(code)) => Ok(std::process::ExitStatus::from_raw((code & 0xff) << 8)),
                Ok(Err(e)) => Err(std::io::Error::other(format!("exec in {label}: {e}"))),
                Err(_) => Err(std::io::Error::other(format!(
                    "exec in {label}: the provider's task ended"
                ))),
            }
        }))
    }

    fn signal(&self, node: &NodeRow, pgid: u32, signal: i32) {
        let token = self.tokens.lock().ok().and_then(|m| m.get(&pgid).cloned());
        if let Some(token) = token {
            let _ = self.run(node, "signal", &signal_token(&token, signal), None);
        }
    }

    fn signal_job(&self, node: &NodeRow, _pgid: u32, job: i64, signal: i32) {
        let script = gangway_provider::kill_where(
            &[
                ("GANGWAY_RUN", &job.to_string()),
                (SCOPE_VAR, &self.selector),
            ],
            &gangway_provider::kill_option(signal),
        );
        let _ = self.run(node, "signal the job", &script, None);
    }

    fn reaped(&self, _node: &NodeRow, pgid: u32) {
        if let Ok(mut m) = self.tokens.lock() {
            m.remove(&pgid);
        }
    }

    fn explain_exit(&self, status: &std::process::ExitStatus) -> Option<String> {
        (status.code() == Some(LOST))
            .then(|| "the exec stream to the pod ended without an exit status (the pod, its node or the connection went away)".to_string())
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
        let script = if local.is_dir() {
            format!("mkdir -p {d} && tar -C {d} -xf -", d = sh_quote(&dest))
        } else {
            let parent = dest.rsplit_once('/').map_or(".", |(p, _)| p);
            format!(
                "mkdir -p {p} && t=$(mktemp -d {p}/.gw.XXXXXX) && tar -C \"$t\" -xf - && mv -f \"$t\"/{f} {d}; rm -rf \"$t\"",
                p = sh_quote(if parent.is_empty() { "/" } else { parent }),
                f = sh_quote(&name),
                d = sh_quote(&dest)
            )
        };
        // The tar streams into the pod as it is made: a restored
        // checkpoint can be larger than this machine's memory.
        let packing = || format!("cannot pack {}", local.display());
        let mut tar = std::process::Command::new("tar")
            .arg("-C")
            .arg(&dir)
            .arg("-cf")
            .arg("-")
            .arg(&name)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(node, packing(), e))?;
        let (Some(packed), Some(mut said)) = (tar.stdout.take(), tar.stderr.take()) else {
            let _ = tar.kill();
            let _ = tar.wait();
            return Err(fail(node, packing(), std::io::Error::other("no pipes")));
        };
        let complaint = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut said, &mut s);
            s
        });
        let sent = self.run(
            node,
            &format!("upload {} to {dest}", local.display()),
            &script,
            Some(Input::Stream(Box::new(packed))),
        );
        let packed = tar.wait();
        let complaint = complaint.join().unwrap_or_default();
        match packed {
            Ok(status) if status.success() => sent.map(|_| ()),
            // The pod stopped reading (its command failed): its error is
            // the cause.
            Ok(status)
                if std::os::unix::process::ExitStatusExt::signal(&status)
                    == Some(libc::SIGPIPE) =>
            {
                sent.map(|_| ())
            }
            // The tar failed on its own (a file it could not read): what
            // the pod said of a stream that broke off is its effect.
            Ok(_) => Err(fail(
                node,
                packing(),
                std::io::Error::other(complaint.trim().to_string()),
            )),
            Err(e) => Err(fail(node, packing(), e)),
        }
    }

    fn node_path(&self, node: &NodeRow, path: &str) -> String {
        let home = node.fact(keys::HOME);
        let home = if home.is_empty() { "/root" } else { home };
        if let Some(rest) = path.strip_prefix("~/") {
            format!("{home}/{rest}")
        } else if path == "~" || path.is_empty() {
            home.to_string()
        } else if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{home}/{path}")
        }
    }

    fn make_dir(&self, node: &NodeRow, path: &str) -> Result<(), TransportError> {
        self.run(
            node,
            &format!("mkdir {path}"),
            &format!("mkdir -p {}", sh_quote(path)),
            None,
        )
        .map(|_| ())
    }

    fn download(
        &self,
        node: &NodeRow,
        path: &str,
        dest: &Path,
    ) -> Result<gangway_provider::Skipped, TransportError> {
        // Unpacked as it arrives (a checkpoint can be larger than this
        // machine's memory), beside `dest`, and merged only once the pod's
        // tar exited 0.
        let copying = || format!("cannot copy {path} to {}", dest.display());
        let (reader, mut writer) = std::io::pipe().map_err(|e| fail(node, copying(), e))?;
        let into = dest.to_path_buf();
        let unpacking =
            std::thread::spawn(move || gangway_provider::tree::stage_stream(reader, &into));
        let api = self.api(node);
        let pod = node.instance_id.clone();
        let script = format!(
            "if [ -d {p} ]; then tar -C {p} -cf - .; fi",
            p = sh_quote(path)
        );
        let command = vec!["/bin/sh".to_string(), "-c".to_string(), script];
        let got = rt::block(async move {
            let api = api.await?;
            let mut stderr = Vec::new();
            let mut open = true;
            let code = exec_stream(&api, &pod, command, None, |err, b| {
                if err {
                    stderr.extend_from_slice(b);
                } else if open {
                    // The unpacker reads beside this; a write that fails
                    // (it gave up) drops the rest.
                    open = std::io::Write::write_all(&mut writer, b).is_ok();
                }
            })
            .await;
            drop(writer);
            code.map(|c| (c, stderr))
        })
        .and_then(|r| r);
        let staged = unpacking
            .join()
            .unwrap_or_else(|_| Some(Err(std::io::Error::other("the unpacking thread panicked"))));
        let what = format!("download {path}");
        match got {
            Ok((0, _)) => match staged {
                None => Ok(Vec::new()),
                Some(s) => s
                    .and_then(gangway_provider::tree::Staged::merge)
                    .map_err(|e| fail(node, copying(), e)),
            },
            Ok((code, stderr)) => Err(exited(node, what, code, &stderr)),
            Err(e) => Err(fail(node, what, std::io::Error::other(e))),
        }
    }

    fn write_file(&self, node: &NodeRow, path: &str, data: &[u8]) -> Result<(), TransportError> {
        self.run(
            node,
            &format!("write {path}"),
            &format!("cat > {p}.tmp && mv -f {p}.tmp {p}", p = sh_quote(path)),
            Some(Input::Bytes(data.to_vec())),
        )
        .map(|_| ())
    }

    fn preemption_notice(&self, node: &NodeRow) -> Option<String> {
        let place = (
            node.fact(keys::CONTEXT).to_string(),
            node.fact(keys::NAMESPACE).to_string(),
        );
        let pod = node.instance_id.clone();
        if let Some((at, n)) = self.notices.lock().ok()?.get(&place) {
            if at.elapsed() < NOTICE_TTL {
                return match n.get(&pod) {
                    Some(notice) => notice.clone(),
                    None => Some(format!("pod {pod} is gone")),
                };
            }
        }
        let shared = self.shared.clone();
        let selector = self.selector.clone();
        let (context, namespace) = place.clone();
        // A reading that fails reads as no notice: it never fails a job.
        let read = rt::block(async move {
            let client = shared.client(&context).await.ok()?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let list = pods
                .list(&kube::api::ListParams::default().labels(&selector))
                .await
                .ok()?
                .items;
            let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
            let mut seen: HashMap<String, Option<k8s_openapi::api::core::v1::Node>> =
                HashMap::new();
            let mut out = Notices::new();
            for p in list {
                let name = p.metadata.name.clone().unwrap_or_default();
                let node_name = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                if !node_name.is_empty() && !seen.contains_key(&node_name) {
                    let n = nodes.get_opt(&node_name).await.ok()?;
                    seen.insert(node_name.clone(), n);
                }
                let n = seen.get(&node_name).map(Option::as_ref);
                // A loss reads as a notice too; a node tainted as leaving is
                // only a notice.
                let notice = match crate::pod_state(&p, n, shared.cfg.not_ready_tolerance) {
                    gangway_provider::NodeState::Preempted { reason } => Some(reason),
                    _ => crate::leaving(&p, n.flatten()),
                };
                out.insert(name, notice);
            }
            Some(out)
        })
        .ok()
        .flatten()?;
        let answer = match read.get(&pod) {
            Some(notice) => notice.clone(),
            None => Some(format!("pod {pod} is gone")),
        };
        if let Ok(mut m) = self.notices.lock() {
            m.insert(place, (std::time::Instant::now(), read));
        }
        answer
    }

    fn probe(&self, node: &NodeRow, script: &str) -> Result<String, TransportError> {
        self.run(node, "probe", script, None)
            .map(|c| String::from_utf8_lossy(&c.stdout).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_travel_on_stdin_not_the_command_line() {
        let l = launcher("gw1-2");
        assert!(l.contains("GANGWAY_TOKEN=gw1-2"), "{l}");
        let w = wrapper(
            &[("API_KEY".into(), "it's secret".into())],
            "/home/x/sky_workdir",
            "echo hi",
        );
        assert!(w.starts_with("rm -f \"$0\"\n"), "{w}");
        assert!(w.contains("export API_KEY='it'\\''s secret'\n"), "{w}");
        assert!(!l.contains("secret"));
        assert!(w.ends_with("exec bash -c 'echo hi'\n"), "{w}");
    }

    #[test]
    fn exit_codes_come_from_the_status() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
        assert_eq!(exit_code(None), LOST);
        assert_eq!(
            exit_code(Some(Status {
                status: Some("Success".into()),
                ..Default::default()
            })),
            0
        );
        assert_eq!(
            exit_code(Some(Status {
                status: Some("Failure".into()),
                reason: Some("NonZeroExitCode".into()),
                details: Some(StatusDetails {
                    causes: Some(vec![StatusCause {
                        reason: Some("ExitCode".into()),
                        message: Some("3".into()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            3
        );
    }
}
