//! Tests against real directories and real TCP listeners.

use std::collections::BTreeSet;
use std::fs;
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use gangway_provider::{
    ClusterName, ErrorKind, LaunchRequest, Node, NodeState, Placement, Provider, ProviderError,
};
use gangway_test::net::{ClosedPort, SshGreeter};

use super::*;

/// A port that answers as an SSH server does while the value lives.
fn open() -> (SshGreeter, u16) {
    let g = SshGreeter::start();
    let port = g.port;
    (g, port)
}

/// A port nothing listens on, held closed while the value lives.
fn closed() -> (ClosedPort, u16) {
    let c = ClosedPort::hold();
    let port = c.port;
    (c, port)
}

fn host(name: &str, port: u16) -> Host {
    Host {
        name: name.into(),
        address: "127.0.0.1".into(),
        port,
        user: "root".into(),
        key: None,
        jump: None,
        gpu: Some(("A100".into(), 8)),
        topology: Vec::new(),
        zone: Some("rack1".into()),
        drain_file: None,
    }
}

/// Pool `gpus` of A100x8 hosts in zone `rack1`: the listed names up, the
/// others down. Returns the sockets to keep alive.
/// A port kept for a test: listening, or held closed.
#[allow(dead_code)] // held for their Drop only
enum Held {
    Open(SshGreeter),
    Closed(ClosedPort),
}

fn gpus_pool(up: &[&str], down: &[&str], order: &[&str]) -> (Pool, Vec<Held>) {
    let mut keep = Vec::new();
    let hosts = order
        .iter()
        .map(|n| {
            if up.contains(n) {
                let (l, p) = open();
                keep.push(Held::Open(l));
                host(n, p)
            } else {
                assert!(down.contains(n), "{n} is neither up nor down");
                let (s, p) = closed();
                keep.push(Held::Closed(s));
                host(n, p)
            }
        })
        .collect();
    (
        Pool {
            name: "gpus".into(),
            hosts,
        },
        keep,
    )
}

fn req(cluster: &str, pool: &str, zone: &str, ty: &str, count: u32) -> LaunchRequest {
    LaunchRequest {
        cluster: ClusterName(cluster.into()),
        owner: "alice".into(),
        placement: Placement {
            cloud: "ssh".into(),
            region: pool.into(),
            zone: zone.into(),
        },
        instance_type: ty.into(),
        count,
        use_spot: false,
        accelerator: Some(("A100".into(), 8.0)),
        disk_size_gib: None,
        image_id: None,
        client_token: format!("tok-{cluster}"),
        provider_config: None,
        network_tier: None,
        max_price: None,
        ports: Vec::new(),
        labels: Default::default(),
    }
}

fn a100(cluster: &str, count: u32) -> LaunchRequest {
    req(cluster, "gpus", "rack1", "gpus.a100x8", count)
}

fn ids(nodes: &[Node]) -> Vec<String> {
    nodes.iter().map(|n| n.id.0.clone()).collect()
}

fn records(root: &Path) -> BTreeSet<String> {
    match fs::read_dir(root.join("alloc")) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
        Err(_) => BTreeSet::new(),
    }
}

fn cluster(name: &str) -> ClusterName {
    ClusterName(name.into())
}

#[test]
fn instance_type_naming() {
    let mut h = host("a", 22);
    assert_eq!(SshPools::instance_type("gpus", &h), "gpus.a100x8");
    h.gpu = Some(("H100-SXM".into(), 4));
    assert_eq!(SshPools::instance_type("lab", &h), "lab.h100-sxmx4");
    h.gpu = None;
    assert_eq!(SshPools::instance_type("lab", &h), "lab.cpu");
    h.gpu = Some(("A10G".into(), 0));
    assert_eq!(SshPools::instance_type("lab", &h), "lab.cpu");
}

#[tokio::test]
async fn allocation_is_exclusive_across_clusters() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(&["a", "b", "c", "d"], &[], &["a", "b", "c", "d"]);
    let p = SshPools::new(dir.path(), vec![pool]);

    let one = p.launch(&a100("one", 2)).await.unwrap();
    let two = p.launch(&a100("two", 2)).await.unwrap();
    assert_eq!(ids(&one), ["gpus/a", "gpus/b"]);
    assert_eq!(ids(&two), ["gpus/c", "gpus/d"]);
    let e = p.launch(&a100("three", 1)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.message.contains("busy: a, b, c, d"), "{e}");
    assert_eq!(ids(&p.describe(&cluster("one")).await.unwrap()), ids(&one));
    assert_eq!(ids(&p.describe(&cluster("two")).await.unwrap()), ids(&two));
    assert!(p.describe(&cluster("three")).await.unwrap().is_empty());
    assert!(p.free_hosts().unwrap().is_empty());

    let text = fs::read_to_string(dir.path().join("alloc/gpus__a")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(rec["cluster"], "one");
    assert_eq!(rec["owner"], "alice");
    assert_eq!(rec["client_token"], "tok-one");
    assert!(rec["at_ms"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn relaunch_reuses_and_adds_only_the_shortfall() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(&["a", "b", "c"], &[], &["a", "b", "c"]);
    let p = SshPools::new(dir.path(), vec![pool]);

    let first = p.launch(&a100("c1", 2)).await.unwrap();
    let again = p.launch(&a100("c1", 2)).await.unwrap();
    assert_eq!(ids(&first), ids(&again));
    assert_eq!(
        records(dir.path()),
        ["gpus__a", "gpus__b"].map(String::from).into()
    );

    let more = p.launch(&a100("c1", 3)).await.unwrap();
    assert_eq!(ids(&more), ["gpus/a", "gpus/b", "gpus/c"]);
    // Fewer than held: exactly `count`, nothing released.
    let fewer = p.launch(&a100("c1", 1)).await.unwrap();
    assert_eq!(ids(&fewer), ["gpus/a"]);
    assert_eq!(p.describe(&cluster("c1")).await.unwrap().len(), 3);
}

#[tokio::test]
async fn reused_hosts_are_not_probed() {
    let dir = tempfile::tempdir().unwrap();
    let (l, port) = open();
    let pool = Pool {
        name: "gpus".into(),
        hosts: vec![host("a", port)],
    };
    let p = SshPools::new(dir.path(), vec![pool]);
    p.launch(&a100("c1", 1)).await.unwrap();
    drop(l);
    // Down now, but it is the cluster's already.
    assert_eq!(ids(&p.launch(&a100("c1", 1)).await.unwrap()), ["gpus/a"]);
}

#[tokio::test]
async fn capacity_error_lists_busy_and_unreachable_and_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(
        &["a", "b", "d", "e"],
        &["c", "f"],
        &["a", "b", "c", "d", "e", "f"],
    );
    let p = SshPools::new(dir.path(), vec![pool]);
    p.launch(&a100("other", 2)).await.unwrap();
    let before = records(dir.path());

    let e = p.launch(&a100("mine", 4)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert_eq!(e.provider, "ssh");
    assert_eq!(e.location, "gpus/rack1");
    assert_eq!(
        e.message,
        "pool gpus zone rack1: 2 of 6 gpus.a100x8 hosts free and reachable, 4 asked for \
         (busy: a, b; unreachable: c, f)"
    );
    assert_eq!(records(dir.path()), before);
    assert!(p.describe(&cluster("mine")).await.unwrap().is_empty());
    assert_eq!(
        p.free_hosts().unwrap(),
        ["c", "d", "e", "f"].map(|h| ("gpus".to_string(), h.to_string()))
    );

    // What is there is enough for 2, skipping the unreachable one.
    let two = p.launch(&a100("mine", 2)).await.unwrap();
    assert_eq!(ids(&two), ["gpus/d", "gpus/e"]);
    // A cluster that holds some counts them, and allocates nothing more
    // when the rest is not there.
    let e = p.launch(&a100("mine", 3)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity);
    assert!(
        e.message
            .contains("2 of 6 gpus.a100x8 hosts free and reachable, 3 asked for (2 already allocated to this cluster; busy: a, b; unreachable: c, f)"),
        "{e}"
    );
    assert_eq!(p.describe(&cluster("mine")).await.unwrap().len(), 2);
}

#[tokio::test]
async fn terminate_releases_for_the_next_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(&["a", "b"], &[], &["a", "b"]);
    let p = SshPools::new(dir.path(), vec![pool]);
    p.launch(&a100("c1", 2)).await.unwrap();
    assert_eq!(
        p.launch(&a100("c2", 1)).await.unwrap_err().kind,
        ErrorKind::Capacity
    );

    p.terminate(&cluster("c1")).await.unwrap();
    assert!(records(dir.path()).is_empty());
    assert!(p.describe(&cluster("c1")).await.unwrap().is_empty());
    assert_eq!(p.free_hosts().unwrap().len(), 2);
    // Idempotent, and a no-op for unknown clusters.
    p.terminate(&cluster("c1")).await.unwrap();
    p.terminate(&cluster("nobody")).await.unwrap();

    assert_eq!(
        ids(&p.launch(&a100("c2", 2)).await.unwrap()),
        ["gpus/a", "gpus/b"]
    );
}

#[test]
fn concurrent_launches_for_the_last_hosts_one_wins() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let (pool, _keep) = gpus_pool(&["a", "b", "c"], &[], &["a", "b", "c"]);
        let p = SshPools::new(dir.path(), vec![pool]);
        p.launch_now(&a100("first", 1)).unwrap();

        let barrier = Arc::new(Barrier::new(2));
        let outcomes: Vec<std::result::Result<Vec<Node>, ProviderError>> = ["x", "y"]
            .map(|c| {
                // Separate instances, as separate processes would have.
                let p = SshPools::new(dir.path(), p.pools().to_vec());
                let barrier = Arc::clone(&barrier);
                thread::spawn(move || {
                    barrier.wait();
                    p.launch_now(&a100(c, 2))
                })
            })
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let won: Vec<&Vec<Node>> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        assert_eq!(won.len(), 1, "round {round}: {outcomes:?}");
        assert_eq!(ids(won[0]), ["gpus/b", "gpus/c"]);
        let lost = outcomes.iter().find_map(|o| o.as_ref().err()).unwrap();
        assert_eq!(lost.kind, ErrorKind::Capacity, "{lost}");
        assert_eq!(records(dir.path()).len(), 3);
    }
}

#[tokio::test]
async fn allocations_survive_a_new_instance() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(&["a", "b"], &[], &["a", "b"]);
    let before = {
        let p = SshPools::new(dir.path(), vec![pool.clone()]);
        p.launch(&a100("c1", 1)).await.unwrap()
        // Dropped without any goodbye, as a killed process would be.
    };
    let p = SshPools::new(dir.path(), vec![pool]);
    assert_eq!(
        ids(&p.describe(&cluster("c1")).await.unwrap()),
        ids(&before)
    );
    assert_eq!(ids(&p.launch(&a100("c1", 1)).await.unwrap()), ids(&before));
    assert_eq!(ids(&p.launch(&a100("c2", 1)).await.unwrap()), ["gpus/b"]);
}

#[tokio::test]
async fn a_half_written_record_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(&["a"], &[], &["a"]);
    let p = SshPools::new(dir.path(), vec![pool]);
    // A process killed between creating the record and writing it.
    fs::create_dir_all(dir.path().join("alloc")).unwrap();
    fs::write(dir.path().join("alloc/gpus__a"), b"{\"clus").unwrap();
    assert_eq!(ids(&p.launch(&a100("c1", 1)).await.unwrap()), ["gpus/a"]);
}

#[tokio::test]
async fn unknown_pool_zone_and_type_are_invalid_and_say_what_exists() {
    let dir = tempfile::tempdir().unwrap();
    let (mut pool, _keep) = gpus_pool(&["a", "b"], &[], &["a", "b"]);
    pool.hosts[1].gpu = None;
    let mut c = host("c", 22);
    c.zone = Some("rack2".into());
    c.gpu = Some(("H100".into(), 8));
    pool.hosts.push(c);
    let p = SshPools::new(
        dir.path(),
        vec![
            pool,
            Pool {
                name: "cpus".into(),
                hosts: vec![],
            },
        ],
    );
    let invalid = |e: ProviderError| {
        assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
        e.message
    };

    let m = invalid(
        p.launch(&req("c1", "nope", "rack1", "gpus.a100x8", 1))
            .await
            .unwrap_err(),
    );
    assert_eq!(m, "no ssh pool \"nope\"; the inventory has gpus, cpus");
    let m = invalid(
        p.launch(&req("c1", "gpus", "rack9", "gpus.a100x8", 1))
            .await
            .unwrap_err(),
    );
    assert_eq!(m, "no zone \"rack9\" in pool gpus; it has rack1, rack2");
    let m = invalid(
        p.launch(&req("c1", "gpus", "rack1", "gpus.h100x8", 1))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        m,
        "no instance type \"gpus.h100x8\" in pool gpus zone rack1; it has gpus.a100x8, gpus.cpu \
         (gpus.h100x8 is in zone rack2)"
    );
    let m = invalid(
        p.launch(&req("c1", "gpus", "rack1", "gpus.a100x8", 0))
            .await
            .unwrap_err(),
    );
    assert!(m.contains("0 asked for"), "{m}");
    let mut wrong_cloud = a100("c1", 1);
    wrong_cloud.placement.cloud = "aws".into();
    invalid(p.launch(&wrong_cloud).await.unwrap_err());
    assert!(records(dir.path()).is_empty());

    // CPU hosts are a type of their own.
    let cpu = p
        .launch(&req("c2", "gpus", "rack1", "gpus.cpu", 1))
        .await
        .unwrap();
    assert_eq!(ids(&cpu), ["gpus/b"]);
    assert_eq!(cpu[0].extra["gpus"], "0");
}

#[tokio::test]
async fn a_cluster_stays_in_one_zone_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let (mut pool, _keep) = gpus_pool(&["a", "b"], &[], &["a", "b"]);
    pool.hosts[1].zone = Some("rack2".into());
    let p = SshPools::new(dir.path(), vec![pool]);
    p.launch(&a100("c1", 1)).await.unwrap();
    let e = p
        .launch(&req("c1", "gpus", "rack2", "gpus.a100x8", 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    assert!(e.message.contains("already holds gpus/a"), "{e}");
    assert_eq!(records(dir.path()).len(), 1);
}

#[tokio::test]
async fn describe_is_in_inventory_order_with_ssh_facts() {
    let dir = tempfile::tempdir().unwrap();
    let (mut pool, _keep) = gpus_pool(&["b", "c", "d"], &["a"], &["a", "b", "c", "d"]);
    pool.hosts[1].key = Some("~/.ssh/lab".into());
    pool.hosts[1].user = "ubuntu".into();
    pool.hosts[1].topology = vec!["spine1".into(), "leaf2".into()];
    pool.hosts[2].zone = None;
    // d is reached through a jump host (its own listener, here).
    pool.hosts[3].jump = Some(format!("127.0.0.1:{}", pool.hosts[3].port));
    let p = SshPools::new(dir.path(), vec![pool.clone()]);

    // Allocated in two steps, so records are not in inventory order.
    p.launch(&a100("c1", 1)).await.unwrap(); // b
    let err = p.launch(&a100("c1", 3)).await.unwrap_err(); // only d left in rack1
    assert_eq!(err.kind, ErrorKind::Capacity, "{err}");
    let nodes = p.launch(&a100("c1", 2)).await.unwrap();
    assert_eq!(ids(&nodes), ["gpus/b", "gpus/d"]);
    let c = p
        .launch(&req("c2", "gpus", "gpus", "gpus.a100x8", 1))
        .await
        .unwrap();
    assert_eq!(ids(&c), ["gpus/c"]);
    assert_eq!(c[0].placement.zone, "gpus");

    let nodes = p.describe(&cluster("c1")).await.unwrap();
    assert_eq!(ids(&nodes), ["gpus/b", "gpus/d"]);
    let b = &nodes[0];
    assert_eq!(b.state, NodeState::Running);
    assert_eq!(b.private_ip, "127.0.0.1");
    assert_eq!(b.public_ip, None);
    assert_eq!(
        b.placement,
        Placement {
            cloud: "ssh".into(),
            region: "gpus".into(),
            zone: "rack1".into()
        }
    );
    assert_eq!(b.topology, ["spine1", "leaf2"]);
    let keys: Vec<&str> = b.extra.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "gpus",
            "instance_type",
            "pool",
            "ssh.host",
            "ssh.key",
            "ssh.port",
            "ssh.user"
        ]
    );
    assert_eq!(b.extra["ssh.host"], "127.0.0.1");
    assert_eq!(b.extra["ssh.port"], pool.hosts[1].port.to_string());
    assert_eq!(b.extra["ssh.user"], "ubuntu");
    assert_eq!(b.extra["ssh.key"], "~/.ssh/lab");
    assert_eq!(b.extra["gpus"], "8");
    assert_eq!(b.extra["instance_type"], "gpus.a100x8");
    assert_eq!(b.extra["pool"], "gpus");
    assert!(!b.extra.keys().any(|k| k.starts_with("env.")));
    assert_eq!(
        nodes[1].extra["ssh.jump"],
        format!("127.0.0.1:{}", pool.hosts[3].port)
    );

    // A host gone from the inventory is reported as terminated, and
    // released by terminate.
    let mut smaller = pool.clone();
    smaller.hosts.remove(1);
    let q = SshPools::new(dir.path(), vec![smaller]);
    let nodes = q.describe(&cluster("c1")).await.unwrap();
    assert_eq!(ids(&nodes), ["gpus/d", "gpus/b"]);
    assert_eq!(nodes[0].state, NodeState::Running);
    assert_eq!(nodes[1].state, NodeState::Terminated);
    assert_eq!(nodes[1].placement.zone, "rack1");
    q.terminate(&cluster("c1")).await.unwrap();
    assert_eq!(records(dir.path()), ["gpus__c".to_string()].into());
}

#[tokio::test]
async fn a_jump_host_is_probed_instead_of_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let (_l, jump_port) = open();
    let (_a, a_port) = closed();
    let mut behind = host("a", a_port);
    behind.jump = Some(format!("me@127.0.0.1:{jump_port}"));
    let (_b, b_port) = closed();
    let mut down = host("b", b_port);
    let (_j, j_port) = closed();
    down.jump = Some(format!("127.0.0.1:{j_port}"));
    let p = SshPools::new(
        dir.path(),
        vec![Pool {
            name: "gpus".into(),
            hosts: vec![down, behind],
        }],
    );
    assert_eq!(ids(&p.launch(&a100("c1", 1)).await.unwrap()), ["gpus/a"]);
}

#[test]
fn first_hop_of_a_proxy_jump() {
    use crate::probe::first_hop;
    let s = |h: &str, p: u16| Some((h.to_string(), p));
    assert_eq!(first_hop("bastion"), s("bastion", 22));
    assert_eq!(first_hop("me@bastion:2222"), s("bastion", 2222));
    assert_eq!(first_hop("ssh://me@bastion:2200,other"), s("bastion", 2200));
    assert_eq!(first_hop("[fe80::1]:23"), s("fe80::1", 23));
    assert_eq!(first_hop("fe80::1"), s("fe80::1", 22));
    assert_eq!(first_hop("none"), None);
    assert_eq!(first_hop("bastion:x"), None);
}

#[test]
fn record_file_names_never_collide() {
    use crate::store::file_name;
    assert_eq!(file_name("gpus", "a"), "gpus__a");
    assert_eq!(file_name("lab", "10.0.0.11"), "lab__10.0.0.11");
    assert_eq!(file_name("lab", "gpu_1"), "lab__gpu_1");
    assert_eq!(file_name("lab", "../x"), "lab__%2E.%2Fx");
    let pairs = [
        ("a__b", "c"),
        ("a", "b__c"),
        ("a_", "b"),
        ("a", "_b"),
        ("a", "%5Fb"),
        ("a", "::1"),
    ];
    let names: BTreeSet<String> = pairs.iter().map(|(p, h)| file_name(p, h)).collect();
    assert_eq!(names.len(), pairs.len(), "{names:?}");
}

#[tokio::test]
async fn stop_start_check() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(&["a", "b"], &[], &["a", "b"]);
    let p = SshPools::new(
        dir.path(),
        vec![
            pool,
            Pool {
                name: "cpus".into(),
                hosts: vec![host("x", 22)],
            },
        ],
    );
    assert_eq!(p.name(), "ssh");
    let e = p.stop(&cluster("c1")).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert_eq!(
        e.message,
        "machines in an ssh pool are not stopped or started by gangway; use down to release them"
    );
    let e = p.start(&cluster("c1"), None).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);

    let r = p.check().await.unwrap();
    assert!(r.ok);
    assert_eq!(r.regions, ["gpus", "cpus"]);
    assert_eq!(r.identity.as_deref(), Some("3 hosts"));
    let empty = SshPools::new(dir.path(), vec![]).check().await.unwrap();
    assert!(!empty.ok);
    assert!(empty.hint.is_some());
}

#[tokio::test]
async fn a_held_host_that_stops_answering_is_reported_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(&["a", "b"], &[], &["a", "b"]);
    let p = SshPools::new(dir.path(), vec![pool.clone()]);
    p.launch(&a100("c1", 2)).await.unwrap();
    let nodes = p.describe(&cluster("c1")).await.unwrap();
    assert!(nodes.iter().all(|n| n.state == NodeState::Running));
    // Host b stops answering on its SSH port.
    let down = ClosedPort::hold();
    let mut later = pool;
    later.hosts[1].port = down.port;
    let q = SshPools::new(dir.path(), vec![later]);
    let nodes = q.describe(&cluster("c1")).await.unwrap();
    assert_eq!(ids(&nodes), ["gpus/a", "gpus/b"]);
    assert_eq!(nodes[0].state, NodeState::Running);
    match &nodes[1].state {
        NodeState::Preempted { reason } => assert_eq!(
            reason,
            &format!(
                "the pool's host b stopped answering: no SSH answer from 127.0.0.1:{} within 5 s",
                down.port
            )
        ),
        other => panic!("{other:?}"),
    }
    // Still held: the cluster releases it (or a replacement does).
    assert_eq!(records(dir.path()).len(), 2);
}

#[test]
fn a_port_that_accepts_without_speaking_ssh_is_not_reachable() {
    use std::io::Write;
    // Accepts (the kernel completes the handshake) and never speaks: a
    // hung sshd, or a proxy answering for an address that is gone.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    // Speaks, but not SSH.
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let http_port = http.local_addr().unwrap().port();
    let answering = thread::spawn(move || {
        if let Ok((mut c, _)) = http.accept() {
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let (_up, up_port) = open();
    let hosts = [
        host("silent", silent_port),
        host("http", http_port),
        host("up", up_port),
    ];
    use crate::probe::{reachable, TIMEOUT};
    let all: Vec<&Host> = hosts.iter().collect();
    let started = std::time::Instant::now();
    assert_eq!(reachable(&all), [false, false, true]);
    // In parallel, within the probe's timeout.
    assert!(started.elapsed() < TIMEOUT + Duration::from_secs(1));
    answering.join().unwrap();
    drop(silent);
}

#[tokio::test]
async fn a_held_host_is_probed_at_most_every_ten_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let a = SshGreeter::start();
    let b = SshGreeter::start();
    let pool = Pool {
        name: "gpus".into(),
        hosts: vec![host("a", a.port), host("b", b.port)],
    };
    let p = SshPools::new(dir.path(), vec![pool]);
    p.launch(&a100("c1", 2)).await.unwrap();
    let nodes = p.describe(&cluster("c1")).await.unwrap();
    assert!(nodes.iter().all(|n| n.state == NodeState::Running));
    // b goes away; this process probed it just now, so the next describe
    // (a controller's, a second later) answers from what it learnt.
    drop(b);
    let started = std::time::Instant::now();
    let nodes = p.describe(&cluster("c1")).await.unwrap();
    assert!(
        nodes.iter().all(|n| n.state == NodeState::Running),
        "{nodes:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "it probed again"
    );
    drop(a);
}

#[tokio::test]
async fn a_host_removed_as_lost_rests_before_any_cluster_takes_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _keep) = gpus_pool(&["a", "b", "c"], &[], &["a", "b", "c"]);
    let p = SshPools::new(dir.path(), vec![pool]);
    let first = p.launch(&a100("one", 2)).await.unwrap();
    assert_eq!(ids(&first), ["gpus/a", "gpus/b"]);
    // b is lost (it still answers SSH, as a draining host does): the
    // replacement takes c, never b back.
    p.remove_nodes(&cluster("one"), &[InstanceId("gpus/b".into())])
        .await
        .unwrap();
    let again = p.launch(&a100("one", 2)).await.unwrap();
    assert_eq!(ids(&again), ["gpus/a", "gpus/c"]);
    // Nor does another cluster get b while it rests; the error says why.
    let e = p.launch(&a100("two", 1)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.message.contains("resting after a loss"), "{e}");
    assert!(e.message.contains(": b"), "{e}");
    // Once the rest is over, b is a free host again.
    let lock = p.store.lock().unwrap();
    lock.rest(&store::file_name("gpus", "b"), now_ms().saturating_sub(1))
        .unwrap();
    drop(lock);
    assert_eq!(ids(&p.launch(&a100("two", 1)).await.unwrap()), ["gpus/b"]);
    // A plain release (down) rests nothing.
    p.terminate(&cluster("one")).await.unwrap();
    assert_eq!(
        ids(&p.launch(&a100("three", 2)).await.unwrap()),
        ["gpus/a", "gpus/c"]
    );
}

#[test]
fn a_host_with_a_drain_file_gives_notice_only_while_the_file_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool {
        name: "lab".into(),
        hosts: vec![Host {
            drain_file: Some(dir.path().join("drain").display().to_string()),
            ..host("a", 22)
        }],
    };
    let n = node(&pool, &pool.hosts[0]);
    let row = NodeRow {
        rank: 0,
        instance_id: n.id.0.clone(),
        private_ip: n.private_ip.clone(),
        public_ip: None,
        zone: n.placement.zone.clone(),
        topology: String::new(),
        state: "running".into(),
        extra: n.extra.clone(),
    };
    let probe = drain_probe(&row).expect("a host with a drain file is asked");
    let ask = || {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&probe)
            .output()
            .unwrap();
        assert!(out.status.success());
        gangway_provider::parse_notice(&String::from_utf8_lossy(&out.stdout))
    };
    assert_eq!(ask(), None);
    std::fs::write(dir.path().join("drain"), "disk swap at 14:00\nmore\n").unwrap();
    let notice = ask().expect("a notice while the file is there");
    assert!(
        notice.contains("draining") && notice.ends_with(": disk swap at 14:00"),
        "{notice}"
    );
    std::fs::write(dir.path().join("drain"), "").unwrap();
    assert!(ask().unwrap().ends_with(": no reason given"));
    // A host without one is never asked.
    let plain = node(&pool, &host("b", 22));
    let mut row2 = row.clone();
    row2.extra = plain.extra;
    assert_eq!(drain_probe(&row2), None);
}
