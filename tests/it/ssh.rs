//! The SSH transport against a real sshd on loopback addresses.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use gangway::transport::ssh::SshTransport;
use gangway_provider::NodeRow;
use gangway_provider::{NodeCommand, Transport};

use crate::netns::{Link, NetnsKeys, NetnsNode};
use crate::sshd::Sshd;

fn nodes(sshd: &Sshd, n: usize) -> Vec<NodeRow> {
    (0..n)
        .map(|i| {
            let addr = &sshd.addrs[i % sshd.addrs.len()];
            let mut extra = BTreeMap::new();
            extra.insert("ssh.host".to_string(), addr.clone());
            extra.insert("ssh.port".to_string(), sshd.port.to_string());
            extra.insert("ssh.user".to_string(), sshd.user.clone());
            extra.insert("ssh.key".to_string(), sshd.client_key.display().to_string());
            extra.insert("env.NODE_FACT".to_string(), format!("fact-{i}"));
            NodeRow {
                rank: i as u32,
                instance_id: format!("ssh-{i}"),
                private_ip: addr.clone(),
                public_ip: None,
                zone: "pool".into(),
                topology: String::new(),
                state: "running".into(),
                extra,
            }
        })
        .collect()
}

fn run_all(
    t: &SshTransport,
    nodes: &[NodeRow],
    script: &str,
    env: &[(&str, &str)],
) -> Vec<(Option<i32>, String)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut waits = Vec::new();
        for n in nodes {
            let (mut r, w) = std::io::pipe().unwrap();
            let cmd = NodeCommand {
                script: script.to_string(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                cwd: "~".into(),
                task_view: true,
            };
            let child = t.spawn(n, &cmd, w).expect("spawn");
            let reader = std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            });
            waits.push((child, reader));
        }
        let mut out = Vec::new();
        for (child, reader) in waits {
            let status = child.wait().await.unwrap();
            out.push((status.code(), reader.join().unwrap()));
        }
        out
    })
}

fn connect(t: &SshTransport, nodes: &[NodeRow]) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(t.connect(nodes)).map_err(|e| e.to_string())
}

#[test]
fn commands_fan_out_over_one_master_per_node_with_env_and_exit_codes() {
    let Some(sshd) = Sshd::start(8) else { return };
    let home = tempfile::tempdir().unwrap();
    let t = SshTransport::new(home.path(), "c1", true).unwrap();
    let ns = nodes(&sshd, 64);
    connect(&t, &ns).unwrap();
    let got = run_all(
        &t,
        &ns,
        "echo \"$GREETING $NODE_FACT $(pwd)\"; [ \"$NODE_FACT\" = fact-7 ] && exit 7; true",
        &[("GREETING", "it's \"quoted\" $HOME")],
    );
    assert_eq!(got.len(), 64);
    for (i, (code, out)) in got.iter().enumerate() {
        let want_code = if i == 7 { 7 } else { 0 };
        assert_eq!(*code, Some(want_code), "node {i}: {out}");
        assert!(
            out.starts_with(&format!("it's \"quoted\" $HOME fact-{i} ")),
            "node {i}: {out:?}"
        );
    }
    // One master per distinct node, not per command.
    let sockets = std::fs::read_dir(home.path().join("ssh/ctl"))
        .unwrap()
        .count();
    assert!(sockets <= 8, "{sockets} control directories for 8 nodes");
}

#[test]
fn a_signal_stops_the_remote_process_group() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = tempfile::tempdir().unwrap();
    let t = SshTransport::new(home.path(), "c2", true).unwrap();
    let ns = nodes(&sshd, 1);
    connect(&t, &ns).unwrap();
    let marker = format!("gw-ssh-sig-{}", std::process::id());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_r, w) = std::io::pipe().unwrap();
        let cmd = NodeCommand {
            script: "sleep 300 & sleep 300; wait".into(),
            env: vec![("GW_TEST_MARKER".into(), marker.clone())],
            cwd: "~".into(),
            task_view: true,
        };
        let child = t.spawn(&ns[0], &cmd, w).unwrap();
        let pid = child.id();
        // Wait for the remote sleepers to exist (same machine: /proc).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while crate::common::procs_with_marker(&marker).len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "remote command never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        t.signal(&ns[0], pid, libc::SIGTERM);
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("the ssh session ends once the remote group is gone")
            .unwrap();
        assert!(!status.success());
    });
    crate::common::assert_no_marker_procs(&marker, "SIGTERM over ssh");
}

#[test]
fn files_go_up_and_come_back_newest_winning() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = tempfile::tempdir().unwrap();
    let t = SshTransport::new(home.path(), "c3", true).unwrap();
    let ns = nodes(&sshd, 1);
    connect(&t, &ns).unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("sub")).unwrap();
    std::fs::write(src.path().join("sub/a.txt"), "alpha").unwrap();
    let dest = format!("gw-ssh-test-{}", std::process::id());
    t.upload(&ns[0], src.path(), &format!("~/{dest}")).unwrap();
    let got = run_all(&t, &ns, &format!("cat ~/{dest}/sub/a.txt"), &[]);
    assert_eq!(got[0].1, "alpha");
    let (_, empty) = comes_back(&t, &ns[0], &dest, "");
    let mut gone = ns[0].clone();
    gone.extra.insert("ssh.host".into(), "127.0.0.1".into());
    assert!(t
        .download(&gone, &format!("~/{dest}"), empty.path())
        .is_err());
}

#[test]
fn a_changed_host_key_is_refused_naming_the_node() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = tempfile::tempdir().unwrap();
    let ns = nodes(&sshd, 1);
    // Someone else's key recorded for this host:port.
    let t = SshTransport::new(home.path(), "c4", false)
        .unwrap()
        .with_connect_timeout(Duration::from_secs(5));
    let (line, _) = forged_host_line(&sshd, home.path());
    std::fs::write(home.path().join("ssh/known_hosts/c4"), line).unwrap();
    let err = connect(&t, &ns).unwrap_err();
    assert!(
        err.contains("rank 0") && err.contains(&sshd.addrs[0]),
        "{err}"
    );
    assert!(err.contains("host key"), "{err}");
}

/// Pool machines outlive their clusters: the key a first cluster learnt
/// holds for every later one. A machine whose key changed between two
/// clusters was accepted as new by the second cluster's fresh known_hosts;
/// it is refused, naming both fingerprints and the file to fix.
#[test]
fn a_pool_machines_key_is_learnt_once_for_every_cluster() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = tempfile::tempdir().unwrap();
    let ns = nodes(&sshd, 1);
    let first = SshTransport::new(home.path(), "c1", true)
        .unwrap()
        .with_lasting_hosts()
        .with_connect_timeout(Duration::from_secs(5));
    connect(&first, &ns).unwrap();
    let lasting = home.path().join("ssh/known_hosts/_lasting-hosts");
    // (ssh may hash the names it records: asked as ssh would find it.)
    let found = std::process::Command::new("ssh-keygen")
        .args(["-F", &format!("[{}]:{}", sshd.addrs[0], sshd.port), "-f"])
        .arg(&lasting)
        .output()
        .unwrap();
    assert!(
        found.status.success(),
        "{}",
        std::fs::read_to_string(&lasting).unwrap()
    );
    // A later cluster on the same machine needs no new first contact.
    let strict = SshTransport::new(home.path(), "c2", false)
        .unwrap()
        .with_lasting_hosts()
        .with_connect_timeout(Duration::from_secs(5));
    connect(&strict, &ns).unwrap();
    // The machine's key changes (here: the record does, which ssh cannot
    // tell apart); a third cluster's first contact refuses it.
    let (line, public) = forged_host_line(&sshd, home.path());
    std::fs::write(&lasting, line).unwrap();
    let third = SshTransport::new(home.path(), "c3", true)
        .unwrap()
        .with_lasting_hosts()
        .with_connect_timeout(Duration::from_secs(5));
    let err = connect(&third, &ns).unwrap_err();
    assert!(err.contains("IDENTIFICATION HAS CHANGED"), "{err}");
    let recorded = fingerprint(&std::fs::read_to_string(&public).unwrap());
    assert!(
        err.contains(&format!(
            "not the key {recorded} recorded in {}:1",
            lasting.display()
        )),
        "{err}"
    );
    assert!(err.contains("with fingerprint SHA256:"), "{err}");
    assert!(err.contains("ssh-keygen -R"), "{err}");
}

/// A known_hosts line recording a stranger's key for the sshd's first
/// address, and that key's public half.
fn forged_host_line(sshd: &Sshd, dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let public = stranger_key(dir).with_extension("pub");
    let text = std::fs::read_to_string(&public).unwrap();
    let key: Vec<&str> = text.split_whitespace().take(2).collect();
    let line = format!("[{}]:{} {}\n", sshd.addrs[0], sshd.port, key.join(" "));
    (line, public)
}

/// A fresh ed25519 key pair no server knows; returns the private half.
pub(crate) fn stranger_key(dir: &std::path::Path) -> std::path::PathBuf {
    let key = dir.join("stranger");
    let ok = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(ok.success());
    key
}

/// `ssh-keygen -l`'s SHA256 fingerprint of an OpenSSH public key line.
pub(crate) fn fingerprint(line: &str) -> String {
    use std::io::Write as _;
    let mut c = std::process::Command::new("ssh-keygen")
        .args(["-l", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
    let out = String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap();
    out.split_whitespace()
        .find(|w| w.starts_with("SHA256:"))
        .unwrap_or_else(|| panic!("no fingerprint of {line}: {out}"))
        .to_string()
}

#[test]
fn a_refused_key_says_permission_denied_and_which_key_was_offered() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = tempfile::tempdir().unwrap();
    let key = stranger_key(home.path());
    let mut ns = nodes(&sshd, 1);
    ns[0]
        .extra
        .insert("ssh.key".into(), key.display().to_string());
    let t = SshTransport::new(home.path(), "denied", true)
        .unwrap()
        .with_connect_timeout(Duration::from_secs(5));
    let err = connect(&t, &ns).unwrap_err();
    assert!(err.contains("Permission denied"), "ssh's words: {err}");
    assert!(
        err.contains(&format!("{}.pub", key.display())) && err.contains("authorized_keys"),
        "the key hint: {err}"
    );
    assert!(
        !err.contains("zone") && !err.contains("failed to connect to the remote host"),
        "{err}"
    );
}

#[test]
fn a_port_nobody_listens_on_says_connection_refused() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = tempfile::tempdir().unwrap();
    let mut ns = nodes(&sshd, 1);
    let port = {
        let l = std::net::TcpListener::bind((sshd.addrs[0].as_str(), 0)).unwrap();
        l.local_addr().unwrap().port()
    };
    ns[0].extra.insert("ssh.port".into(), port.to_string());
    let t = SshTransport::new(home.path(), "refused", true)
        .unwrap()
        .with_connect_timeout(Duration::from_secs(2));
    let err = connect(&t, &ns).unwrap_err();
    assert!(err.contains("Connection refused"), "{err}");
    assert!(err.contains("not up yet"), "{err}");
}

#[test]
fn a_pool_launch_with_a_refused_key_gets_the_key_hint_not_the_capacity_one() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = pool_home(&sshd);
    let key = stranger_key(home.path());
    let inventory = home.path().join("ssh_pools.yaml");
    let text = std::fs::read_to_string(&inventory).unwrap().replace(
        &format!("key: {}", sshd.client_key.display()),
        &format!("key: {}", key.display()),
    );
    std::fs::write(&inventory, text).unwrap();
    let task = home.file(
        "one.yaml",
        "resources:\n  infra: ssh/lab\nrun: echo never\n",
    );
    let (code, out, err) = crate::common::parts(&home.run(["launch", &task, "-c", "denied", "-y"]));
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(err.contains(&format!("{}.pub", key.display())), "{err}");
    assert!(
        !err.contains("allow more zones"),
        "the capacity hint: {err}"
    );
}

/// `$GANGWAY_HOME/ssh_pools.yaml`: pool `lab` of `hosts` (inventory
/// lines) on `sshd`'s port, user and key.
fn write_pool(home: &crate::common::TestHome, sshd: &Sshd, hosts: &[String]) {
    std::fs::write(
        home.path().join("ssh_pools.yaml"),
        format!(
            "pools:\n  lab:\n    defaults:\n      port: {}\n      user: {}\n      key: {}\n    hosts:\n{}\n",
            sshd.port,
            sshd.user,
            sshd.client_key.display(),
            hosts.join("\n")
        ),
    )
    .unwrap();
}

fn pool_home(sshd: &Sshd) -> crate::common::TestHome {
    let home = crate::common::TestHome::new();
    let paths = ["s1/l1", "s1/l2", "s1/l1", "s1/l2"];
    let hosts: Vec<String> = sshd
        .addrs
        .iter()
        .zip(paths)
        .map(|(a, p)| format!("      - {{address: {a}, name: n-{a}, topology: {p}}}"))
        .collect();
    write_pool(&home, sshd, &hosts);
    home
}

#[test]
fn a_gang_runs_on_an_ssh_pool_ranked_by_topology_and_down_releases_it() {
    let Some(sshd) = Sshd::start(4) else { return };
    let home = pool_home(&sshd);
    let task = home.file(
        "pool.yaml",
        &format!(
            "num_nodes: 4\nresources:\n  infra: ssh/lab\nenvs:\n  GW_TEST_MARKER: {}\n\
             run: |\n  me=$(echo \"$GANGWAY_NODE_IPS\" | sed -n \"$((NODE_RANK + 1))p\")\n\
             \x20 echo \"rank $NODE_RANK of $NNODES at $me under $GANGWAY_NODE_TOPOLOGY gpus $GANGWAY_NUM_GPUS_PER_NODE head $MASTER_ADDR\"\n",
            home.marker
        ),
    );
    let (code, out, err) = crate::common::parts(&home.run(["launch", &task, "-c", "pool"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let mut seen = Vec::new();
    for r in 0..4 {
        let line = out
            .lines()
            .find(|l| l.contains(&format!(") rank {r} of 4 at ")))
            .unwrap_or_else(|| panic!("no rank {r}: {out}"));
        let path = line
            .split(" under ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        assert!(line.contains(" gpus 0 "), "no GPUs here: {line}");
        seen.push(path.to_string());
    }
    // Same leaf ⇒ neighbouring ranks.
    assert_eq!(seen, ["s1/l1", "s1/l1", "s1/l2", "s1/l2"], "{out}");
    let c = home.cluster("pool");
    assert_eq!(
        (c["cloud"].as_str(), c["region"].as_str()),
        (Some("ssh"), Some("lab")),
        "{c}"
    );

    // Every host is taken: another cluster finds no capacity.
    let one = home.file(
        "one.yaml",
        "resources:\n  infra: ssh/lab\nrun: echo never\n",
    );
    let (code, _, err) = crate::common::parts(&home.run(["launch", &one, "-c", "other"]));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("busy"), "{err}");

    // A failing rank over ssh stops the gang and is named.
    let (code, out, _) = crate::common::parts(&home.run([
        "exec",
        "pool",
        "if [ $NODE_RANK = 2 ]; then exit 5; fi; sleep 300",
    ]));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("rank 2") && out.contains("exited with code 5"),
        "{out}"
    );

    let (code, _, err) = crate::common::parts(&home.run(["down", "pool", "-y"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        crate::common::dir_names(&home.path().join("ssh_pools/alloc")).is_empty(),
        "hosts still allocated"
    );
    crate::common::assert_no_marker_procs(&home.marker, "down of an ssh pool cluster");
    // Released: the other cluster fits now.
    let (code, _, err) = crate::common::parts(&home.run(["launch", &one, "-c", "other", "--down"]));
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_node_that_stops_answering_is_detected_within_15_seconds() {
    let Some(keys) = NetnsKeys::new() else { return };
    let node = NetnsNode::start("gw-lone", Link::Host, &keys);
    let home = tempfile::tempdir().unwrap();
    let t = SshTransport::new(home.path(), "ns", true).unwrap();
    let rows = vec![node.row(0)];
    connect(&t, &rows).unwrap();
    let marker = format!("gw-netns-{}", std::process::id());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (status, waited) = rt.block_on(async {
        let (_r, w) = std::io::pipe().unwrap();
        let cmd = NodeCommand {
            script: "sleep 300".into(),
            env: vec![("GW_TEST_MARKER".into(), marker.clone())],
            cwd: "~".into(),
            task_view: true,
        };
        let child = t.spawn(&rows[0], &cmd, w).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while crate::common::procs_with_marker(&marker).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the remote command never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        node.cut();
        let cut_at = std::time::Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("a node that stopped answering was never noticed")
            .unwrap();
        (status, cut_at.elapsed())
    });
    // Keepalives every 3 s; OpenSSH gives up when the 4th is due (12 s).
    assert!(
        waited <= Duration::from_secs(15),
        "noticed after {waited:?}"
    );
    assert!(
        waited >= Duration::from_secs(9),
        "ended too soon ({waited:?}): not by keepalives"
    );
    let why = t
        .explain_exit(&status)
        .expect("a lost connection is explained");
    assert!(why.contains("connection was lost"), "{why}");
    eprintln!("the lost node was noticed after {waited:?}");
    // The remote command is still running in the namespace: kill it.
    for pid in crate::common::procs_with_marker(&marker) {
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

#[test]
fn setup_workdir_and_cancel_work_over_ssh_as_on_the_local_cloud() {
    let Some(sshd) = Sshd::start(4) else { return };
    let home = pool_home(&sshd);
    let wd = home.path().join("wd");
    std::fs::create_dir_all(&wd).unwrap();
    std::fs::write(wd.join("data.txt"), "synced-over-rsync\n").unwrap();
    // Setup fails on rank 1: the run never starts, the tail is shown.
    let bad = home.file(
        "bad.yaml",
        &format!(
            "num_nodes: 2\nworkdir: {}\nresources:\n  infra: ssh/lab\nenvs:\n  GW_TEST_MARKER: {}\n\
             setup: |\n  echo preparing-$SKYPILOT_SETUP_NODE_RANK\n  [ $SKYPILOT_SETUP_NODE_RANK = 1 ] && echo boom-over-ssh && exit 4\n  true\n\
             run: touch ~/run-started-{}\n",
            wd.display(),
            home.marker,
            home.marker
        ),
    );
    let (code, out, err) = crate::common::parts(&home.run(["launch", &bad, "-c", "ss"]));
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("rank 1") && out.contains("exited with code 4"),
        "{out}"
    );
    assert!(out.contains("boom-over-ssh"), "{out}");
    let q = home.jobs("ss");
    assert_eq!(q.last().unwrap()["status"], "FAILED_SETUP", "{q:?}");
    assert!(!sshd
        .home
        .join(format!("run-started-{}", home.marker))
        .exists());

    // The workdir reached the nodes; a detached job is then cancelled and
    // its remote processes are gone.
    let (code, out, err) =
        crate::common::parts(&home.run(["exec", "ss", "cat ~/sky_workdir/data.txt && pwd"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(out.matches("synced-over-rsync").count(), 2, "{out}");
    let (code, _, err) = crate::common::parts(&home.run([
        "exec",
        "ss",
        "-d",
        "--env",
        &home.marker_env(),
        "sleep 300",
    ]));
    assert_eq!(code, 0, "{err}");
    home.wait_job_status("ss", "RUNNING");
    wait_for_marker(&home.marker, 2);
    let (code, out, err) = crate::common::parts(&home.run(["cancel", "ss"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("CANCELLED"), "{out}");
    crate::common::assert_no_marker_procs(&home.marker, "cancel over ssh");
}

/// A directory of links to every program of this machine's usual `PATH`
/// directories but rsync: `PATH` for a machine without rsync.
fn path_without_rsync(dir: &std::path::Path) -> String {
    let bin = dir.join("bin-without-rsync");
    std::fs::create_dir_all(&bin).unwrap();
    for d in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        let Ok(entries) = std::fs::read_dir(d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let to = bin.join(&name);
            if name != "rsync" && !to.exists() {
                let _ = std::os::unix::fs::symlink(e.path(), to);
            }
        }
    }
    assert!(!bin.join("rsync").exists());
    bin.display().to_string()
}

/// A node without rsync (minimal images): files go up and come back as tar
/// streams over the node's connection, with rsync -a's modes and links, by
/// the same rules for what a node may send back.
#[test]
fn files_reach_a_node_without_rsync_as_tar_over_ssh() {
    let Some(sshd) = Sshd::start(1) else { return };
    let scratch = tempfile::tempdir().unwrap();
    sshd.session_profile(&format!(
        "export PATH={}\n",
        path_without_rsync(scratch.path())
    ));
    let home = tempfile::tempdir().unwrap();
    let t = SshTransport::new(home.path(), "c-tar", true).unwrap();
    let ns = nodes(&sshd, 1);
    connect(&t, &ns).unwrap();
    let (code, said) = run_all(&t, &ns, "command -v rsync || echo none", &[])
        .pop()
        .unwrap();
    assert_eq!(
        (code, said.trim()),
        (Some(0), "none"),
        "rsync is on the node"
    );
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("sub")).unwrap();
    std::fs::write(src.path().join("sub/a.txt"), "alpha").unwrap();
    std::fs::write(src.path().join("tool.sh"), "#!/bin/sh\necho tool-ran\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        src.path().join("tool.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("sub/a.txt", src.path().join("link")).unwrap();
    let dest = format!("gw-tar-test-{}", std::process::id());
    t.upload(&ns[0], src.path(), &format!("~/{dest}")).unwrap();
    let one = src.path().join("sub/a.txt");
    t.upload(&ns[0], &one, &format!("~/{dest}/renamed.txt"))
        .unwrap();
    let got = run_all(
        &t,
        &ns,
        &format!("cd ~/{dest} && cat sub/a.txt && ./tool.sh && readlink link && cat renamed.txt"),
        &[],
    );
    assert_eq!(got[0], (Some(0), "alphatool-ran\nsub/a.txt\nalpha".into()));
    // A link out of the tree on the node is not followed back here.
    let (skipped, _) = comes_back(
        &t,
        &ns[0],
        &dest,
        &format!("ln -s /etc/passwd ~/{dest}/sub/out"),
    );
    assert!(
        skipped.iter().any(|s| s.contains("sub/out")),
        "a link out of the tree came back: {skipped:?}"
    );
}

/// The node's `~/dest` (with a file written there, after `also` ran on
/// it) comes back newest-winning over a local file that stays; then a
/// directory that is not there (a rank that never checkpointed) copies
/// nothing and is no error. Returns what was left out, and that empty
/// directory.
fn comes_back(
    t: &SshTransport,
    node: &NodeRow,
    dest: &str,
    also: &str,
) -> (gangway_provider::Skipped, tempfile::TempDir) {
    let ns = std::slice::from_ref(node);
    t.write_file(node, &format!("~/{dest}/sub/b.txt"), b"beta")
        .unwrap();
    if !also.is_empty() {
        let _ = run_all(t, ns, also, &[]);
    }
    let back = tempfile::tempdir().unwrap();
    std::fs::write(back.path().join("keep.txt"), "local").unwrap();
    let skipped = t.download(node, &format!("~/{dest}"), back.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(back.path().join("sub/b.txt")).unwrap(),
        "beta"
    );
    assert_eq!(
        std::fs::read_to_string(back.path().join("keep.txt")).unwrap(),
        "local"
    );
    assert!(!back.path().join("sub/out").exists());
    let _ = run_all(t, ns, &format!("rm -rf ~/{dest}"), &[]);
    let empty = tempfile::tempdir().unwrap();
    t.download(node, &format!("~/{dest}"), empty.path())
        .expect("a missing directory is no error");
    assert!(crate::common::dir_names(empty.path()).is_empty());
    (skipped, empty)
}

/// A laptop without rsync launches on a pool all the same (the workdir as
/// a tar stream), and says so once.
#[test]
fn a_pool_launch_from_a_machine_without_rsync_sends_the_workdir_as_tar() {
    let Some(sshd) = Sshd::start(2) else { return };
    let home = pool_home(&sshd);
    let wd = home.path().join("wd");
    std::fs::create_dir_all(wd.join("sub")).unwrap();
    std::fs::write(wd.join("sub/data.txt"), "sent-as-tar\n").unwrap();
    let task = home.file(
        "t.yaml",
        &format!(
            "num_nodes: 2\nworkdir: {}\nresources:\n  infra: ssh/lab\n\
             run: echo \"rank-$NODE_RANK $(cat sub/data.txt)\"\n",
            wd.display(),
        ),
    );
    let mut c = crate::common::command_in(home.path());
    c.env("PATH", path_without_rsync(home.path()))
        .args(["launch", &task, "-c", "nr", "-y", "--down"]);
    let (code, out, err) = crate::common::parts(&crate::common::Running::start(c).wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank-{r} sent-as-tar")),
            "{out}\n{err}"
        );
    }
    let all = format!("{out}{err}");
    assert_eq!(
        all.matches("rsync is not installed on this machine")
            .count(),
        1,
        "said once: {all}"
    );
}

/// A TCP port that forwards its first connection to `to`, then hangs up on
/// every connection for `closed`, then forwards each again (a pool
/// machine whose sshd answered the pool's probe, then restarted).
fn late_port(to: std::net::SocketAddr, closed: Duration) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        // The first connection (the pool's probe when a launch takes the
        // host) goes through; the hang-ups start after it.
        let mut start: Option<std::time::Instant> = None;
        for c in l.incoming().flatten() {
            if start.is_some_and(|s| s.elapsed() < closed) {
                drop(c);
                continue;
            }
            start.get_or_insert_with(std::time::Instant::now);
            let Ok(up) = std::net::TcpStream::connect(to) else {
                continue;
            };
            let (mut a, mut b) = (c.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut a, &mut b);
                let _ = b.shutdown(std::net::Shutdown::Write);
            });
            let (mut c, mut up) = (c, up);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut up, &mut c);
                let _ = c.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    port
}

/// A first contact that takes a while says what it waits for: plain,
/// timestamped lines (not every second) naming the silent node and what
/// its connection last said.
#[test]
fn a_slow_first_contact_names_the_silent_node_and_its_last_error() {
    let Some(sshd) = Sshd::start(1) else { return };
    let to: std::net::SocketAddr = format!("{}:{}", sshd.addrs[0], sshd.port).parse().unwrap();
    let port = late_port(to, Duration::from_secs(5));
    let home = crate::common::TestHome::new();
    std::fs::write(
        home.path().join("ssh_pools.yaml"),
        format!(
            "pools:\n  lab:\n    defaults:\n      user: {}\n      key: {}\n    hosts:\n      - {{address: 127.0.0.1, port: {port}, name: late}}\n",
            sshd.user,
            sshd.client_key.display(),
        ),
    )
    .unwrap();
    let task = home.file(
        "t.yaml",
        "resources:\n  infra: ssh/lab\nrun: echo answered\n",
    );
    let (code, out, err) =
        crate::common::parts(&home.run(["launch", &task, "-c", "late", "-y", "--down"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("answered"), "{out}");
    let waits: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("reaching 1 node(s)"))
        .collect();
    assert!(!waits.is_empty(), "the wait was not told:\n{err}");
    // Calm: told at its 2nd second, then every 15 s at most (it took ~5 s).
    assert_eq!(waits.len(), 1, "{err}");
    let w = waits[0];
    assert!(
        w.starts_with('[') && w.as_bytes().get(9) == Some(&b']'),
        "not timestamped: {w}"
    );
    assert!(
        w.contains("0/1 answered SSH") && w.contains("still silent: rank 0 (127.0.0.1)"),
        "{w}"
    );
    let said = w.to_ascii_lowercase();
    assert!(
        said.contains("reset") || said.contains("closed"),
        "the node's last error is not named: {w}"
    );
}

fn wait_for_marker(marker: &str, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while crate::common::procs_with_marker(marker).len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "remote commands never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_killed_driver_leaves_no_ranks_running_on_pool_machines() {
    let Some(sshd) = Sshd::start(2) else { return };
    let home = pool_home(&sshd);
    let t = home.file(
        "idle.yaml",
        "num_nodes: 2\nresources:\n  infra: ssh/lab\nrun: \"true\"\n",
    );
    let (code, out, err) = crate::common::parts(&home.run(["launch", &t, "-c", "kd"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let (code, _, err) = crate::common::parts(&home.run([
        "exec",
        "kd",
        "-d",
        "--env",
        &home.marker_env(),
        "sleep 300",
    ]));
    assert_eq!(code, 0, "{err}");
    let job = home.wait_job_status("kd", "RUNNING");
    wait_for_marker(&home.marker, 2);
    let pid = job["driver_pid"].as_u64().expect("driver_pid") as u32;
    let ours = format!("GANGWAY_HOME={}", home.path().display());
    assert!(crate::common::procs_with_env(&ours).contains(&pid));
    // SAFETY: kill(2) on this test's own driver, checked above.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    // Whoever notices the dead driver next (here `queue`) stops its ranks
    // on the pool machines, over SSH.
    home.wait_job_status("kd", "FAILED_DRIVER");
    crate::common::assert_no_marker_procs(&home.marker, "the driver was killed");
    assert_eq!(crate::common::parts(&home.run(["down", "kd", "-y"])).0, 0);
}

fn env0(path: &std::path::Path) -> BTreeMap<String, String> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    raw.split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let e = String::from_utf8_lossy(e);
            e.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

#[test]
fn every_rank_over_ssh_gets_the_gang_environment_and_nothing_else() {
    let Some(sshd) = Sshd::start(3) else { return };
    let home = pool_home(&sshd);
    let wd = home.path().join("wd");
    std::fs::create_dir_all(&wd).unwrap();
    std::fs::write(wd.join("synced.txt"), "from the workdir\n").unwrap();
    // The pool's hosts share one home here (one sshd): files per rank.
    let t = home.file(
        "env.yaml",
        &format!(
            "num_nodes: 3\nworkdir: {}\nresources:\n  infra: ssh/lab\n\
             envs:\n  GW_TEST_MARKER: {}\n  MY_SETTING: forty-two\n\
             setup: env -0 > ~/env-setup-$SKYPILOT_SETUP_NODE_RANK\n\
             run: |\n  env -0 > ~/env-run-$NODE_RANK\n  pwd > ~/pwd-run-$NODE_RANK\n  \
             cat synced.txt > ~/synced-run-$NODE_RANK\n",
            wd.display(),
            home.marker
        ),
    );
    let o = crate::common::Running::start({
        let mut c = crate::common::command_in(home.path());
        c.args(["launch", &t, "-c", "envs"])
            .env("AWS_SECRET_ACCESS_KEY", "leak")
            .env("GW_UNRELATED_LAUNCHER_VAR", "leak");
        c
    })
    .wait();
    let (code, out, err) = crate::common::parts(&o);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let nodes = home.nodes("envs");
    assert_eq!(nodes.len(), 3);
    let ips: Vec<&str> = nodes.iter().map(|n| n.ip.as_str()).collect();
    let mut sorted = ips.clone();
    sorted.sort();
    let mut pool: Vec<&str> = sshd.addrs.iter().map(String::as_str).collect();
    pool.sort();
    assert_eq!(sorted, pool, "the gang is the pool's hosts");
    let job_id = home.last_job("envs")["id"].as_i64().unwrap();
    for r in 0..3usize {
        let env = env0(&sshd.home.join(format!("env-run-{r}")));
        let get = |k: &str| env.get(k).map(String::as_str);
        let rs = r.to_string();
        let ctx = format!("rank {r}: {env:#?}");
        for k in ["NODE_RANK", "GANGWAY_NODE_RANK", "SKYPILOT_NODE_RANK"] {
            assert_eq!(get(k), Some(rs.as_str()), "{k} of {ctx}");
        }
        for k in ["NNODES", "GANGWAY_NUM_NODES", "SKYPILOT_NUM_NODES"] {
            assert_eq!(get(k), Some("3"), "{k} of {ctx}");
        }
        for k in ["GANGWAY_NODE_IPS", "SKYPILOT_NODE_IPS"] {
            let got: Vec<&str> = get(k).unwrap_or("").lines().collect();
            assert_eq!(got, ips, "{k} of {ctx}");
        }
        assert_eq!(get("MASTER_ADDR"), Some(ips[0]), "{ctx}");
        assert_eq!(get("MASTER_PORT"), Some("29500"), "{ctx}");
        assert_eq!(get("GANGWAY_NUM_GPUS_PER_NODE"), Some("0"), "{ctx}");
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), None, "no GPUs here: {ctx}");
        assert_eq!(get("GANGWAY_CLUSTER"), Some("envs"), "{ctx}");
        assert_eq!(
            get("GANGWAY_JOB_ID"),
            Some(job_id.to_string().as_str()),
            "{ctx}"
        );
        assert_eq!(get("GANGWAY_RESTART_COUNT"), Some("0"), "{ctx}");
        assert_eq!(
            get("GANGWAY_CHECKPOINT_DIR"),
            Some(
                sshd.home
                    .join("gangway_checkpoints")
                    .display()
                    .to_string()
                    .as_str()
            ),
            "absolute on the node: {ctx}"
        );
        assert_eq!(get("MY_SETTING"), Some("forty-two"), "{ctx}");
        assert_eq!(get("GW_TEST_MARKER"), Some(home.marker.as_str()), "{ctx}");
        assert_eq!(
            get("HOME"),
            Some(sshd.home.display().to_string().as_str()),
            "{ctx}"
        );
        // The node's own ssh session, not the launcher's environment.
        assert!(get("SSH_CONNECTION").is_some(), "{ctx}");
        for k in [
            "AWS_SECRET_ACCESS_KEY",
            "GW_UNRELATED_LAUNCHER_VAR",
            "GANGWAY_HOME",
        ] {
            assert_eq!(get(k), None, "launcher env leaked: {k} in {ctx}");
        }
        assert!(
            !env.values().any(|v| v == "leak"),
            "launcher env leaked: {ctx}"
        );
        let pwd = std::fs::read_to_string(sshd.home.join(format!("pwd-run-{r}"))).unwrap();
        assert_eq!(
            pwd.trim(),
            sshd.home.join("sky_workdir").display().to_string()
        );
        assert_eq!(
            std::fs::read_to_string(sshd.home.join(format!("synced-run-{r}"))).unwrap(),
            "from the workdir\n"
        );
        let setup = env0(&sshd.home.join(format!("env-setup-{r}")));
        let sget = |k: &str| setup.get(k).map(String::as_str);
        let sctx = format!("setup of rank {r}: {setup:#?}");
        assert_eq!(sget("GANGWAY_SETUP_NODE_RANK"), Some(rs.as_str()), "{sctx}");
        for k in ["NODE_RANK", "MASTER_ADDR"] {
            assert_eq!(sget(k), None, "{k} in {sctx}");
        }
        assert_eq!(sget("MY_SETTING"), Some("forty-two"), "{sctx}");
        assert_eq!(sget("AWS_SECRET_ACCESS_KEY"), None, "{sctx}");
    }
    assert_eq!(crate::common::parts(&home.run(["down", "envs", "-y"])).0, 0);
}

#[test]
fn file_mounts_reach_every_node_over_ssh() {
    let Some(sshd) = Sshd::start(2) else { return };
    let home = pool_home(&sshd);
    let src = home.path().join("data");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/a.txt"), "alpha\n").unwrap();
    let one = home.path().join("one.txt");
    std::fs::write(&one, "just one\n").unwrap();
    // An absolute destination: on these "nodes" (this machine), a fresh
    // directory of the test's own.
    let abs = tempfile::tempdir().unwrap();
    let dest = abs.path().join("deep/one.txt");
    let t = home.file(
        "mounts.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: ssh/lab\nfile_mounts:\n  ~/mounted: {}\n  {}: {}\n\
             run: |\n  cat ~/mounted/sub/a.txt\n  cat {}\n",
            src.display(),
            dest.display(),
            one.display(),
            dest.display()
        ),
    );
    let (code, out, err) = crate::common::parts(&home.run(["launch", &t, "-c", "mounts"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for rank in 0..2 {
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("(rank {rank}, ")))
            .collect();
        assert!(lines.iter().any(|l| l.ends_with(" alpha")), "{out}");
        assert!(lines.iter().any(|l| l.ends_with(" just one")), "{out}");
    }
    assert_eq!(
        std::fs::read_to_string(sshd.home.join("mounted/sub/a.txt")).unwrap(),
        "alpha\n"
    );
    assert_eq!(
        crate::common::parts(&home.run(["down", "mounts", "-y"])).0,
        0
    );
}

#[test]
fn ctrl_c_once_stops_and_twice_kills_the_ranks_over_ssh() {
    let Some(sshd) = Sshd::start(2) else { return };
    let home = pool_home(&sshd);
    let task = |name: &str, run: &str| {
        home.file(
            name,
            &format!(
                "num_nodes: 2\nresources:\n  infra: ssh/lab\nenvs:\n  GW_TEST_MARKER: {}\nrun: |\n{run}",
                home.marker
            ),
        )
    };
    // Once: SIGTERM reaches the ranks on the pool hosts; the job is
    // CANCELLED and nothing is left there.
    let t = task("once.yaml", "  sleep 300\n");
    let mut launcher = home.spawn(["launch", &t, "-c", "cc"]);
    launcher.wait_for_stdout("all 2 rank(s) running", "the ranks to run");
    wait_for_marker(&home.marker, 2);
    launcher.signal(libc::SIGINT);
    let (code, out, err) = crate::common::parts(&launcher.wait());
    assert_eq!(code, 5, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(home.last_job("cc")["status"], "CANCELLED");
    crate::common::assert_no_marker_procs(&home.marker, "Ctrl-C over ssh");

    // Twice: ranks that ignore SIGTERM are killed.
    let t = task("twice.yaml", "  trap '' TERM\n  sleep 300\n");
    let mut launcher = home.spawn(["exec", "cc", &t]);
    launcher.wait_for_stdout("all 2 rank(s) running", "the ranks to run");
    wait_for_marker(&home.marker, 2);
    launcher.signal(libc::SIGINT);
    launcher.wait_for_stdout("stopping every rank", "the graceful stop to begin");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        crate::common::procs_with_marker(&home.marker).len() >= 2,
        "SIGTERM was ignored: the ranks must still be there"
    );
    launcher.signal(libc::SIGINT);
    let (code, out, err) = crate::common::parts(&launcher.wait());
    assert_eq!(code, 5, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("killing every rank"), "{out}");
    assert_eq!(home.last_job("cc")["status"], "CANCELLED");
    crate::common::assert_no_marker_procs(&home.marker, "the second Ctrl-C over ssh");
    assert_eq!(crate::common::parts(&home.run(["down", "cc", "-y"])).0, 0);
}

#[test]
fn a_managed_job_on_a_pool_restarts_from_its_kept_checkpoint() {
    let Some(sshd) = Sshd::start(2) else { return };
    let home = pool_home(&sshd);
    // Run 0 checkpoints step 7, waits until gangway kept it, loses its
    // disk and fails; run 1 must find step 7 restored onto the node. The
    // syncs are 4 s apart: the one after the loss, should it come before
    // the failure is seen, would keep the empty directory (a sync keeps
    // what the nodes have), and on a loaded machine 1 s apart it did.
    let t = home.file(
        "managed.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: ssh/lab\n  job_recovery:\n    max_restarts_on_errors: 1\n\
             checkpoint:\n  sync_interval: 4\nenvs:\n  GW_TEST_MARKER: {}\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  \
             if [ \"$GANGWAY_RESTART_COUNT\" = 0 ]; then\n    t=$(date +%s%3N)\n    \
             [ \"$NODE_RANK\" = 0 ] && echo 7 > \"$ck\"\n    \
             while [ \"$(cat \"$GANGWAY_CHECKPOINT_DIR/.gangway-synced\" 2>/dev/null || echo 0)\" -lt \"$t\" ]; do sleep 0.05; done\n    \
             sleep 0.5; rm -f \"$ck\"; exit 3\n  fi\n  \
             echo \"rank $NODE_RANK resumed at step $(cat \"$ck\") in run $GANGWAY_RESTART_COUNT\"\n",
            home.marker
        ),
    );
    let (code, out, err) = crate::common::parts(&home.run(["jobs", "launch", &t, "-y"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank {r} resumed at step 7 in run 1")),
            "{out}"
        );
    }
    let (_, q, _) = crate::common::parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["restarts_on_errors"], 1, "{j}");
    // The job's cluster is gone and the pool's hosts are free again.
    released_when_ended(&home);
}

/// A managed job's end released every host of its pool and left no
/// process of its own behind.
fn released_when_ended(home: &crate::common::TestHome) {
    crate::common::wait_for(
        "the pool's hosts to be released",
        Duration::from_secs(30),
        || {
            let left = crate::common::dir_names(&home.path().join("ssh_pools/alloc"));
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
    crate::common::assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// An ssh pool of namespaced nodes.
fn netns_pool(
    home: &crate::common::TestHome,
    keys: &NetnsKeys,
    hosts: &[(&NetnsNode, Option<&NetnsNode>)],
) {
    let lines: Vec<String> = hosts
        .iter()
        .map(|(n, jump)| {
            let jump = jump
                .map(|j| format!(", jump: root@{}", j.addr))
                .unwrap_or_default();
            format!(
                "      - {{address: {}, name: {}{jump}}}",
                n.addr, n.hostname
            )
        })
        .collect();
    std::fs::write(
        home.path().join("ssh_pools.yaml"),
        format!(
            "pools:\n  ns:\n    defaults:\n      port: 22\n      user: root\n      key: {}\n    hosts:\n{}\n",
            keys.client().display(),
            lines.join("\n")
        ),
    )
    .unwrap();
}

/// `count` namespaced nodes named `<prefix>-<i>`, all hosts of pool `ns`
/// in a fresh home; `None` (the suite said why) where namespaces cannot be
/// made.
fn namespaced_pool(
    prefix: &str,
    count: usize,
) -> Option<(NetnsKeys, Vec<NetnsNode>, crate::common::TestHome)> {
    let keys = NetnsKeys::new()?;
    let nodes: Vec<NetnsNode> = (0..count)
        .map(|i| NetnsNode::start(&format!("{prefix}-{i}"), Link::Host, &keys))
        .collect();
    let home = crate::common::TestHome::new();
    netns_pool(
        &home,
        &keys,
        &nodes.iter().map(|n| (n, None)).collect::<Vec<_>>(),
    );
    Some((keys, nodes, home))
}

#[test]
fn a_gang_on_namespaced_nodes_stops_when_one_stops_answering_and_names_it() {
    let Some((_keys, nodes, home)) = namespaced_pool("gw-node", 3) else {
        return;
    };
    let t = home.file(
        "gang.yaml",
        &format!(
            "num_nodes: 3\nresources:\n  infra: ssh/ns\nenvs:\n  GW_TEST_MARKER: {}\n\
             run: |\n  echo \"rank $NODE_RANK is $(hostname)\"\n  sleep 300\n",
            home.marker
        ),
    );
    let mut launcher = home.spawn(["launch", &t, "-c", "nsg"]);
    launcher.wait_for_stdout("all 3 rank(s) running", "the ranks to run");
    wait_for_marker(&home.marker, 3);
    for n in &nodes {
        launcher.wait_for_stdout(&format!(" is {}", n.hostname), "every node's own hostname");
    }
    let lost = &nodes[1];
    lost.cut();
    let cut_at = std::time::Instant::now();
    let (code, out, err) = crate::common::parts(&launcher.wait());
    let took = cut_at.elapsed();
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    // Named: its rank and address, and why.
    let line = out
        .lines()
        .find(|l| l.contains(&format!("({})", lost.addr)) && l.contains("connection was lost"))
        .unwrap_or_else(|| panic!("the lost node is not named:\n{out}"));
    assert!(line.contains("rank "), "{line}");
    // Keepalives notice in 12 s; then the others are stopped (SIGTERM).
    assert!(
        took < Duration::from_secs(30),
        "the gang stopped after {took:?}"
    );
    eprintln!("gang stopped {took:?} after the link was cut: {line}");
    // The others' ranks were stopped on their nodes; the lost one's rank is
    // out of reach (its node is gone, as far as anyone can tell).
    let left = crate::common::leftover_marker_procs(&home.marker);
    let elsewhere: Vec<u32> = left
        .iter()
        .copied()
        .filter(|p| !lost.inside(&[*p]).contains(p))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "ranks left on the nodes that still answer: {}",
        crate::common::describe_procs(&elsewhere)
    );
    lost.kill_all();
    assert_eq!(home.last_job("nsg")["status"], "FAILED");
}

/// A managed gang of 2 on a pool of 3 namespaced hosts: the link to rank
/// 1's host is cut after step 7 was kept. The host stops answering, so
/// the pool reports it lost; the gang keeps rank 0's host (and its setup)
/// and takes the third host for rank 1; both resume from step 7.
#[test]
fn a_managed_gang_on_a_pool_replaces_only_the_host_that_stopped_answering() {
    let Some((_keys, nodes, home)) = namespaced_pool("gw-rp", 3) else {
        return;
    };
    let t = home.file(
        "gang.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: ssh/ns\ncheckpoint:\n  sync_interval: 1\n\
             envs:\n  GW_TEST_MARKER: {}\n\
             setup: echo \"setup on $(hostname)\"\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  \
             echo \"rank $NODE_RANK on $(hostname) in run $GANGWAY_RESTART_COUNT\"\n  \
             if [ \"$GANGWAY_RESTART_COUNT\" = 0 ]; then\n    \
             if [ \"$NODE_RANK\" = 0 ]; then\n      t=$(date +%s%3N); echo 7 > \"$ck\"\n      \
             while [ \"$(cat \"$GANGWAY_CHECKPOINT_DIR/.gangway-synced\" 2>/dev/null || echo 0)\" -lt \"$t\" ]; do sleep 0.05; done\n      \
             echo \"step 7 kept\"\n    fi\n    sleep 300\n  fi\n  \
             echo \"rank $NODE_RANK resumed at step $(cat \"$ck\") in run $GANGWAY_RESTART_COUNT\"\n",
            home.marker
        ),
    );
    let mut launcher = home.spawn(["jobs", "launch", &t, "-y"]);
    launcher.wait_for_stdout("step 7 kept", "step 7 to be kept");
    let so_far = launcher.stdout_now();
    let host_of = |rank: u32, out: &str| -> String {
        let needle = format!("rank {rank} on ");
        let line = out
            .lines()
            .find(|l| l.contains(&needle) && l.ends_with(" in run 0"))
            .unwrap_or_else(|| panic!("no rank {rank} line:\n{out}"));
        let rest = &line[line.find(&needle).unwrap() + needle.len()..];
        rest.trim_end_matches(" in run 0").to_string()
    };
    let (h0, h1) = (host_of(0, &so_far), host_of(1, &so_far));
    let lost = nodes
        .iter()
        .find(|n| n.hostname == h1)
        .expect("rank 1's host");
    let spare = nodes
        .iter()
        .find(|n| n.hostname != h0 && n.hostname != h1)
        .expect("the spare host");
    lost.cut();
    let story = |home: &crate::common::TestHome| {
        let (_, ev, _) = crate::common::parts(&home.run(["jobs", "events", "1"]));
        let (_, log, _) = crate::common::parts(&home.run(["jobs", "logs", "1", "--controller"]));
        let (_, job, _) = crate::common::parts(&home.run(["jobs", "logs", "1", "--no-follow"]));
        let ps = std::process::Command::new("sh")
            .args([
                "-c",
                "ps -eo pid,ppid,etimes,args | grep -E 'gangway|ssh ' | grep -v grep",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        format!("events:\n{ev}\ncontroller:\n{log}\njob:\n{job}\nprocesses:\n{ps}")
    };
    crate::common::wait_for("the job to end", Duration::from_secs(150), || {
        let (_, q, _) = crate::common::parts(&home.run(["jobs", "queue", "-o", "json"]));
        let state = crate::common::json_doc(&q)["jobs"][0]["state"].clone();
        if state == "SUCCEEDED" || state == "FAILED" || state == "FAILED_CONTROLLER" {
            Ok(())
        } else {
            Err(format!("{state}\n{}", story(&home)))
        }
    });
    let (code, out, err) = crate::common::parts(&launcher.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}\n{}", story(&home));
    assert!(
        out.contains(&format!("rank 0 on {h0} in run 1")),
        "rank 0 kept its host:\n{out}"
    );
    assert!(
        out.contains(&format!("rank 1 on {} in run 1", spare.hostname)),
        "rank 1 moved to the spare host:\n{out}"
    );
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank {r} resumed at step 7 in run 1")),
            "{out}"
        );
    }
    // Setup ran once on each host that needed it: never again on rank 0's.
    assert_eq!(out.matches(&format!("setup on {h0}")).count(), 1, "{out}");
    assert_eq!(
        out.matches(&format!("setup on {}", spare.hostname)).count(),
        1,
        "{out}"
    );
    let (_, ev, _) = crate::common::parts(&home.run(["jobs", "events", "1"]));
    assert!(
        ev.contains(&format!(
            "replaced rank 1 ns/{} -> ns/{}",
            lost.hostname, spare.hostname
        )),
        "{ev}"
    );
    assert!(ev.contains("stopped answering"), "{ev}");
    assert!(!ev.contains("whole-gang recovery"), "{ev}");
    let (_, q, _) = crate::common::parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["nodes_replaced"], 1, "{j}");
    assert_eq!(j["restarts_on_errors"], 0, "{j}");
    // Nothing left on the hosts that answer; the pool is free again.
    lost.kill_all();
    released_when_ended(&home);
}

#[test]
fn nodes_behind_a_jump_host_are_reached_through_one_connection_to_it() {
    let Some(keys) = NetnsKeys::new() else { return };
    let bastion = NetnsNode::start("gw-bastion", Link::Host, &keys);
    let behind: Vec<NetnsNode> = (0..3)
        .map(|i| NetnsNode::start(&format!("gw-inner-{i}"), Link::Behind(&bastion), &keys))
        .collect();
    // Not reachable from here except through the bastion: ssh straight to
    // a node fails. (A plain TCP connect is no proof: this machine's
    // default route may lead to a proxy that accepts anything.)
    for n in &behind {
        let direct = std::process::Command::new("timeout")
            .args(["5", "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2"])
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
            ])
            .arg("-i")
            .arg(keys.client())
            .arg(format!("root@{}", n.addr))
            .arg("true")
            .output()
            .unwrap();
        assert!(!direct.status.success(), "{} is reachable directly", n.addr);
    }
    let home = crate::common::TestHome::new();
    netns_pool(
        &home,
        &keys,
        &behind
            .iter()
            .map(|n| (n, Some(&bastion)))
            .collect::<Vec<_>>(),
    );
    let t = home.file(
        "jump.yaml",
        &format!(
            "num_nodes: 3\nresources:\n  infra: ssh/ns\nenvs:\n  GW_TEST_MARKER: {}\n\
             run: |\n  echo \"rank $NODE_RANK is $(hostname)\"\n  sleep 2\n",
            home.marker
        ),
    );
    // While it runs, count the connections the bastion's sshd holds.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let counter = {
        let stop = std::sync::Arc::clone(&stop);
        let ns = format!("ip netns exec {}", bastion.ns());
        let addr = bastion.addr.clone();
        std::thread::spawn(move || {
            let mut most = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let o = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(format!(
                        "{ns} ss -Htn state established '( sport = :22 )' src {addr}"
                    ))
                    .output()
                    .unwrap();
                most = most.max(String::from_utf8_lossy(&o.stdout).lines().count());
                std::thread::sleep(Duration::from_millis(50));
            }
            most
        })
    };
    let (code, out, err) = crate::common::parts(&home.run(["launch", &t, "-c", "jmp"]));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let most = counter.join().unwrap();
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for n in &behind {
        assert!(out.contains(&format!(" is {}", n.hostname)), "{out}");
    }
    assert!(most >= 1, "never saw a connection to the bastion");
    assert!(
        most < behind.len(),
        "{most} connections to the bastion at once for {} nodes: not shared",
        behind.len()
    );
    assert_eq!(crate::common::parts(&home.run(["down", "jmp", "-y"])).0, 0);
    crate::common::assert_no_marker_procs(&home.marker, "down behind a jump host");
}

/// A bucket MOUNT on a pool machine is unmounted at `down` before the
/// cluster's processes are killed: the machine (which outlives the
/// cluster) keeps no mount and no rclone of it.
#[test]
fn a_bucket_mount_on_a_pool_machine_is_unmounted_at_down() {
    let Some(sshd) = Sshd::start(1) else { return };
    let Some(emu) = gangway_test::storage::StoreEmulator::gcs() else {
        return;
    };
    let home = pool_home(&sshd);
    let m = home.marker.to_ascii_lowercase();
    let bucket = format!("gw-{m}-pool");
    emu.create_bucket(&bucket);
    emu.put_object(&bucket, "x/a.txt", b"alpha");
    let dir = format!("gwm-{m}");
    let t = home.file(
        "pm.yaml",
        &format!(
            "resources:\n  infra: ssh/lab\nfile_mounts:\n  ~/{dir}:\n    source: gs://{bucket}/x\n    mode: MOUNT\n\
             run: echo \"got $(cat ~/{dir}/a.txt)\"\n"
        ),
    );
    let gangway = |args: &[&str]| {
        let mut c = crate::common::command_in(home.path());
        c.env("GANGWAY_GCS_ENDPOINT", &emu.endpoint)
            .env(
                "GOOGLE_SERVICE_ACCOUNT_KEY",
                gangway_test::storage::GCS_NO_AUTH_KEY,
            )
            .args(args);
        crate::common::parts(&crate::common::Running::start(c).wait())
    };
    let (code, out, err) = gangway(&["launch", &t, "-c", "pm", "-y"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("got alpha"), "{out}");
    let path = sshd.home.join(&dir);
    let mounted = |p: &std::path::Path| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
    };
    assert!(
        mounted(&path),
        "{} is a mount while the cluster is up",
        path.display()
    );
    // The mount's credentials: 0600 files in a 0700 directory named by
    // this installation's scope (`<owner>/pm`), which down removes.
    let creds: Vec<std::path::PathBuf> = std::fs::read_dir(sshd.home.join(".gangway/creds"))
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with("_pm") && p.join("gw0.conf").exists())
        .collect();
    assert_eq!(creds.len(), 1, "one credentials directory: {creds:?}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&creds[0]), 0o700);
        assert_eq!(mode(&creds[0].join("gw0.conf")), 0o600);
    }
    let (code, _, err) = gangway(&["down", "pm", "-y"]);
    assert_eq!(code, 0, "{err}");
    assert!(!creds[0].exists(), "{} left after down", creds[0].display());
    assert!(
        !mounted(&path),
        "{} still mounted after down",
        path.display()
    );
    let rclones = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            let c = String::from_utf8_lossy(c);
            c.contains("rclone") && c.contains(&dir)
        })
        .count();
    assert_eq!(rclones, 0, "an rclone of the mount is left");
}

/// Two installations on one pool machine, each with a cluster of the same
/// name running run 1: one's dead driver being reaped, and its `down`,
/// stop its own ranks only; the other's keep running.
#[test]
fn another_installations_cluster_of_the_same_name_is_never_touched() {
    let Some(sshd) = Sshd::start(1) else { return };
    let (a, b) = (pool_home(&sshd), pool_home(&sshd));
    for home in [&a, &b] {
        let t = home.file("idle.yaml", "resources:\n  infra: ssh/lab\nrun: \"true\"\n");
        let (code, out, err) = crate::common::parts(&home.run(["launch", &t, "-c", "same"]));
        assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
        let (code, _, err) = crate::common::parts(&home.run([
            "exec",
            "same",
            "-d",
            "--env",
            &home.marker_env(),
            "sleep 300",
        ]));
        assert_eq!(code, 0, "{err}");
        home.wait_job_status("same", "RUNNING");
        wait_for_marker(&home.marker, 1);
    }
    let job = a.jobs("same");
    let run = job.last().unwrap();
    assert_eq!(
        run["id"],
        b.jobs("same").last().unwrap()["id"],
        "the same run number"
    );
    let pid = run["driver_pid"].as_u64().expect("driver_pid") as u32;
    // SAFETY: kill(2) on this test's own driver (a's).
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    a.wait_job_status("same", "FAILED_DRIVER");
    crate::common::assert_no_marker_procs(&a.marker, "a's dead driver was reaped");
    assert_eq!(
        crate::common::procs_with_marker(&b.marker).len(),
        1,
        "b's rank survived a's reap"
    );
    assert_eq!(crate::common::parts(&a.run(["down", "same", "-y"])).0, 0);
    assert_eq!(
        crate::common::procs_with_marker(&b.marker).len(),
        1,
        "b's rank survived a's down"
    );
    assert_eq!(crate::common::parts(&b.run(["down", "same", "-y"])).0, 0);
    crate::common::assert_no_marker_procs(&b.marker, "b's down");
}

/// A destination with a space and a `$(...)` reaches the node as the path
/// it is: rsync's remote path is quoted for the node's shell, the same for
/// every rsync (older ones, and macOS's, hand it to that shell).
#[test]
fn a_file_mount_path_with_shell_metacharacters_is_only_a_path() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = pool_home(&sshd);
    let src = home.path().join("data");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a.txt"), "alpha\n").unwrap();
    let t = home.file(
        "odd.yaml",
        &format!(
            "resources:\n  infra: ssh/lab\nfile_mounts:\n  \"~/odd dir $(touch PWNED)\": {}\nrun: echo ok\n",
            src.display()
        ),
    );
    // As an rsync before 3.2.4 behaves (this one protects its arguments
    // unless told otherwise).
    let mut c = crate::common::command_in(home.path());
    c.env("RSYNC_OLD_ARGS", "1")
        .args(["launch", &t, "-c", "odd"]);
    let (code, out, err) = crate::common::parts(&crate::common::Running::start(c).wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        std::fs::read_to_string(sshd.home.join("odd dir $(touch PWNED)/a.txt")).unwrap(),
        "alpha\n"
    );
    assert!(
        !sshd.home.join("PWNED").exists(),
        "the path ran as a command"
    );
    assert_eq!(crate::common::parts(&home.run(["down", "odd", "-y"])).0, 0);
}

/// A pool host's operator gives notice by creating its drain file: the
/// gang checkpoints on it, that host alone is replaced by a free one (the
/// drained host rests, so it is not taken back), and both ranks resume
/// exactly at the noticed step.
#[test]
fn a_managed_gang_on_a_pool_told_a_host_is_draining_replaces_it_at_the_noticed_step() {
    let Some(sshd) = Sshd::start(3) else { return };
    let home = crate::common::TestHome::new();
    let drains = tempfile::tempdir().unwrap();
    let drain = |a: &str| drains.path().join(format!("drain-{a}"));
    let hosts: Vec<String> = sshd
        .addrs
        .iter()
        .map(|a| {
            format!(
                "      - {{address: {a}, name: n-{a}, drain_file: {}}}",
                drain(a).display()
            )
        })
        .collect();
    write_pool(&home, &sshd, &hosts);
    let t = home.file(
        "gang.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: ssh/lab\n\
             checkpoint:\n  sync_interval: 1\n  signal: SIGTERM\n  grace_period: 30\n\
             envs:\n  GW_TEST_MARKER: {}\n\
             setup: echo \"setup on $(set -- $SSH_CONNECTION; echo $3)\"\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  me=$(set -- $SSH_CONNECTION; echo $3)\n  \
             step=0\n  [ -f \"$ck\" ] && step=$(cat \"$ck\")\n  \
             echo \"rank $NODE_RANK on $me in run $GANGWAY_RESTART_COUNT from step $step\"\n  \
             on_notice() {{\n    [ \"$NODE_RANK\" = 0 ] && echo \"$step\" > \"$ck.tmp\" && mv \"$ck.tmp\" \"$ck\"\n    \
             echo \"rank $NODE_RANK checkpointed step $step on the notice\"\n    exit 0\n  }}\n  \
             trap on_notice TERM\n  \
             while [ \"$step\" -lt 40 ]; do\n    sleep 0.2\n    step=$((step + 1))\n    \
             [ \"$NODE_RANK\" = 0 ] && [ \"$GANGWAY_RESTART_COUNT\" = 0 ] && [ \"$step\" = 5 ] && echo \"at step 5\"\n  \
             done\n  echo \"rank $NODE_RANK done at step $step\"\n",
            home.marker
        ),
    );
    let mut launcher = home.spawn(["jobs", "launch", &t, "-y"]);
    launcher.wait_for_stdout("at step 5", "run 0 to reach step 5");
    let so_far = launcher.stdout_now();
    let host_of = |rank: u32| -> String {
        let needle = format!("rank {rank} on ");
        let line = so_far
            .lines()
            .find(|l| l.contains(&needle) && l.ends_with(" in run 0 from step 0"))
            .unwrap_or_else(|| panic!("no rank {rank} line:\n{so_far}"));
        let rest = &line[line.find(&needle).unwrap() + needle.len()..];
        rest.trim_end_matches(" in run 0 from step 0").to_string()
    };
    let (h0, h1) = (host_of(0), host_of(1));
    let spare = sshd
        .addrs
        .iter()
        .find(|a| **a != h0 && **a != h1)
        .expect("the spare host")
        .clone();
    std::fs::write(drain(&h1), "kernel update\n").unwrap();
    let (code, out, err) = crate::common::parts(&launcher.wait());
    let (_, ev, _) = crate::common::parts(&home.run(["jobs", "events", "1"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}\nevents:\n{ev}");
    let noticed = crate::common::noticed_step(&out)
        .unwrap_or_else(|| panic!("no checkpoint on the notice:\n{out}\n{ev}"));
    assert!(
        out.contains(&format!("rank 0 on {h0} in run 1 from step {noticed}")),
        "rank 0 kept its host and resumed at the noticed step:\n{out}"
    );
    assert!(
        out.contains(&format!("rank 1 on {spare} in run 1 from step {noticed}")),
        "rank 1 moved to the spare host, not back to the drained one:\n{out}"
    );
    for r in 0..2 {
        assert!(out.contains(&format!("rank {r} done at step 40")), "{out}");
    }
    // Setup ran on the two hosts of the launch, then on the spare only.
    assert_eq!(out.matches(") setup on ").count(), 3, "{out}");
    assert_eq!(
        out.matches(&format!(") setup on {spare}")).count(),
        1,
        "{out}"
    );
    assert!(
        ev.contains("NOTICE") && ev.contains("draining") && ev.contains("kernel update"),
        "the notice names the drain and its reason:\n{ev}"
    );
    assert!(
        ev.contains(&format!("replaced rank 1 lab/n-{h1} -> lab/n-{spare}")),
        "{ev}"
    );
    assert!(!ev.contains("whole-gang recovery"), "{ev}");
    let (_, q, _) = crate::common::parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["nodes_replaced"], 1, "{j}");
    released_when_ended(&home);
}
