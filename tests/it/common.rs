//! Running the real `gangway` binary in a clean environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared` beside the repository, if this checkout has it.
pub fn shared() -> Option<PathBuf> {
    let p = root().join("../shared");
    p.is_dir().then_some(p)
}

/// Runs gangway with `args`, with no catalog override from the environment.
pub fn gangway<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_gangway"))
        .args(args)
        .env_remove("GANGWAY_CATALOG_DIR")
        .env_remove("RUST_LOG")
        .current_dir(root())
        .output()
        .expect("gangway runs")
}

/// Exit code, stdout and stderr as strings.
pub fn parts(o: &Output) -> (i32, String, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write fixture");
    p
}

// ---------------------------------------------------------------------------
// End-to-end runs against the embedded local cloud: one GANGWAY_HOME per test.
// ---------------------------------------------------------------------------

use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one gangway command may run before it is killed as a hang.
/// Not a timing assertion: only a hang detector.
pub const WATCHDOG: Duration = Duration::from_secs(240);

/// How long a test waits for an observable state (a job status, a process
/// to be gone). Generous: tests share a loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The env name every test task carries, with a value unique to the test,
/// so its node processes can be found in `/proc`.
pub const MARKER_ENV: &str = "GW_TEST_MARKER";

/// A gangway command with `home` as `GANGWAY_HOME`, no catalog override,
/// no log filter, stdin closed, run from the repository root.
pub fn command_in(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gangway"));
    c.env_remove("GANGWAY_CATALOG_DIR")
        .env_remove("RUST_LOG")
        .env("GANGWAY_HOME", home)
        .current_dir(root())
        .stdin(Stdio::null());
    c
}

/// Runs gangway with `args` and `home` as `GANGWAY_HOME` to its end (a
/// command still running after [`WATCHDOG`] is killed and the test fails).
pub fn gangway_in<I, S>(home: &Path, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = command_in(home);
    c.args(args);
    Running::start(c).wait()
}

/// Starts gangway with `args` and `home` as `GANGWAY_HOME` without waiting;
/// stdout and stderr are piped.
pub fn spawn_in<I, S>(home: &Path, args: I) -> Child
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = command_in(home);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn().expect("gangway starts")
}

fn drain(mut pipe: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => into
                    .lock()
                    .expect("output buffer")
                    .extend_from_slice(&buf[..n]),
            }
        }
    })
}

/// A gangway process that is still running, its output collected as it
/// comes. Dropping it kills the process (SIGKILL) if it is still running,
/// so a failing test leaves no launcher behind.
pub struct Running {
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<std::process::ExitStatus>,
}

impl Running {
    /// Waits until stdout contains `needle`; fails the test (with what was
    /// printed) if the process exits first or `DEADLINE` passes.
    pub fn wait_for_stdout(&mut self, needle: &str, what: &str) {
        wait_for(what, DEADLINE, || {
            let so_far = self.stdout_now();
            if so_far.contains(needle) {
                Ok(())
            } else if self.exited() {
                Err(format!("exited early: {so_far}{}", self.stderr_now()))
            } else {
                Err(so_far)
            }
        });
    }

    /// Spawns `c` with piped output.
    pub fn start(mut c: Command) -> Running {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        Running::from_child(c.spawn().expect("gangway starts"))
    }

    /// Collects the output of a child whose stdout and stderr are piped.
    pub fn from_child(mut child: Child) -> Running {
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            drain(
                child.stdout.take().expect("stdout is piped"),
                stdout.clone(),
            ),
            drain(
                child.stderr.take().expect("stderr is piped"),
                stderr.clone(),
            ),
        ];
        Running {
            child,
            stdout,
            stderr,
            readers,
            status: None,
        }
    }

    /// Stdout so far.
    pub fn stdout_now(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().expect("output buffer")).into_owned()
    }

    /// Stderr so far.
    pub fn stderr_now(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("output buffer")).into_owned()
    }

    /// Sends `sig` to the process (never to a process that was reaped).
    pub fn signal(&mut self, sig: i32) {
        if self.status.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe {
                libc::kill(self.child.id() as i32, sig);
            }
        }
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status.is_some()
    }

    /// Waits for the end (at most [`WATCHDOG`]) and returns everything.
    pub fn wait(mut self) -> Output {
        let started = Instant::now();
        while !self.exited() {
            if started.elapsed() > WATCHDOG {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "gangway (pid {}) was still running after {}s and was killed (a hang)\n\
                     stdout:\n{}\nstderr:\n{}",
                    self.child.id(),
                    WATCHDOG.as_secs(),
                    self.stdout_now(),
                    self.stderr_now()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Output {
            status: self.status.expect("exited"),
            stdout: std::mem::take(&mut *self.stdout.lock().expect("output buffer")),
            stderr: std::mem::take(&mut *self.stderr.lock().expect("output buffer")),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.exited() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until `probe` says yes (Ok), polling, for at most `timeout`; on
/// timeout the test fails with `what` and the last thing `probe` saw (Err).
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let started = Instant::now();
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if started.elapsed() > timeout => panic!(
                "timed out after {}s waiting for {what}; last seen: {last}",
                timeout.as_secs()
            ),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Processes whose environment has exactly the entry `entry` (`KEY=VALUE`).
/// Processes that vanish (or cannot be read) while scanning are skipped.
pub fn procs_with_env(entry: &str) -> Vec<u32> {
    let me = std::process::id();
    let needle = entry.as_bytes();
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == needle) {
            found.push(pid);
        }
    }
    found
}

/// Processes carrying a test's marker env value.
pub fn procs_with_marker(marker: &str) -> Vec<u32> {
    procs_with_env(&format!("{MARKER_ENV}={marker}"))
}

/// `pid: command line`, for failure messages.
pub fn describe_procs(pids: &[u32]) -> String {
    pids.iter()
        .map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            format!("{p}: {}", cmd.trim())
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Waits (up to 20 s: SIGTERM to exit is asynchronous) until no process
/// carries `marker`; returns those still there.
pub fn leftover_marker_procs(marker: &str) -> Vec<u32> {
    let started = Instant::now();
    loop {
        let left = procs_with_marker(marker);
        if left.is_empty() || started.elapsed() > Duration::from_secs(20) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fails the test if a process carrying `marker` is still alive (after the
/// grace [`leftover_marker_procs`] gives).
pub fn assert_no_marker_procs(marker: &str, after: &str) {
    let left = leftover_marker_procs(marker);
    assert!(
        left.is_empty(),
        "node processes still alive after {after}: {}",
        describe_procs(&left)
    );
}

/// A test's own `GANGWAY_HOME`. Dropping it (also when the test fails)
/// tears every cluster down, then kills whatever the test's processes left.
pub struct TestHome {
    dir: tempfile::TempDir,
    /// The value of [`MARKER_ENV`] in this test's tasks.
    pub marker: String,
}

impl TestHome {
    /// A fresh, empty home.
    pub fn new() -> TestHome {
        let dir = tempfile::Builder::new()
            .prefix("gangway-it-")
            .tempdir()
            .expect("tempdir");
        let tag: String = dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        TestHome {
            marker: format!("gwt{tag}{}", std::process::id()),
            dir,
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs gangway in this home.
    pub fn run<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        gangway_in(self.path(), args)
    }

    /// Starts gangway in this home without waiting.
    pub fn spawn<I, S>(&self, args: I) -> Running
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Running::from_child(spawn_in(self.path(), args))
    }

    /// Writes a file into the home's directory; returns its path as text.
    pub fn file(&self, name: &str, text: &str) -> String {
        write(self.path(), name, text).display().to_string()
    }

    /// `--env GW_TEST_MARKER=...`, for tasks this test does not write.
    pub fn marker_env(&self) -> String {
        format!("{MARKER_ENV}={}", self.marker)
    }

    /// `status -o json`: every cluster (without nodes).
    pub fn clusters(&self) -> Vec<Value> {
        let o = self.run(["status", "-o", "json"]);
        let (code, out, err) = parts(&o);
        assert_eq!(code, 0, "status -o json failed: {err}");
        json_doc(&out)["clusters"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("status JSON has no clusters list: {out}"))
    }

    /// The cluster `name` from `status -o json`, if listed.
    pub fn cluster_opt(&self, name: &str) -> Option<Value> {
        self.clusters().into_iter().find(|c| c["name"] == name)
    }

    /// `status NAME -o json`: the cluster with its nodes (the test fails if
    /// there is no such cluster).
    pub fn cluster(&self, name: &str) -> Value {
        let o = self.run(["status", name, "-o", "json"]);
        let (code, out, err) = parts(&o);
        assert_eq!(code, 0, "status {name} -o json failed: {err}");
        let v = json_doc(&out);
        let list = v["clusters"].as_array().cloned().unwrap_or_default();
        assert_eq!(list.len(), 1, "status {name}: {out}");
        list[0].clone()
    }

    /// The cluster's nodes in rank order: (rank, private_ip, instance_id, zone).
    pub fn nodes(&self, name: &str) -> Vec<NodeInfo> {
        let c = self.cluster(name);
        let nodes = c["nodes"]
            .as_array()
            .unwrap_or_else(|| panic!("status {name}: no nodes list: {c}"));
        nodes
            .iter()
            .map(|n| NodeInfo {
                rank: n["rank"].as_u64().expect("rank") as u32,
                ip: n["private_ip"].as_str().expect("private_ip").to_string(),
                id: n["instance_id"].as_str().expect("instance_id").to_string(),
                zone: n["zone"].as_str().expect("zone").to_string(),
                topology: n["topology"].as_str().unwrap_or("").to_string(),
                ports: n["ports"].as_str().map(str::to_string),
            })
            .collect()
    }

    /// A node's home directory on the local cloud.
    pub fn node_home(&self, instance_id: &str) -> PathBuf {
        self.path()
            .join("local/nodes")
            .join(instance_id)
            .join("home")
    }

    /// `queue CLUSTER -o json`: the jobs, oldest first.
    pub fn jobs(&self, cluster: &str) -> Vec<Value> {
        self.jobs_opt(cluster)
            .unwrap_or_else(|e| panic!("queue {cluster} -o json failed: {e}"))
    }

    /// `queue CLUSTER -o json`, or its error (e.g. no such cluster).
    pub fn jobs_opt(&self, cluster: &str) -> Result<Vec<Value>, String> {
        let o = self.run(["queue", cluster, "-o", "json"]);
        let (code, out, err) = parts(&o);
        if code != 0 {
            return Err(format!("exit {code}: {err}"));
        }
        Ok(json_doc(&out)["jobs"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("queue JSON has no jobs list: {out}")))
    }

    /// The latest job of `cluster`.
    pub fn last_job(&self, cluster: &str) -> Value {
        self.jobs(cluster)
            .pop()
            .unwrap_or_else(|| panic!("cluster {cluster} has no jobs"))
    }

    /// Polls the queue until the latest job of `cluster` has `status`;
    /// returns the job.
    pub fn wait_job_status(&self, cluster: &str, status: &str) -> Value {
        wait_for(
            &format!("the latest job on {cluster} to be {status}"),
            DEADLINE,
            || {
                // The cluster may not exist yet (a launch is provisioning it).
                let jobs = self.jobs_opt(cluster)?;
                match jobs.last() {
                    Some(j) if j["status"] == status => Ok(j.clone()),
                    Some(j) => Err(j.to_string()),
                    None => Err("no jobs".into()),
                }
            },
        )
    }

    /// The local cloud's instance records (`local/instances/<cluster>/`),
    /// as `cluster/file`; anything else left in `local/instances` too.
    pub fn instance_records(&self) -> Vec<String> {
        let root = self.path().join("local/instances");
        let mut out = Vec::new();
        for name in dir_names(&root) {
            let inner = dir_names(&root.join(&name));
            if root.join(&name).is_dir() && !inner.is_empty() {
                out.extend(inner.into_iter().map(|f| format!("{name}/{f}")));
            } else {
                out.push(name);
            }
        }
        out
    }

    /// Directories under `local/nodes`.
    pub fn node_dirs(&self) -> Vec<String> {
        dir_names(&self.path().join("local/nodes"))
    }
}

impl Default for TestHome {
    fn default() -> Self {
        TestHome::new()
    }
}

impl Drop for TestHome {
    fn drop(&mut self) {
        // The local cloud's suite never skips (it needs bash and python3
        // only, which CI checks), but its runs are counted like every
        // suite's (tests/support/src/skip.rs): a test that launched on the
        // local cloud left its launch counters here.
        if self.path().join("local/launches").is_dir() {
            crate::skip::ran("local");
        }
        // Everything below is best effort and must not panic (this may run
        // while a failed test unwinds).
        let home_entry = format!("GANGWAY_HOME={}", self.path().display());
        // Managed jobs first: their controller would bring clusters back.
        for args in [
            &["jobs", "cancel", "--all"][..],
            &["down", "--all", "-y"][..],
        ] {
            let mut c = command_in(self.path());
            c.args(args).stdout(Stdio::null()).stderr(Stdio::null());
            if let Ok(mut child) = c.spawn() {
                let started = Instant::now();
                while matches!(child.try_wait(), Ok(None)) && started.elapsed() < WATCHDOG {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Drivers, autostop watchers and node processes end on their own
        // after `down`; give them a moment, then kill what is left.
        let started = Instant::now();
        loop {
            let mut left = procs_with_marker(&self.marker);
            left.extend(procs_with_env(&home_entry));
            // An ssh master kept open for the next command (a hosted
            // controller's connection) has no next command here.
            left.retain(|pid| {
                let ssh = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "ssh");
                if ssh {
                    // SAFETY: kill(2) of an ssh this test's gangway started
                    // (it carries the test's GANGWAY_HOME).
                    unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
                }
                !ssh
            });
            if left.is_empty() {
                break;
            }
            if started.elapsed() > Duration::from_secs(15) {
                for pid in left {
                    // SAFETY: kill(2) on a process this test started (it
                    // carries the test's own marker or GANGWAY_HOME).
                    unsafe {
                        libc::kill(pid as i32, libc::SIGKILL);
                    }
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One node of `status NAME -o json`.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// Rank.
    pub rank: u32,
    /// Private address.
    pub ip: String,
    /// Provider id.
    pub id: String,
    /// Zone.
    pub zone: String,
    /// Topology path, `/`-joined.
    pub topology: String,
    /// The node's own port range, `FIRST-LAST`, where nodes share one
    /// address (the local provider's single-address mode).
    pub ports: Option<String>,
}

/// Parses stdout as exactly one JSON document.
pub fn json_doc(stdout: &str) -> Value {
    serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"))
}

/// Names in a directory (none if it does not exist), sorted.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// An IPv4 address as a number, for ordering.
pub fn ip_num(ip: &str) -> u32 {
    u32::from(
        ip.parse::<std::net::Ipv4Addr>()
            .unwrap_or_else(|e| panic!("{ip:?} is not an IPv4 address: {e}")),
    )
}

impl NodeInfo {
    /// The first port of the node's own range, where nodes share an address.
    pub fn first_port(&self) -> Option<u16> {
        let ports = self.ports.as_deref()?;
        ports.split('-').next()?.parse().ok()
    }

    /// What tells the node apart from the others, and orders ranks after
    /// the topology: its address as a number, then its first port.
    pub fn key(&self) -> (u32, u16) {
        (ip_num(&self.ip), self.first_port().unwrap_or(0))
    }
}

/// Whether the local provider runs in single-address mode in this test
/// run (every node on 127.0.0.1, told apart by port): where
/// `GANGWAY_LOCAL_ADDRESSES=single` (CI's second pass of the local suite)
/// or where only 127.0.0.1 answers (macOS).
pub fn single_address() -> bool {
    gangway_local::single_address(None, std::net::Ipv4Addr::new(127, 0, 10, 1))
}

/// The step rank 0 checkpointed on a preemption notice, from a trainer's
/// output (its `rank 0 checkpointed step N on the notice` line).
pub(crate) fn noticed_step(out: &str) -> Option<u32> {
    out.lines().find_map(|l| {
        l.split("rank 0 checkpointed step ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|s| s.parse().ok())
    })
}
