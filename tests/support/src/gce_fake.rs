//! The Compute Engine fake (tests/emulators/gce) for Rust tests: starts one
//! on a free loopback port and talks to its control API
//! (`gangway_test::gce_fake::GceFake`).
//!
//! It needs the fake's venv (the discovery document comes from the pinned
//! google-api-python-client in it): `GANGWAY_TEST_GCE_PYTHON` (what
//! `.ci/run` sets), else `target/gce-venv/bin/python` made by
//! `tests/emulators/gce/setup.sh`; without either, `start` says
//! `SKIPPED gcp: ...` (through `skip`) and returns `None`.
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running fake; killed when dropped (and when the test process's pipe
/// to it closes, `--watch-stdin`).
pub struct GceFake {
    /// `http://127.0.0.1:PORT`, for `GANGWAY_GCP_ENDPOINT`.
    pub url: String,
    child: Child,
}

/// The workspace root: the first directory above this crate's that holds
/// the fake.
fn workspace_root() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("tests/emulators/gce/server.py").is_file())
        .map(Path::to_path_buf)
}

impl GceFake {
    /// Starts one for this test (recorded as `ran gcp`), or says why not
    /// (`skip::skipped("gcp", ..)`) and returns `None`.
    pub fn start() -> Option<GceFake> {
        crate::skip::gate("gcp", GceFake::try_start())
    }

    /// Starts one, or returns why it cannot here; records nothing (for a
    /// fake shared by many tests, each of which records its own).
    pub fn try_start() -> Result<GceFake, String> {
        let Some(root) = workspace_root() else {
            return Err("tests/emulators/gce/server.py is not above this crate".into());
        };
        let python = std::env::var_os("GANGWAY_TEST_GCE_PYTHON")
            .map(PathBuf::from)
            .or_else(|| {
                let p = root.join("target/gce-venv/bin/python");
                p.exists().then_some(p)
            });
        let Some(python) = python else {
            return Err(
                "no venv for the GCE fake (run tests/emulators/gce/setup.sh, or set GANGWAY_TEST_GCE_PYTHON)"
                    .into(),
            );
        };
        let mut child = Command::new(python)
            .arg(root.join("tests/emulators/gce/server.py"))
            .args(["--host", "127.0.0.1", "--port", "0", "--watch-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the GCE fake starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("the GCE fake says READY");
        let url = line
            .trim()
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("the GCE fake said {line:?}"))
            .to_string();
        Ok(GceFake { url, child })
    }

    /// One request to the fake (its control API under `/_gangway/`, or
    /// the API itself); the JSON answer, `null` when there is none.
    pub fn call(&self, method: &str, path: &str, body: &str) -> serde_json::Value {
        let addr = self.url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).expect("the GCE fake listens");
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

    /// Arms the fake's kill points: from now on its API requests are
    /// counted, request k's arrival being kill point 2k-1 and its return
    /// 2k, and at point `at` (0: never, only count) every process whose
    /// environment has the entry `marker` (`KEY=VALUE`) is SIGKILLed.
    pub fn kill_at(&self, at: u64, marker: &str) -> serde_json::Value {
        let spec = serde_json::json!({"at": at, "marker": marker});
        let state = self.call("POST", "/_gangway/kill", &spec.to_string());
        assert!(
            state["requests"].is_u64(),
            "GCE fake kill points {spec}: {state}"
        );
        state
    }

    /// The kill points: `requests` and `points` counted so far, `at`, and
    /// `fired` (null, or the point, request, `arrival`/`return`, call and
    /// the pids `killed`).
    pub fn kill_state(&self) -> serde_json::Value {
        self.call("GET", "/_gangway/kill", "")
    }

    /// Stops counting (and killing).
    pub fn kill_off(&self) {
        self.call("DELETE", "/_gangway/kill", "");
    }

    /// Everything the fake holds.
    pub fn state(&self) -> serde_json::Value {
        self.call("GET", "/_gangway/state", "")
    }

    /// The resources of `kind` (`instances`, `resourcePolicies`,
    /// `firewalls`) whose name starts with `prefix`.
    pub fn named(&self, kind: &str, prefix: &str) -> Vec<serde_json::Value> {
        let st = self.state();
        assert!(st.is_object(), "no state from the GCE fake: {st}");
        let mut out = Vec::new();
        let mut stack = vec![st[kind].clone()];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Array(a) => stack.extend(a),
                serde_json::Value::Object(o) => {
                    let hit = o.contains_key("kind")
                        && o.get("name")
                            .and_then(|n| n.as_str())
                            .is_some_and(|n| n.starts_with(prefix));
                    if hit {
                        out.push(serde_json::Value::Object(o));
                    } else {
                        stack.extend(o.into_iter().map(|(_, v)| v));
                    }
                }
                _ => {}
            }
        }
        out
    }
}

impl Drop for GceFake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
