//! Managed jobs with the controller on another machine (`jobs.controller`):
//! a real sshd on loopback stands in for the controller host (its sessions
//! get a home of their own, so the host's `~/.gangway-controller` is not the
//! laptop's `$GANGWAY_HOME`), the jobs' clusters are the host's local cloud.
//! The laptop side is gone while the job is recovered; the host's
//! supervisor restarts a killed controller; a host with another binary is
//! upgraded, its old controller stopped first.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{
    assert_no_marker_procs, json_doc, parts, procs_with_env, wait_for, TestHome, DEADLINE,
};
use crate::jobs::{check_ledger, check_training, managed, spot_train, wait_ended, CloudWatch};
use crate::sshd::Sshd;

/// The controller host's `GANGWAY_HOME`.
pub(crate) fn host_home(sshd: &Sshd) -> PathBuf {
    sshd.home.join(".gangway-controller/home")
}

/// Points `home` at the sshd as its controller host.
pub(crate) fn use_host(home: &TestHome, sshd: &Sshd) {
    std::fs::write(
        home.path().join("config.yaml"),
        format!(
            "jobs:\n  controller:\n    host: {}\n    port: {}\n    user: {}\n    identity_file: {}\n",
            sshd.addrs[0],
            sshd.port,
            sshd.user,
            sshd.client_key.display()
        ),
    )
    .expect("config.yaml");
}

/// A controller host whose supervisor ends 3 s after its last job.
pub(crate) fn host() -> Option<Sshd> {
    let sshd = Sshd::start(1)?;
    sshd.session_profile("export GANGWAY_CONTROLLER_IDLE_SECONDS=3\n");
    Some(sshd)
}

/// Kills what runs with `GANGWAY_HOME=home` (the laptop's ssh master, a
/// follower; or the host's supervisor and controller).
pub(crate) fn kill_home(home: &Path) {
    for pid in procs_with_env(&format!("GANGWAY_HOME={}", home.display())) {
        // SAFETY: kill(2) of a process this test started (it carries the
        // test's own GANGWAY_HOME).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

/// Stops everything of the host's when the test ends, however it ends.
pub(crate) struct HostGuard(pub(crate) PathBuf);

impl Drop for HostGuard {
    fn drop(&mut self) {
        kill_home(&self.0);
    }
}

fn launch_detached(laptop: &TestHome, task: &str) -> String {
    let (code, out, err) = parts(&laptop.run([
        "jobs",
        "launch",
        task,
        "-y",
        "-d",
        "--env",
        &laptop.marker_env(),
    ]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    err
}

fn lock_holder(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn a_managed_job_survives_its_preemptions_with_the_laptop_gone() {
    let Some(sshd) = host() else { return };
    let _guard = HostGuard(host_home(&sshd));
    let laptop = TestHome::new();
    use_host(&laptop, &sshd);
    let task = spot_train(&laptop);
    let err = launch_detached(&laptop, &task);
    let address = format!("{}@{}:{}", sshd.user, sshd.addrs[0], sshd.port);
    assert!(
        err.contains("installing gangway") && err.contains(&address),
        "the first command puts this gangway on the host: {err}"
    );
    assert!(
        err.contains(&format!("submitted to the controller at {address}")),
        "{err}"
    );
    let watch = CloudWatch::start_at(&host_home(&sshd));
    {
        use std::os::unix::fs::PermissionsExt;
        let dir = sshd.home.join(".gangway-controller");
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is the host user's alone", dir.display());
    }

    // The laptop goes: every process of its home, then the home itself.
    kill_home(laptop.path());
    let marker = laptop.marker.clone();
    std::fs::remove_dir_all(laptop.path()).expect("remove the laptop's home");
    assert!(
        !laptop.path().exists(),
        "nothing of the job is left on the laptop"
    );

    // Another machine, told only where the controller is, sees the job.
    let other = TestHome::new();
    use_host(&other, &sshd);
    let job = wait_ended(&other, 1);
    let (most, ever) = watch.finish();
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(
        (job["preemptions"].as_u64(), job["restart_count"].as_u64()),
        (Some(3), Some(3)),
        "{job}"
    );
    check_training(&other, 1);
    // The job ends before its last cluster is down: its cost is final once
    // the ledger's last row is closed.
    wait_for("the job's last run closed in the ledger", DEADLINE, || {
        let (_, out, _) = parts(&other.run(["cost-report", "-o", "json"]));
        let r: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
        match r["managed_jobs"][0]["up"].as_bool() {
            Some(false) => Ok(()),
            _ => Err(out),
        }
    });
    let job = managed(&other, 1);
    check_ledger(&other, &job, 3);
    let (code, report, err) = parts(&other.run(["cost-report", "-o", "json"]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        json_doc(&report)["controller"]["host"],
        address.as_str(),
        "{report}"
    );
    // Never two clusters for the job; nothing left on the host.
    assert!(most <= 2, "{most} instances at once");
    assert_eq!(ever.len(), 8, "{ever:?}");
    let instances = host_home(&sshd).join("local/instances");
    assert_eq!(crate::common::dir_names(&instances), Vec::<String>::new());
    assert!(!host_home(&sshd)
        .join("jobs/managed-1/secrets.json")
        .exists());
    assert_no_marker_procs(&marker, "the managed job ended");
    // The supervisor ends once no job needs it (3 s here).
    let entry = format!("GANGWAY_HOME={}", host_home(&sshd).display());
    wait_for("the host's supervisor to end when idle", DEADLINE, || {
        let left = procs_with_env(&entry);
        if left.is_empty() {
            Ok(())
        } else {
            Err(crate::common::describe_procs(&left))
        }
    });
    let log = std::fs::read_to_string(host_home(&sshd).join("jobs/controller.log")).unwrap();
    assert!(
        log.contains("no managed job needs a controller; ending"),
        "{log}"
    );
    kill_home(other.path());
}

#[test]
fn the_hosts_supervisor_restarts_a_killed_controller_mid_recovery() {
    let Some(sshd) = host() else { return };
    let hh = host_home(&sshd);
    let _guard = HostGuard(hh.clone());
    let laptop = TestHome::new();
    use_host(&laptop, &sshd);
    let task = spot_train(&laptop);
    launch_detached(&laptop, &task);
    let watch = CloudWatch::start_at(&hh);
    let lock = hh.join("locks/controller.lock");
    // The first preemption: the controller is tearing down and relaunching.
    let first = wait_for("the first preemption", DEADLINE, || {
        let (_, out, _) = parts(&laptop.run(["jobs", "events", "1", "-o", "json"]));
        let ev: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let seen = ev["events"]
            .as_array()
            .is_some_and(|l| l.iter().any(|e| e["state"] == "PREEMPTED"));
        match (seen, lock_holder(&lock)) {
            (true, Some(pid)) => Ok(pid),
            _ => Err(out),
        }
    });
    // SAFETY: kill(2) of the host's controller this test started.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    let second = wait_for("a new controller", DEADLINE, || match lock_holder(&lock) {
        Some(pid) if pid != first && alive(pid) => Ok(pid),
        other => Err(format!("{other:?}")),
    });
    assert_ne!(first, second);
    let job = wait_ended(&laptop, 1);
    let (most, _) = watch.finish();
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    assert_eq!(job["preemptions"], 3, "{job}");
    assert!(
        most <= 2,
        "never two clusters for the job: {most} instances at once"
    );
    check_training(&laptop, 1);
    // The host's controller log, as the laptop reads it.
    let (code, log, err) = parts(&laptop.run(["jobs", "logs", "1", "--controller"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        log.contains("supervisor: the controller ended (signal: 9"),
        "{log}"
    );
    assert_eq!(
        crate::common::dir_names(&hh.join("local/instances")),
        Vec::<String>::new()
    );
    assert_no_marker_procs(&laptop.marker, "the managed job ended");
    kill_home(laptop.path());
}

#[test]
fn a_host_with_another_gangway_is_upgraded_and_its_old_controller_stopped() {
    let Some(sshd) = host() else { return };
    let hh = host_home(&sshd);
    let _guard = HostGuard(hh.clone());
    let laptop = TestHome::new();
    use_host(&laptop, &sshd);
    let task = laptop.file(
        "long.yaml",
        "resources:\n  infra: local\nrun: |\n  echo started\n  sleep 8\n  echo finished\n",
    );
    launch_detached(&laptop, &task);
    let running = wait_for("the job to run", DEADLINE, || {
        let j = managed(&laptop, 1);
        let pids = (
            lock_holder(&hh.join("locks/supervisor.lock")),
            lock_holder(&hh.join("locks/controller.lock")),
        );
        match (j["state"].as_str(), pids) {
            (Some("RUNNING"), (Some(s), Some(c))) if alive(s) && alive(c) => Ok((s, c)),
            _ => Err(j.to_string()),
        }
    });
    // The host's binary is now "another version".
    let stamp = sshd.home.join(".gangway-controller/bin/stamp");
    std::fs::write(&stamp, format!("{}\n", "0".repeat(64))).unwrap();
    let (code, out, err) = parts(&laptop.run(["jobs", "queue"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("installing gangway"), "{err}");
    assert!(
        out.contains("RUNNING") || out.contains("SUCCEEDED") || out.contains("RECOVERING"),
        "{out}"
    );
    // The old supervisor and controller were stopped before the new one ran.
    assert!(
        !alive(running.0) && !alive(running.1),
        "{running:?} still alive"
    );
    let sha = |p: &Path| {
        let o = std::process::Command::new("sha256sum")
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)[..64].to_string()
    };
    let ours = sha(Path::new(env!("CARGO_BIN_EXE_gangway")));
    assert_eq!(std::fs::read_to_string(&stamp).unwrap().trim(), ours);
    assert_eq!(
        sha(&sshd.home.join(".gangway-controller/bin/gangway")),
        ours
    );
    // A new controller picks the job up where the old one left it.
    let job = wait_ended(&laptop, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    let (_, logs, _) = parts(&laptop.run(["jobs", "logs", "1"]));
    assert!(logs.contains("finished"), "{logs}");
    kill_home(laptop.path());
}

#[test]
fn an_unreachable_controller_host_is_a_clear_error_and_decides_nothing() {
    let home = TestHome::new();
    // Nothing listens on port 9 of this loopback address.
    std::fs::write(
        home.path().join("config.yaml"),
        "jobs:\n  controller: ops@127.0.0.1:9\n",
    )
    .unwrap();
    let (code, out, err) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    assert_eq!(code, 7, "{out}\n{err}");
    assert!(out.is_empty(), "no job state is guessed here: {out}");
    assert!(
        err.contains("cannot reach the managed-job controller at ops@127.0.0.1:9")
            && err.contains("Connection refused")
            && err.contains("ssh -p 9 ops@127.0.0.1"),
        "{err}"
    );
}

/// With no jobs.bucket, a hosted job's workdir and local file mounts go to
/// the host with the job and are kept there for its runs: the laptop's
/// copies can go right after the submission; the job's end deletes the
/// host's.
#[test]
fn a_hosted_jobs_local_files_go_to_the_host_when_there_is_no_bucket() {
    let Some(sshd) = host() else { return };
    let _guard = HostGuard(host_home(&sshd));
    let laptop = TestHome::new();
    use_host(&laptop, &sshd);
    let wd = laptop.path().join("wd");
    std::fs::create_dir_all(wd.join("sub")).unwrap();
    std::fs::write(wd.join("sub/data.txt"), "from-the-workdir").unwrap();
    let one = laptop.file("one.txt", "from-a-file-mount");
    let task = laptop.file(
        "files.yaml",
        &format!(
            "resources:\n  infra: local\nworkdir: {}\nfile_mounts:\n  ~/mounted.txt: {one}\n\
             run: echo \"saw $(cat sub/data.txt) and $(cat ~/mounted.txt)\"\n",
            wd.display()
        ),
    );
    let err = launch_detached(&laptop, &task);
    assert!(
        err.contains("Sending the workdir and local file mounts"),
        "{err}"
    );
    // The laptop's files go: the host has its own.
    std::fs::remove_dir_all(&wd).unwrap();
    std::fs::remove_file(&one).unwrap();
    let job = wait_ended(&laptop, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    let (code, out, err) = parts(&laptop.run(["jobs", "logs", "1"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("saw from-the-workdir and from-a-file-mount"),
        "{out}"
    );
    let kept = host_home(&sshd).join("jobs-files");
    wait_for(
        "the host's copy of the job's files deleted",
        DEADLINE,
        || {
            let left = crate::common::dir_names(&kept);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
    kill_home(laptop.path());
}

#[test]
fn launch_follows_a_hosted_job_to_its_end_and_exits_with_its_code() {
    let Some(sshd) = host() else { return };
    let _guard = HostGuard(host_home(&sshd));
    let laptop = TestHome::new();
    use_host(&laptop, &sshd);
    let task = laptop.file(
        "fails.yaml",
        "resources:\n  infra: local\nsecrets:\n  TOKEN: s3cr3t-value\nrun: |\n  echo \"hello from the host, token ${#TOKEN} chars\"\n  exit 3\n",
    );
    let (code, out, err) =
        parts(&laptop.run(["jobs", "launch", &task, "-y", "--env", &laptop.marker_env()]));
    assert_eq!(code, 1, "the job failed: exit 1\n{out}\n{err}");
    assert!(out.contains("hello from the host, token 12 chars"), "{out}");
    assert!(err.contains("Managed job 1 FAILED"), "{err}");
    assert!(!out.contains("s3cr3t-value") && !err.contains("s3cr3t-value"));
    // The host's copy of the task has no secret value in it.
    let kept = std::fs::read_to_string(host_home(&sshd).join("jobs/managed-1/task.yaml")).unwrap();
    assert!(!kept.contains("s3cr3t-value"), "{kept}");
    assert!(!host_home(&sshd)
        .join("jobs/managed-1/secrets.json")
        .exists());
    kill_home(laptop.path());
}

/// A task's own `config.jobs.controller` sends that job to its host with
/// no `jobs.controller` in config.yaml; `jobs queue` asks the configured
/// controller only (here: this machine's, which has no job), so the job is
/// listed where the host is configured.
#[test]
fn a_tasks_own_controller_takes_its_job_and_queue_asks_the_configured_one() {
    let Some(sshd) = host() else { return };
    let _guard = HostGuard(host_home(&sshd));
    let laptop = TestHome::new();
    let task = laptop.file(
        "own.yaml",
        &format!(
            "resources:\n  infra: local\nconfig:\n  jobs:\n    controller:\n      host: {}\n      port: {}\n      user: {}\n      identity_file: {}\nrun: echo from-the-task\n",
            sshd.addrs[0],
            sshd.port,
            sshd.user,
            sshd.client_key.display()
        ),
    );
    let err = launch_detached(&laptop, &task);
    assert!(err.contains("submitted to the controller at"), "{err}");
    let (code, out, _) = parts(&laptop.run(["jobs", "queue", "-o", "json"]));
    assert_eq!(code, 0);
    assert_eq!(json_doc(&out)["jobs"], serde_json::json!([]), "{out}");
    let other = TestHome::new();
    use_host(&other, &sshd);
    let job = wait_ended(&other, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    kill_home(laptop.path());
    kill_home(other.path());
}

/// `jobs.controller: ssh/POOL`: the first host of that pool in
/// ssh_pools.yaml (address, port, user, key) is the controller host.
#[test]
fn an_ssh_pools_first_host_is_the_controller_host() {
    let Some(sshd) = host() else { return };
    let _guard = HostGuard(host_home(&sshd));
    let laptop = TestHome::new();
    std::fs::write(
        laptop.path().join("ssh_pools.yaml"),
        format!(
            "pools:\n  ctl:\n    defaults:\n      port: {}\n      user: {}\n      key: {}\n    hosts:\n      - {{address: {}, name: first}}\n      - {{address: 192.0.2.1, name: second}}\n",
            sshd.port,
            sshd.user,
            sshd.client_key.display(),
            sshd.addrs[0],
        ),
    )
    .unwrap();
    std::fs::write(
        laptop.path().join("config.yaml"),
        "jobs:\n  controller: ssh/ctl\n",
    )
    .unwrap();
    let task = laptop.file(
        "pool.yaml",
        "resources:\n  infra: local\nrun: echo on-the-pool-host\n",
    );
    let err = launch_detached(&laptop, &task);
    let address = format!("{}@{}:{}", sshd.user, sshd.addrs[0], sshd.port);
    assert!(
        err.contains(&format!("submitted to the controller at {address}")),
        "{err}"
    );
    let job = wait_ended(&laptop, 1);
    assert_eq!(job["state"], "SUCCEEDED", "{job}");
    // A pool that is not there is a clear error.
    std::fs::write(
        laptop.path().join("config.yaml"),
        "jobs:\n  controller: ssh/nope\n",
    )
    .unwrap();
    let (code, _, err) = parts(&laptop.run(["jobs", "queue"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("'ssh/nope' names no machine"), "{err}");
    kill_home(laptop.path());
}
