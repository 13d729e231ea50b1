//! A Kubernetes control plane built from source (tests/emulators/k8s) for
//! Rust tests: etcd, kube-apiserver, kube-scheduler, kube-controller-manager
//! and kubectl from k8s.io/kubernetes v1.37.2, with node agents that run
//! pods as local processes (`gangway_test::k8s::K8sHarness`).
//!
//! The binary is `GANGWAY_TEST_K8S_HARNESS` (what `.ci/run` sets), else
//! `tests/emulators/k8s/build.sh` builds it into the cargo target directory
//! when Go is there (minutes cold, nothing when cached); without either,
//! `try_start` says why, for `skip::gate("k8s", ..)`.
//!
//! With Kueue (`K8sHarness::try_start_with_kueue`): Kueue's binary is
//! `GANGWAY_TEST_K8S_KUEUE`, else `kueue` beside the harness binary (where
//! `.ci/run` has `build-kueue.sh` put it), else `build-kueue.sh` builds it
//! into the cargo target directory when Go is there (tens of minutes cold).
//!
//! ```ignore
//! let nodes = [NodeSpec::new("gpu-0").capacity("nvidia.com/gpu", "8")];
//! let Some(k8s) = skip::gate("k8s", K8sHarness::try_start(&nodes)) else { return };
//! let out = k8s.kubectl(&["get", "nodes", "-o", "json"]).unwrap();
//! ```
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// One node: its name, labels, capacity (`cpu`, `memory`, `pods`,
/// `nvidia.com/gpu`, ... as quantities; allocatable is the same) and
/// taints (`key=value:Effect`).
#[derive(Clone, Debug, Default)]
pub struct NodeSpec {
    /// The Node's name.
    pub name: String,
    /// Labels (the harness adds kubernetes.io/hostname, os, arch).
    pub labels: BTreeMap<String, String>,
    /// Capacity; cpu 4, memory 16Gi, pods 110 unless given.
    pub capacity: BTreeMap<String, String>,
    /// Taints as (key, value, effect).
    pub taints: Vec<(String, String, String)>,
}

impl NodeSpec {
    /// A node named `name` with the default capacity.
    pub fn new(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            ..NodeSpec::default()
        }
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> NodeSpec {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets one resource's capacity (and allocatable).
    pub fn capacity(mut self, resource: &str, quantity: &str) -> NodeSpec {
        self.capacity.insert(resource.into(), quantity.into());
        self
    }

    /// Adds a taint (`effect`: NoSchedule, PreferNoSchedule, NoExecute).
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> NodeSpec {
        self.taints.push((key.into(), value.into(), effect.into()));
        self
    }

    /// The harness's JSON for it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "labels": self.labels,
            "capacity": self.capacity,
            "taints": self.taints.iter().map(|(k, v, e)| serde_json::json!({"key": k, "value": v, "effect": e})).collect::<Vec<_>>(),
        })
    }
}

/// A running cluster; everything it started is stopped when dropped.
pub struct K8sHarness {
    binary: PathBuf,
    dir: PathBuf,
    kubeconfig: PathBuf,
    control: String,
    child: Child,
}

fn workspace_root() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("tests/emulators/k8s/build.sh").is_file())
        .map(Path::to_path_buf)
}

/// The harness binary: `GANGWAY_TEST_K8S_HARNESS`, or built (once per test
/// process) by build.sh into the cargo target directory.
pub fn binary() -> Result<PathBuf, String> {
    static BUILT: Mutex<Option<Result<PathBuf, String>>> = Mutex::new(None);
    if let Some(p) = std::env::var_os("GANGWAY_TEST_K8S_HARNESS") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "GANGWAY_TEST_K8S_HARNESS={} is not a file",
                p.display()
            ))
        };
    }
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = built.as_ref() {
        return r.clone();
    }
    let r = (|| {
        let root =
            workspace_root().ok_or("tests/emulators/k8s/build.sh is not above this crate")?;
        let out = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"))
            .join("k8s-harness");
        let o = Command::new(root.join("tests/emulators/k8s/build.sh"))
            .arg(&out)
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("tests/emulators/k8s/build.sh: {e}"))?;
        match o.status.code() {
            Some(0) => Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
            Some(3) => Err("no Go to build the k8s harness (tests/emulators/k8s/build.sh), and GANGWAY_TEST_K8S_HARNESS is not set".to_string()),
            _ => Err(format!(
                "tests/emulators/k8s/build.sh failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
            )),
        }
    })();
    *built = Some(r.clone());
    r
}

/// Kueue's binary (its manifests in `kueue-config/` beside it):
/// `GANGWAY_TEST_K8S_KUEUE`, else `kueue` beside the harness binary, else
/// built (once per test process) by build-kueue.sh into the cargo target
/// directory.
pub fn kueue_binary() -> Result<PathBuf, String> {
    static BUILT: Mutex<Option<Result<PathBuf, String>>> = Mutex::new(None);
    if let Some(p) = std::env::var_os("GANGWAY_TEST_K8S_KUEUE") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "GANGWAY_TEST_K8S_KUEUE={} is not a file",
                p.display()
            ))
        };
    }
    let beside = binary()?.with_file_name("kueue");
    if beside.is_file() && beside.with_file_name("kueue-config").is_dir() {
        return Ok(beside);
    }
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = built.as_ref() {
        return r.clone();
    }
    let r = (|| {
        let root =
            workspace_root().ok_or("tests/emulators/k8s/build-kueue.sh is not above this crate")?;
        let out = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"))
            .join("k8s-harness");
        let o = Command::new(root.join("tests/emulators/k8s/build-kueue.sh"))
            .arg(&out)
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("tests/emulators/k8s/build-kueue.sh: {e}"))?;
        match o.status.code() {
            Some(0) => Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
            Some(3) => Err("no Go to build Kueue (tests/emulators/k8s/build-kueue.sh), and GANGWAY_TEST_K8S_KUEUE is not set".to_string()),
            _ => Err(format!(
                "tests/emulators/k8s/build-kueue.sh failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
            )),
        }
    })();
    *built = Some(r.clone());
    r
}

impl K8sHarness {
    /// Starts a cluster with `nodes` and waits until it is ready (every
    /// node Ready, the default service account there: a few seconds), or
    /// says why it cannot here.
    pub fn try_start(nodes: &[NodeSpec]) -> Result<K8sHarness, String> {
        K8sHarness::start_with(nodes, None)
    }

    /// [`K8sHarness::try_start`] with Kueue running too (its CRDs and
    /// webhooks in place, the pod integration on; about 10 s more), or why
    /// it cannot here.
    pub fn try_start_with_kueue(nodes: &[NodeSpec]) -> Result<K8sHarness, String> {
        let kueue = kueue_binary()?;
        K8sHarness::start_with(nodes, Some(&kueue))
    }

    fn start_with(nodes: &[NodeSpec], kueue: Option<&Path>) -> Result<K8sHarness, String> {
        let binary = binary()?;
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gangway-k8s-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let nodes_file = dir.join("nodes.json");
        let specs: Vec<_> = nodes.iter().map(NodeSpec::to_json).collect();
        std::fs::write(&nodes_file, serde_json::Value::Array(specs).to_string())
            .map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("serve.log")).map_err(|e| e.to_string())?;
        let mut serve = Command::new(&binary);
        serve
            .arg("serve")
            .arg("--dir")
            .arg(dir.join("state"))
            .arg("--nodes")
            .arg(&nodes_file);
        if let Some(k) = kueue {
            serve.arg("--kueue").arg(k);
        }
        let mut child = serve
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("READY ") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
                return Err(format!(
                    "the k8s harness did not say READY within 180 s; its stderr: {}",
                    log.lines().rev().take(10).collect::<Vec<_>>().join(" | ")
                ));
            }
        };
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(&format!("{k}=")).map(str::to_string))
                .unwrap_or_default()
        };
        Ok(K8sHarness {
            binary,
            kubeconfig: PathBuf::from(field("kubeconfig")),
            control: field("control"),
            dir,
            child,
        })
    }

    /// The admin kubeconfig (client certificate, CA data, server
    /// https://127.0.0.1:PORT).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The harness binary (`<binary> kubectl ...` is kubectl).
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The state directory (logs/ holds each component's log; pods/ each
    /// pod's working directory).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs kubectl against this cluster: its stdout, or an error with its
    /// stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_stdin(args, "")
    }

    /// [`K8sHarness::kubectl`] with `stdin` fed to it.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Result<String, String> {
        let mut child = Command::new(&self.binary)
            .arg("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut input = child.stdin.take().expect("piped");
        let data = stdin.to_string();
        let feeder = std::thread::spawn(move || {
            let _ = input.write_all(data.as_bytes());
        });
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let _ = feeder.join();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {}: {}: {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// One request to the control endpoint; its JSON answer.
    pub fn control(&self, method: &str, path: &str, body: &str) -> serde_json::Value {
        let addr = self.control.trim_start_matches("http://");
        let mut s =
            std::net::TcpStream::connect(addr).expect("the k8s harness's control endpoint listens");
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        serde_json::from_str(out.split_once("\r\n\r\n").map_or("", |(_, b)| b))
            .unwrap_or(serde_json::Value::Null)
    }

    /// Adds a node (registered when this returns; Ready soon after).
    pub fn add_node(&self, node: &NodeSpec) -> serde_json::Value {
        self.control("POST", "/nodes", &node.to_json().to_string())
    }

    /// The machine is gone: its Node is deleted and its pods' processes
    /// are SIGKILLed at once (the pods themselves go by podgc, about 40-60 s
    /// later). `{"killed": [pids]}`.
    pub fn remove_node(&self, name: &str) -> serde_json::Value {
        self.control("DELETE", &format!("/nodes/{name}"), "")
    }

    /// The node stops heartbeating and handling its pods (its processes
    /// keep running): NotReady after the grace period (10 s).
    pub fn freeze_node(&self, name: &str) -> serde_json::Value {
        self.control("POST", &format!("/nodes/{name}/freeze"), "")
    }

    /// Undoes [`K8sHarness::freeze_node`].
    pub fn thaw_node(&self, name: &str) -> serde_json::Value {
        self.control("POST", &format!("/nodes/{name}/thaw"), "")
    }

    /// Where a pod runs: node, ip, dir, phase, containers' pids and logs.
    pub fn pod(&self, namespace: &str, name: &str) -> serde_json::Value {
        self.control("GET", &format!("/pods/{namespace}/{name}"), "")
    }
}

impl Drop for K8sHarness {
    fn drop(&mut self) {
        // SIGTERM: the harness kills its pods and components and exits.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..150 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Whatever a harness that did not finish left: its components die
        // with it (Pdeathsig); pod process groups are listed here.
        if let Ok(pgids) = std::fs::read_to_string(self.dir.join("state/pgids")) {
            for pgid in pgids.lines().filter(|l| !l.is_empty()) {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pgid}")])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
