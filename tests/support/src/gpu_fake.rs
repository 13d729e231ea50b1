//! The fakes of the GPU clouds with a JSON API (`tests/emulators/lambda`,
//! `runpod`, `vast`, all on `tests/emulators/gpucloud/fakecore.py`): one
//! started per test on a free port, at a hundredth of the cloud's rate
//! limits, killed on drop (and gone by itself when the test process dies:
//! it watches its stdin). Control calls (`/_fake/...`) go through python3's
//! standard library, so this crate needs no HTTP client.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The API key the fakes accept by default.
pub const KEY: &str = "test-key";

/// The rate scale the fakes are started at, and clients should use.
pub const RATE_SCALE: &str = "0.01";

/// A running fake, killed on drop.
pub struct GpuCloudFake {
    child: Child,
    /// Where it serves, `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Drop for GpuCloudFake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The checkout's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl GpuCloudFake {
    /// `cloud`'s fake (`lambda`, `runpod`, `vast`), its instances booting
    /// in `boot_seconds`, with `extra` arguments; or why not (no python3).
    pub fn start(cloud: &str, boot_seconds: &str, extra: &[&str]) -> Result<GpuCloudFake, String> {
        let server = root().join(format!("tests/emulators/{cloud}/server.py"));
        let mut child = Command::new("python3")
            .arg(&server)
            .args(["--port", "0", "--watch-stdin", "--rate-scale", RATE_SCALE])
            .args(["--boot-seconds", boot_seconds])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("python3 (for {}): {e}", server.display()))?;
        let mut line = String::new();
        let read = match child.stdout.take() {
            Some(out) => BufReader::new(out).read_line(&mut line).map(|_| ()),
            None => Ok(()),
        };
        match (read, line.trim().strip_prefix("READY ")) {
            (Ok(()), Some(url)) => Ok(GpuCloudFake {
                url: url.to_string(),
                child,
            }),
            (read, _) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("the {cloud} fake did not start: {line:?} {read:?}"))
            }
        }
    }

    /// A control call (`/_fake/...`), its JSON answer; panics (a test's
    /// failure) when the fake refuses it.
    pub fn control(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let out = Command::new("python3")
            .arg("-c")
            .arg(
                "import sys,urllib.request as u\n\
                 d=None if sys.argv[2]=='GET' else sys.argv[3].encode()\n\
                 r=u.Request(sys.argv[1],data=d,method=sys.argv[2],headers={'Content-Type':'application/json'})\n\
                 print(u.urlopen(r,timeout=20).read().decode())",
            )
            .args([format!("{}{path}", self.url), method.into(), body.to_string()])
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    }

    /// `/_fake/state`.
    pub fn state(&self) -> serde_json::Value {
        self.control("GET", "/_fake/state", serde_json::json!({}))
    }

    /// `/_fake/violations`: requests that broke the published shapes.
    pub fn violations(&self) -> serde_json::Value {
        self.control("GET", "/_fake/violations", serde_json::json!({}))
    }

    /// (resources left running, account SSH keys).
    pub fn leaks(&self) -> (usize, usize) {
        let s = self.state();
        let len = |k: &str| s[k].as_array().map_or(0, Vec::len);
        (len("leaks"), len("ssh_keys"))
    }

    /// `leak_check.py --keys`: (exit code, what it printed).
    pub fn leak_check(&self) -> (i32, String) {
        let out = Command::new("python3")
            .arg(root().join("tests/emulators/gpucloud/leak_check.py"))
            .args(["--endpoint", &self.url, "--keys"])
            .output()
            .expect("python3");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}
