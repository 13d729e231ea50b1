//! The managed-job controller on a cloud VM gangway provisions
//! (`jobs.controller: {cloud: aws, ...}`): the EC2 emulator's instance is a
//! real sshd (tests/it/aws_e2e.rs) whose sessions find the instance's
//! metadata service, so the hosted gangway gets its instance profile's
//! credentials through the SDK's default chain and stops its own instance
//! when idle. The jobs' clusters are the host's local cloud.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::aws::tagged_resources;
use crate::aws_e2e::{make_instance_profile, tag, Cloud, AMI, REGION};
use crate::common::{command_in, json_doc, parts, wait_for, Running, TestHome, DEADLINE};
use crate::hosted::kill_home;
use crate::jobs::spot_train;
use crate::ssh::{fingerprint, stranger_key};

/// The controller host's cluster for `region`.
fn host_cluster(region: &str) -> String {
    format!("gangway-controller-aws-{region}")
}

/// gangway in `home`, as the test's AWS account.
fn command(cloud: &Cloud, home: &Path, args: &[&str]) -> Command {
    let mut c = command_in(home);
    c.envs(cloud.emu.env_as(&cloud.scope))
        .env("USER", "e2e")
        .env("GANGWAY_AWS_SSH_CIDR", "127.0.0.0/8")
        .args(args);
    c
}

fn run(cloud: &Cloud, home: &Path, args: &[&str]) -> (i32, String, String) {
    parts(&Running::start(command(cloud, home, args)).wait())
}

/// Every instance of the controller host's cluster under `owner`, any
/// state but terminated: (id, state, the whole DescribeInstances answer).
fn host_instances(cloud: &Cloud, owner: &str) -> Vec<(String, String, String)> {
    let (status, xml) = cloud.emu.call(
        REGION,
        &[
            ("Action", "DescribeInstances"),
            ("Filter.1.Name", "tag:gangway-cluster"),
            ("Filter.1.Value.1", &host_cluster(REGION)),
            ("Filter.2.Name", "tag:gangway-owner"),
            ("Filter.2.Value.1", owner),
        ],
    );
    assert_eq!(status, 200, "{xml}");
    let mut ids: Vec<String> = xml
        .split("<instanceId>")
        .skip(1)
        .map(|c| c.split('<').next().unwrap_or_default().to_string())
        .collect();
    ids.dedup();
    ids.into_iter()
        .map(|id| {
            let (status, one) = cloud.emu.call(
                REGION,
                &[("Action", "DescribeInstances"), ("InstanceId.1", &id)],
            );
            assert_eq!(status, 200, "{one}");
            let state = tag(
                one.split("<instanceState>").nth(1).unwrap_or_default(),
                "name",
            );
            (id, state, one)
        })
        .filter(|(_, state, _)| state != "terminated")
        .collect()
}

/// The managed job `id` as the host lists it, from `home`.
fn job(cloud: &Cloud, home: &Path, id: i64) -> Result<Value, String> {
    let (code, out, err) = run(cloud, home, &["jobs", "queue", "-o", "json"]);
    if code != 0 {
        return Err(format!("exit {code}: {err}"));
    }
    let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    v["jobs"]
        .as_array()
        .and_then(|l| l.iter().find(|j| j["id"] == id).cloned())
        .ok_or_else(|| out.clone())
}

/// Closes this home's SSH master connections (`ssh -O exit`), as a VM's
/// stop would drop them.
fn close_masters(home: &Path) {
    for f in std::fs::read_dir(home.join("ssh/ctl"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = Command::new("ssh")
            .arg("-o")
            .arg(format!("ControlPath={}", f.path().display()))
            .args(["-O", "exit", "controller-host"])
            .output();
    }
}

/// Kills whatever of the host's runs (supervisor, controller) when the
/// test ends, however it ends.
struct HostGuard(PathBuf);

impl Drop for HostGuard {
    fn drop(&mut self) {
        kill_home(&self.0);
    }
}

/// An EC2 emulator account whose instances run on one sshd, their
/// sessions' AWS SDK reaching the emulator with no keys of the laptop's
/// (only the instance's metadata service's); the controller host's home on
/// it, and the guard that kills what runs there when the test ends.
fn aws_host() -> Option<(crate::sshd::Sshd, Cloud, PathBuf, HostGuard)> {
    let sshd = crate::aws_e2e::machines(1)?;
    let mut cloud = Cloud::new(&sshd)?;
    cloud.profile = format!(
        "export AWS_ENDPOINT_URL={e} AWS_ENDPOINT_URL_EC2={e} AWS_MAX_ATTEMPTS=1 \
         AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null\n",
        e = cloud.emu.endpoint
    );
    cloud.run_on(&sshd);
    let host_home = sshd.home.join(".gangway-controller/home");
    let guard = HostGuard(host_home.clone());
    Some((sshd, cloud, host_home, guard))
}

/// `jobs.controller: {cloud: aws}` end to end on the EC2 emulator: `jobs
/// launch` provisions one on-demand m6i.large (the cheapest type with 2
/// vCPUs and 4 GB) tagged with the owner, the user and the controller
/// mark, launched with the named instance profile; the job (three
/// preemptions on the host's local cloud) succeeds with the laptop's
/// gangway killed and its home deleted; a new home (given the owner id and
/// key, as the user's other machine would be) finds the same instance by
/// its tags and sees the job; the host's gangway stops its own instance
/// after the idle time, with the only credentials its sessions have: the
/// instance profile's, from the metadata service (no key variables, the
/// SDK's files /dev/null); the next `jobs queue` starts it and still lists
/// the job; `cost-report` shows its cost apart; an instance terminated
/// behind gangway's back is provisioned again with a note; a user's
/// launch may not take the reserved name; `down --all` refuses the host
/// (exit 2) while the job runs, and once it has ended removes it and
/// leaves nothing tagged.
#[test]
fn a_cloud_controller_host_is_provisioned_outlives_the_laptop_stops_when_idle_and_goes_with_down() {
    let Some((sshd, cloud, host_home, _guard)) = aws_host() else {
        return;
    };
    let m = cloud.home.marker.to_ascii_lowercase();
    let profile = format!("gw-{m}-ctl");
    let arn = make_instance_profile(cloud.emu, &profile);
    let config = format!(
        "jobs:\n  controller:\n    cloud: aws\n    region: {REGION}\n    remote_identity: {profile}\n\
         \x20   idle_minutes: 0.1\n    image_id: {AMI}\n    config: {{ssh_user: root, poll_ms: 50}}\n"
    );
    let laptop = cloud.home.path().to_path_buf();
    std::fs::write(laptop.join("config.yaml"), &config).unwrap();
    let task = spot_train(&cloud.home);
    let marker = cloud.home.marker_env();

    let started = std::time::Instant::now();
    let (code, out, err) = run(
        &cloud,
        &laptop,
        &["jobs", "launch", &task, "-y", "-d", "--env", &marker],
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains(&format!(
            "provisioning the managed-job controller host '{}'",
            host_cluster(REGION)
        )) && err.contains("installing gangway"),
        "{err}"
    );
    eprintln!("provisioned and submitted in {:?}", started.elapsed());
    // Its host key was pinned from its console output (cloud-init's
    // block) before the first connection, under its cluster's name (its
    // address changes at every start): nothing trusted on first use.
    assert_eq!(
        std::fs::read_to_string(laptop.join(format!("ssh/known_hosts_{}", host_cluster(REGION))))
            .unwrap(),
        format!("{} {}\n", host_cluster(REGION), key_of(&sshd)),
    );
    assert!(!err.contains("WARNING"), "{err}");
    let owner = std::fs::read_to_string(laptop.join("owner"))
        .unwrap()
        .trim()
        .to_string();
    let found = host_instances(&cloud, &owner);
    assert_eq!(found.len(), 1, "one instance: {found:?}");
    let (id, state, xml) = &found[0];
    assert_eq!(state, "running");
    assert_eq!(
        tag(xml, "instanceType"),
        "m6i.large",
        "the cheapest fitting CPU type"
    );
    assert!(!xml.contains("<instanceLifecycle>spot"), "on-demand: {xml}");
    assert!(
        xml.contains(&arn),
        "launched with the instance profile: {xml}"
    );
    for t in ["gangway-owner", "gangway-user", "gangway-controller"] {
        assert!(xml.contains(&format!("<key>{t}</key>")), "tag {t}: {xml}");
    }
    // `status` shows it as the controller.
    let (_, status, _) = run(&cloud, &laptop, &["status"]);
    assert!(status.contains("(jobs controller)"), "{status}");
    // Not torn down under a running job without --yes.
    let (code, out, err) = run(&cloud, &laptop, &["down", "--all"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains(
            "is the managed-job controller host, and 1 of its managed job(s) have not finished"
        ),
        "{err}"
    );
    assert_eq!(host_instances(&cloud, &owner)[0].1, "running");

    // The laptop goes: its processes, then its home. Its owner id and key
    // are what the user's other machine is given (as an ssh key is).
    let keep = tempfile::tempdir().unwrap();
    for f in [
        "owner",
        "ssh/id_ed25519",
        "ssh/id_ed25519.pub",
        "config.yaml",
    ] {
        let to = keep.path().join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(laptop.join(f), &to).unwrap();
    }
    kill_home(&laptop);
    std::fs::remove_dir_all(&laptop).unwrap();
    let other = TestHome::new();
    for f in [
        "owner",
        "ssh/id_ed25519",
        "ssh/id_ed25519.pub",
        "config.yaml",
    ] {
        let to = other.path().join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(keep.path().join(f), &to).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        other.path().join("ssh/id_ed25519"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let home = other.path().to_path_buf();
    let ended = wait_for(
        "the managed job to end, seen from a new home",
        DEADLINE * 3,
        || {
            let j = job(&cloud, &home, 1)?;
            match j["state"].as_str() {
                Some(
                    "SUCCEEDED" | "FAILED" | "FAILED_SETUP" | "FAILED_NO_RESOURCE" | "CANCELLED",
                ) => Ok(j),
                _ => Err(j.to_string()),
            }
        },
    );
    assert_eq!(ended["state"], "SUCCEEDED", "{ended}");
    assert_eq!(ended["preemptions"], 3, "{ended}");
    let again = host_instances(&cloud, &owner);
    assert_eq!(
        again.iter().map(|i| &i.0).collect::<Vec<_>>(),
        vec![id],
        "the new home found the same instance by its tags"
    );

    // Idle (6 s here): the host stops its own instance.
    let stopped_after = std::time::Instant::now();
    wait_for(
        "the host to stop itself when idle",
        DEADLINE,
        || match host_instances(&cloud, &owner).first() {
            Some((_, s, _)) if s == "stopped" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    eprintln!(
        "stopped {:?} after the job was seen ended",
        stopped_after.elapsed()
    );
    let log = std::fs::read_to_string(host_home.join("jobs/controller.log")).unwrap();
    assert!(
        log.contains("supervisor: this machine is stopping"),
        "{log}"
    );
    // A stopped VM drops its connections; the emulator's machine stays
    // up, so this machine's master is closed as the stop would.
    close_masters(&home);
    let (code, out, err) = run(&cloud, &home, &["jobs", "queue", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("is stopped (idle); starting it"), "{err}");
    assert_eq!(json_doc(&out)["jobs"][0]["state"], "SUCCEEDED", "{out}");
    assert_eq!(host_instances(&cloud, &owner)[0].1, "running");
    // Warm (the master connection open): no provider call, a local check.
    let mut took: Vec<std::time::Duration> = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            let (code, _, err) = run(&cloud, &home, &["jobs", "queue", "-o", "json"]);
            assert_eq!(code, 0, "{err}");
            t.elapsed()
        })
        .collect();
    took.sort();
    eprintln!(
        "warm jobs queue against the cloud host (debug build): median {:?}",
        took[2]
    );
    // The controller's cost is its own line.
    let (code, out, err) = run(&cloud, &home, &["cost-report", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let report = json_doc(&out);
    assert_eq!(
        report["controller"]["cluster"],
        host_cluster(REGION).as_str(),
        "{out}"
    );
    assert!(
        report["clusters"]
            .as_array()
            .is_some_and(|l| l.iter().all(|c| c["name"] != host_cluster(REGION).as_str())),
        "{out}"
    );

    // Terminated behind gangway's back: provisioned again, with a note.
    let (status, xml) = cloud.emu.call(
        REGION,
        &[("Action", "TerminateInstances"), ("InstanceId.1", id)],
    );
    assert_eq!(status, 200, "{xml}");
    close_masters(&home);
    let (code, out, err) = run(&cloud, &home, &["jobs", "queue", "-o", "json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        err.contains(
            "is gone (terminated outside gangway): its jobs, logs and ledger went with it"
        ),
        "{err}"
    );
    let now = host_instances(&cloud, &owner);
    assert!(
        now.len() == 1 && &now[0].0 != id && now[0].1 == "running",
        "a new instance: {now:?}"
    );
    // The reserved name is the controller's alone.
    let plain = other.file("plain.yaml", "resources:\n  infra: local\nrun: \"true\"\n");
    let (code, _, err) = run(
        &cloud,
        &home,
        &["launch", &plain, "-c", &host_cluster(REGION), "-y"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("are the managed-job controller host's"),
        "{err}"
    );

    let (code, out, err) = run(&cloud, &home, &["down", "--all", "-y"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        tagged_resources(cloud.emu, &host_cluster(REGION), &owner),
        Vec::<String>::new(),
        "nothing of the controller host is left"
    );
    kill_home(&home);
    crate::common::assert_no_marker_procs(&cloud.home.marker, "the job ended");
}

/// The sshd's host key as a known_hosts entry has it: `TYPE BASE64`.
fn key_of(sshd: &crate::sshd::Sshd) -> String {
    let line = sshd.host_keys().remove(0);
    line.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A machine that is not the one EC2 says it made answers at the
/// controller host's address: its key is not the one the instance's
/// console published, so gangway refuses it at once (exit 7) before the
/// host is given anything, naming both fingerprints and the command that
/// forgets the pinned key; once the console shows the machine's key (the
/// VM really rebuilt) and the user ran that command, the next command pins
/// the new key and goes on. (Main before this pinning trusted whatever key
/// answered at a new address.)
#[test]
fn a_controller_host_whose_key_is_not_the_one_its_cloud_published_is_refused() {
    let Some((sshd, cloud, _, _guard)) = aws_host() else {
        return;
    };
    let laptop = cloud.home.path().to_path_buf();
    // The console publishes another machine's key.
    let keys = tempfile::tempdir().unwrap();
    let other = stranger_key(keys.path());
    let other_key = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    cloud
        .emu
        .publish_host_keys(&cloud.scope, &[other_key.trim().to_string()]);
    let m = cloud.home.marker.to_ascii_lowercase();
    let profile = format!("gw-{m}-ctl");
    make_instance_profile(cloud.emu, &profile);
    std::fs::write(
        laptop.join("config.yaml"),
        format!(
            "jobs:\n  controller:\n    cloud: aws\n    region: {REGION}\n    remote_identity: {profile}\n\
             \x20   image_id: {AMI}\n    config: {{ssh_user: root, poll_ms: 50}}\n"
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let (code, out, err) = run(&cloud, &laptop, &["jobs", "queue"]);
    assert_eq!(code, 7, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(120),
        "refused at once, not waited on: {:?}",
        started.elapsed()
    );
    let known = laptop.join(format!("ssh/known_hosts_{}", host_cluster(REGION)));
    let forget = format!(
        "ssh-keygen -R {} -f {}",
        host_cluster(REGION),
        known.display()
    );
    for said in [
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
        &fingerprint(&other_key),
        &fingerprint(&sshd.host_keys()[0]),
        &forget,
    ] {
        assert!(err.contains(said), "{said} in:\n{err}");
    }
    // Nothing of gangway's reached the machine.
    assert!(!sshd.home.join(".gangway-controller/bin/gangway").exists());
    // The VM was really rebuilt: its console shows the new key; the
    // user forgets the old one as told.
    cloud.emu.publish_host_keys(&cloud.scope, &sshd.host_keys());
    let mut words = forget.split_whitespace();
    let ok = Command::new(words.next().unwrap())
        .args(words)
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    let (code, out, err) = run(&cloud, &laptop, &["jobs", "queue"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        std::fs::read_to_string(&known)
            .unwrap()
            .contains(&key_of(&sshd)),
        "the new key is pinned"
    );
    let (code, _, err) = run(&cloud, &laptop, &["down", "-y", &host_cluster(REGION)]);
    assert_eq!(code, 0, "{err}");
    kill_home(&laptop);
}

/// `jobs.controller: aws` without `remote_identity`: refused with exit 2,
/// naming what to create and where to name it; nothing is provisioned
/// (no cluster record, no AWS call made).
#[test]
fn a_cloud_controller_without_an_identity_is_refused_naming_what_to_create() {
    let home = TestHome::new();
    std::fs::write(
        home.path().join("config.yaml"),
        "jobs:\n  controller: aws\n",
    )
    .unwrap();
    let task = spot_train(&home);
    let (code, out, err) = parts(&home.run(["jobs", "launch", &task, "-y", "-d"]));
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("remote_identity")
            && err.contains("instance profile")
            && err.contains("docs/managed-jobs.md"),
        "{err}"
    );
    let (code, out, _) = parts(&home.run(["status", "-o", "json"]));
    assert_eq!(code, 0);
    assert_eq!(json_doc(&out)["clusters"], serde_json::json!([]), "{out}");
    // The same for every jobs command.
    let (code, _, err) = parts(&home.run(["jobs", "queue"]));
    assert_eq!(code, 2, "{err}");
}

/// `jobs.controller: {cloud: gcp}` on the GCE fake: the VM (of the
/// configured type: the fake has no e2-standard-4, the cheapest fitting
/// type in the catalog) is provisioned on-demand with the named service account (Storage and Compute scopes,
/// the controller label), a job submitted to it succeeds, the hosted
/// gangway stops its own VM after the idle time (its name, zone and project
/// from its metadata server; the fake takes the call without credentials),
/// and `down --all` leaves nothing in the fake.
#[test]
fn a_gcp_controller_host_runs_as_its_service_account_stops_when_idle_and_goes_with_down() {
    let Some((gce, sshd, home)) = crate::gcp::vms_with_sshd(1) else {
        return;
    };
    let host_home = sshd.home.join(".gangway-controller/home");
    let _guard = HostGuard(host_home.clone());
    let email = "gangway-ctl@gangway-test.iam.gserviceaccount.com";
    gce.call(
        "POST",
        "/_gangway/settings",
        &serde_json::json!({ "service_accounts": [email] }).to_string(),
    );
    std::fs::write(
        home.path().join("config.yaml"),
        format!(
            "jobs:\n  controller:\n    cloud: gcp\n    region: us-central1\n    remote_identity: {email}\n\
             \x20   instance_type: n2-standard-8\n\
             \x20   idle_minutes: 0.1\n    config: {{ssh_user: root}}\n"
        ),
    )
    .unwrap();
    let gcp = |args: &[&str]| {
        let mut c = command_in(home.path());
        c.args(args)
            .env("GANGWAY_GCP_ENDPOINT", &gce.url)
            .env("GOOGLE_CLOUD_PROJECT", "gangway-test")
            .env("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24");
        parts(&Running::start(c).wait())
    };
    // The host's API endpoint (the fake); the project comes from here.
    sshd.session_profile(&format!("export GANGWAY_GCP_ENDPOINT={}\n", gce.url));
    let (code, out, err) = gcp(&["jobs", "queue"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        err.contains(
            "provisioning the managed-job controller host 'gangway-controller-gcp-us-central1'"
        ),
        "{err}"
    );
    let vms = gce.named("instances", "gw-");
    assert_eq!(vms.len(), 1, "{vms:#?}");
    let vm = &vms[0];
    assert_ne!(vm["scheduling"]["provisioningModel"], "SPOT", "{vm:#}");
    assert_eq!(vm["serviceAccounts"][0]["email"], email, "{vm:#}");
    let scopes = vm["serviceAccounts"][0]["scopes"].to_string();
    assert!(
        scopes.contains("auth/compute") && scopes.contains("devstorage"),
        "{scopes}"
    );
    assert_eq!(vm["labels"]["gangway-controller"], "true", "{vm:#}");
    // Its host key was pinned from its guest attributes (the guest agent
    // publishes them; gangway's metadata turns them on).
    assert!(!err.contains("WARNING"), "{err}");
    assert_eq!(
        std::fs::read_to_string(
            home.path()
                .join("ssh/known_hosts_gangway-controller-gcp-us-central1")
        )
        .unwrap(),
        format!("gangway-controller-gcp-us-central1 {}\n", key_of(&sshd)),
    );
    // Its metadata server (the fake serves one per VM on request, once
    // the VM exists; a VM has it from boot): the host's supervisor,
    // started by the command above without it, starts again with it.
    let name = vm["name"].as_str().unwrap().to_string();
    let md = gce.call(
        "POST",
        "/_gangway/metadata-server",
        &serde_json::json!({ "instance": name }).to_string(),
    );
    let mdhost = md["host"].as_str().expect("metadata host").to_string();
    sshd.session_profile(&format!(
        "export GANGWAY_GCP_ENDPOINT={} GCE_METADATA_HOST={mdhost}\n",
        gce.url
    ));
    kill_home(&host_home);
    let task = home.file(
        "hello.yaml",
        "resources:\n  infra: local\nrun: echo hello\n",
    );
    let (code, out, err) = gcp(&["jobs", "launch", &task, "-y", "-d"]);
    assert_eq!(code, 0, "{out}\n{err}");
    wait_for("the job to succeed", DEADLINE, || {
        let (_, out, err) = gcp(&["jobs", "queue", "-o", "json"]);
        let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}{err}"))?;
        match v["jobs"][0]["state"].as_str() {
            Some("SUCCEEDED") => Ok(()),
            s => Err(format!("{s:?}")),
        }
    });
    wait_for("the VM to stop itself when idle", DEADLINE, || {
        let vms = gce.named("instances", "gw-");
        match vms.first().and_then(|v| v["status"].as_str()) {
            Some("TERMINATED" | "STOPPED") => Ok(()),
            s => Err(format!("{s:?}")),
        }
    });
    let log = std::fs::read_to_string(host_home.join("jobs/controller.log")).unwrap();
    assert!(
        log.contains("supervisor: this machine is stopping"),
        "{log}"
    );
    let (code, out, err) = gcp(&["down", "--all", "-y"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(crate::gcp::leftovers(&gce), Vec::<String>::new());
}
