//! Nothing runs unseen: a teardown that fails keeps its cluster (as
//! `TERMINATING`, with the reason) until a retry confirms it gone, and
//! every command that leaves one behind exits non-zero and says so.
//!
//! The local cloud's API is made to fail through its fault file
//! (`$GANGWAY_HOME/local/faults.json`, as the EC2 emulator and the GCE fake
//! fail on request), and what is left is read from the cloud's side: its
//! instance records.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{parts, wait_for, TestHome};

const DEADLINE: Duration = Duration::from_secs(120);

/// Makes the local cloud's `op` fail `times` times (-1: always).
fn inject(home: &TestHome, op: &str, times: i64, kind: &str, message: &str) {
    let path = home.path().join("local/faults.json");
    let mut all: serde_json::Map<String, Value> = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    all.insert(
        op.into(),
        json!({"times": times, "kind": kind, "message": message}),
    );
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, Value::Object(all).to_string()).unwrap();
}

fn heal(home: &TestHome) {
    let _ = std::fs::remove_file(home.path().join("local/faults.json"));
}

fn task(home: &TestHome, body: &str) -> String {
    home.file(
        "task.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\n{body}",
            home.marker
        ),
    )
}

#[test]
fn a_failed_cleanup_during_failover_keeps_the_cluster_until_down_removes_it() {
    let home = TestHome::new();
    // No zone has room for two nodes: each attempt fails and must be
    // cleaned up, and the cleanup fails (expired credentials, not retried).
    let t = task(
        &home,
        "config:\n  local:\n    capacity: 1\nrun: echo never\n",
    );
    inject(&home, "terminate", -1, "auth", "the token expired");
    let (code, out, err) = parts(&home.run(["launch", &t, "-c", "leaky", "-y"]));
    assert_eq!(code, 6, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("cluster 'leaky' may still be running"),
        "{err}"
    );
    assert!(err.contains("the token expired"), "{err}");
    assert!(err.contains("gangway down leaky"), "{err}");
    // The walk stopped at the first attempt: it did not move on and
    // forget what that one may have left.
    assert_eq!(err.matches("capacity").count().min(1), 1, "{err}");
    let c = home.cluster_opt("leaky").expect("the row is kept");
    assert_eq!(c["status"], "TERMINATING", "{c}");
    assert!(
        c["last_error"]
            .as_str()
            .unwrap()
            .contains("the token expired"),
        "{c}"
    );
    let (_, table, _) = parts(&home.run(["status"]));
    assert!(
        table.contains("TERMINATING 'leaky': may still be running"),
        "{table}"
    );
    // down while the API still fails: non-zero, still kept.
    let (code, _, err) = parts(&home.run(["down", "leaky", "-y"]));
    assert_eq!(code, 6, "{err}");
    assert!(home.cluster_opt("leaky").is_some());
    heal(&home);
    let (code, _, err) = parts(&home.run(["down", "leaky", "-y"]));
    assert_eq!(code, 0, "{err}");
    assert!(home.cluster_opt("leaky").is_none());
}

#[test]
fn a_transient_cleanup_failure_is_retried_at_once_and_forgets_nothing() {
    let home = TestHome::new();
    let t = task(
        &home,
        "config:\n  local:\n    capacity: 1\nrun: echo never\n",
    );
    // Throttled once: the retry with backoff removes the attempt, and the
    // walk goes on to say there is no capacity (exit 3), leaving no row.
    inject(
        &home,
        "terminate",
        1,
        "transient",
        "Throttling: rate exceeded",
    );
    let (code, out, err) = parts(&home.run(["launch", &t, "-c", "once", "-y"]));
    assert_eq!(code, 3, "stdout:\n{out}\nstderr:\n{err}");
    assert!(home.cluster_opt("once").is_none());
    assert!(home.instance_records().is_empty());
}

#[test]
fn launch_down_whose_teardown_fails_exits_non_zero_and_status_r_finishes_it() {
    let home = TestHome::new();
    let t = task(&home, "run: echo ran-$NODE_RANK\n");
    inject(&home, "terminate", -1, "auth", "the token expired");
    let (code, out, err) = parts(&home.run(["launch", &t, "-c", "downed", "--down", "-y"]));
    assert_eq!(code, 6, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("ran-1"), "the job ran: {out}");
    assert!(
        err.contains("cluster 'downed' may still be running"),
        "{err}"
    );
    assert_eq!(
        home.instance_records().len(),
        2,
        "both nodes are still there, and known"
    );
    let c = home.cluster_opt("downed").expect("kept");
    assert_eq!(c["status"], "TERMINATING", "{c}");
    // status -r while it still fails: says so, non-zero, keeps it.
    let (code, _, err) = parts(&home.run(["status", "-r"]));
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("failed again"), "{err}");
    heal(&home);
    let (code, out, err) = parts(&home.run(["status", "-r"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Finished tearing down 'downed'"), "{out}");
    assert!(home.cluster_opt("downed").is_none());
    assert!(home.instance_records().is_empty());
}

#[test]
fn a_managed_jobs_controller_retries_a_failed_teardown_until_it_is_gone() {
    let home = TestHome::new();
    let t = home.file(
        "job.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\nrun: echo done\n",
            home.marker
        ),
    );
    inject(&home, "terminate", -1, "transient", "the API is down");
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "-d"]));
    assert_eq!(code, 0, "{err}");
    let cluster = wait_for("the job to end with its cluster kept", DEADLINE, || {
        let (_, out, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
        let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let j = v["jobs"][0].clone();
        if j["state"] != "SUCCEEDED" {
            return Err(j.to_string());
        }
        let kept = home
            .clusters()
            .into_iter()
            .find(|c| c["status"] == "TERMINATING" && c["last_error"].is_string());
        kept.map(|c| c["name"].as_str().unwrap().to_string())
            .ok_or_else(|| "no TERMINATING cluster yet".into())
    });
    assert_eq!(home.instance_records().len(), 1, "its node still runs");
    heal(&home);
    // The controller, still alive for it, retries when due (5 s after the
    // first failure) and removes it.
    wait_for(
        "the controller to finish the teardown",
        DEADLINE,
        || match home.cluster_opt(&cluster) {
            None if home.instance_records().is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
}

#[test]
fn autostop_records_a_stop_that_fails_where_status_shows_it() {
    let home = TestHome::new();
    let t = task(&home, "run: echo ok\n");
    let (code, _, err) = parts(&home.run(["launch", &t, "-c", "idle", "-y"]));
    assert_eq!(code, 0, "{err}");
    inject(&home, "stop", -1, "fatal", "stop refused by the API");
    let (code, _, err) = parts(&home.run(["autostop", "idle", "-i", "0"]));
    assert_eq!(code, 0, "{err}");
    wait_for("the watcher to record its failure", DEADLINE, || {
        let c = home.cluster_opt("idle").ok_or("gone")?;
        match c["last_error"].as_str() {
            Some(e) if e.contains("autostop could not stop it") => Ok(()),
            _ => Err(c.to_string()),
        }
    });
    let c = home.cluster_opt("idle").unwrap();
    assert_eq!(c["status"], "UP", "{c}");
    let (_, table, _) = parts(&home.run(["status"]));
    assert!(table.contains("stop refused by the API"), "{table}");
    heal(&home);
}

#[test]
fn relaunching_onto_a_cluster_that_lost_a_node_replaces_it() {
    let home = TestHome::new();
    // Spot nodes the local market reclaims 1 s after the first launch only.
    let t = home.file(
        "task.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {}\nconfig:\n  local:\n    preemptions:\n      - {{after_s: 1}}\nrun: echo hello-$NODE_RANK\n",
            home.marker
        ),
    );
    let (code, out, err) = parts(&home.run(["launch", &t, "-c", "lost", "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let before: Vec<String> = home.nodes("lost").iter().map(|n| n.id.clone()).collect();
    wait_for("the preemption", DEADLINE, || {
        let (_, out, _) = parts(&home.run(["status", "lost", "-r", "-o", "json"]));
        if out.contains("\"preempted\"") {
            Ok(())
        } else {
            Err(out)
        }
    });
    // The record still says UP; a relaunch must not trust it.
    let (code, out, err) = parts(&home.run(["launch", &t, "-c", "lost", "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("replacing it") || out.contains("replacing it"),
        "{out}{err}"
    );
    assert!(out.contains("hello-1"), "{out}");
    let after: Vec<String> = home.nodes("lost").iter().map(|n| n.id.clone()).collect();
    assert_eq!(after.len(), 2);
    assert!(
        after.iter().all(|a| !before.contains(a)),
        "{before:?} {after:?}"
    );
}

#[test]
fn secrets_come_off_the_command_line_and_a_damaged_secrets_file_fails_the_recovery() {
    let home = TestHome::new();
    // --secret KEY takes the value from gangway's own environment.
    let t = home.file(
        "s.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\nsecrets:\n  TOKEN: null\nrun: echo token-length-${{#TOKEN}}\n",
            home.marker
        ),
    );
    let o = crate::common::command_in(home.path())
        .args(["launch", &t, "-c", "env-secret", "-y", "--secret", "TOKEN"])
        .env("TOKEN", "from-the-env")
        .output()
        .unwrap();
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("token-length-12"), "{out}");
    let o = crate::common::command_in(home.path())
        .args(["launch", &t, "-c", "env-secret", "-y", "--secret", "TOKEN"])
        .env_remove("TOKEN")
        .output()
        .unwrap();
    let (code, _, err) = parts(&o);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("TOKEN is not set in gangway's environment"),
        "{err}"
    );
    // --secret-file.
    let f = home.file("secrets.env", "TOKEN=from-a-file-0\n");
    let (code, out, err) =
        parts(&home.run(["launch", &t, "-c", "env-secret", "-y", "--secret-file", &f]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("token-length-13"), "{out}");

    // A managed job whose task file holds the value literally: the copy
    // kept for recoveries does not, and when the secrets file is damaged
    // the recovery fails saying so instead of running without them.
    let t = home.file(
        "m.yaml",
        &format!(
            "resources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {}\nsecrets:\n  TOKEN: literal-s3cret\nconfig:\n  local:\n    preemptions:\n      - {{after_s: 2}}\nrun: |\n  echo token-length-${{#TOKEN}}\n  sleep 60\n",
            home.marker
        ),
    );
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "-d"]));
    assert_eq!(code, 0, "{err}");
    let dir = home.path().join("jobs/managed-1");
    let copy = std::fs::read_to_string(dir.join("task.yaml")).unwrap();
    assert!(!copy.contains("literal-s3cret"), "{copy}");
    assert!(copy.contains("TOKEN: null"), "{copy}");
    std::fs::write(dir.join("secrets.json"), "{damaged").unwrap();
    let j = wait_for("the recovery to fail", DEADLINE, || {
        let (_, out, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
        let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let j = v["jobs"][0].clone();
        if j["state"] == "FAILED" {
            Ok(j)
        } else {
            Err(j.to_string())
        }
    });
    let detail = j["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("secrets file") && detail.contains("damaged"),
        "{j}"
    );
    assert!(!dir.join("secrets.json").exists(), "removed at the end");
}
