//! The shared loop, run by `sh` after a stub cloud part whose `check`
//! answers from a list and counts the times it was asked.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::*;
use crate::parse_notice;

/// A cloud part whose metadata service is `$STUB_ANSWERS`: the answer to
/// each ask in turn (0 notice, 1 none, 2 no service; the last one again
/// after the list), each ask a line in `$STUB_ASKS`, the notice naming the
/// ask that found it.
const STUB: Watcher = Watcher {
    name: "stub-watch",
    check: r#"#!/bin/sh
set -u
DEFAULT_POLL_S=0.01
UNREACHABLE="stub-watch: no metadata service at ${STUB_ANSWERS:-}"
check() {
    echo ask >>"$STUB_ASKS"
    n=$(($(wc -l <"$STUB_ASKS")))
    a=$(echo "$STUB_ANSWERS" | cut -d' ' -f"$n")
    [ -n "$a" ] || a=${STUB_ANSWERS##* }
    NOTICE="notice at ask $n"
    return "$a"
}
"#,
    endpoint_var: "STUB_ANSWERS",
    notice: "stub/notice",
};

/// Longer than any run here takes; a watcher still running then is one
/// that kept polling.
const BOUND: Duration = Duration::from_secs(20);

struct Run {
    dir: tempfile::TempDir,
}

impl Run {
    fn new() -> Run {
        Run {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// How many times `check` was asked.
    fn asks(&self) -> usize {
        std::fs::read_to_string(self.path("asks"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// `sh -c SCRIPT` as a probe or the core runs it, with the stub's
    /// files and `env`; stdout and stderr go to files of this run.
    fn sh(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(script)
            .arg(STUB.name)
            .args(args)
            .env_remove("GANGWAY_SPOT_POLL_S")
            .env_remove("GANGWAY_NOTICE_FILE")
            .env_remove("GANGWAY_NOTICE_PGID")
            .env("STUB_ASKS", self.path("asks"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(File::create(self.path("stdout")).unwrap())
            .stderr(File::create(self.path("stderr")).unwrap());
        c
    }

    /// Runs `c` to its end: the status, stdout and stderr; panics when it
    /// is still running after [`BOUND`].
    fn finish(&self, mut c: Command) -> (ExitStatus, String, String) {
        let mut child = c.spawn().expect("sh starts");
        let status = wait(&mut child, BOUND).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the watcher still runs after {BOUND:?}, asked {} times: it kept polling",
                self.asks()
            )
        });
        (status, self.read("stdout"), self.read("stderr"))
    }
}

fn wait(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// A process leading a group of its own, as a job's ranks do, reaped on
/// drop.
struct Job(Child);

impl Job {
    fn start() -> Job {
        let mut c = Command::new("sleep");
        c.arg("60").stdin(Stdio::null()).process_group(0);
        Job(c.spawn().expect("sleep starts"))
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn polling_reports_the_notice_it_finds_and_asks_no_more() {
    let run = Run::new();
    let mut job = Job::start();
    let pgid = job.0.id().to_string();
    let notice_file = run.path("notice");
    // None, no service (taken as passing after the first answer), none,
    // then the notice; a fifth ask would find another.
    let mut c = run.sh(&STUB.script(), &[], &[("STUB_ANSWERS", "1 2 1 0 0")]);
    c.env("GANGWAY_NOTICE_FILE", &notice_file)
        .env("GANGWAY_NOTICE_PGID", &pgid);
    let (status, out, err) = run.finish(c);
    assert!(status.success(), "{status:?}: {out}{err}");
    assert_eq!(out, "notice at ask 4\n", "{err}");
    assert_eq!(err, "");
    assert_eq!(
        std::fs::read_to_string(&notice_file).expect("the notice file"),
        "notice at ask 4\n"
    );
    assert!(!Path::new(&format!("{}.tmp", notice_file.display())).exists());
    let ended = wait(&mut job.0, BOUND).expect("the job's group got SIGTERM");
    assert_eq!(ended.signal(), Some(libc::SIGTERM), "{ended:?}");
    // It stopped asking at the notice.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(run.asks(), 4);
}

#[test]
fn polling_without_a_service_gives_up_at_the_first_answer() {
    let run = Run::new();
    let (status, out, err) = run.finish(run.sh(&STUB.script(), &[], &[("STUB_ANSWERS", "2 0")]));
    assert_eq!(status.code(), Some(2), "{out}{err}");
    assert_eq!(out, "");
    assert_eq!(err, "stub-watch: no metadata service at 2 0\n");
    assert_eq!(run.asks(), 1);
}

#[test]
fn once_asks_once_and_says_what_it_found_by_its_exit_code() {
    for (answers, code, said, stderr) in [
        ("0", 0, "notice at ask 1\n", ""),
        ("1 0", 1, "", ""),
        ("2 0", 2, "", "stub-watch: no metadata service at 2 0\n"),
    ] {
        let run = Run::new();
        let (status, out, err) =
            run.finish(run.sh(&STUB.script(), &["--once"], &[("STUB_ANSWERS", answers)]));
        assert_eq!(status.code(), Some(code), "{answers}: {out}{err}");
        assert_eq!((out.as_str(), err.as_str()), (said, stderr), "{answers}");
        assert_eq!(run.asks(), 1, "{answers}");
    }
}

fn node(facts: &[(&str, &str)]) -> NodeRow {
    NodeRow {
        rank: 0,
        instance_id: "i-0".into(),
        private_ip: "10.0.0.1".into(),
        public_ip: None,
        zone: "zone-a".into(),
        topology: String::new(),
        state: "running".into(),
        extra: facts
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    }
}

#[test]
fn the_probe_asks_spot_nodes_once_and_marks_the_notice() {
    assert_eq!(STUB.probe(&node(&[])), None);
    assert_eq!(STUB.probe(&node(&[("market", "on-demand")])), None);
    for (answers, notice) in [
        ("0", Some("stub/notice: notice at ask 1")),
        ("1", None),
        ("2", None),
    ] {
        let run = Run::new();
        let probe = STUB
            .probe(&node(&[("market", "spot"), ("env.STUB_ANSWERS", answers)]))
            .expect("a spot node is asked");
        assert!(probe.contains(&sh_quote(&STUB.script())), "{probe}");
        let (status, out, err) = run.finish(run.sh(&probe, &[], &[]));
        assert!(
            status.success(),
            "{answers}: a probe never fails: {out}{err}"
        );
        assert_eq!(parse_notice(&out).as_deref(), notice, "{answers}: {out}");
        assert_eq!(out.is_empty(), notice.is_none(), "{answers}: {out}");
        assert_eq!(run.asks(), 1, "{answers}");
    }
}
