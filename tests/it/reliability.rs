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

/// Arms the local cloud's kill point `n` (0: count the points, kill none).
fn arm_kill(home: &TestHome, n: u64) {
    std::fs::create_dir_all(home.path().join("local")).unwrap();
    std::fs::write(
        home.path().join("local/faults.json"),
        format!(r#"{{"kill_at": {n}}}"#),
    )
    .unwrap();
}

/// The first managed job, from `jobs queue -o json`.
fn first_job(home: &TestHome) -> Result<Value, String> {
    let (_, out, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    Ok(v["jobs"][0].clone())
}

/// A one-node managed job on the local cloud that echoes and ends.
fn echo_job(home: &TestHome) -> String {
    home.file(
        "job.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\nrun: echo done\n",
            home.marker
        ),
    )
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
    let t = echo_job(&home);
    inject(&home, "terminate", -1, "transient", "the API is down");
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "-d"]));
    assert_eq!(code, 0, "{err}");
    let cluster = wait_for("the job to end with its cluster kept", DEADLINE, || {
        let j = first_job(&home)?;
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
        let j = first_job(&home)?;
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

/// The local cloud's kill-point counter after a run.
fn calls(home: &TestHome) -> u64 {
    std::fs::read_to_string(home.path().join("local/calls"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Kill points to sweep out of `total`: all of them with
/// `GANGWAY_FAULT_SWEEP=full` (bench/fault_sweep.sh), else the first
/// `first` and then every `stride`-th, to keep the suite quick.
fn kill_points(total: u64, first: u64, stride: u64) -> Vec<u64> {
    let full = std::env::var("GANGWAY_FAULT_SWEEP").is_ok_and(|v| v == "full");
    (1..=total)
        .filter(|n| full || *n <= first || n % stride == 0)
        .collect()
}

/// After a kill: nothing of the cloud's left once the user ran `down
/// --all`, no process of the test's left, no row left.
fn assert_nothing_left(home: &TestHome, after: &str) {
    let (code, out, err) = parts(&home.run(["down", "--all", "-y"]));
    assert_eq!(code, 0, "{after}: down --all:\n{out}\n{err}");
    assert!(
        home.instance_records().is_empty(),
        "{after}: instances left: {:?}",
        home.instance_records()
    );
    assert!(home.clusters().is_empty(), "{after}: rows left");
    wait_for(after, DEADLINE, || {
        let left = crate::common::procs_with_marker(&home.marker);
        if left.is_empty() {
            Ok(())
        } else {
            Err(crate::common::describe_procs(&left))
        }
    });
}

#[test]
fn the_fault_sweep_kills_launch_at_every_provider_call_and_nothing_leaks() {
    let body = "run: echo swept-$NODE_RANK\n";
    // The baseline counts the kill points of one whole `launch --down`.
    let base = TestHome::new();
    let t = task(&base, body);
    arm_kill(&base, 0);
    let (code, out, err) = parts(&base.run(["launch", &t, "-c", "sweep", "--down", "-y"]));
    assert_eq!(code, 0, "baseline:\n{out}\n{err}");
    let total = calls(&base);
    assert!(total >= 4, "a launch and a teardown at least: {total}");
    let mut swept = 0;
    for n in kill_points(total, total, 1) {
        let home = TestHome::new();
        let t = task(&home, body);
        arm_kill(&home, n);
        let (code, out, err) = parts(&home.run(["launch", &t, "-c", "sweep", "--down", "-y"]));
        heal(&home);
        let what = format!("kill point {n} of {total} (launch exit {code})\n{out}\n{err}");
        // What a user does next: launch the same name again. It finishes
        // or replaces what the killed one left; never two clusters.
        let (code2, out2, err2) = parts(&home.run(["launch", &t, "-c", "sweep", "-y"]));
        assert!(
            code2 == 0 || code2 == 2,
            "{what}\nrelaunch: {code2}\n{out2}\n{err2}"
        );
        assert!(
            home.instance_records().len() <= 2,
            "{what}: two clusters for one name: {:?}",
            home.instance_records()
        );
        assert_nothing_left(&home, &what);
        swept += 1;
    }
    eprintln!(
        "fault sweep (launch --down, local): kill points swept: {swept}; resources leaked: 0"
    );
}

#[test]
fn the_fault_sweep_kills_a_managed_jobs_controller_at_every_provider_call() {
    // Both nodes preempted: the whole gang is recovered.
    sweep_a_managed_job("", "a preemption of both nodes");
}

#[test]
fn the_fault_sweep_kills_a_replacement_of_a_lost_node_at_every_provider_call() {
    // One node of two preempted: the survivor is kept and one node is
    // added in its place (REPLACE_LOST_NODES, the default).
    sweep_a_managed_job("    preempt_nodes: 1\n", "a replacement of one lost node");
}

/// A 2-node spot job on the local cloud, preempted once without notice
/// 1.5 s in (`preempt`: more `config.local` lines), killed (the launcher
/// and the controller it runs) at every provider call of its life: each
/// time the job ends SUCCEEDED once a controller runs again, never more
/// than two nodes run at once, and nothing is left.
fn sweep_a_managed_job(preempt: &str, what_for: &str) {
    // The run takes about 3 s, so the sweep meets provisioning, watching,
    // the preemption, the recovery and the final teardown.
    let body = |home: &TestHome| {
        home.file(
            "job.yaml",
            &format!(
                "num_nodes: 2\nresources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {}\nconfig:\n  local:\n{preempt}    preemptions:\n      - {{after_s: 1.5}}\nrun: sleep 3; echo done-$NODE_RANK\n",
                home.marker
            ),
        )
    };
    let base = TestHome::new();
    let t = body(&base);
    arm_kill(&base, 0);
    let (code, out, err) = parts(&base.run(["jobs", "launch", &t, "--wait"]));
    assert_eq!(code, 0, "baseline:\n{out}\n{err}");
    let j = first_job(&base).unwrap();
    assert_eq!(j["preemptions"], 1, "{j}");
    let replaced = if preempt.is_empty() { 0 } else { 1 };
    assert_eq!(j["nodes_replaced"], replaced, "the path swept: {j}");
    let total = calls(&base);
    let mut swept = 0;
    for n in kill_points(total, 6, 4) {
        let home = TestHome::new();
        let t = body(&home);
        arm_kill(&home, n);
        let watch = crate::jobs::CloudWatch::start_at(home.path());
        // The controller runs in this process (--wait): the kill takes both.
        let (code, out, err) = parts(&home.run(["jobs", "launch", &t, "--wait"]));
        heal(&home);
        let what = format!("kill point {n} of {total} (exit {code})\n{out}\n{err}");
        // What a user does next: look at the queue, which starts a
        // controller again; the job must end (or resume and end).
        let j = wait_for(&what, DEADLINE, || {
            let j = first_job(&home)?;
            match j["state"].as_str() {
                Some("SUCCEEDED" | "FAILED" | "CANCELLED" | "FAILED_NO_RESOURCE")
                    if home.clusters().is_empty() =>
                {
                    Ok(j)
                }
                _ => Err(j.to_string()),
            }
        });
        let (most, _) = watch.finish();
        assert_eq!(j["state"], "SUCCEEDED", "{what}\n{j}");
        assert!(most <= 2, "{what}: {most} nodes at once");
        assert!(
            home.instance_records().is_empty(),
            "{what}: instances left: {:?}",
            home.instance_records()
        );
        assert_nothing_left(&home, &what);
        swept += 1;
    }
    eprintln!(
        "fault sweep (jobs launch, {what_for}, local): kill points swept: {swept} of {total}; resources leaked: 0"
    );
}

#[test]
fn a_recovery_whose_teardown_fails_waits_for_it_and_never_doubles() {
    let home = TestHome::new();
    let t = home.file(
        "job.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {}\nconfig:\n  local:\n    preemptions:\n      - {{after_s: 1}}\nrun: sleep 2; echo done-$NODE_RANK\n",
            home.marker
        ),
    );
    inject(&home, "terminate", -1, "auth", "the token expired");
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "-d"]));
    assert_eq!(code, 0, "{err}");
    // Preempted: the controller must remove the lost cluster before it
    // launches the next one, and cannot.
    wait_for("the failed teardown to be kept", DEADLINE, || {
        let kept = home
            .clusters()
            .into_iter()
            .any(|c| c["status"] == "TERMINATING" && c["last_error"].is_string());
        if kept {
            Ok(())
        } else {
            Err(format!("{:?}", home.clusters()))
        }
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        home.instance_records().len(),
        2,
        "no second cluster while the first is not gone"
    );
    heal(&home);
    let j = wait_for("the job to recover and finish", DEADLINE, || {
        let j = first_job(&home)?;
        match j["state"].as_str() {
            Some("SUCCEEDED") if home.clusters().is_empty() => Ok(j),
            Some("FAILED" | "CANCELLED") => panic!("{j}"),
            _ => Err(j.to_string()),
        }
    });
    assert_eq!(j["preemptions"], 1, "{j}");
    assert!(home.instance_records().is_empty());
}

#[test]
fn jobs_launch_wait_exits_6_when_its_clusters_teardown_fails_and_a_controller_finishes_it() {
    let home = TestHome::new();
    let t = echo_job(&home);
    inject(&home, "terminate", -1, "auth", "the token expired");
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "--wait"]));
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("may still be running"), "{err}");
    assert!(err.contains("the token expired"), "{err}");
    assert_eq!(home.instance_records().len(), 1, "its node still runs");
    heal(&home);
    // A detached controller was left to retry; it removes the cluster.
    wait_for(
        "a detached controller to finish the teardown",
        DEADLINE,
        || {
            if home.clusters().is_empty() && home.instance_records().is_empty() {
                Ok(())
            } else {
                Err(format!("{:?}", home.clusters()))
            }
        },
    );
}
