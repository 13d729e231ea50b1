//! Managed jobs end to end on the local cloud: preemptions with and
//! without notice survived by checkpoint-and-requeue, the controller killed
//! at many points, restarts on errors, cancel, no capacity.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::common::{assert_no_marker_procs, json_doc, parts, root, wait_for, TestHome};

const DEADLINE: Duration = Duration::from_secs(120);

pub(crate) fn managed(home: &TestHome, id: i64) -> Value {
    let (code, out, err) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    json_doc(&out)["jobs"]
        .as_array()
        .and_then(|a| a.iter().find(|j| j["id"] == id).cloned())
        .unwrap_or_else(|| panic!("no managed job {id}: {out}"))
}

pub(crate) fn wait_ended(home: &TestHome, id: i64) -> Value {
    wait_for("the managed job to end", DEADLINE, || {
        let j = managed(home, id);
        match j["state"].as_str() {
            Some("SUCCEEDED" | "FAILED" | "FAILED_SETUP" | "FAILED_NO_RESOURCE" | "CANCELLED") => {
                Ok(j)
            }
            _ => Err(j.to_string()),
        }
    })
}

/// Watches the local cloud's instance records in the background and
/// remembers the most nodes seen at once.
pub(crate) struct CloudWatch {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<(usize, BTreeSet<String>)>>,
}

impl CloudWatch {
    fn start(home: &TestHome) -> CloudWatch {
        CloudWatch::start_at(home.path())
    }

    /// Watches the local cloud of the gangway home at `home`.
    pub(crate) fn start_at(home: &std::path::Path) -> CloudWatch {
        let dir = home.join("local/instances");
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut most = 0;
            let mut ever = BTreeSet::new();
            while !s.load(Ordering::SeqCst) {
                // Records are `<cluster>/<id>.json`.
                let now: Vec<String> = std::fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|c| std::fs::read_dir(c.path()).ok())
                    .flatten()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
                    .collect();
                most = most.max(now.len());
                ever.extend(now);
                std::thread::sleep(Duration::from_millis(20));
            }
            (most, ever)
        });
        CloudWatch {
            stop,
            handle: Some(handle),
        }
    }

    pub(crate) fn finish(mut self) -> (usize, BTreeSet<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take().unwrap().join().unwrap()
    }
}

/// The step numbers rank 0 printed, per run, from `jobs logs`.
fn steps_per_run(log: &str) -> Vec<(u32, Vec<u32>)> {
    let mut runs: Vec<(u32, Vec<u32>)> = Vec::new();
    for line in log.lines().filter(|l| l.starts_with("(rank 0, ")) {
        let text = line.split_once(") ").map_or("", |(_, t)| t);
        if let Some(rest) = text.strip_prefix("run ") {
            // "run R of job J: resuming at step S"
            let start: u32 = rest.rsplit(' ').next().unwrap().parse().unwrap();
            runs.push((start, Vec::new()));
        } else if let Some(n) = text.strip_prefix("step ") {
            runs.last_mut().unwrap().1.push(n.parse().unwrap());
        }
    }
    runs
}

pub(crate) fn spot_train(home: &TestHome) -> String {
    // The example as shipped, with this test's marker.
    let text = std::fs::read_to_string(root().join("examples/spot-train.yaml")).unwrap();
    home.file("spot-train.yaml", &text)
}

pub(crate) fn check_training(home: &TestHome, id: i64) {
    let (code, log, err) = parts(&home.run(["jobs", "logs", &id.to_string()]));
    assert_eq!(code, 0, "{err}");
    let runs = steps_per_run(&log);
    // Every run is the same job, one restart further.
    for (i, _) in runs.iter().enumerate() {
        assert!(
            log.contains(&format!("run {i} of job {id}: resuming")),
            "{log}"
        );
    }
    assert_eq!(runs.len(), 4, "one run and three recoveries:\n{log}");
    assert_eq!(runs[0].0, 0, "{log}");
    // The last run reaches exactly 60.
    assert_eq!(runs.last().unwrap().1.last(), Some(&60), "{log}");
    assert!(log.contains("done at step 60"), "{log}");
    for w in runs.windows(2) {
        let (_, before) = &w[0];
        let (resumed, _) = w[1];
        let reached = before.last().copied().unwrap_or(w[0].0);
        assert!(
            resumed <= reached,
            "resumed ahead of the work done: {runs:?}"
        );
        let redone = reached - resumed;
        assert!(redone <= 5, "more than CKPT_EVERY=5 steps redone: {runs:?}");
    }
    // Runs that got notice lost nothing.
    let events = home.run(["jobs", "events", &id.to_string(), "-o", "json"]);
    let ev = json_doc(&String::from_utf8_lossy(&events.stdout));
    let list = ev["events"].as_array().unwrap().clone();
    let notices = list.iter().filter(|e| e["state"] == "NOTICE").count();
    let preempted = list.iter().filter(|e| e["state"] == "PREEMPTED").count();
    assert_eq!((notices, preempted), (2, 3), "{list:?}");
    for (i, w) in runs.windows(2).enumerate() {
        // Runs 0 and 2 were told (the example's schedule).
        if i == 0 || i == 2 {
            let reached = w[0].1.last().copied().unwrap_or(w[0].0);
            assert_eq!(
                w[1].0, reached,
                "a run with notice must lose nothing: {runs:?}"
            );
        }
    }
}

#[test]
fn a_spot_job_survives_three_preemptions_and_finishes_exactly() {
    let home = TestHome::new();
    let task = spot_train(&home);
    let watch = CloudWatch::start(&home);
    let (code, out, err) =
        parts(&home.run(["jobs", "launch", &task, "-y", "--env", &home.marker_env()]));
    let (most, ever) = watch.finish();
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let job = managed(&home, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(job["preemptions"], 3, "{job}");
    assert_eq!(job["restart_count"], 3, "{job}");
    check_training(&home, 1);
    check_story(&out, &err, 1, 3);
    // Never two clusters: at most the job's 2 nodes existed at any moment,
    // though 4 clusters' worth came and went.
    assert!(most <= 2, "{most} instances at once");
    assert_eq!(ever.len(), 8, "{ever:?}");
    assert!(home.instance_records().is_empty());
    let (_, status, _) = parts(&home.run(["status", "-o", "json"]));
    assert_eq!(json_doc(&status)["clusters"].as_array().unwrap().len(), 0);
    assert_no_marker_procs(&home.marker, "the managed job ended");
    // Secrets file gone, events complete.
    assert!(!home.path().join("jobs/managed-1/secrets.json").exists());
    check_ledger(&home, &job, 3);
}

/// What following managed job `id` printed tells one story in the job's
/// own number: each of its `preemptions` as a preemption with its cause
/// (never a run's FAILED, never a run's own number), then its end.
pub(crate) fn check_story(out: &str, err: &str, id: u32, preemptions: usize) {
    let all = format!("{out}\n{err}");
    for line in all.lines().filter(|l| l.starts_with("gangway")) {
        let own = format!("gangway: job {id} ");
        assert!(
            !line.starts_with("gangway: job ") || line.starts_with(&own),
            "another numbering than job {id}'s: {line}\n{all}"
        );
        assert!(
            !line.starts_with(&format!("{own}FAILED")),
            "a preempted run told as a failure: {line}\n{all}"
        );
        assert!(!line.starts_with("gangway jobs:"), "{line}");
    }
    let preempted: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with(&format!("gangway: job {id} PREEMPTED: ")))
        .collect();
    assert_eq!(preempted.len(), preemptions, "{err}");
    for p in &preempted {
        assert!(
            p.contains("preemption notice") || p.contains("was preempted"),
            "a preemption without its cause: {p}"
        );
        assert!(
            !p.contains("killed by signal"),
            "the effect told as the cause: {p}"
        );
    }
    assert!(
        err.contains(&format!("gangway: job {id} SUCCEEDED")),
        "{err}"
    );
    // Runs are counted in the job's own numbers: 1, then one per recovery.
    for run in 1..=preemptions + 1 {
        assert!(
            err.contains(&format!("cluster up; run {run} submitted")),
            "run {run}: {err}"
        );
    }
}

/// The cost ledger of managed job 1 after `preemptions` recoveries: one
/// row per run (spot, the job's 2 nodes, closed, one after another), and
/// the cost `jobs queue` and `cost-report` give is exactly their sum.
pub(crate) fn check_ledger(home: &TestHome, job: &Value, preemptions: usize) {
    let (code, out, err) = parts(&home.run(["cost-report", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    let report = json_doc(&out);
    let j = &report["managed_jobs"][0];
    assert_eq!(j["id"], 1, "{report}");
    let rows = j["rows"].as_array().unwrap();
    let recoveries = parts(&home.run(["jobs", "events", "1", "-o", "json"])).1;
    let recovering = json_doc(&recoveries)["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["state"] == "RECOVERING")
        .count();
    assert_eq!(recovering, preemptions, "{recoveries}");
    assert_eq!(rows.len(), preemptions + 1, "one row per run: {report}");
    let mut sum = 0.0;
    let mut last_end = 0;
    for r in rows {
        let (start, end) = (
            r["started_at"].as_i64().unwrap(),
            r["ended_at"].as_i64().expect("every run ended"),
        );
        assert!(start >= last_end && end >= start, "runs in order: {rows:?}");
        last_end = end;
        assert_eq!(r["market"], "spot", "{r}");
        assert_eq!(r["num_nodes"], 2, "{r}");
        let price = r["price_per_hour"].as_f64().unwrap();
        assert!(price > 0.0, "{r}");
        sum += price * (end - start) as f64 / 3_600_000.0;
    }
    assert!(sum > 0.0);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    assert!(close(j["cost"].as_f64().unwrap(), sum), "{j} vs {sum}");
    assert!(close(job["cost"].as_f64().unwrap(), sum), "{job} vs {sum}");
    assert!(close(report["total"].as_f64().unwrap(), sum), "{report}");
    assert_eq!(j["up"], false);
}

#[test]
fn killing_the_controller_at_many_points_loses_nothing_and_doubles_nothing() {
    let home = TestHome::new();
    let task = spot_train(&home);
    let watch = CloudWatch::start(&home);
    let (code, _, err) =
        parts(&home.run(["jobs", "launch", &task, "-d", "--env", &home.marker_env()]));
    assert_eq!(code, 0, "{err}");
    let kills = kill_controller_until_ended(&home, 0x9e37_79b9, 150, 600);
    let job = wait_ended(&home, 1);
    let (most, ever) = watch.finish();
    assert!(kills >= 5, "only {kills} kills landed");
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    check_training(&home, 1);
    assert!(most <= 2, "{most} instances at once");
    assert_eq!(ever.len(), 8, "{ever:?}");
    wait_for("the last cluster to go", DEADLINE, || {
        if home.instance_records().is_empty() {
            Ok(())
        } else {
            Err(format!("{:?}", home.instance_records()))
        }
    });
    // The controllers killed on the way doubled no ledger row: one per run.
    wait_for("the ledger's last row to close", DEADLINE, || {
        let out = parts(&home.run(["cost-report", "-o", "json"])).1;
        match json_doc(&out)["managed_jobs"][0]["up"].as_bool() {
            Some(false) => Ok(()),
            _ => Err(out),
        }
    });
    let preempted = job["preemptions"].as_u64().unwrap() as usize;
    check_ledger(&home, &managed(&home, 1), preempted);
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// Kills managed job 1's controller (SIGKILL) again and again, a
/// pseudo-random `from_ms + [0, spread_ms)` apart (from `seed`), until the
/// job ends (each `jobs queue` in between starts a controller again);
/// returns how many kills landed.
pub(crate) fn kill_controller_until_ended(
    home: &TestHome,
    mut seed: u64,
    from_ms: u64,
    spread_ms: u64,
) -> usize {
    let lock = home.path().join("locks/controller.lock");
    let mut kills = 0;
    loop {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        std::thread::sleep(Duration::from_millis(from_ms + (seed >> 33) % spread_ms));
        if let Some(pid) = std::fs::read_to_string(&lock)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            // SAFETY: kill(2) on the controller this test's home started.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                kills += 1;
            }
        }
        let j = managed(home, 1);
        if j["state"] == "SUCCEEDED" || j["state"] == "FAILED" {
            return kills;
        }
        assert!(kills < 400, "the job never ended: {j}");
    }
}

fn task(home: &TestHome, body: &str) -> String {
    home.file(
        "task.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\n{body}",
            home.marker
        ),
    )
}

#[test]
fn own_failures_restart_within_the_limit_and_exit_codes_can_be_exempt() {
    let home = TestHome::new();
    // Fails on its first run only: one restart on errors is enough.
    let t = home.file(
        "once.yaml",
        &format!(
            "resources:\n  infra: local\n  job_recovery:\n    max_restarts_on_errors: 1\nenvs:\n  GW_TEST_MARKER: {}\nrun: |\n  [ \"$GANGWAY_RESTART_COUNT\" = 0 ] && exit 3\n  echo second-try-ok\n",
            home.marker
        ),
    );
    let (code, out, err) = parts(&home.run(["jobs", "launch", &t, "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("second-try-ok"), "{out}");
    let j = managed(&home, 1);
    assert_eq!(
        (j["restarts_on_errors"].as_u64(), j["preemptions"].as_u64()),
        (Some(1), Some(0)),
        "{j}"
    );

    // Always failing: one restart, then FAILED naming the exit code.
    let t = home.file(
        "always.yaml",
        &format!(
            "resources:\n  infra: local\n  job_recovery:\n    max_restarts_on_errors: 1\nenvs:\n  GW_TEST_MARKER: {}\nrun: exit 4\n",
            home.marker
        ),
    );
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "-y"]));
    assert_eq!(code, 1, "{err}");
    let j = managed(&home, 2);
    assert_eq!(j["state"], "FAILED", "{j}");
    assert_eq!(j["restart_count"], 1, "{j}");
    assert!(
        j["detail"].as_str().unwrap().contains("exited with code 4"),
        "{j}"
    );

    // An exempt exit code restarts without counting (limit 0).
    let t = home.file(
        "exempt.yaml",
        &format!(
            "resources:\n  infra: local\n  job_recovery:\n    recover_on_exit_codes: [42]\nenvs:\n  GW_TEST_MARKER: {}\nrun: |\n  [ \"$GANGWAY_RESTART_COUNT\" -lt 2 ] && exit 42\n  echo third-try-ok\n",
            home.marker
        ),
    );
    let (code, out, err) = parts(&home.run(["jobs", "launch", &t, "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let j = managed(&home, 3);
    assert_eq!(
        (
            j["restart_count"].as_u64(),
            j["restarts_on_errors"].as_u64()
        ),
        (Some(2), Some(0)),
        "{j}"
    );
    assert_no_marker_procs(&home.marker, "the jobs ended");
}

#[test]
fn cancel_stops_a_managed_job_and_removes_its_cluster() {
    let home = TestHome::new();
    let t = task(&home, "run: sleep 300\n");
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "-d"]));
    assert_eq!(code, 0, "{err}");
    wait_for("the job to run", DEADLINE, || {
        let j = managed(&home, 1);
        if j["state"] == "RUNNING" {
            Ok(())
        } else {
            Err(j.to_string())
        }
    });
    let (code, out, err) = parts(&home.run(["jobs", "cancel", "1"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Managed job 1 CANCELLED"), "{out}");
    assert!(home.instance_records().is_empty());
    assert_no_marker_procs(&home.marker, "jobs cancel");
}

#[test]
fn no_capacity_for_the_first_launch_is_failed_no_resource() {
    let home = TestHome::new();
    let t = task(
        &home,
        "config:\n  local:\n    capacity: 0\nrun: echo never\n",
    );
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "-y"]));
    assert_eq!(code, 3, "{err}");
    let j = managed(&home, 1);
    assert_eq!(j["state"], "FAILED_NO_RESOURCE", "{j}");
    assert!(
        j["detail"].as_str().unwrap().contains("out of capacity"),
        "{j}"
    );
}

#[test]
fn wait_runs_the_controller_in_the_foreground() {
    let home = TestHome::new();
    let t = task(&home, "run: echo in-the-foreground\n");
    let (code, out, err) = parts(&home.run([
        "jobs", "launch", &t, "--wait", "--name", "fg-job", "-o", "json",
    ]));
    assert_eq!(code, 0, "{err}");
    let doc = json_doc(&out);
    assert_eq!(doc["state"], "SUCCEEDED", "{doc}");
    assert_eq!(doc["name"], "fg-job", "--name names the job: {doc}");
    // No controller was left behind to run detached.
    assert!(
        !crate::common::procs_with_env(&format!("GANGWAY_HOME={}", home.path().display()))
            .iter()
            .any(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .contains("__jobs-controller"))
    );
}

#[test]
fn secrets_of_a_managed_job_are_kept_owner_only_and_removed_at_the_end() {
    use std::os::unix::fs::PermissionsExt;
    let home = TestHome::new();
    let t = home.file(
        "s.yaml",
        &format!(
            "resources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\n  GW_FLAG: {}\nsecrets:\n  TOKEN: null\nrun: |\n  echo token-length-${{#TOKEN}}\n  while [ ! -e \"$GW_FLAG\" ]; do sleep 0.1; done\n",
            home.marker,
            home.path().join("flag").display()
        ),
    );
    let (code, _, err) =
        parts(&home.run(["jobs", "launch", &t, "-d", "--secret", "TOKEN=sup3r-s3cret"]));
    assert_eq!(code, 0, "{err}");
    let secrets = home.path().join("jobs/managed-1/secrets.json");
    let mode = std::fs::metadata(&secrets).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    wait_for("the job to run", DEADLINE, || {
        let j = managed(&home, 1);
        if j["state"] == "RUNNING" {
            Ok(())
        } else {
            Err(j.to_string())
        }
    });
    std::fs::write(home.path().join("flag"), "").unwrap();
    let j = wait_ended(&home, 1);
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert!(!secrets.exists());
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    assert!(log.contains("token-length-12"), "{log}");
    for f in ["state.db", "state.db-wal"] {
        let bytes = std::fs::read(home.path().join(f)).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("sup3r-s3cret"),
            "{f}"
        );
    }
}

#[test]
fn a_deadline_moves_a_job_that_spot_keeps_losing_onto_on_demand() {
    let home = TestHome::new();
    // Spot is reclaimed 0.3 s after every launch, before the run finishes
    // a single 0.5 s step, so spot never gets the 4 s of work done; uniform
    // progress must end on on-demand while there is still time (the
    // deadline is 30 s away). With no restart measured yet it assumes a
    // cloud's 30 s and starts on on-demand, then tries spot once it knows
    // restarts here are quick.
    let schedule: Vec<String> = (0..200)
        .map(|_| "      - {after_s: 0.3}".to_string())
        .collect();
    let t = home.file(
        "deadline.yaml",
        &format!(
            "resources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {}\n\
             deadline: {{within: 30s, work: 4s, policy: uniform_progress}}\n\
             checkpoint: {{sync_interval: 1}}\n\
             config:\n  local:\n    preemptions:\n{}\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  step=0\n  [ -f \"$ck\" ] && step=$(cat \"$ck\")\n\
             \x20 trap 'echo $step > \"$ck\"; exit 0' TERM\n\
             \x20 while [ $step -lt 8 ]; do sleep 0.5; step=$((step+1)); echo $step > \"$ck\"; done\n\
             \x20 echo finished-at-$step\n",
            home.marker,
            schedule.join("\n")
        ),
    );
    let (code, out, err) = parts(&home.run(["jobs", "launch", &t, "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("finished-at-8"), "{out}");
    let events = home.run(["jobs", "events", "1", "-o", "json"]);
    let ev = json_doc(&String::from_utf8_lossy(&events.stdout));
    let list = ev["events"].as_array().unwrap().clone();
    let starts: Vec<String> = list
        .iter()
        .filter(|e| e["state"] == "STARTING")
        .map(|e| e["placement"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(starts.len() >= 2, "{list:?}");
    assert!(
        starts.iter().any(|s| s.ends_with(" spot")),
        "spot was tried: {starts:?}"
    );
    let last = starts.last().unwrap();
    assert!(
        !last.ends_with(" spot"),
        "finishes on on-demand: {starts:?}"
    );
    let j = managed(&home, 1);
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["market"], "on-demand", "{j}");
    // The point of the policy: the job finished within its deadline
    // (`within: 30s` from submission), by the queue's times and by the
    // events' (both Unix ms).
    let within_ms = 30_000;
    let submitted = j["submitted_at"]
        .as_i64()
        .unwrap_or_else(|| panic!("no submitted_at: {j}"));
    let ended = j["ended_at"]
        .as_i64()
        .unwrap_or_else(|| panic!("no ended_at: {j}"));
    let took = ended - submitted;
    eprintln!("deadline job took {took} ms for a {within_ms} ms deadline; starts: {starts:?}");
    assert!(
        (0..=within_ms).contains(&took),
        "the job ended {took} ms after it was submitted, past its {within_ms} ms deadline: {j}\n{list:?}"
    );
    let succeeded = list
        .iter()
        .find(|e| e["state"] == "SUCCEEDED")
        .and_then(|e| e["at"].as_i64())
        .unwrap_or_else(|| panic!("no SUCCEEDED event with a time: {list:?}"));
    assert!(
        succeeded <= submitted + within_ms,
        "SUCCEEDED at {succeeded}, {} ms after submission, past the {within_ms} ms deadline: {list:?}",
        succeeded - submitted
    );
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// The modification time of a file, in unix ms.
fn mtime_ms(path: &std::path::Path) -> Option<i64> {
    let t = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64)
}

#[test]
fn a_job_stuck_provisioning_does_not_delay_another_jobs_preemption_notice() {
    let home = TestHome::new();
    // Job 1's launch hangs for a minute, as a cloud's boot can.
    let slow = home.file(
        "slow.yaml",
        &format!(
            "name: slow\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\nconfig:\n  local:\n    boot_s: 60\nrun: sleep 300\n",
            home.marker
        ),
    );
    // Job 2 runs on spot and gets 4 s of notice 2 s after launch; its run
    // writes the time it was signalled.
    let signalled = home.path().join("signalled");
    let noticed = home.file(
        "noticed.yaml",
        &format!(
            "name: noticed\nresources:\n  infra: local\n  use_spot: true\nenvs:\n  GW_TEST_MARKER: {}\n  SIGNAL_FILE: {}\ncheckpoint:\n  signal: SIGUSR1\n  grace_period: 10\nconfig:\n  local:\n    preemptions:\n      - {{after_s: 6, notice_s: 4}}\nrun: |\n  [ \"$GANGWAY_RESTART_COUNT\" = 0 ] || exec sleep 300\n  trap 'date +%s%3N > \"$SIGNAL_FILE\"; exit 0' USR1\n  while true; do sleep 0.02; done\n",
            home.marker,
            signalled.display()
        ),
    );
    let (code, _, err) = parts(&home.run(["jobs", "launch", &slow, "-d"]));
    assert_eq!(code, 0, "{err}");
    wait_for("job 1 to be provisioning", DEADLINE, || {
        let j = managed(&home, 1);
        if j["state"] == "PROVISIONING" {
            Ok(())
        } else {
            Err(j.to_string())
        }
    });
    // The notice's own time: when the local cloud posted the file (the
    // node's directory goes with the cluster, so it is watched for).
    let nodes = home.path().join("local/nodes");
    let posted = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        while started.elapsed() < DEADLINE {
            if let Some(t) = std::fs::read_dir(&nodes).ok().and_then(|d| {
                d.filter_map(|e| mtime_ms(&e.ok()?.path().join("metadata/preempted")))
                    .min()
            }) {
                return Some(t);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    });
    let (code, _, err) = parts(&home.run(["jobs", "launch", &noticed, "-d"]));
    assert_eq!(code, 0, "{err}");
    let at = wait_for("job 2's run to be signalled", DEADLINE, || {
        std::fs::read_to_string(&signalled)
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .ok_or_else(|| managed(&home, 2).to_string())
    });
    // The slow launch is still under way: the notice did not wait for it.
    let slow_job = managed(&home, 1);
    assert_eq!(slow_job["state"], "PROVISIONING", "{slow_job}");
    let notice = posted
        .join()
        .unwrap()
        .expect("the local cloud posted a notice");
    let latency = at - notice;
    eprintln!("notice to signal: {latency} ms");
    assert!(
        (0..1_000).contains(&latency),
        "signalled {latency} ms after the notice appeared"
    );
    let events = home.run(["jobs", "events", "2", "-o", "json"]);
    let ev = json_doc(&String::from_utf8_lossy(&events.stdout));
    assert!(
        ev["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["state"] == "NOTICE"),
        "{ev}"
    );
    // A cancel reaches a launch in progress: job 1 ends long before its
    // boot would have, and leaves nothing.
    let started = std::time::Instant::now();
    let (code, out, err) = parts(&home.run(["jobs", "cancel", "1", "2"]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "cancel took {:?}",
        started.elapsed()
    );
    for id in [1, 2] {
        assert_eq!(managed(&home, id)["state"], "CANCELLED");
    }
    assert!(
        home.instance_records().is_empty(),
        "{:?}",
        home.instance_records()
    );
    assert_no_marker_procs(&home.marker, "both jobs were cancelled");
}

#[test]
fn a_recovery_plans_with_the_prices_a_refresh_saved() {
    let home = TestHome::new();
    // Spot local.cpu: local-a is cheapest as shipped, then local-b, then
    // local-c. The first cluster lands in local-a and is reclaimed 4 s
    // after launch, without notice.
    let t = home.file(
        "refresh.yaml",
        &format!(
            "name: refresh\nresources:\n  infra: local\n  use_spot: true\n  cpus: 4\nenvs:\n  GW_TEST_MARKER: {}\nconfig:\n  local:\n    preemptions:\n      - {{after_s: 4}}\nrun: sleep 300\n",
            home.marker
        ),
    );
    let (code, _, err) = parts(&home.run(["jobs", "launch", &t, "-d"]));
    assert_eq!(code, 0, "{err}");
    let first = wait_for("the first run", DEADLINE, || {
        let j = managed(&home, 1);
        if j["state"] == "RUNNING" {
            Ok(j)
        } else {
            Err(j.to_string())
        }
    });
    assert!(
        first["placement"]
            .as_str()
            .unwrap()
            .starts_with("local/local/local-a "),
        "{first}"
    );
    // What `gangway catalog refresh` would save: local-c is now the
    // cheapest of the zones left.
    let text = std::fs::read_to_string(root().join("src/core/catalog/data/local.csv"))
        .unwrap()
        .replace(
            "local.cpu,,0,,4,8,local,local-c,0.01,0.0033,",
            "local.cpu,,0,,4,8,local,local-c,0.01,0.0011,",
        );
    assert!(
        text.contains("local-c,0.01,0.0011,"),
        "the shipped row moved"
    );
    std::fs::create_dir_all(home.path().join("catalog")).unwrap();
    std::fs::write(home.path().join("catalog/local.csv"), text).unwrap();
    let second = wait_for("the recovered run", DEADLINE, || {
        let j = managed(&home, 1);
        if j["state"] == "RUNNING" && j["restart_count"] == 1 {
            Ok(j)
        } else {
            Err(j.to_string())
        }
    });
    assert!(
        second["placement"]
            .as_str()
            .unwrap()
            .starts_with("local/local/local-c "),
        "the recovery skipped the refreshed cheapest zone: {second}"
    );
    assert!(
        (second["price_per_hour"].as_f64().unwrap() - 0.0011).abs() < 1e-9,
        "{second}"
    );
    let (code, _, err) = parts(&home.run(["jobs", "cancel", "1"]));
    assert_eq!(code, 0, "{err}");
    assert!(home.instance_records().is_empty());
}

/// The review's attack on the directory checkpoint sync: rank 0 makes
/// `$GANGWAY_CHECKPOINT_DIR/x` a link to a directory of this machine, rank
/// 1 writes `x/authorized_keys` with a future mtime; the controller merges
/// both nodes' directories into one. Nothing may land in the link's
/// target, and the job's events say what was left out.
#[test]
fn a_link_a_rank_plants_is_never_written_through_by_the_checkpoint_sync() {
    let home = TestHome::new();
    let victim = home.path().join("victim-ssh-dir");
    std::fs::create_dir_all(&victim).unwrap();
    let t = home.file(
        "plant.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\n  VICTIM: {}\n\
             checkpoint: {{sync_interval: 1}}\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR\"; mkdir -p \"$ck\"\n\
             \x20 if [ \"$GANGWAY_NODE_RANK\" = 0 ]; then ln -sfn \"$VICTIM\" \"$ck/x\"\n\
             \x20 else mkdir -p \"$ck/x\" && echo attacker > \"$ck/x/authorized_keys\" && touch -d '+1 day' \"$ck/x/authorized_keys\"; fi\n\
             \x20 while [ ! -f \"$ck/.gangway-synced\" ]; do sleep 0.1; done\n\
             \x20 echo synced\n",
            home.marker,
            victim.display()
        ),
    );
    let (code, out, err) = parts(&home.run(["jobs", "launch", &t, "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let planted: Vec<_> = std::fs::read_dir(&victim).unwrap().collect();
    assert!(
        planted.is_empty(),
        "the sync wrote through the link: {planted:?}"
    );
    let events = home.run(["jobs", "events", "1", "-o", "json"]);
    let ev = json_doc(&String::from_utf8_lossy(&events.stdout));
    let warned = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["state"] == "WARNING")
        .filter_map(|e| e["reason"].as_str())
        .find(|r| r.contains("rank 0") && r.contains("x: a link to") && r.contains("leaves"));
    assert!(warned.is_some(), "no warning in the events: {ev}");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}
