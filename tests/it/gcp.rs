//! `infra: gcp` through the binary, against the schema-checked Compute
//! Engine fake (tests/emulators/gce), one fake per test.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::common::{json_doc, parts, root, TestHome};

struct Gce {
    url: String,
    child: Child,
}

impl Gce {
    fn start() -> Option<Gce> {
        let python = std::env::var_os("GANGWAY_TEST_GCE_PYTHON")
            .map(PathBuf::from)
            .or_else(|| {
                let p = root().join("target/gce-venv/bin/python");
                p.exists().then_some(p)
            });
        let Some(python) = python else {
            eprintln!(
                "SKIPPED: no venv for the GCE fake (run tests/emulators/gce/setup.sh, or set GANGWAY_TEST_GCE_PYTHON)"
            );
            return None;
        };
        let mut child = Command::new(python)
            .arg(root().join("tests/emulators/gce/server.py"))
            .args(["--host", "127.0.0.1", "--port", "0", "--watch-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the GCE fake starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("the GCE fake said {line:?}"))
            .to_string();
        Some(Gce { url, child })
    }

    fn call(&self, method: &str, path: &str, body: &str) -> serde_json::Value {
        let addr = self.url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        serde_json::from_str(out.split_once("\r\n\r\n").map_or("", |(_, b)| b))
            .unwrap_or(serde_json::Value::Null)
    }

    /// Names of whatever the fake holds with gangway's labels or names.
    fn left(&self) -> Vec<String> {
        let st = self.call("GET", "/_gangway/state", "");
        let text = st.to_string();
        let mut names = Vec::new();
        for kind in ["instances", "resourcePolicies", "firewalls"] {
            let mut stack = vec![st[kind].clone()];
            while let Some(v) = stack.pop() {
                match v {
                    serde_json::Value::Array(a) => stack.extend(a),
                    serde_json::Value::Object(o) => match o.get("name").and_then(|n| n.as_str()) {
                        Some(n) if n.starts_with("gw-") && o.contains_key("kind") => {
                            names.push(format!("{kind}/{n}"))
                        }
                        _ => stack.extend(o.into_iter().map(|(_, v)| v)),
                    },
                    _ => {}
                }
            }
        }
        assert!(st.is_object(), "no state from the fake: {text}");
        names.sort();
        names
    }

    fn run(&self, home: &TestHome, args: &[&str]) -> std::process::Output {
        let mut c = crate::common::command_in(home.path());
        c.args(args)
            .env("GANGWAY_GCP_ENDPOINT", &self.url)
            .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
            .env("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24");
        crate::common::Running::start(c).wait()
    }
}

impl Drop for Gce {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_gcp_stockout_fails_over_to_the_next_zone_and_down_leaves_nothing() {
    let Some(gce) = Gce::start() else { return };
    let home = TestHome::new();
    let task = home.file(
        "gcp.yaml",
        "num_nodes: 2\nresources:\n  infra: gcp/us-central1\n  accelerators: A100:1\n  use_spot: true\nrun: \"true\"\n",
    );
    // The plan's first zone has no a2-highgpu-1g left.
    let (_, plan, _) = parts(&gce.run(&home, &["optimize", &task, "-o", "json"]));
    let first = json_doc(&plan)["plan"][0].clone();
    let zone = first["zone"].as_str().expect("a zone").to_string();
    let ty = first["instance_type"].as_str().expect("a type").to_string();
    gce.call(
        "POST",
        "/_gangway/capacity",
        &serde_json::json!({"zone": zone, "machineType": ty, "available": 0}).to_string(),
    );
    let (code, out, err) = parts(&gce.run(
        &home,
        &["launch", &task, "--provision-only", "-c", "gg", "-y"],
    ));
    assert_eq!(code, 0, "{out}\n{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains("ZONE_RESOURCE_POOL_EXHAUSTED") && all.contains(&zone),
        "the failed attempt is not shown: {all}"
    );
    let (_, st, _) = parts(&gce.run(&home, &["status", "gg", "-o", "json"]));
    let c = json_doc(&st)["clusters"][0].clone();
    assert_eq!(c["cloud"], "gcp", "{c}");
    assert_ne!(c["zone"].as_str(), Some(zone.as_str()), "{c}");
    assert_eq!(c["nodes"].as_array().map(Vec::len), Some(2), "{c}");
    let left = gce.left();
    assert_eq!(
        left.iter().filter(|l| l.starts_with("instances/")).count(),
        2,
        "no leftovers of the failed attempt: {left:?}"
    );
    let (code, out, err) = parts(&gce.run(&home, &["down", "-y", "gg"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(gce.left(), Vec::<String>::new());
}

#[test]
fn gcp_check_names_the_project_or_what_is_missing() {
    let Some(gce) = Gce::start() else { return };
    let home = TestHome::new();
    let (code, out, err) = parts(&gce.run(&home, &["check", "gcp"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("gangway-test"),
        "{out}\n{err}"
    );
    // Without a project it says how to set one.
    let mut c = crate::common::command_in(home.path());
    c.args(["check", "gcp"])
        .env("GANGWAY_GCP_ENDPOINT", &gce.url)
        .env_remove("GOOGLE_CLOUD_PROJECT")
        .env_remove("CLOUDSDK_CORE_PROJECT")
        .env("CLOUDSDK_CONFIG", home.path().join("no-gcloud"));
    let (code, out, err) = parts(&crate::common::Running::start(c).wait());
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("GOOGLE_CLOUD_PROJECT"),
        "{out}\n{err}"
    );
}
