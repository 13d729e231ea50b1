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
