//! The Azure Resource Manager fake (tests/emulators/azure) for Rust tests:
//! starts one on a free loopback port and talks to its control API
//! (`gangway_test::azure_fake::AzureFake`).
//!
//! The server is standard-library Python; it needs the schema file that
//! `tests/emulators/azure/setup.sh` writes (`target/azure-venv/
//! arm-schema.json`, or `GANGWAY_TEST_AZURE_SCHEMA`). Without it, `start`
//! says `SKIPPED azure: ...` (through `skip`) and returns `None`.
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running fake; killed when dropped (and when the test process's pipe
/// to it closes, `--watch-stdin`).
pub struct AzureFake {
    /// `http://127.0.0.1:PORT`, for `GANGWAY_AZURE_ENDPOINT`.
    pub url: String,
    root: PathBuf,
    child: Child,
}

fn workspace_root() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("tests/emulators/azure/server.py").is_file())
        .map(Path::to_path_buf)
}

impl AzureFake {
    /// Starts one for this test (recorded as `ran azure`), or says why not
    /// and returns `None`.
    pub fn start() -> Option<AzureFake> {
        crate::skip::gate("azure", AzureFake::try_start())
    }

    /// Starts one, or returns why it cannot here; records nothing.
    pub fn try_start() -> Result<AzureFake, String> {
        let Some(root) = workspace_root() else {
            return Err("tests/emulators/azure/server.py is not above this crate".into());
        };
        let schema = std::env::var_os("GANGWAY_TEST_AZURE_SCHEMA")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target/azure-venv/arm-schema.json"));
        if !schema.is_file() {
            return Err(format!(
                "no schema file for the Azure fake at {} (run tests/emulators/azure/setup.sh)",
                schema.display()
            ));
        }
        let mut child = Command::new("python3")
            .arg(root.join("tests/emulators/azure/server.py"))
            .args(["--host", "127.0.0.1", "--port", "0", "--watch-stdin"])
            // Quick operations for tests: one poll, no waiting.
            .args(["--op-polls", "1", "--retry-after", "0"])
            .arg("--schema")
            .arg(&schema)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("python3 cannot start the Azure fake: {e}"))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("the Azure fake says READY");
        let url = line
            .trim()
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("the Azure fake said {line:?}"))
            .to_string();
        Ok(AzureFake { url, root, child })
    }

    /// One request to the fake (its control API under `/_fake/`); the
    /// JSON answer, `null` when there is none.
    pub fn call(&self, method: &str, path: &str, body: &str) -> serde_json::Value {
        let addr = self.url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).expect("the Azure fake listens");
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

    /// The requests that broke the API specification so far (a test
    /// asserts there are none): `{"count", "violations": [...]}`.
    pub fn violations(&self) -> serde_json::Value {
        self.call("GET", "/_fake/violations", "")
    }

    /// Gives `subscription`'s VMs these `(public, private)` addresses (a
    /// real sshd's) and their SSH keys to `authorized_keys`; answers with
    /// the subscription's `imds_port`.
    pub fn machines(
        &self,
        subscription: &str,
        addresses: &[(String, String)],
        authorized_keys: &Path,
    ) -> serde_json::Value {
        let pairs: Vec<[&str; 2]> = addresses
            .iter()
            .map(|(a, b)| [a.as_str(), b.as_str()])
            .collect();
        self.call(
            "POST",
            "/_fake/machines",
            &serde_json::json!({"subscription": subscription, "addresses": pairs,
                "authorized_keys": authorized_keys})
            .to_string(),
        )
    }

    /// Arms the fake's kill points: from now on its ARM requests are
    /// counted, request k's arrival being kill point 2k-1 and its return
    /// 2k, and at point `at` (0: never, only count) every process whose
    /// environment has the entry `marker` (`KEY=VALUE`) is SIGKILLed.
    pub fn kill_at(&self, at: u64, marker: &str) -> serde_json::Value {
        let spec = serde_json::json!({"at": at, "marker": marker});
        let state = self.call("POST", "/_fake/kill", &spec.to_string());
        assert!(
            state["requests"].is_u64(),
            "Azure fake kill points {spec}: {state}"
        );
        state
    }

    /// The kill points: `requests` and `points` counted so far, `at`, and
    /// `fired` (null, or the point, request, `arrival`/`return`, call and
    /// the pids `killed`).
    pub fn kill_state(&self) -> serde_json::Value {
        self.call("GET", "/_fake/kill", "")
    }

    /// Stops counting (and killing).
    pub fn kill_off(&self) {
        self.call("DELETE", "/_fake/kill", "");
    }

    /// `tests/emulators/azure/leak_check.py` on `subscription`: `Ok` with
    /// its report when nothing of gangway's is left, `Err` with it otherwise.
    pub fn leak_check(&self, subscription: &str) -> Result<String, String> {
        let out = Command::new("python3")
            .arg(self.root.join("tests/emulators/azure/leak_check.py"))
            .args(["--endpoint", &self.url, "--subscription", subscription])
            .output()
            .expect("python3 runs leak_check.py");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(text)
        }
    }
}

impl Drop for AzureFake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
