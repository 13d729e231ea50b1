//! A managed gang that loses some of its nodes keeps the others
//! (`job_recovery.strategy: REPLACE_LOST_NODES`, the default), on the
//! local cloud: one node of four reclaimed without notice, then with
//! notice; a strategy that asks for the whole gang, and a loss of most of
//! the gang, recover it whole.

use serde_json::Value;

use std::time::Duration;

use crate::common::{json_doc, parts, wait_for, TestHome};
use crate::jobs::{managed, wait_ended, CloudWatch};

/// A 4-node spot trainer on the local cloud whose first launch loses
/// `lost` of its nodes `after_s` into the run (with `notice_s` of notice),
/// with a setup that says where it ran, under recovery `strategy`.
fn gang_task(home: &TestHome, strategy: Option<&str>, lost: u32, notice_s: Option<u32>) -> String {
    let recovery = strategy
        .map(|s| format!("  job_recovery:\n    strategy: {s}\n"))
        .unwrap_or_default();
    let notice = notice_s
        .map(|n| format!(", notice_s: {n}"))
        .unwrap_or_default();
    let text =
        std::fs::read_to_string(crate::common::root().join("examples/spot-train.yaml")).unwrap();
    // The example's trainer (its `run`), on a gang of four.
    let run = &text[text.find("run: |").unwrap()..];
    home.file(
        "gang.yaml",
        &format!(
            "name: gang\nnum_nodes: 4\nresources:\n  infra: local\n  accelerators: A100:1\n  \
             use_spot: true\n{recovery}envs:\n  TOTAL_STEPS: 60\n  CKPT_EVERY: 5\n  \
             STEP_SECONDS: 0.1\n  GW_TEST_MARKER: {marker}\ncheckpoint:\n  sync_interval: 1\n  \
             signal: SIGTERM\n  grace_period: 10\nconfig:\n  local:\n    preempt_nodes: {lost}\n    \
             preemptions:\n      - {{after_s: 3{notice}}}\nsetup: |\n  echo \"setup ran on rank \
             $GANGWAY_NODE_RANK\"\n{run}",
            marker = home.marker
        ),
    )
}

/// Launches the gang as managed job 1 and waits for it: (job, instances
/// ever seen, the job's log, its events).
fn run_gang(home: &TestHome, task: &str) -> (Value, usize, String, Vec<Value>) {
    let watch = CloudWatch::start_at(home.path());
    let (code, out, err) =
        parts(&home.run(["jobs", "launch", task, "-y", "--env", &home.marker_env()]));
    let (_, ever) = watch.finish();
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let job = managed(home, 1);
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    let (_, events, _) = parts(&home.run(["jobs", "events", "1", "-o", "json"]));
    let events = json_doc(&events)["events"].as_array().unwrap().clone();
    assert!(home.instance_records().is_empty(), "nothing left running");
    (job, ever.len(), log, events)
}

/// The last run counted to exactly 60 and resumed no further back than
/// the last kept checkpoint.
fn finished_exactly(log: &str) {
    assert!(log.contains("done at step 60"), "{log}");
    let resumed: Vec<u32> = log
        .lines()
        .filter(|l| l.starts_with("(rank 0, ") && l.contains(": resuming at step "))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(resumed.len(), 2, "one run and one recovery:\n{log}");
    assert_eq!(resumed[0], 0, "{log}");
}

/// Managed job 1's entry in `cost-report -o json` once its last ledger
/// row closed (the cluster's teardown), with its text report.
fn cost_report(home: &TestHome) -> (Value, String) {
    wait_for(
        "the ledger's last row to close",
        Duration::from_secs(60),
        || {
            let out = parts(&home.run(["cost-report", "-o", "json"])).1;
            match json_doc(&out)["managed_jobs"][0]["up"].as_bool() {
                Some(false) => Ok(()),
                _ => Err(out),
            }
        },
    );
    let (code, out, err) = parts(&home.run(["cost-report", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    let report = json_doc(&out);
    let j = report["managed_jobs"][0].clone();
    assert_eq!(j["id"], 1, "{report}");
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    assert!(
        close(
            report["total"].as_f64().unwrap(),
            j["cost"].as_f64().unwrap()
        ),
        "{report}"
    );
    let (code, text, err) = parts(&home.run(["cost-report"]));
    assert_eq!(code, 0, "{err}");
    (j, text)
}

/// The job's ledger rows, closed and one after another (no stretch
/// counted twice), every one on 4 nodes unless 3 survivors waited alone;
/// their sum is the job's cost. With `abut`, a waiting stretch touches
/// the rows on both sides (the replacement came up: nothing left out
/// between the gang's first node up and its last down). Returns them.
fn rows_in_order(j: &Value, abut: bool) -> Vec<Value> {
    let rows = j["rows"].as_array().unwrap().clone();
    let mut sum = 0.0;
    for (i, r) in rows.iter().enumerate() {
        let (start, end) = (
            r["started_at"].as_i64().unwrap(),
            r["ended_at"].as_i64().expect("every row closed"),
        );
        assert!(end >= start, "{r}");
        let nodes = if r["phase"] == "run" { 4 } else { 3 };
        assert_eq!(r["num_nodes"], nodes, "{r}");
        if let Some(next) = rows.get(i + 1) {
            // A whole-gang recovery leaves a gap (teardown, relaunch);
            // a replacement none.
            let next_start = next["started_at"].as_i64().unwrap();
            assert!(next_start >= end, "overlap: {rows:#?}");
            if abut && (next["phase"] == "survivors-waiting" || r["phase"] == "survivors-waiting") {
                assert_eq!(next_start, end, "a replacement's rows abut: {rows:#?}");
            }
        }
        sum += r["price_per_hour"].as_f64().unwrap() * (end - start) as f64 / 3_600_000.0;
    }
    let cost = j["cost"].as_f64().unwrap();
    assert!(sum > 0.0 && (cost - sum).abs() <= 1e-9 * sum, "{j}");
    rows
}

fn setups(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("setup ran on rank"))
        .count()
}

fn reasons(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("{} {}", e["state"], e["reason"]))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_gang_that_loses_one_node_without_notice_keeps_the_other_three() {
    let home = TestHome::new();
    let task = gang_task(&home, None, 1, None);
    let (job, ever, log, events) = run_gang(&home, &task);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(job["preemptions"], 1, "{job}");
    assert_eq!(job["nodes_replaced"], 1, "{job}");
    finished_exactly(&log);
    // Four nodes, then one more: the survivors were kept.
    assert_eq!(ever, 5, "instances ever: {ever}\n{}", reasons(&events));
    // Setup ran on the four, then on the replacement only.
    assert_eq!(setups(&log), 5, "{log}");
    assert_eq!(
        log.matches("setup kept on rank").count(),
        3,
        "the survivors' setup is kept:\n{log}"
    );
    let story = reasons(&events);
    assert!(story.contains("replaced rank"), "{story}");
    assert!(story.contains("3 survivor(s) kept"), "{story}");
    assert!(story.contains("survivor(s) waited"), "{story}");
    assert!(!story.contains("whole-gang recovery"), "{story}");
    // The ledger: four nodes, the three survivors alone while the lost
    // one was replaced, four again; back to back.
    let (j, text) = cost_report(&home);
    let rows = rows_in_order(&j, true);
    let phases: Vec<&str> = rows.iter().map(|r| r["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["run", "survivors-waiting", "run"], "{j}");
    // From the gang's launch for this job to its teardown after the end.
    let first = rows[0]["started_at"].as_i64().unwrap();
    let last = rows[2]["ended_at"].as_i64().unwrap();
    assert!(first >= job["submitted_at"].as_i64().unwrap(), "{j}\n{job}");
    assert!(last >= job["ended_at"].as_i64().unwrap(), "{j}\n{job}");
    let wait = &rows[1];
    assert_eq!(wait["num_nodes"], 3, "{wait}");
    let per_node = rows[0]["price_per_hour"].as_f64().unwrap() / 4.0;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-9);
    assert!(
        close(wait["price_per_hour"].as_f64().unwrap(), 3.0 * per_node),
        "{wait}"
    );
    let kept: Vec<u64> = wait["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .collect();
    assert_eq!(kept.len(), 3, "{wait}");
    let lost = (0..4).find(|r| !kept.contains(r)).unwrap();
    assert!(
        story.contains(&format!("replaced rank {lost} ")),
        "rank {lost}: {story}"
    );
    // cost-report: the replacement, the survivors' wait and its cost,
    // and the estimate against a whole-gang recovery, from these rows.
    let r = &j["replacements"];
    assert_eq!(r["nodes_replaced"], 1, "{r}");
    assert_eq!(r["count"], 1, "{r}");
    let waited_ms = wait["ended_at"].as_i64().unwrap() - wait["started_at"].as_i64().unwrap();
    assert!(waited_ms > 0, "{wait}");
    let waited_s = r["survivors_waiting_s"].as_f64().unwrap();
    assert!(close(waited_s, waited_ms as f64 / 1000.0), "{r}");
    assert!(close(
        r["survivors_waiting_node_hours"].as_f64().unwrap(),
        3.0 * waited_ms as f64 / 3_600_000.0
    ));
    let usd = r["survivors_waiting_usd"].as_f64().unwrap();
    assert!(
        usd > 0.0 && close(usd, 3.0 * per_node * waited_ms as f64 / 3_600_000.0),
        "{r}"
    );
    let s = &r["stretches"][0];
    assert_eq!(s["replaced_ranks"], serde_json::json!([lost]), "{s}");
    assert_eq!(
        (&s["nodes"], &s["survivors"], &s["completed"]),
        (&4.into(), &3.into(), &true.into())
    );
    let (b, took) = (
        r["whole_gang_bring_up_s"]
            .as_f64()
            .expect("the first launch's bring-up"),
        s["bring_up_s"]
            .as_f64()
            .expect("the replacement's bring-up"),
    );
    assert!(b > 0.0 && took > waited_s - 1e-3, "{r}");
    let extra = r["whole_gang_extra_usd"].as_f64().expect("an estimate");
    assert!(
        close(extra, 4.0 * per_node * (b - took) / 3600.0),
        "{extra} {r}"
    );
    // The same in the text report and in `jobs queue -o json`.
    assert!(
        text.contains(&format!(
            "job 1 (gang): 1 node(s) replaced (rank {lost}) in 1 replacement(s); the survivors \
             waited {waited_s:.2} s alone"
        )),
        "{text}"
    );
    assert!(
        text.contains("a whole-gang recovery would have cost about $"),
        "{text}"
    );
    // Idle longer than alone: from the loss to the run going again, the
    // new node's setup included, as the events count it.
    let idle = r["survivors_idle_s"]
        .as_f64()
        .expect("the survivors' idle time");
    assert!(idle >= took && idle > 0.0, "{r}");
    assert!(close(
        r["survivors_idle_usd"].as_f64().unwrap(),
        3.0 * per_node * idle / 3600.0
    ));
    let said = story
        .lines()
        .find_map(|l| l.split_once(" survivor(s) waited ")?.1.split(" s ").next())
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{story}"));
    assert!(
        (said - idle).abs() < 1.0,
        "events: {said} s, cost-report: {idle} s"
    );
    assert!(
        close(job["survivors_waiting_s"].as_f64().unwrap(), waited_s),
        "{job}"
    );
    assert!(
        close(job["survivors_waiting_usd"].as_f64().unwrap(), usd),
        "{job}"
    );
    assert!(
        close(job["survivors_idle_s"].as_f64().unwrap(), idle),
        "{job}"
    );
}

#[test]
fn a_gang_told_of_one_nodes_preemption_replaces_it_and_loses_no_step() {
    let home = TestHome::new();
    let task = gang_task(&home, None, 1, Some(2));
    let (job, ever, log, events) = run_gang(&home, &task);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    finished_exactly(&log);
    assert_eq!(ever, 5, "instances ever: {ever}\n{}", reasons(&events));
    assert_eq!(setups(&log), 5, "{log}");
    let story = reasons(&events);
    assert!(story.contains("NOTICE"), "{story}");
    assert!(story.contains("work lost: none"), "{story}");
    // Told in time, the run resumed exactly where it checkpointed.
    let reached = log
        .lines()
        .filter(|l| l.starts_with("(rank 0, "))
        .find_map(|l| l.split_once("checkpointed at step ")?.1.split(' ').next())
        .map(|n| n.parse::<u32>().unwrap())
        .unwrap_or_else(|| panic!("no checkpoint on notice:\n{log}"));
    assert!(
        log.contains(&format!("resuming at step {reached}")),
        "{log}"
    );
    // The noticed node ran (and billed) until its removal: the gang's
    // row lasts until then, the survivors' alone from that instant.
    let (j, _) = cost_report(&home);
    let rows = rows_in_order(&j, true);
    let phases: Vec<&str> = rows.iter().map(|r| r["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["run", "survivors-waiting", "run"], "{j}");
    assert_eq!(j["replacements"]["stretches"][0]["completed"], true, "{j}");
}

#[test]
fn a_whole_gang_strategy_or_a_mostly_lost_gang_recovers_it_whole() {
    // SkyPilot's names keep their meaning: the whole gang is replaced.
    let home = TestHome::new();
    let task = gang_task(&home, Some("EAGER_NEXT_REGION"), 1, None);
    let (job, ever, log, _) = run_gang(&home, &task);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(job["nodes_replaced"], 0, "{job}");
    finished_exactly(&log);
    assert_eq!(ever, 8, "a new gang of four");
    assert_eq!(setups(&log), 8, "{log}");
    // Two runs of four nodes each in the ledger; no survivors waited.
    let (j, text) = cost_report(&home);
    let rows = rows_in_order(&j, true);
    assert_eq!(rows.len(), 2, "{j}");
    assert!(rows.iter().all(|r| r["phase"] == "run"), "{j}");
    let r = &j["replacements"];
    assert_eq!(
        (&r["count"], &r["nodes_replaced"]),
        (&0.into(), &0.into()),
        "{r}"
    );
    assert_eq!(r["survivors_waiting_usd"], 0.0, "{r}");
    assert!(r["whole_gang_extra_usd"].is_null(), "{r}");
    assert!(!text.contains("replaced"), "{text}");
    assert_eq!(job["survivors_waiting_s"], 0.0, "{job}");
    // Three of four lost at once: recovered whole, saying why.
    let home = TestHome::new();
    let task = gang_task(&home, None, 3, None);
    let (job, ever, log, events) = run_gang(&home, &task);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    finished_exactly(&log);
    assert_eq!(ever, 8);
    let story = reasons(&events);
    assert!(
        story.contains("whole-gang recovery: 3 of 4 nodes lost at once"),
        "{story}"
    );
}

#[test]
fn killing_the_controller_during_replacements_loses_nothing_and_doubles_nothing() {
    let home = TestHome::new();
    let task = gang_task(&home, None, 1, None);
    let watch = CloudWatch::start_at(home.path());
    let (code, _, err) =
        parts(&home.run(["jobs", "launch", &task, "-d", "--env", &home.marker_env()]));
    assert_eq!(code, 0, "{err}");
    let kills = crate::jobs::kill_controller_until_ended(&home, 0x2545_f491, 100, 400);
    let job = wait_ended(&home, 1);
    let (most, ever) = watch.finish();
    assert!(kills >= 5, "only {kills} kills landed");
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    assert!(log.contains("done at step 60"), "{log}");
    // Never two gangs, nor a fifth node beside four: the lost node goes
    // before its replacement comes.
    assert!(most <= 4, "{most} instances at once");
    assert!(ever.len() >= 5, "{ever:?}");
    wait_for("the last cluster to go", Duration::from_secs(60), || {
        if home.instance_records().is_empty() {
            Ok(())
        } else {
            Err(format!("{:?}", home.instance_records()))
        }
    });
    // The ledger after the kills: no stretch twice, each of the gang or
    // of its survivors, adding up to the job's cost.
    let (j, _) = cost_report(&home);
    let rows = rows_in_order(&j, false);
    let waits = rows
        .iter()
        .filter(|r| r["phase"] == "survivors-waiting")
        .count();
    assert_eq!(j["replacements"]["count"], waits, "{j}");
    crate::common::assert_no_marker_procs(&home.marker, "the managed job ended");
}

#[test]
fn a_replacement_the_zone_has_no_capacity_for_falls_back_to_the_whole_gang() {
    // The loss comes 8 s into a 15 s run; once the gang runs, the local
    // cloud's next launch (the replacement's) fails for want of capacity.
    let home = TestHome::new();
    let task = gang_task(&home, None, 1, None);
    let text = std::fs::read_to_string(&task)
        .unwrap()
        .replace("TOTAL_STEPS: 60", "TOTAL_STEPS: 150")
        .replace("{after_s: 3}", "{after_s: 8}");
    std::fs::write(&task, text).unwrap();
    let watch = CloudWatch::start_at(home.path());
    let (code, _, err) =
        parts(&home.run(["jobs", "launch", &task, "-d", "--env", &home.marker_env()]));
    assert_eq!(code, 0, "{err}");
    wait_for("the gang to run", Duration::from_secs(60), || {
        let j = managed(&home, 1);
        if j["state"] == "RUNNING" {
            Ok(())
        } else {
            Err(format!("{j}"))
        }
    });
    std::fs::write(
        home.path().join("local/faults.json"),
        r#"{"launch": {"times": 1, "kind": "capacity", "message": "no A100 left in the zone (injected)"}}"#,
    )
    .unwrap();
    let job = wait_ended(&home, 1);
    let (_, ever) = watch.finish();
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(job["nodes_replaced"], 0, "{job}");
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    assert!(log.contains("done at step 150"), "{log}");
    let (_, events, _) = parts(&home.run(["jobs", "events", "1", "-o", "json"]));
    let story = reasons(json_doc(&events)["events"].as_array().unwrap());
    assert!(
        story.contains("whole-gang recovery: replacing rank(s) failed")
            && story.contains("no A100 left in the zone (injected)"),
        "the fallback says why:\n{story}"
    );
    // The refused replacement added nothing; the whole gang is four new
    // nodes, set up again.
    assert_eq!(ever.len(), 8, "instances ever: {ever:?}\n{story}");
    assert_eq!(setups(&log), 8, "{log}");
    wait_for("the last cluster to go", Duration::from_secs(60), || {
        if home.instance_records().is_empty() {
            Ok(())
        } else {
            Err(format!("{:?}", home.instance_records()))
        }
    });
    crate::common::assert_no_marker_procs(&home.marker, "the managed job ended");
}

#[test]
fn a_replacement_gives_the_workdir_to_the_new_node_only_and_survivors_keep_theirs() {
    let home = TestHome::new();
    let task = gang_task(&home, None, 1, None);
    // A workdir whose file each rank of the first run writes to: the
    // survivors keep what their run made of it; the new node gets it as
    // the user gave it.
    let dir = home.path().join("wd");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("data.txt"), "as given\n").unwrap();
    let text = std::fs::read_to_string(&task).unwrap().replacen(
        "run: |\n",
        &format!(
            "workdir: {}\nrun: |\n  [ \"$GANGWAY_RESTART_COUNT\" = 0 ] && echo 'run 0 wrote here' \
             >> data.txt\n  [ \"$GANGWAY_RESTART_COUNT\" = 1 ] && echo \"workdir of rank \
             $GANGWAY_NODE_RANK: $(tr '\\n' '|' < data.txt)\"\n",
            dir.display()
        ),
        1,
    );
    std::fs::write(&task, text).unwrap();
    let (job, ever, log, events) = run_gang(&home, &task);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(
        (job["nodes_replaced"].as_u64(), ever),
        (Some(1), 5),
        "{job}"
    );
    finished_exactly(&log);
    let story = reasons(&events);
    let lost: u32 = story
        .split("replaced rank ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("{story}"));
    for rank in 0..4 {
        let want = if rank == lost {
            "as given|"
        } else {
            "as given|run 0 wrote here|"
        };
        assert!(
            log.contains(&format!("workdir of rank {rank}: {want}\n")),
            "rank {rank} (lost {lost}):\n{log}"
        );
    }
    assert!(
        log.contains("3 survivor(s) reached beside the new nodes' setup"),
        "{log}"
    );
}

#[test]
fn a_node_lost_during_setup_is_replaced_and_setup_runs_again_on_every_node() {
    let home = TestHome::new();
    let task = gang_task(&home, None, 1, None);
    // The node is reclaimed 1 s after the launch, in the first setup's
    // 4 s: no survivor finished its setup, so none may skip it.
    let text = std::fs::read_to_string(&task)
        .unwrap()
        .replacen("after_s: 3", "after_s: 1", 1)
        .replacen("setup: |\n", "setup: |\n  sleep 4\n", 1);
    std::fs::write(&task, text).unwrap();
    let (job, ever, log, events) = run_gang(&home, &task);
    let story = reasons(&events);
    // Lost in setup, it is a preemption to recover, not a failed setup.
    assert_eq!(job["state"], "SUCCEEDED", "{job}\n{story}\n{log}");
    assert_eq!(
        (job["nodes_replaced"].as_u64(), ever),
        (Some(1), 5),
        "{story}"
    );
    assert!(log.contains("done at step 60"), "{log}");
    assert!(story.contains("setup runs again"), "{story}");
    assert_eq!(log.matches("setup on 4 node(s)").count(), 2, "{log}");
    assert!(!log.contains("setup kept on rank"), "{log}");
}

#[test]
fn a_survivor_that_fails_after_a_replacement_stops_the_new_nodes_setup() {
    let home = TestHome::new();
    let task = gang_task(&home, None, 1, None);
    // Run 0 turns every survivor-to-be's checkpoint directory into a file
    // (rank 0 keeps its own: it writes the checkpoints), so that after
    // the replacement no survivor but rank 0 can have its directory made
    // again; and it makes the replacement's setup take 60 s.
    let slow = home.path().join("slow");
    let text = std::fs::read_to_string(&task)
        .unwrap()
        .replacen(
            "setup: |\n",
            &format!("setup: |\n  [ -e {s} ] && sleep 60\n", s = slow.display()),
            1,
        )
        .replacen(
            "run: |\n",
            &format!(
                "run: |\n  if [ \"$GANGWAY_RESTART_COUNT\" = 0 ]; then touch {s}; \
                 [ \"$GANGWAY_NODE_RANK\" != 0 ] && rm -rf \"$GANGWAY_CHECKPOINT_DIR\" && \
                 echo x > \"$GANGWAY_CHECKPOINT_DIR\"; fi\n",
                s = slow.display()
            ),
            1,
        );
    std::fs::write(&task, text).unwrap();
    let (_, out, err) = parts(&home.run([
        "jobs",
        "launch",
        &task,
        "-y",
        "--wait",
        "--env",
        &home.marker_env(),
    ]));
    let job = managed(&home, 1);
    let (_, events, _) = parts(&home.run(["jobs", "events", "1", "-o", "json"]));
    let events = json_doc(&events)["events"].as_array().unwrap().clone();
    let story = reasons(&events);
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    assert_eq!(job["state"], "FAILED_SETUP", "{job}\n{story}\n{out}\n{err}");
    assert_eq!(job["nodes_replaced"], 1, "{story}");
    // The survivor's failure is the reason, not the setup it stopped.
    let detail = job["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("gangway_checkpoints"), "{detail}\n{log}");
    assert!(log.contains("stopping every rank"), "{log}");
    // The new node's 60 s setup was stopped, not waited for.
    let at = |state: &str| {
        events
            .iter()
            .rev()
            .find(|e| e["state"] == state)
            .and_then(|e| e["at"].as_i64())
            .unwrap_or_else(|| panic!("no {state}: {story}"))
    };
    let took = at("FAILED_SETUP") - at("STARTING");
    assert!(took < 20_000, "{took} ms after the replacement:\n{story}");
    assert!(home.instance_records().is_empty(), "nothing left running");
}
