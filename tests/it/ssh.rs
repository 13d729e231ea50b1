//! The SSH transport against a real sshd on loopback addresses.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use gangway::gang::ssh::SshTransport;
use gangway::gang::{NodeCommand, Transport};
use gangway::state::NodeRow;

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
        for (mut child, reader) in waits {
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
        };
        let mut child = t.spawn(&ns[0], &cmd, w).unwrap();
        let pid = child.id().unwrap();
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
    t.write_file(&ns[0], &format!("~/{dest}/sub/b.txt"), b"beta")
        .unwrap();
    let back = tempfile::tempdir().unwrap();
    std::fs::write(back.path().join("keep.txt"), "local").unwrap();
    t.download(&ns[0], &format!("~/{dest}"), back.path())
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(back.path().join("sub/b.txt")).unwrap(),
        "beta"
    );
    assert_eq!(
        std::fs::read_to_string(back.path().join("keep.txt")).unwrap(),
        "local"
    );
    let _ = run_all(&t, &ns, &format!("rm -rf ~/{dest}"), &[]);
}

#[test]
fn a_changed_host_key_is_refused_naming_the_node() {
    let Some(sshd) = Sshd::start(1) else { return };
    let home = tempfile::tempdir().unwrap();
    let ns = nodes(&sshd, 1);
    // Someone else's key recorded for this host:port.
    let other = home.path().join("other");
    let ok = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap();
    assert!(ok.success());
    let public = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let t = SshTransport::new(home.path(), "c4", false)
        .unwrap()
        .with_connect_timeout(Duration::from_secs(5));
    let line = format!(
        "[{}]:{} {}\n",
        sshd.addrs[0],
        sshd.port,
        public
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    );
    std::fs::write(home.path().join("ssh/known_hosts/c4"), line).unwrap();
    let err = connect(&t, &ns).unwrap_err();
    assert!(
        err.contains("rank 0") && err.contains(&sshd.addrs[0]),
        "{err}"
    );
    assert!(err.contains("host key"), "{err}");
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

/// A node in a network namespace of its own, with its own sshd, reached
/// over a veth pair; `cut()` drops the link without a word, as a dead node
/// or a broken switch does.
struct NetnsNode {
    ns: String,
    host_if: String,
    addr: String,
    sshd: Option<std::process::Child>,
    dir: tempfile::TempDir,
}

impl NetnsNode {
    fn start() -> Option<NetnsNode> {
        let root = unsafe { libc::geteuid() } == 0;
        let have = |p: &str| std::path::Path::new(p).exists();
        if !root || !have("/usr/sbin/sshd") || !(have("/usr/sbin/ip") || have("/sbin/ip")) {
            eprintln!("SKIPPED: the network-namespace test needs root, sshd and ip");
            return None;
        }
        let id = std::process::id();
        let ns = format!("gwn{id}");
        let host_if = format!("gwh{id}");
        let node_if = format!("gwp{id}");
        let subnet = format!("10.231.{}", id % 250);
        let addr = format!("{subnet}.2");
        let sh = |cmd: &str| {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        if !sh(&format!("ip netns add {ns}")) {
            eprintln!("SKIPPED: cannot create a network namespace here");
            return None;
        }
        let ok = sh(&format!(
            "ip link add {host_if} type veth peer name {node_if} && \
             ip link set {node_if} netns {ns} && \
             ip addr add {subnet}.1/24 dev {host_if} && ip link set {host_if} up && \
             ip netns exec {ns} ip addr add {addr}/24 dev {node_if} && \
             ip netns exec {ns} ip link set {node_if} up && \
             ip netns exec {ns} ip link set lo up"
        ));
        let dir = tempfile::tempdir().unwrap();
        let mut node = NetnsNode {
            ns,
            host_if,
            addr,
            sshd: None,
            dir,
        };
        if !ok {
            eprintln!("SKIPPED: cannot wire a veth pair into the namespace");
            return None;
        }
        let d = node.dir.path().to_path_buf();
        for k in ["host", "client"] {
            assert!(sh(&format!(
                "ssh-keygen -q -t ed25519 -N '' -f {}/{k}",
                d.display()
            )));
        }
        std::fs::copy(d.join("client.pub"), d.join("authorized_keys")).unwrap();
        std::fs::create_dir_all(d.join("home")).unwrap();
        let _ = std::fs::create_dir_all("/run/sshd");
        std::fs::write(
            d.join("sshd_config"),
            format!(
                "ListenAddress {addr}:22\nHostKey {d}/host\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 StrictModes no\nUseDNS no\nLogLevel ERROR\nSetEnv HOME={d}/home\n\
                 ClientAliveInterval 60\n\
                 ForceCommand cd \"$HOME\" || exit 1; eval \"$SSH_ORIGINAL_COMMAND\"\n",
                addr = node.addr,
                d = d.display()
            ),
        )
        .unwrap();
        node.sshd = Some(
            std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &node.ns,
                    "/usr/sbin/sshd",
                    "-D",
                    "-e",
                    "-f",
                ])
                .arg(d.join("sshd_config"))
                .stderr(std::fs::File::create(d.join("sshd.log")).unwrap())
                .spawn()
                .unwrap(),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let target: std::net::SocketAddr = format!("{}:22", node.addr).parse().unwrap();
        while std::net::TcpStream::connect_timeout(&target, Duration::from_millis(200)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "sshd in the namespace never listened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(node)
    }

    fn row(&self) -> NodeRow {
        let mut extra = BTreeMap::new();
        extra.insert("ssh.host".to_string(), self.addr.clone());
        extra.insert("ssh.user".to_string(), "root".to_string());
        extra.insert(
            "ssh.key".to_string(),
            self.dir.path().join("client").display().to_string(),
        );
        NodeRow {
            rank: 0,
            instance_id: "netns-0".into(),
            private_ip: self.addr.clone(),
            public_ip: None,
            zone: "ns".into(),
            topology: String::new(),
            state: "running".into(),
            extra,
        }
    }

    /// The link goes down: packets vanish, nothing answers.
    fn cut(&self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "set", &self.host_if, "down"])
            .status();
    }
}

impl Drop for NetnsNode {
    fn drop(&mut self) {
        if let Some(mut s) = self.sshd.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
    }
}

#[test]
fn a_node_that_stops_answering_is_detected_within_15_seconds() {
    let Some(node) = NetnsNode::start() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let t = SshTransport::new(home.path(), "ns", true).unwrap();
    let rows = vec![node.row()];
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
        };
        let mut child = t.spawn(&rows[0], &cmd, w).unwrap();
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
