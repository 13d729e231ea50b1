//! Commands on existing clusters, end to end on the local cloud: logs,
//! exec, cancel, Ctrl-C, stop/start, autostop, and what `kill -9` at
//! various moments leaves behind.
//!
//! Every test has its own `GANGWAY_HOME` ([`TestHome`]), which tears its
//! clusters down when the test ends, pass or fail. Jobs that must still be
//! running when the test looks wait for a flag file the test creates, so
//! nothing depends on how fast this machine is.

use std::path::PathBuf;

use crate::common::{
    assert_no_marker_procs, describe_procs, parts, procs_with_env, wait_for, TestHome, DEADLINE,
};

/// Writes a task on the local cloud with the test's marker env and
/// `GW_FLAG` (a path the run can wait for); returns (task path, flag path).
fn task(home: &TestHome, nodes: u32, body: &str) -> (String, PathBuf) {
    let flag = home.path().join("flag");
    let t = home.file(
        "task.yaml",
        &format!(
            "num_nodes: {nodes}\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\n  GW_FLAG: {}\n{body}",
            home.marker,
            flag.display()
        ),
    );
    (t, flag)
}

/// A run that waits for the flag file, then prints `then`.
fn wait_for_flag_then(then: &str) -> String {
    format!("run: |\n  while [ ! -e \"$GW_FLAG\" ]; do sleep 0.1; done\n  echo {then}-$NODE_RANK\n")
}

fn run_ok(home: &TestHome, args: &[&str]) -> String {
    let (code, out, err) = parts(&home.run(args));
    assert_eq!(code, 0, "gangway {args:?}:\nstdout:\n{out}\nstderr:\n{err}");
    out
}

fn launch_detached(home: &TestHome, task: &str, name: &str) {
    let (code, out, err) = parts(&home.run(["launch", task, "-c", name, "-d"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
}

fn is_live(status: &serde_json::Value) -> bool {
    ["PENDING", "SETTING_UP", "RUNNING"]
        .iter()
        .any(|s| status == s)
}

#[test]
fn kill_9_while_provisioning_leaves_an_interrupted_cluster_that_down_removes() {
    let home = TestHome::new();
    let (t, _) = task(
        &home,
        2,
        "config:\n  local:\n    boot_s: 30\nrun: echo never\n",
    );
    let mut launcher = home.spawn(["launch", &t, "-c", "k9"]);
    wait_for(
        "the cluster to be INIT with its instances created",
        DEADLINE,
        || match home.cluster_opt("k9") {
            Some(c) if c["status"] == "INIT" && home.instance_records().len() == 2 => Ok(()),
            other => Err(format!("{other:?}, records {:?}", home.instance_records())),
        },
    );
    launcher.signal(libc::SIGKILL);
    let o = launcher.wait();
    assert_eq!(o.status.code(), None, "the launcher was not killed: {o:?}");

    let out = run_ok(&home, &["status"]);
    let row = out
        .lines()
        .find(|l| l.starts_with("k9 "))
        .unwrap_or_else(|| panic!("no row for k9:\n{out}"));
    assert!(row.contains("INIT (interrupted)"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("note:") && l.contains("`gangway down k9`")),
        "no note telling to run down:\n{out}"
    );
    let c = home
        .cluster_opt("k9")
        .expect("status -o json still lists it");
    assert_eq!(c["status"], "INIT", "{c}");
    assert_eq!(c["shown_status"], "INIT (interrupted)", "{c}");

    let out = run_ok(&home, &["down", "k9", "-y"]);
    assert!(out.contains("Terminated cluster 'k9'"), "{out}");
    assert!(home.clusters().is_empty(), "{:?}", home.clusters());
    assert!(
        home.instance_records().is_empty(),
        "{:?}",
        home.instance_records()
    );
    assert!(home.node_dirs().is_empty(), "{:?}", home.node_dirs());
}

#[test]
fn ctrl_c_while_provisioning_removes_what_was_created() {
    let home = TestHome::new();
    let (t, _) = task(
        &home,
        2,
        "config:\n  local:\n    boot_s: 3\nrun: echo never\n",
    );
    let mut launcher = home.spawn(["launch", &t, "-c", "intr"]);
    wait_for(
        "the cluster's instances to be created",
        DEADLINE,
        || match home.instance_records().len() {
            2 => Ok(()),
            n => Err(format!("{n} records")),
        },
    );
    launcher.signal(libc::SIGINT);
    let (code, out, err) = parts(&launcher.wait());
    assert_eq!(code, 5, "stdout:\n{out}\nstderr:\n{err}");
    assert!(!out.contains("never"), "{out}");
    assert!(home.clusters().is_empty(), "{:?}", home.clusters());
    assert!(
        home.instance_records().is_empty(),
        "{:?}",
        home.instance_records()
    );
}

#[test]
fn kill_9_of_the_attached_launcher_does_not_stop_the_job() {
    let home = TestHome::new();
    let (t, flag) = task(&home, 2, &wait_for_flag_then("done-marker"));
    let mut launcher = home.spawn(["launch", &t, "-c", "attached"]);
    home.wait_job_status("attached", "RUNNING");
    launcher.signal(libc::SIGKILL);
    let o = launcher.wait();
    assert_eq!(o.status.code(), None, "the launcher was not killed: {o:?}");
    std::fs::write(&flag, "").unwrap();

    let job = home.wait_job_status("attached", "SUCCEEDED");
    assert_eq!(job["id"], 1, "{job}");
    let out = run_ok(&home, &["logs", "attached", "--no-follow"]);
    for n in home.nodes("attached") {
        let want = format!("(rank {}, {}) done-marker-{}", n.rank, n.ip, n.rank);
        assert!(out.contains(&want), "{want:?} not in:\n{out}");
    }
}

#[test]
fn kill_9_of_the_driver_marks_the_job_failed_driver() {
    let home = TestHome::new();
    let (t, _) = task(&home, 2, "run: sleep 300\n");
    launch_detached(&home, &t, "drv");
    let job = home.wait_job_status("drv", "RUNNING");
    let pid = job["driver_pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no driver_pid: {job}")) as u32;
    // Only ever kill our own driver.
    let ours = format!("GANGWAY_HOME={}", home.path().display());
    assert!(
        procs_with_env(&ours).contains(&pid),
        "pid {pid} is not this test's driver"
    );
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("__drive"),
        "pid {pid} is not a driver"
    );
    // SAFETY: kill(2) on the driver this test's job records, checked above.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let job = home.wait_job_status("drv", "FAILED_DRIVER");
    assert!(
        job["detail"].as_str().unwrap_or("").contains("driving"),
        "{job}"
    );
    assert_eq!(home.cluster("drv")["status"], "UP");
}

#[test]
fn kill_9_of_the_driver_leaves_no_ranks_running() {
    let home = TestHome::new();
    let (t, _) = task(&home, 2, "run: sleep 300\n");
    launch_detached(&home, &t, "orphans");
    let job = home.wait_job_status("orphans", "RUNNING");
    let pid = job["driver_pid"].as_u64().expect("driver_pid") as u32;
    let ours = format!("GANGWAY_HOME={}", home.path().display());
    assert!(procs_with_env(&ours).contains(&pid));
    // SAFETY: kill(2) on this test's own driver, checked above.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    home.wait_job_status("orphans", "FAILED_DRIVER");
    // The job has ended as far as gangway says; its ranks must not go on
    // (holding GPUs, running beside the cluster's next job).
    assert_no_marker_procs(&home.marker, "the job was marked FAILED_DRIVER");
}

#[test]
fn logs_replay_a_job_and_one_rank_and_exec_skips_setup() {
    let home = TestHome::new();
    let (t, _) = task(
        &home,
        2,
        "setup: |\n  echo setup-out-$SKYPILOT_SETUP_NODE_RANK\n  touch ~/setup-ran\n\
         run: echo run-out-$NODE_RANK\n",
    );
    let launched = run_ok(&home, &["launch", &t, "-c", "lg"]);
    let nodes = home.nodes("lg");
    for n in &nodes {
        for want in [
            format!("(setup rank {}, {}) setup-out-{}", n.rank, n.ip, n.rank),
            format!("(rank {}, {}) run-out-{}", n.rank, n.ip, n.rank),
        ] {
            assert!(launched.contains(&want), "{want:?} not in:\n{launched}");
        }
    }
    // The replay is what the launch printed.
    let replay = run_ok(&home, &["logs", "lg", "1", "--no-follow"]);
    assert_eq!(replay, launched);
    // One rank: its raw lines, setup's and run's, without prefixes.
    let rank1 = run_ok(&home, &["logs", "lg", "1", "--no-follow", "--rank", "1"]);
    assert_eq!(rank1, "setup-out-1\nrun-out-1\n");

    // A command on every node.
    for n in &nodes {
        std::fs::remove_file(home.node_home(&n.id).join("setup-ran")).unwrap();
    }
    let out = run_ok(&home, &["exec", "lg", "echo", "hi-from-exec"]);
    for n in &nodes {
        let want = format!("(rank {}, {}) hi-from-exec", n.rank, n.ip);
        assert!(out.contains(&want), "{want:?} not in:\n{out}");
    }
    // A task: its run, not its setup.
    let out = run_ok(&home, &["exec", "lg", &t]);
    for n in &nodes {
        let want = format!("(rank {}, {}) run-out-{}", n.rank, n.ip, n.rank);
        assert!(out.contains(&want), "{want:?} not in:\n{out}");
        assert!(
            !home.node_home(&n.id).join("setup-ran").exists(),
            "exec ran the setup on rank {}",
            n.rank
        );
    }
    assert!(!out.contains("setup-out"), "{out}");
    let jobs = home.jobs("lg");
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    assert!(jobs.iter().all(|j| j["status"] == "SUCCEEDED"), "{jobs:?}");
}

#[test]
fn detached_launch_returns_and_logs_follows_to_the_end() {
    let home = TestHome::new();
    let (t, flag) = task(&home, 2, &wait_for_flag_then("detached-done"));
    let (code, out, err) = parts(&home.run(["launch", &t, "-c", "det", "-d"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("Job 1 submitted on 'det'"), "{err}");
    assert!(!out.contains("detached-done"), "{out}");
    // It returned while the job cannot have ended (the flag is not there).
    let job = home.last_job("det");
    assert!(is_live(&job["status"]), "{job}");

    let mut logs = home.spawn(["logs", "det"]);
    logs.wait_for_stdout("all 2 rank(s) running", "logs to show the running ranks");
    assert!(!logs.exited(), "logs returned before the job ended");
    std::fs::write(&flag, "").unwrap();
    let (code, out, err) = parts(&logs.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for n in home.nodes("det") {
        let want = format!("(rank {}, {}) detached-done-{}", n.rank, n.ip, n.rank);
        assert!(out.contains(&want), "{want:?} not in:\n{out}");
    }
    assert!(out.contains("job 1 SUCCEEDED"), "{out}");
    assert_eq!(home.last_job("det")["status"], "SUCCEEDED");
}

#[test]
fn cancel_stops_a_detached_job() {
    let home = TestHome::new();
    let (t, _) = task(&home, 2, "run: sleep 300\n");
    launch_detached(&home, &t, "can");
    home.wait_job_status("can", "RUNNING");
    let out = run_ok(&home, &["cancel", "can"]);
    assert!(out.contains("Job 1 CANCELLED"), "{out}");
    let job = home.last_job("can");
    assert_eq!(job["status"], "CANCELLED", "{job}");
    assert_no_marker_procs(&home.marker, "cancel");
    assert_eq!(home.cluster("can")["status"], "UP");
}

#[test]
fn ctrl_c_cancels_an_attached_job() {
    let home = TestHome::new();
    let (t, _) = task(&home, 2, "run: sleep 300\n");
    let mut launcher = home.spawn(["launch", &t, "-c", "ctrlc"]);
    // Once the launcher prints the ranks' start it follows the job (and
    // handles Ctrl-C).
    launcher.wait_for_stdout(
        "all 2 rank(s) running",
        "the launcher to follow the running job",
    );
    launcher.signal(libc::SIGINT);
    let (code, out, err) = parts(&launcher.wait());
    assert_eq!(code, 5, "stdout:\n{out}\nstderr:\n{err}");
    let job = home.last_job("ctrlc");
    assert_eq!(job["status"], "CANCELLED", "{job}");
    assert_no_marker_procs(&home.marker, "Ctrl-C");
}

#[test]
fn stop_kills_the_nodes_processes_and_start_brings_them_back() {
    let home = TestHome::new();
    let (t, _) = task(&home, 2, "run: sleep 300\n");
    launch_detached(&home, &t, "ss");
    home.wait_job_status("ss", "RUNNING");
    let before: Vec<String> = home.nodes("ss").into_iter().map(|n| n.id).collect();

    let out = run_ok(&home, &["stop", "ss"]);
    assert!(out.contains("Stopped cluster 'ss'"), "{out}");
    assert_eq!(home.cluster("ss")["status"], "STOPPED");
    assert_no_marker_procs(&home.marker, "stop");
    wait_for("the job to end", DEADLINE, || {
        let j = home.last_job("ss");
        if is_live(&j["status"]) {
            Err(j.to_string())
        } else {
            Ok(())
        }
    });

    let (code, out, err) = parts(&home.run(["exec", "ss", "echo", "nope"]));
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("STOPPED"), "{err}");
    assert!(err.contains("gangway start ss"), "{err}");
    assert!(!out.contains("nope"), "{out}");

    let out = run_ok(&home, &["start", "ss"]);
    assert!(out.contains("Started cluster 'ss'"), "{out}");
    assert_eq!(home.cluster("ss")["status"], "UP");
    let nodes = home.nodes("ss");
    let mut after: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(after, before, "start brought back other nodes");
    let out = run_ok(&home, &["exec", "ss", "echo", "hi-again"]);
    for n in &nodes {
        let want = format!("(rank {}, {}) hi-again", n.rank, n.ip);
        assert!(out.contains(&want), "{want:?} not in:\n{out}");
    }
    // The cost ledger: up, stopped (the row closes), started (a new one),
    // and after down both rows stay, priced as planned.
    let price = home.cluster("ss")["price_per_hour"].as_f64().unwrap();
    assert!(price > 0.0);
    run_ok(&home, &["down", "-y", "ss"]);
    let report = crate::common::json_doc(&run_ok(&home, &["cost-report", "-o", "json"]));
    let c = &report["clusters"][0];
    assert_eq!(c["name"], "ss", "{report}");
    assert_eq!(c["up"], false, "{report}");
    let rows = c["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "up, then up again after start: {report}");
    let mut sum = 0.0;
    for r in rows {
        assert_eq!(r["market"], "on-demand");
        assert_eq!(r["num_nodes"], 2);
        assert_eq!(r["price_per_hour"].as_f64(), Some(price));
        let (a, b) = (
            r["started_at"].as_i64().unwrap(),
            r["ended_at"].as_i64().unwrap(),
        );
        sum += price * (b - a) as f64 / 3_600_000.0;
    }
    // The stopped stretch costs nothing: the first row ends before the
    // second starts.
    assert!(
        rows[0]["ended_at"].as_i64() < rows[1]["started_at"].as_i64(),
        "{rows:?}"
    );
    assert!(
        (c["cost"].as_f64().unwrap() - sum).abs() < 1e-12,
        "{c} vs {sum}"
    );
    let text = run_ok(&home, &["cost-report"]);
    assert!(
        text.contains("cluster ss") && text.contains("Total $"),
        "{text}"
    );
}

#[test]
fn stop_records_a_running_job_as_cancelled() {
    let home = TestHome::new();
    let (t, _) = task(&home, 2, "run: sleep 300\n");
    launch_detached(&home, &t, "stopjob");
    // The outcome is a race; a few rounds make a wrong one show.
    for round in 1..=4 {
        home.wait_job_status("stopjob", "RUNNING");
        run_ok(&home, &["stop", "stopjob"]);
        let job = wait_for("the job to end", DEADLINE, || {
            let j = home.last_job("stopjob");
            if is_live(&j["status"]) {
                Err(j.to_string())
            } else {
                Ok(j)
            }
        });
        assert_eq!(job["status"], "CANCELLED", "round {round}: {job}");
        run_ok(&home, &["start", "stopjob"]);
        let (code, out, err) = parts(&home.run(["exec", "stopjob", "-d", "sleep", "300"]));
        assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    }
}

#[test]
fn autostop_down_tears_down_an_idle_cluster() {
    let home = TestHome::new();
    let (t, _) = task(&home, 2, "run: echo idle-ran-$NODE_RANK\n");
    let out = run_ok(&home, &["launch", &t, "-c", "idle"]);
    assert!(out.contains("idle-ran-1"), "{out}");
    let out = run_ok(&home, &["autostop", "idle", "-i", "0", "--down"]);
    assert!(out.contains("'idle' will be torn down"), "{out}");
    wait_for(
        "the idle cluster to be torn down",
        DEADLINE,
        || match home.cluster_opt("idle") {
            None => Ok(()),
            Some(c) => Err(c.to_string()),
        },
    );
    assert!(
        home.instance_records().is_empty(),
        "{:?}",
        home.instance_records()
    );
    assert_no_marker_procs(&home.marker, "autostop --down");
    // The watcher and the driver are gone too.
    let ours = format!("GANGWAY_HOME={}", home.path().display());
    wait_for("this test's gangway processes to exit", DEADLINE, || {
        let left = procs_with_env(&ours);
        if left.is_empty() {
            Ok(())
        } else {
            Err(describe_procs(&left))
        }
    });
}

#[test]
fn autostop_cancel_keeps_the_cluster_after_its_job_ends() {
    let home = TestHome::new();
    let (t, flag) = task(&home, 2, &wait_for_flag_then("cancel-kept"));
    launch_detached(&home, &t, "kept");
    home.wait_job_status("kept", "RUNNING");
    let out = run_ok(&home, &["autostop", "kept", "-i", "0", "--down"]);
    assert!(out.contains("'kept' will be torn down"), "{out}");
    let out = run_ok(&home, &["autostop", "kept", "--cancel"]);
    assert!(out.contains("Autostop off for 'kept'"), "{out}");
    let c = home.cluster_opt("kept").expect("the cluster");
    assert!(c["autostop_idle_min"].is_null(), "{c}");
    assert_eq!(c["autostop_down"], false, "{c}");
    // The job ends; a watcher that missed the cancel would now tear the
    // idle cluster down. Watch it stay for longer than a watcher's poll.
    std::fs::write(&flag, "").unwrap();
    home.wait_job_status("kept", "SUCCEEDED");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
    while std::time::Instant::now() < until {
        let c = home
            .cluster_opt("kept")
            .expect("autostop --cancel was ignored: the cluster is gone");
        assert_eq!(c["status"], "UP", "{c}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    run_ok(&home, &["down", "-y", "kept"]);
    assert!(home.instance_records().is_empty());
    assert_no_marker_procs(&home.marker, "autostop --cancel then down");
}

#[test]
fn autostop_waits_for_the_running_job() {
    let home = TestHome::new();
    let (t, flag) = task(&home, 2, &wait_for_flag_then("autostop-waited"));
    launch_detached(&home, &t, "busy");
    home.wait_job_status("busy", "RUNNING");
    let out = run_ok(&home, &["autostop", "busy", "-i", "0", "--down"]);
    assert!(out.contains("'busy' will be torn down"), "{out}");
    let log =
        || std::fs::read_to_string(home.path().join("logs/job-1/job.log")).unwrap_or_default();
    // The job cannot end before the flag exists; give the watcher time to
    // (wrongly) act, observing the cluster the whole while.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let (Some(c), Ok(jobs)) = (home.cluster_opt("busy"), home.jobs_opt("busy")) else {
            panic!(
                "autostop -i 0 --down tore the cluster down while its job was running; job log:\n{}",
                log()
            );
        };
        assert_eq!(c["autostop_idle_min"], 0, "{c}");
        assert_eq!(c["autostop_down"], true, "{c}");
        let job = jobs.last().expect("the job");
        assert!(
            is_live(&job["status"]),
            "autostop ended a running job: {job}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::fs::write(&flag, "").unwrap();
    wait_for(
        "the cluster to be torn down after its job",
        DEADLINE,
        || match home.cluster_opt("busy") {
            None => Ok(()),
            Some(c) => Err(c.to_string()),
        },
    );
    // The job ended by itself before the teardown: its log says so.
    let log = log();
    assert!(log.contains("autostop-waited-0"), "{log}");
    assert!(log.contains("job 1 SUCCEEDED"), "{log}");
    assert!(home.instance_records().is_empty());
    assert_no_marker_procs(&home.marker, "autostop --down");
}

#[test]
fn a_second_ctrl_c_kills_ranks_that_ignore_sigterm() {
    let home = TestHome::new();
    // The ranks ignore SIGTERM (inherited by `sleep`): only SIGKILL stops them.
    let (t, _) = task(&home, 2, "run: |\n  trap '' TERM\n  sleep 300\n");
    let mut launcher = home.spawn(["launch", &t, "-c", "twice"]);
    launcher.wait_for_stdout("all 2 rank(s) running", "the ranks to run");
    launcher.signal(libc::SIGINT);
    launcher.wait_for_stdout("stopping every rank", "the graceful stop to begin");
    // SIGTERM changed nothing: the ranks are still there.
    assert!(!crate::common::procs_with_marker(&home.marker).is_empty());
    launcher.signal(libc::SIGINT);
    let (code, out, err) = parts(&launcher.wait());
    assert_eq!(code, 5, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("killing every rank"), "{out}");
    assert!(err.contains("killing the job"), "{err}");
    assert_eq!(home.last_job("twice")["status"], "CANCELLED");
    assert_no_marker_procs(&home.marker, "the second Ctrl-C");
}

#[test]
fn jobs_on_one_cluster_run_one_at_a_time_in_order() {
    let home = TestHome::new();
    let (t, flag) = task(&home, 2, &wait_for_flag_then("first"));
    launch_detached(&home, &t, "fifo");
    home.wait_job_status("fifo", "RUNNING");
    let (code, out, err) = parts(&home.run(["exec", "fifo", "-d", "echo", "second-$NODE_RANK"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    // The second job waits while the first runs.
    let jobs = home.jobs("fifo");
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_eq!(jobs[0]["status"], "RUNNING", "{jobs:?}");
    assert_eq!(jobs[1]["status"], "PENDING", "{jobs:?}");
    std::fs::write(&flag, "").unwrap();
    wait_for("both jobs to succeed", DEADLINE, || {
        let jobs = home.jobs("fifo");
        if jobs.iter().all(|j| j["status"] == "SUCCEEDED") {
            Ok(jobs)
        } else {
            Err(format!("{jobs:?}"))
        }
    });
    let jobs = home.jobs("fifo");
    let first_end = jobs[0]["ended_at"].as_i64().unwrap();
    let second_start = jobs[1]["started_at"].as_i64().unwrap();
    assert!(second_start >= first_end, "{jobs:?}");
    let out = run_ok(
        &home,
        &["logs", "fifo", &jobs[1]["id"].to_string(), "--no-follow"],
    );
    assert!(
        out.contains("second-0") && out.contains("second-1"),
        "{out}"
    );
}

#[test]
fn file_mounts_of_local_paths_reach_every_node() {
    let home = TestHome::new();
    let src_dir = home.path().join("data");
    std::fs::create_dir_all(src_dir.join("sub")).unwrap();
    std::fs::write(src_dir.join("sub/a.txt"), "alpha\n").unwrap();
    let src_file = home.path().join("one.txt");
    std::fs::write(&src_file, "just one\n").unwrap();
    let body = format!(
        "file_mounts:\n  ~/mounted: {}\n  /opt/one.txt: {}\n\
         run: |\n  cat ~/mounted/sub/a.txt\n  cat /opt/one.txt\n",
        src_dir.display(),
        src_file.display()
    );
    let (t, _) = task(&home, 2, &body);
    let (code, out, err) = parts(&home.run(["launch", &t, "-c", "mounts"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for rank in 0..2 {
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("(rank {rank}, ")))
            .collect();
        assert!(lines.iter().any(|l| l.ends_with(" alpha")), "{out}");
        assert!(lines.iter().any(|l| l.ends_with(" just one")), "{out}");
    }
    // A missing source is bad input, named, before anything is created.
    let bad = home.file(
        "bad.yaml",
        "resources:\n  infra: local\nfile_mounts:\n  ~/x: /no/such/path\nrun: echo hi\n",
    );
    let (code, _, err) = parts(&home.run(["launch", &bad, "-c", "badmount"]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("file_mounts.~/x") && err.contains("/no/such/path"),
        "{err}"
    );
    assert!(home.cluster_opt("badmount").is_none());
}
