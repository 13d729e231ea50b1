//! Tests against real directories and real processes.

use std::collections::HashSet;
use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use gangway_provider::{
    ClusterName, ErrorKind, LaunchRequest, Node, NodeState, Placement, Provider, ProviderError,
};
use serde_json::{json, Value};

/// The `i`-th address (1-based) of the block this provider's home starts at.
fn addr(p: &LocalProvider, i: u32) -> String {
    let first = crate::store::first_address(p.root());
    std::net::Ipv4Addr::from(u32::from(first) + i - 1).to_string()
}

#[test]
fn homes_get_different_address_blocks() {
    let a = crate::store::first_address(Path::new("/home/a/.gangway/local"));
    let b = crate::store::first_address(Path::new("/home/b/.gangway/local"));
    assert_ne!(a, b);
    for f in [a, b] {
        assert_eq!(f.octets()[0], 127);
        assert_eq!(f.octets()[3], 1);
    }
}

use crate::store::{Layout, Record};
use crate::LocalProvider;

/// Generous: only ever waited out when something is broken.
const PATIENCE: Duration = Duration::from_secs(10);

fn req(cluster: &str, zone: &str, ty: &str, count: u32, cfg: Option<Value>) -> LaunchRequest {
    LaunchRequest {
        cluster: ClusterName(cluster.to_string()),
        owner: "tester".to_string(),
        placement: Placement {
            cloud: "local".to_string(),
            region: "local".to_string(),
            zone: zone.to_string(),
        },
        instance_type: ty.to_string(),
        count,
        use_spot: false,
        accelerator: None,
        disk_size_gib: None,
        image_id: None,
        client_token: format!("token-{cluster}"),
        provider_config: cfg,
        network_tier: None,
        max_price: None,
        ports: Vec::new(),
        labels: Default::default(),
    }
}

fn spot(mut r: LaunchRequest) -> LaunchRequest {
    r.use_spot = true;
    r
}

fn cluster(name: &str) -> ClusterName {
    ClusterName(name.to_string())
}

fn records(p: &LocalProvider) -> Vec<Record> {
    Layout {
        root: p.root().to_path_buf(),
    }
    .read_records()
    .unwrap()
}

fn dir_names(dir: &Path) -> Vec<String> {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn ids(nodes: &[Node]) -> Vec<String> {
    nodes.iter().map(|n| n.id.0.clone()).collect()
}

fn ips(nodes: &[Node]) -> Vec<String> {
    nodes.iter().map(|n| n.private_ip.clone()).collect()
}

fn index(n: &Node) -> u32 {
    n.extra["launch_index"].parse().unwrap()
}

fn expect_err(
    r: gangway_provider::Result<Vec<Node>>,
    kind: ErrorKind,
    needle: &str,
) -> ProviderError {
    let e = r.expect_err("expected an error");
    assert_eq!(e.kind, kind, "{e}");
    assert!(e.message.contains(needle), "{needle:?} not in: {e}");
    e
}

fn poll(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// A `sleep 1000` in its own process group, as gangway starts commands on a
/// node; killed and reaped on drop whatever happens.
struct Sleeper {
    child: Child,
    status: Option<ExitStatus>,
}

impl Sleeper {
    fn start() -> Sleeper {
        let child = Command::new("sleep")
            .arg("1000")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Sleeper {
            child,
            status: None,
        }
    }

    /// Registers its process group on `node`, as the caller does.
    fn register_on(&self, node: &Node) {
        let procs = PathBuf::from(&node.extra["procs"]);
        fs::write(procs.join(self.child.id().to_string()), b"").unwrap();
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    /// Waits (generously) for it to be killed by SIGKILL.
    fn assert_killed(&mut self) {
        assert!(
            poll(PATIENCE, || self.exited().is_some()),
            "process {} still alive",
            self.child.id()
        );
        assert_eq!(self.status.unwrap().signal(), Some(libc::SIGKILL));
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn fresh() -> (tempfile::TempDir, LocalProvider) {
    let tmp = tempfile::tempdir().unwrap();
    let p = LocalProvider::new(tmp.path().join("local"));
    (tmp, p)
}

/// A node's own port range in single-address mode.
fn port_range(n: &Node) -> (u16, u16) {
    gangway_provider::parse_port_range(&n.extra[gangway_provider::PORT_RANGE_FACT]).unwrap()
}

#[tokio::test]
async fn single_address_mode_gives_every_node_127_0_0_1_and_its_own_ports() {
    let (_tmp, p) = fresh();
    let single = || Some(json!({"addresses": "single"}));
    let nodes = p
        .launch(&req("c", "local-a", "local.gpu1", 3, single()))
        .await
        .unwrap();
    assert_eq!(ips(&nodes), vec!["127.0.0.1"; 3]);
    let ranges: Vec<(u16, u16)> = nodes.iter().map(port_range).collect();
    // Launch order, ranges ascending from this home's first one (wrapping
    // at the end of the ports ranges come from), never overlapping.
    let first = crate::store::first_port(p.root());
    assert_eq!(ranges[0].0, first);
    for (a, b) in ranges.iter().zip(&ranges[1..]) {
        assert_eq!(a.1 - a.0 + 1, crate::store::PORTS_PER_NODE);
        assert!(a.1 < b.0 || b.1 < a.0, "{ranges:?}");
    }
    // A second cluster in the same home gets ranges of its own.
    let other = p
        .launch(&req("d", "local-b", "local.cpu", 2, single()))
        .await
        .unwrap();
    let mut all: Vec<(u16, u16)> = ranges.clone();
    all.extend(other.iter().map(port_range));
    let starts: HashSet<u16> = all.iter().map(|r| r.0).collect();
    assert_eq!(starts.len(), 5, "{all:?}");
    // Stop and start keep each node's range; a relaunch returns the same.
    p.stop(&cluster("c")).await.unwrap();
    let started = p.start(&cluster("c"), None).await.unwrap();
    assert_eq!(started.iter().map(port_range).collect::<Vec<_>>(), ranges);
    let again = p
        .launch(&req("c", "local-a", "local.gpu1", 3, single()))
        .await
        .unwrap();
    assert_eq!(again.iter().map(port_range).collect::<Vec<_>>(), ranges);
    // A range whose first port another program holds is skipped.
    p.terminate(&cluster("d")).await.unwrap();
    let taken = std::net::TcpListener::bind((
        "127.0.0.1",
        other[0].extra[gangway_provider::PORT_RANGE_FACT]
            .split('-')
            .next()
            .unwrap()
            .parse::<u16>()
            .unwrap(),
    ));
    let e = p
        .launch(&req("e", "local-b", "local.cpu", 1, single()))
        .await
        .unwrap();
    if taken.is_ok() {
        assert_ne!(port_range(&e[0]), port_range(&other[0]));
    }
    // More task ports than a range holds: refused, naming the option.
    let mut r = req("f", "local-c", "local.cpu", 1, single());
    r.ports = vec![(8000, 8000 + crate::store::PORTS_PER_NODE)];
    expect_err(
        p.launch(&r).await,
        ErrorKind::InvalidRequest,
        "config.local.addresses",
    );
    assert!(p.describe(&cluster("f")).await.unwrap().is_empty());
    // A node with its own address carries no range.
    let own = p
        .launch(&req(
            "g",
            "local-c",
            "local.cpu",
            1,
            Some(json!({"addresses": "per-node"})),
        ))
        .await
        .unwrap();
    assert_ne!(own[0].private_ip, "127.0.0.1");
    assert!(!own[0].extra.contains_key(gangway_provider::PORT_RANGE_FACT));
    for c in ["c", "e", "g"] {
        p.terminate(&cluster(c)).await.unwrap();
    }
    assert!(records(&p).is_empty());
}

#[test]
fn auto_picks_single_address_where_only_127_0_0_1_answers() {
    use crate::{single_address, Addresses};
    let loopback = std::net::Ipv4Addr::new(127, 0, 10, 1);
    // 192.0.2.1 (TEST-NET-1) is on no interface of this machine, as
    // 127.0.10.1 is on none of a Mac's: the probe a macOS build makes
    // fails there and the launch goes single-address.
    let nowhere = std::net::Ipv4Addr::new(192, 0, 2, 1);
    assert!(single_address(Some(Addresses::Auto), nowhere));
    assert_eq!(
        single_address(Some(Addresses::Auto), loopback),
        !crate::store::answers_on(loopback)
    );
    if cfg!(target_os = "linux") {
        // Linux answers on the whole of 127.0.0.0/8.
        assert!(!single_address(Some(Addresses::Auto), loopback));
    }
    // The task's choice wins over the probe either way.
    assert!(single_address(Some(Addresses::Single), loopback));
    assert!(!single_address(Some(Addresses::PerNode), nowhere));
}

#[tokio::test]
async fn check_is_ok_with_one_region() {
    let (_tmp, p) = fresh();
    assert_eq!(p.name(), "local");
    let r = p.check().await.unwrap();
    assert!(r.ok);
    assert_eq!(r.regions, vec!["local".to_string()]);
    assert!(r.identity.is_some_and(|i| !i.is_empty()));
}

#[tokio::test]
async fn launch_gives_distinct_addresses_dirs_and_extras() {
    let (_tmp, p) = fresh();
    let per_node = Some(json!({"addresses": "per-node"}));
    let nodes = p
        .launch(&req("c", "local-b", "local.gpu2", 3, per_node))
        .await
        .unwrap();
    assert_eq!(nodes.len(), 3);
    let addrs: HashSet<String> = ips(&nodes).into_iter().collect();
    assert_eq!(addrs.len(), 3, "{addrs:?}");
    // Without a seed: launch order, addresses ascending from the home's block.
    assert_eq!(ips(&nodes), vec![addr(&p, 1), addr(&p, 2), addr(&p, 3)]);
    let root = p.root().to_path_buf();
    for (i, n) in nodes.iter().enumerate() {
        assert!(n.private_ip.starts_with("127."));
        assert!(
            n.id.0.starts_with("local-") && n.id.0.len() == 18,
            "{}",
            n.id
        );
        assert!(n.id.0[6..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(n.state, NodeState::Running);
        assert_eq!(n.public_ip, None);
        assert_eq!(
            n.placement,
            Placement {
                cloud: "local".into(),
                region: "local".into(),
                zone: "local-b".into()
            }
        );
        assert!(n.topology.is_empty());
        let keys: Vec<&str> = n.extra.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            vec![
                "dir",
                "env.CUDA_VISIBLE_DEVICES",
                "env.GANGWAY_METADATA_DIR",
                "gpus",
                "home",
                "instance_type",
                "launch_index",
                "procs"
            ]
        );
        let dir = root.join("nodes").join(&n.id.0);
        assert_eq!(PathBuf::from(&n.extra["dir"]), dir);
        assert_eq!(PathBuf::from(&n.extra["home"]), dir.join("home"));
        assert_eq!(PathBuf::from(&n.extra["procs"]), dir.join("procs"));
        assert_eq!(
            PathBuf::from(&n.extra["env.GANGWAY_METADATA_DIR"]),
            dir.join("metadata")
        );
        for sub in ["home", "procs", "metadata"] {
            assert!(dir.join(sub).is_dir(), "{}", dir.join(sub).display());
        }
        assert_eq!(n.extra["env.CUDA_VISIBLE_DEVICES"], "0,1");
        assert_eq!(n.extra["gpus"], "2");
        assert_eq!(n.extra["instance_type"], "local.gpu2");
        assert_eq!(n.extra["launch_index"], i.to_string());
        let rec: Value = serde_json::from_slice(
            &fs::read(root.join("instances/c").join(format!("{}.json", n.id))).unwrap(),
        )
        .unwrap();
        assert_eq!(rec["state"], "running");
        assert_eq!(rec["cluster"], "c");
        assert_eq!(rec["client_token"], "token-c");
        assert_eq!(rec["launch_index"], i);
    }
    let described = p.describe(&cluster("c")).await.unwrap();
    assert_eq!(ids(&described), ids(&nodes));

    // A CPU node announces no GPUs, and its address is the next free one.
    let cpu = p
        .launch(&req(
            "cpu",
            "local-a",
            "local.cpu",
            1,
            Some(json!({"addresses": "per-node"})),
        ))
        .await
        .unwrap();
    assert_eq!(cpu[0].extra["gpus"], "0");
    assert!(!cpu[0].extra.contains_key("env.CUDA_VISIBLE_DEVICES"));
    assert_eq!(cpu[0].extra.len(), 7);
    assert_eq!(cpu[0].private_ip, addr(&p, 4));
}

#[tokio::test]
async fn relaunch_reuses_and_creates_only_the_shortfall() {
    let (_tmp, p) = fresh();
    let first = p
        .launch(&req("c", "local-a", "local.gpu1", 3, None))
        .await
        .unwrap();
    let again = p
        .launch(&req("c", "local-a", "local.gpu1", 3, None))
        .await
        .unwrap();
    assert_eq!(ids(&again), ids(&first));
    assert_eq!(ips(&again), ips(&first));
    assert_eq!(records(&p).len(), 3);

    let more = p
        .launch(&req("c", "local-a", "local.gpu1", 4, None))
        .await
        .unwrap();
    assert_eq!(more.len(), 4);
    assert_eq!(ids(&more)[..3], ids(&first)[..]);
    assert_eq!(index(&more[3]), 3);
    assert_eq!(records(&p).len(), 4);
}

#[tokio::test]
async fn relaunch_elsewhere_is_refused() {
    let (_tmp, p) = fresh();
    p.launch(&req("c", "local-a", "local.gpu1", 1, None))
        .await
        .unwrap();
    expect_err(
        p.launch(&req("c", "local-b", "local.gpu1", 1, None)).await,
        ErrorKind::InvalidRequest,
        "cluster c already has nodes in local-a of type local.gpu1",
    );
    expect_err(
        p.launch(&req("c", "local-a", "local.gpu2", 1, None)).await,
        ErrorKind::InvalidRequest,
        "already has nodes in local-a of type local.gpu1",
    );
    assert_eq!(records(&p).len(), 1);
}

#[tokio::test]
async fn over_capacity_fails_and_creates_nothing() {
    let (_tmp, p) = fresh();
    let cfg = json!({"capacity": {"local-a": 2}});
    let e = expect_err(
        p.launch(&req("c", "local-a", "local.gpu8", 3, Some(cfg.clone())))
            .await,
        ErrorKind::Capacity,
        "zone local-a has capacity for 2 nodes (config.local.capacity); 0 in use, 3 asked for",
    );
    assert!(e.kind.fails_over());
    assert_eq!(e.location, "local/local-a");
    assert!(records(&p).is_empty());
    assert!(dir_names(&p.root().join("nodes")).is_empty());
    assert!(dir_names(&p.root().join("instances")).is_empty());
    // Zones not named keep the default.
    let nodes = p
        .launch(&req("c", "local-b", "local.gpu8", 3, Some(cfg)))
        .await
        .unwrap();
    assert_eq!(nodes.len(), 3);
}

#[tokio::test]
async fn capacity_counts_every_cluster_in_the_zone() {
    let (_tmp, p) = fresh();
    let cfg = || Some(json!({"capacity": 3}));
    p.launch(&req("a", "local-a", "local.cpu", 2, cfg()))
        .await
        .unwrap();
    expect_err(
        p.launch(&req("b", "local-a", "local.cpu", 2, cfg())).await,
        ErrorKind::Capacity,
        "2 in use, 2 asked for",
    );
    assert_eq!(records(&p).len(), 2);
    p.launch(&req("b", "local-a", "local.cpu", 1, cfg()))
        .await
        .unwrap();
    // Another zone has its own capacity.
    p.launch(&req("z", "local-c", "local.cpu", 3, cfg()))
        .await
        .unwrap();
    // Freed capacity is usable again; b's running node is reused.
    p.terminate(&cluster("a")).await.unwrap();
    let b = p
        .launch(&req("b", "local-a", "local.cpu", 3, cfg()))
        .await
        .unwrap();
    assert_eq!(b.len(), 3);
    // Stopped nodes free their slot.
    p.stop(&cluster("b")).await.unwrap();
    p.launch(&req("a", "local-a", "local.cpu", 3, cfg()))
        .await
        .unwrap();
    expect_err(
        p.launch(&req("b", "local-a", "local.cpu", 3, cfg())).await,
        ErrorKind::Capacity,
        "3 in use, 3 asked for",
    );
}

#[tokio::test]
async fn preempted_nodes_hold_no_capacity_and_are_replaced() {
    let (_tmp, p) = fresh();
    let cfg = json!({"capacity": 2, "preempt_after_s": 0});
    let first = p
        .launch(&spot(req(
            "a",
            "local-a",
            "local.gpu1",
            2,
            Some(cfg.clone()),
        )))
        .await
        .unwrap();
    for n in p.describe(&cluster("a")).await.unwrap() {
        assert!(
            matches!(n.state, NodeState::Preempted { .. }),
            "{:?}",
            n.state
        );
    }
    // Preempted nodes hold no capacity.
    p.launch(&req(
        "b",
        "local-a",
        "local.gpu1",
        2,
        Some(json!({"capacity": 2})),
    ))
    .await
    .unwrap();
    p.terminate(&cluster("b")).await.unwrap();
    // Relaunching replaces them: new ids, same launch indices, running.
    let second = p
        .launch(&spot(req(
            "a",
            "local-a",
            "local.gpu1",
            2,
            Some(json!({"capacity": 2})),
        )))
        .await
        .unwrap();
    assert_eq!(second.len(), 2);
    let old: HashSet<String> = ids(&first).into_iter().collect();
    assert!(ids(&second).iter().all(|id| !old.contains(id)));
    assert_eq!(second.iter().map(index).collect::<Vec<_>>(), vec![0, 1]);
    assert!(second.iter().all(|n| n.state == NodeState::Running));
    assert_eq!(records(&p).len(), 2);
    for id in &old {
        assert!(!p.root().join("nodes").join(id).exists());
    }
}

#[tokio::test]
async fn topology_follows_launch_index() {
    let (_tmp, p) = fresh();
    let topo = json!([
        "spine1/leaf1",
        "spine1/leaf2",
        "spine2/leaf3",
        "spine2/leaf4"
    ]);
    for (name, cfg) in [
        ("plain", json!({"topology": topo})),
        ("seeded", json!({"topology": topo, "seed": 11})),
    ] {
        let nodes = p
            .launch(&req(name, "local-a", "local.gpu1", 4, Some(cfg)))
            .await
            .unwrap();
        for n in &nodes {
            let i = index(n) as usize;
            let want: Vec<String> = topo[i]
                .as_str()
                .unwrap()
                .split('/')
                .map(str::to_string)
                .collect();
            assert_eq!(n.topology, want, "{name} node {i}");
        }
        let described = p.describe(&cluster(name)).await.unwrap();
        assert_eq!(described[2].topology, vec!["spine2", "leaf3"]);
    }
    expect_err(
        p.launch(&req(
            "short",
            "local-a",
            "local.gpu1",
            3,
            Some(json!({"topology": ["s/l1", "s/l2"]})),
        ))
        .await,
        ErrorKind::InvalidRequest,
        "config.local.topology",
    );
    assert!(p.describe(&cluster("short")).await.unwrap().is_empty());
}

#[tokio::test]
async fn seed_shuffles_order_and_addresses_deterministically() {
    const SEED: u64 = 20_240_601;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (_tmp, p) = fresh();
        let nodes = p
            .launch(&req(
                "c",
                "local-a",
                "local.gpu1",
                6,
                Some(json!({"seed": SEED, "addresses": "per-node"})),
            ))
            .await
            .unwrap();
        // Addresses as offsets into this home's block, so two homes compare.
        let first = u32::from(crate::store::first_address(p.root()));
        let seen: Vec<(u32, String)> = nodes
            .iter()
            .map(|n| {
                let a: std::net::Ipv4Addr = n.private_ip.parse().unwrap();
                (index(n), format!("{:03}", u32::from(a) - first + 1))
            })
            .collect();
        // describe is never shuffled.
        let described = p.describe(&cluster("c")).await.unwrap();
        assert_eq!(
            described.iter().map(index).collect::<Vec<_>>(),
            (0..6).collect::<Vec<_>>()
        );
        // A relaunch hands back the same nodes in the same shuffled order.
        let again = p
            .launch(&req(
                "c",
                "local-a",
                "local.gpu1",
                6,
                Some(json!({"seed": SEED, "addresses": "per-node"})),
            ))
            .await
            .unwrap();
        assert_eq!(ids(&again), ids(&nodes));
        runs.push(seen);
    }
    assert_eq!(runs[0], runs[1], "same seed, same result");
    let seen = &runs[0];
    let order: Vec<u32> = seen.iter().map(|s| s.0).collect();
    assert_ne!(
        order,
        (0..6).collect::<Vec<_>>(),
        "nodes come back shuffled"
    );
    let mut by_index = seen.clone();
    by_index.sort();
    let addr_order: Vec<String> = by_index.iter().map(|s| s.1.clone()).collect();
    let mut ascending = addr_order.clone();
    ascending.sort();
    assert_ne!(addr_order, ascending, "addresses are not in launch order");
    let want: Vec<String> = (1..=6).map(|i| format!("{i:03}")).collect();
    assert_eq!(ascending, want);
}

#[tokio::test]
async fn bad_requests_are_invalid_and_create_nothing() {
    let (_tmp, p) = fresh();
    let cases: Vec<(LaunchRequest, &str)> = vec![
        (
            req(
                "c",
                "local-a",
                "local.cpu",
                1,
                Some(json!({"capacity": 2, "bogus": 1})),
            ),
            "config.local.bogus",
        ),
        (
            req(
                "c",
                "local-a",
                "local.cpu",
                1,
                Some(json!({"capacity": "many"})),
            ),
            "config.local.capacity",
        ),
        (
            req("c", "local-a", "local.cpu", 1, Some(json!({"seed": -3}))),
            "config.local.seed",
        ),
        (
            req(
                "c",
                "local-a",
                "local.cpu",
                1,
                Some(json!({"preempt_after_s": "soon"})),
            ),
            "config.local.preempt_after_s",
        ),
        (req("c", "local-a", "local.gpu3", 1, None), "local.gpu8"),
        (
            req("c", "local-z", "local.cpu", 1, None),
            "local-a, local-b, local-c",
        ),
        (
            req("c", "local-a", "local.cpu", 0, None),
            "at least one node",
        ),
    ];
    for (r, needle) in cases {
        expect_err(p.launch(&r).await, ErrorKind::InvalidRequest, needle);
    }
    let e = expect_err(
        p.launch(&req(
            "c",
            "local-a",
            "local.cpu",
            1,
            Some(json!({"bogus": 1})),
        ))
        .await,
        ErrorKind::InvalidRequest,
        "capacity, topology, seed, preempt_after_s, notice_s",
    );
    assert!(!e.kind.fails_over());
    let mut wrong_region = req("c", "local-a", "local.cpu", 1, None);
    wrong_region.placement.region = "us-east-1".into();
    expect_err(
        p.launch(&wrong_region).await,
        ErrorKind::InvalidRequest,
        "us-east-1",
    );
    assert!(records(&p).is_empty());
}

#[tokio::test]
async fn terminate_kills_registered_processes_and_removes_everything() {
    let (_tmp, p) = fresh();
    // Nothing there yet: not even the root.
    p.terminate(&cluster("c")).await.unwrap();
    assert!(p.describe(&cluster("c")).await.unwrap().is_empty());

    let nodes = p
        .launch(&req("c", "local-a", "local.cpu", 2, None))
        .await
        .unwrap();
    let other = p
        .launch(&req("other", "local-a", "local.cpu", 1, None))
        .await
        .unwrap();
    let mut sleeper = Sleeper::start();
    sleeper.register_on(&nodes[1]);
    let mut bystander = Sleeper::start();
    bystander.register_on(&other[0]);

    p.terminate(&cluster("c")).await.unwrap();
    sleeper.assert_killed();
    for n in &nodes {
        assert!(!Path::new(&n.extra["dir"]).exists());
        assert!(!p
            .root()
            .join("instances/c")
            .join(format!("{}.json", n.id))
            .exists());
    }
    assert!(p.describe(&cluster("c")).await.unwrap().is_empty());
    // Other clusters are untouched.
    assert_eq!(p.describe(&cluster("other")).await.unwrap().len(), 1);
    thread::sleep(Duration::from_millis(200));
    assert!(bystander.exited().is_none());
    p.terminate(&cluster("c")).await.unwrap();

    // Freed addresses are handed out again.
    let again = p
        .launch(&req("c", "local-a", "local.cpu", 2, None))
        .await
        .unwrap();
    assert_eq!(ips(&again), ips(&nodes));
}

#[tokio::test]
async fn terminate_cleans_up_after_a_killed_caller() {
    let (_tmp, p) = fresh();
    let nodes = p
        .launch(&req("c", "local-a", "local.cpu", 3, None))
        .await
        .unwrap();
    let root = p.root().to_path_buf();
    // What a caller killed mid-way can leave: a record whose directory is
    // gone, a node directory without a record (with a process registered
    // in it), a temporary record file.
    fs::remove_dir_all(&nodes[2].extra["dir"]).unwrap();
    let orphan = root.join("nodes").join("local-0123456789ab");
    fs::create_dir_all(orphan.join("procs")).unwrap();
    let mut stray = Sleeper::start();
    fs::write(orphan.join("procs").join(stray.child.id().to_string()), b"").unwrap();
    fs::write(
        root.join("instances/c")
            .join(".local-0123456789ab.json.tmp"),
        b"{",
    )
    .unwrap();

    // describe still tells the truth about the records.
    assert_eq!(p.describe(&cluster("c")).await.unwrap().len(), 3);
    p.terminate(&cluster("c")).await.unwrap();
    assert!(dir_names(&root.join("instances")).is_empty());
    assert!(dir_names(&root.join("nodes")).is_empty());
    stray.assert_killed();
}

#[tokio::test]
async fn relaunch_repairs_a_missing_node_directory() {
    let (_tmp, p) = fresh();
    let nodes = p
        .launch(&req("c", "local-a", "local.cpu", 2, None))
        .await
        .unwrap();
    fs::remove_dir_all(&nodes[0].extra["dir"]).unwrap();
    let again = p
        .launch(&req("c", "local-a", "local.cpu", 2, None))
        .await
        .unwrap();
    assert_eq!(ids(&again), ids(&nodes));
    assert!(Path::new(&again[0].extra["home"]).is_dir());
}

#[tokio::test]
async fn spot_market_posts_notices_then_preempts() {
    let (_tmp, p) = fresh();
    let cfg = json!({"preempt_after_s": 1, "notice_s": 0.5});
    let nodes = p
        .launch(&spot(req("c", "local-a", "local.gpu1", 2, Some(cfg))))
        .await
        .unwrap();
    let recs = records(&p);
    assert_eq!(recs.len(), 2);
    assert!(recs
        .iter()
        .all(|r| r.market_pid.is_some() && r.market_pid == recs[0].market_pid));
    let r = &recs[0];
    assert_eq!(r.preempt_at_ms.unwrap() - r.created_ms, 1000);
    assert_eq!(r.preempt_at_ms.unwrap() - r.notice_at_ms.unwrap(), 500);

    let mut sleepers: Vec<Sleeper> = nodes
        .iter()
        .map(|n| {
            let s = Sleeper::start();
            s.register_on(n);
            s
        })
        .collect();
    for n in &nodes {
        let md = PathBuf::from(&n.extra["env.GANGWAY_METADATA_DIR"]);
        assert!(
            poll(PATIENCE, || md.join("preempted").exists()
                && md.join("spot-instance-action").exists()),
            "no notice in {}",
            md.display()
        );
        assert_eq!(fs::read_to_string(md.join("preempted")).unwrap(), "TRUE");
        let action: Value =
            serde_json::from_str(&fs::read_to_string(md.join("spot-instance-action")).unwrap())
                .unwrap();
        assert_eq!(action["action"], "terminate");
        let time = action["time"].as_str().unwrap();
        assert_eq!(time.len(), 20, "{time}");
        assert!(time.ends_with('Z') && time.as_bytes()[10] == b'T', "{time}");
    }
    for s in &mut sleepers {
        s.assert_killed();
    }
    for n in &nodes {
        assert!(dir_names(Path::new(&n.extra["procs"])).is_empty());
    }
    let described = p.describe(&cluster("c")).await.unwrap();
    assert_eq!(described.len(), 2);
    for n in described {
        match n.state {
            NodeState::Preempted { reason } => assert_eq!(
                reason,
                "spot capacity reclaimed by the local market (preempt_after_s=1)"
            ),
            other => panic!("expected preempted, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn terminate_kills_a_pending_market() {
    let (_tmp, p) = fresh();
    p.launch(&spot(req(
        "c",
        "local-a",
        "local.cpu",
        1,
        Some(json!({"preempt_after_s": 120})),
    )))
    .await
    .unwrap();
    let pid = records(&p)[0].market_pid.unwrap();
    let alive = || {
        fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.windows(20).any(|w| w == b"gangway-local-market"))
    };
    assert!(alive());
    p.terminate(&cluster("c")).await.unwrap();
    assert!(poll(PATIENCE, || !alive()), "market {pid} still running");
}

#[tokio::test]
async fn on_demand_is_never_preempted() {
    let (_tmp, p) = fresh();
    let cfg = json!({"preempt_after_s": 0.1, "notice_s": 0});
    let nodes = p
        .launch(&req("c", "local-a", "local.cpu", 1, Some(cfg)))
        .await
        .unwrap();
    let mut sleeper = Sleeper::start();
    sleeper.register_on(&nodes[0]);
    thread::sleep(Duration::from_millis(1500));
    assert!(sleeper.exited().is_none(), "on-demand process was killed");
    let n = &p.describe(&cluster("c")).await.unwrap()[0];
    assert_eq!(n.state, NodeState::Running);
    assert!(dir_names(Path::new(&n.extra["env.GANGWAY_METADATA_DIR"])).is_empty());
    let r = &records(&p)[0];
    assert_eq!((r.preempt_at_ms, r.market_pid), (None, None));
}

#[tokio::test]
async fn stop_then_start_keeps_nodes_and_cancels_preemption() {
    let (_tmp, p) = fresh();
    // Nothing there: stop is a no-op, start is refused.
    p.stop(&cluster("c")).await.unwrap();
    expect_err(
        p.start(&cluster("c"), None).await,
        ErrorKind::InvalidRequest,
        "no cluster c",
    );

    let cfg = json!({"preempt_after_s": 1});
    let nodes = p
        .launch(&spot(req("c", "local-a", "local.gpu4", 2, Some(cfg))))
        .await
        .unwrap();
    let mut sleeper = Sleeper::start();
    sleeper.register_on(&nodes[0]);
    p.stop(&cluster("c")).await.unwrap();
    sleeper.assert_killed();
    let stopped = p.describe(&cluster("c")).await.unwrap();
    assert!(stopped.iter().all(|n| n.state == NodeState::Stopped));
    assert!(records(&p)
        .iter()
        .all(|r| r.preempt_at_ms.is_none() && r.market_pid.is_none()));
    assert!(Path::new(&nodes[0].extra["home"]).is_dir(), "disk is kept");

    let started = p.start(&cluster("c"), None).await.unwrap();
    assert_eq!(ids(&started), ids(&nodes));
    assert_eq!(ips(&started), ips(&nodes));
    assert!(started.iter().all(|n| n.state == NodeState::Running));
    let mut survivor = Sleeper::start();
    survivor.register_on(&started[1]);
    // Past the cancelled preemption time, nothing happens.
    thread::sleep(Duration::from_millis(2000));
    assert!(survivor.exited().is_none());
    let now = p.describe(&cluster("c")).await.unwrap();
    assert!(now.iter().all(|n| n.state == NodeState::Running));
    assert!(dir_names(Path::new(&now[1].extra["env.GANGWAY_METADATA_DIR"])).is_empty());

    // A launch starts stopped nodes instead of creating new ones.
    p.stop(&cluster("c")).await.unwrap();
    let relaunched = p
        .launch(&req("c", "local-a", "local.gpu4", 2, None))
        .await
        .unwrap();
    assert_eq!(ids(&relaunched), ids(&nodes));
    assert!(relaunched.iter().all(|n| n.state == NodeState::Running));
    assert_eq!(records(&p).len(), 2);
}

#[test]
fn concurrent_launches_share_capacity_atomically() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("local");
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = ["left", "right"]
        .into_iter()
        .map(|name| {
            let root = root.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                let p = LocalProvider::new(root);
                barrier.wait();
                rt.block_on(p.launch(&req(
                    name,
                    "local-a",
                    "local.cpu",
                    2,
                    Some(json!({"capacity": 3})),
                )))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1, "{results:?}");
    let err = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert_eq!(err.kind, ErrorKind::Capacity, "{err}");
    assert!(err.message.contains("2 in use, 2 asked for"), "{err}");
    let p = LocalProvider::new(root);
    assert_eq!(records(&p).len(), 2);
}

#[test]
fn relative_roots_become_absolute() {
    let p = LocalProvider::new("some/relative/root");
    assert!(p.root().is_absolute());
    assert!(p.root().ends_with("some/relative/root"));
}

#[test]
fn kill_registered_spares_junk_and_removes_registrations() {
    let tmp = tempfile::tempdir().unwrap();
    let procs = tmp.path().join("procs");
    fs::create_dir(&procs).unwrap();
    let mut s = Sleeper::start();
    fs::write(procs.join(s.child.id().to_string()), b"").unwrap();
    for junk in ["0", "1", "-1", "notes"] {
        fs::write(procs.join(junk), b"").unwrap();
    }
    // Our own process group must never be killed, even if registered.
    // SAFETY: no preconditions.
    let own = unsafe { libc::getpgrp() };
    fs::write(procs.join(own.to_string()), b"").unwrap();
    crate::kill_registered(&procs);
    s.assert_killed();
    let mut left = dir_names(&procs);
    left.sort();
    assert_eq!(left, vec!["notes"]);
    crate::kill_registered(&tmp.path().join("missing"));
}

#[tokio::test]
async fn start_honours_the_capacity_the_cluster_was_launched_with() {
    let (_tmp, p) = fresh();
    let cfg = json!({"capacity": {"local-a": 2}});
    p.launch(&req("a", "local-a", "local.cpu", 2, Some(cfg.clone())))
        .await
        .unwrap();
    p.stop(&cluster("a")).await.unwrap();
    // While `a` is stopped its capacity is free, and `b` takes one node of it.
    p.launch(&req("b", "local-a", "local.cpu", 1, Some(cfg.clone())))
        .await
        .unwrap();
    expect_err(
        p.start(&cluster("a"), Some(&cfg)).await,
        ErrorKind::Capacity,
        "capacity for 2 nodes",
    );
    // Without the limit (the default 256) it fits.
    assert_eq!(p.start(&cluster("a"), None).await.unwrap().len(), 2);
}

#[tokio::test]
async fn preemptions_follow_the_schedule_launch_by_launch() {
    let (_tmp, p) = fresh();
    let cfg = json!({"preemptions": [{"after_s": 60, "notice_s": 10}, {"after_s": 30}]});
    let launch = |token: &str| {
        let mut r = spot(req("s", "local-a", "local.cpu", 1, Some(cfg.clone())));
        r.client_token = token.to_string();
        r
    };
    let first = p.launch(&launch("s-0")).await.unwrap();
    let r = &records(&p)[0];
    let after = r.preempt_at_ms.unwrap() - r.created_ms;
    assert!((59_000..=61_000).contains(&after), "{after}");
    assert_eq!(r.preempt_at_ms.unwrap() - r.notice_at_ms.unwrap(), 10_000);
    // A retried launch of the same cluster is not a new launch.
    let again = p.launch(&launch("s-0")).await.unwrap();
    assert_eq!(ids(&again), ids(&first));
    p.terminate(&cluster("s")).await.unwrap();
    // Made again with the same token (a controller killed mid-launch and
    // restarted tries its launch again): still the first launch.
    p.launch(&launch("s-0")).await.unwrap();
    let r = &records(&p)[0];
    assert_eq!(r.preempt_at_ms.unwrap() - r.notice_at_ms.unwrap(), 10_000);
    p.terminate(&cluster("s")).await.unwrap();
    p.launch(&launch("s-1")).await.unwrap();
    let r = &records(&p)[0];
    assert_eq!(r.preempt_at_ms.unwrap() - r.notice_at_ms.unwrap(), 0);
    p.terminate(&cluster("s")).await.unwrap();
    // Past the schedule: no more preemptions.
    p.launch(&launch("s-2")).await.unwrap();
    assert_eq!(records(&p)[0].preempt_at_ms, None);
    p.terminate(&cluster("s")).await.unwrap();
}

#[tokio::test]
async fn a_preemption_without_notice_posts_no_notice() {
    let (_tmp, p) = fresh();
    let cfg = json!({"preempt_after_s": 0.5});
    let nodes = p
        .launch(&spot(req("q", "local-a", "local.cpu", 1, Some(cfg))))
        .await
        .unwrap();
    let mut sleeper = Sleeper::start();
    sleeper.register_on(&nodes[0]);
    sleeper.assert_killed();
    let meta = Path::new(&nodes[0].extra["env.GANGWAY_METADATA_DIR"]).to_path_buf();
    assert!(dir_names(&meta).is_empty(), "{:?}", dir_names(&meta));
    p.terminate(&cluster("q")).await.unwrap();
}

#[tokio::test]
async fn records_of_an_earlier_layout_are_moved_into_their_clusters_directory() {
    let (_tmp, p) = fresh();
    let nodes = p
        .launch(&req("old", "local-a", "local.cpu", 2, None))
        .await
        .unwrap();
    let root = p.root().to_path_buf();
    // As an earlier version left them: records directly in instances/.
    for n in &nodes {
        let from = root.join("instances/old").join(format!("{}.json", n.id));
        fs::rename(&from, root.join("instances").join(format!("{}.json", n.id))).unwrap();
    }
    fs::remove_dir(root.join("instances/old")).unwrap();
    fs::remove_file(root.join("layout")).unwrap();
    // describe finds them (moving them first), and nothing else is listed.
    assert_eq!(p.describe(&cluster("old")).await.unwrap().len(), 2);
    assert_eq!(dir_names(&root.join("instances")), ["old"]);
    assert!(p.describe(&cluster("other")).await.unwrap().is_empty());
    p.terminate(&cluster("old")).await.unwrap();
    assert!(dir_names(&root.join("instances")).is_empty());
}

/// The row the core keeps for a node, as the transport is handed it.
fn row(n: &Node, rank: u32) -> gangway_provider::NodeRow {
    gangway_provider::NodeRow {
        rank,
        instance_id: n.id.0.clone(),
        private_ip: n.private_ip.clone(),
        public_ip: None,
        zone: n.placement.zone.clone(),
        topology: n.topology.join("/"),
        state: "running".into(),
        extra: n.extra.clone(),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_job_is_signalled_only_while_its_own_group_lives() {
    use gangway_provider::{NodeCommand, Transport};
    let (_tmp, p) = fresh();
    let nodes = p
        .launch(&req("sig", "local-a", "local.cpu", 1, None))
        .await
        .unwrap();
    let node = row(&nodes[0], 0);
    let t = crate::LocalTransport::default();
    let (_out, w) = std::io::pipe().unwrap();
    let cmd = NodeCommand {
        script: "sleep 1000 & wait".into(),
        env: vec![("GANGWAY_RUN".into(), "5".into())],
        cwd: "~".into(),
        task_view: true,
    };
    let proc_ = t.spawn(&node, &cmd, w).unwrap();
    let pgid = proc_.id();
    let reg = PathBuf::from(&nodes[0].extra["procs"]).join(pgid.to_string());
    assert_eq!(fs::read_to_string(&reg).unwrap(), "GANGWAY_RUN=5\n");
    // Another job's id: left alone.
    t.signal_job(&node, pgid, 6, libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        unsafe { libc::kill(-(pgid as i32), 0) },
        0,
        "group {pgid} was hit"
    );
    // Its own: the whole group gets the signal.
    t.signal_job(&node, pgid, 5, libc::SIGTERM);
    let status = tokio::time::timeout(PATIENCE, proc_.wait())
        .await
        .expect("the job ended")
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert!(poll(PATIENCE, || !crate::held::is_held(&reg)));

    // A group id the system handed to someone else after the job's group
    // ended: the registration is still there (its driver died before it
    // could forget it) but nothing holds its lock, so nothing is signalled.
    let mut stranger = Sleeper::start();
    let stale = PathBuf::from(&nodes[0].extra["procs"]).join(stranger.child.id().to_string());
    fs::write(&stale, "GANGWAY_RUN=7\n").unwrap();
    t.signal_job(&node, stranger.child.id(), 7, libc::SIGKILL);
    thread::sleep(Duration::from_millis(200));
    assert!(stranger.exited().is_none(), "a stranger's group was killed");
    fs::remove_file(&stale).unwrap();
    p.terminate(&cluster("sig")).await.unwrap();
}

/// Runs `script` as a task's (or, `task_view` false, gangway's own)
/// command on `node`; its exit code and output.
#[cfg(target_os = "linux")]
async fn run_on(
    t: &crate::LocalTransport,
    node: &gangway_provider::NodeRow,
    script: &str,
    task_view: bool,
) -> (i32, String) {
    use gangway_provider::{NodeCommand, Transport};
    use std::io::Read;
    let (mut out, w) = std::io::pipe().unwrap();
    let cmd = NodeCommand {
        script: script.into(),
        env: Vec::new(),
        cwd: "~".into(),
        task_view,
    };
    let child = t.spawn(node, &cmd, w).unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("the command ended")
        .unwrap();
    (status.code().unwrap_or(-1), reader.join().unwrap())
}

/// A task's absolute paths are where it wrote them for its own commands:
/// one the machine lacks (`/<name>`), one under a directory the machine
/// has (`/tmp/<name>/`), one over a file the machine has (`/etc/hostname`),
/// while the machine's own stay untouched; what a command creates beside
/// them is the node's, kept for its next command; gangway's own commands
/// see the machine as it is.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "current_thread")]
async fn a_tasks_absolute_paths_are_where_it_wrote_them() {
    let usable = crate::view::usable().map_err(|why| format!("no mount namespace here: {why}"));
    let Some(()) = gangway_test::skip::gate("local", usable) else {
        return;
    };
    let (_tmp, p) = fresh();
    let nodes = p
        .launch(&req("view", "local-a", "local.cpu", 1, None))
        .await
        .unwrap();
    let node = row(&nodes[0], 0);
    let dir = PathBuf::from(&nodes[0].extra["dir"]);
    let top = format!("gw-view-{}", std::process::id());
    let root = dir.join("root");
    fs::create_dir_all(root.join(&top).join("sub")).unwrap();
    fs::write(root.join(&top).join("sub/x"), "mine\n").unwrap();
    fs::create_dir_all(root.join("tmp").join(&top)).unwrap();
    fs::write(root.join("tmp").join(&top).join("y"), "under tmp\n").unwrap();
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::write(root.join("etc/hostname"), "node-own\n").unwrap();
    let host_hostname = fs::read_to_string("/etc/hostname").ok();

    let t = crate::LocalTransport::default();
    let (code, out) = run_on(
        &t,
        &node,
        &format!(
            "cat /{top}/sub/x /tmp/{top}/y /etc/hostname && echo made > /{top}/made \
             && echo kept > /top-{top} && ls / | grep -c '^proc$'"
        ),
        true,
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "mine\nunder tmp\nnode-own\n1\n");
    // Written through to the node's copy; nothing appeared on the machine.
    assert_eq!(
        fs::read_to_string(root.join(&top).join("made")).unwrap(),
        "made\n"
    );
    assert!(!Path::new(&format!("/{top}")).exists());
    assert!(!Path::new(&format!("/top-{top}")).exists());
    assert!(!Path::new(&format!("/tmp/{top}")).exists());
    assert_eq!(fs::read_to_string("/etc/hostname").ok(), host_hostname);
    // The next command finds what the last one made beside the paths.
    let (code, out) = run_on(&t, &node, &format!("cat /top-{top} /{top}/made"), true).await;
    assert_eq!((code, out.as_str()), (0, "kept\nmade\n"));
    // gangway's own commands see the machine.
    let (code, out) = run_on(&t, &node, &format!("test -e /{top} || echo absent"), false).await;
    assert_eq!((code, out.as_str()), (0, "absent\n"));
    assert!(gangway_provider::Transport::take_notes(&t).is_empty());
    p.terminate(&cluster("view")).await.unwrap();
    assert!(!dir.exists());
    assert_eq!(fs::read_to_string("/etc/hostname").ok(), host_hostname);
}

/// The same for a user who is not root (a laptop's): the namespace comes
/// with a user namespace mapping the user to itself. Run as `nobody`, by
/// this test binary run again under `setpriv`.
#[cfg(target_os = "linux")]
#[test]
fn a_tasks_absolute_paths_are_where_it_wrote_them_for_a_user_who_is_not_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Not root: the test above already ran as such a user.
        gangway_test::skip::ran("local");
        return;
    }
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(setpriv) = setpriv else {
        gangway_test::skip::skipped("local", "no setpriv (util-linux) to run as another user");
        return;
    };
    let me = std::env::current_exe().unwrap();
    let out = Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&me)
        .args([
            "--exact",
            "tests::a_tasks_absolute_paths_are_where_it_wrote_them",
            "--nocapture",
        ])
        .env("HOME", "/tmp")
        .env("TMPDIR", "/tmp")
        .env_remove("GANGWAY_SUITE_LOG")
        .env_remove("GANGWAY_REQUIRE_SUITES")
        .current_dir("/")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success()
        && text.contains("Permission denied")
        && text.contains(&*me.to_string_lossy())
    {
        gangway_test::skip::skipped(
            "local",
            format!("nobody cannot run this test binary ({})", me.display()),
        );
        return;
    }
    assert!(out.status.success(), "{text}");
    if let Some(line) = text.lines().find(|l| l.starts_with("SKIPPED")) {
        gangway_test::skip::skipped("local", format!("as nobody: {line}"));
        return;
    }
    gangway_test::skip::ran("local");
    assert!(text.contains("test result: ok. 1 passed"), "{text}");
}

/// A task path under a directory the machine has, whose own name the
/// machine lacks (`/root/<name>`): that level alone is mirrored, in the
/// node's `view/` (not under its `root/`, which a path through a directory
/// named `root` once led to).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "current_thread")]
async fn a_path_under_an_existing_directory_mirrors_only_that_level() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        gangway_test::skip::skipped("local", "/root can be listed by root only");
        return;
    }
    let usable = crate::view::usable().map_err(|why| format!("no mount namespace here: {why}"));
    let Some(()) = gangway_test::skip::gate("local", usable) else {
        return;
    };
    let (_tmp, p) = fresh();
    let nodes = p
        .launch(&req("under", "local-a", "local.cpu", 1, None))
        .await
        .unwrap();
    let node = row(&nodes[0], 0);
    let dir = PathBuf::from(&nodes[0].extra["dir"]);
    let name = format!("gw-under-{}", std::process::id());
    fs::create_dir_all(dir.join("root/root").join(&name)).unwrap();
    fs::write(dir.join("root/root").join(&name).join("x"), "mine\n").unwrap();
    let t = crate::LocalTransport::default();
    let (code, out) = run_on(
        &t,
        &node,
        &format!("cat /root/{name}/x && ls / | grep -c '^proc$'"),
        true,
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "mine\n1\n"));
    assert!(dir.join("view/root/root").join(&name).is_dir());
    assert!(
        !dir.join("root/view").exists(),
        "a mirror under the node's root/"
    );
    assert!(!Path::new("/root").join(&name).exists());
    p.terminate(&cluster("under")).await.unwrap();
}
