//! The AWS provider against the EC2 emulator (moto plus gangway's fault
//! layer, `tests/emulators/ec2`): every call goes through the real SDK over
//! HTTP, and every check is an independent `Describe*` call.

mod common;

use gangway_test::ec2_emulator;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use ec2_emulator::{values, Ec2Emulator};
use gangway_aws::AwsProvider;
use gangway_provider::{
    ClusterName, ErrorKind, LaunchRequest, NodeState, Placement, Provider, TaggedCluster,
};
use serde_json::json;

const REGION: &str = "us-east-1";

/// A provider of its own (owner, records, key) for one test.
struct Fixture {
    emu: &'static Ec2Emulator,
    p: AwsProvider,
    /// The emulator's SDK configuration, for more providers.
    p_conf: aws_config::SdkConfig,
    owner: String,
    dir: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn fixture(test: &str) -> Option<Fixture> {
    let emu = Ec2Emulator::shared()?;
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("gw-aws-{test}-{}-{n}", std::process::id()));
    let conf = common::sdk_config(emu, REGION).await;
    let owner = format!("owner-{test}-{}-{n}", std::process::id());
    let p = common::provider(&dir, &owner, &conf);
    Some(Fixture {
        emu,
        p,
        p_conf: conf,
        owner,
        dir,
    })
}

fn request(cluster: &str, zone: &str, count: u32, spot: bool) -> LaunchRequest {
    LaunchRequest {
        cluster: ClusterName(cluster.into()),
        owner: "ignored".into(),
        placement: Placement {
            cloud: "aws".into(),
            region: REGION.into(),
            zone: zone.into(),
        },
        instance_type: "p4d.24xlarge".into(),
        count,
        use_spot: spot,
        accelerator: Some(("A100".into(), 8.0)),
        disk_size_gib: Some(300),
        image_id: None,
        client_token: format!("tok-{cluster}"),
        provider_config: Some(json!({
            // moto's images are 2017's: name one of them.
            "ami_name": "Deep Learning AMI Ubuntu*",
            "ami_owner": "898082745236",
            "ssh_cidr": "203.0.113.7/32",
            "poll_ms": 20,
            "boot_timeout_s": 30,
        })),
        network_tier: None,
        max_price: Some(40.0),
        ports: vec![(8888, 8888)],
        labels: BTreeMap::from([("team".to_string(), "ml".to_string())]),
    }
}

/// Independent look: the cluster's live instances by tag.
fn live_instances(emu: &Ec2Emulator, cluster: &str, owner: &str) -> String {
    let (status, xml) = emu.call(
        REGION,
        &[
            ("Action", "DescribeInstances"),
            ("Filter.1.Name", "tag:gangway-cluster"),
            ("Filter.1.Value.1", cluster),
            ("Filter.2.Name", "tag:gangway-owner"),
            ("Filter.2.Value.1", owner),
            ("Filter.3.Name", "instance-state-name"),
            ("Filter.3.Value.1", "pending"),
            ("Filter.3.Value.2", "running"),
            ("Filter.3.Value.3", "stopping"),
            ("Filter.3.Value.4", "stopped"),
        ],
    );
    assert_eq!(status, 200, "{xml}");
    xml
}

fn tagged(emu: &Ec2Emulator, action: &str, cluster: &str, owner: &str) -> String {
    let (status, xml) = emu.call(
        REGION,
        &[
            ("Action", action),
            ("Filter.1.Name", "tag:gangway-cluster"),
            ("Filter.1.Value.1", cluster),
            ("Filter.2.Name", "tag:gangway-owner"),
            ("Filter.2.Value.1", owner),
        ],
    );
    assert_eq!(status, 200, "{action}: {xml}");
    xml
}

fn instance_ids(xml: &str) -> Vec<String> {
    let mut ids: Vec<String> = values(xml, "instanceId")
        .into_iter()
        .filter(|i| i.starts_with("i-"))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

fn assert_nothing_left(emu: &Ec2Emulator, cluster: &str, owner: &str) {
    let inst = live_instances(emu, cluster, owner);
    assert!(instance_ids(&inst).is_empty(), "instances left: {inst}");
    let sg = tagged(emu, "DescribeSecurityGroups", cluster, owner);
    assert!(
        values(&sg, "groupId").is_empty(),
        "security groups left: {sg}"
    );
    let pg = tagged(emu, "DescribePlacementGroups", cluster, owner);
    assert!(
        values(&pg, "groupName").is_empty(),
        "placement groups left: {pg}"
    );
    let kp = tagged(emu, "DescribeKeyPairs", cluster, owner);
    assert!(values(&kp, "keyName").is_empty(), "key pairs left: {kp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_gang_is_created_tagged_reused_and_removed_without_a_trace() {
    let Some(f) = fixture("gang").await else {
        return;
    };
    let req = request("gang4", "us-east-1b", 4, true);
    let nodes = f.p.launch(&req).await.expect("launch");
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().all(|n| n.state == NodeState::Running));
    assert!(nodes.iter().all(|n| n.placement.zone == "us-east-1b"));
    assert!(nodes.iter().all(|n| n.extra["market"] == "spot"));
    assert!(nodes
        .iter()
        .all(|n| n.extra.get("ssh.host") == n.public_ip.as_ref()));
    assert!(nodes.iter().all(|n| n.extra["ssh.user"] == "ubuntu"));

    // Independent checks of everything launch made.
    let xml = live_instances(f.emu, "gang4", &f.owner);
    let ids = instance_ids(&xml);
    assert_eq!(ids.len(), 4, "{xml}");
    let mut got: Vec<String> = nodes.iter().map(|n| n.id.0.clone()).collect();
    got.sort();
    assert_eq!(got, ids);
    assert_eq!(
        values(&xml, "instanceType")
            .iter()
            .filter(|t| *t == "p4d.24xlarge")
            .count(),
        4
    );
    assert_eq!(
        values(&xml, "instanceLifecycle")
            .iter()
            .filter(|t| *t == "spot")
            .count(),
        4,
        "{xml}"
    );
    let name = values(&xml, "keyName");
    assert!(
        name.iter().all(|k| k.starts_with("gangway-gang4-")),
        "{name:?}"
    );
    assert!(
        xml.contains("<key>team</key>") && xml.contains("<value>ml</value>"),
        "labels are tags"
    );
    let groups = values(&xml, "groupName");
    assert!(
        groups.iter().any(|g| g.starts_with("gangway-gang4-")),
        "placement/security group: {groups:?}"
    );

    let sg = tagged(f.emu, "DescribeSecurityGroups", "gang4", &f.owner);
    assert_eq!(
        values(&sg, "groupId")
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        1,
        "{sg}"
    );
    assert!(
        sg.contains("203.0.113.7/32"),
        "ssh only from the caller: {sg}"
    );
    assert!(
        sg.contains("<fromPort>8888</fromPort>"),
        "task ports opened: {sg}"
    );
    let own_group = values(&sg, "groupId")[0].clone();
    assert!(
        values(&sg, "groupId")
            .iter()
            .filter(|g| **g == own_group)
            .count()
            >= 2,
        "the group admits its own members: {sg}"
    );
    let pg = tagged(f.emu, "DescribePlacementGroups", "gang4", &f.owner);
    assert_eq!(values(&pg, "strategy"), vec!["cluster"], "{pg}");
    let kp = tagged(f.emu, "DescribeKeyPairs", "gang4", &f.owner);
    assert_eq!(values(&kp, "keyName").len(), 1, "{kp}");

    // Topology: the four nodes sit under two leaf switches, in pairs.
    let paths = f.p.topology(&nodes).await.unwrap();
    assert!(paths.iter().all(|p| p.len() == 3), "{paths:?}");
    let leaves: std::collections::BTreeSet<&String> = paths.iter().map(|p| &p[2]).collect();
    assert_eq!(leaves.len(), 2, "{paths:?}");

    // Launching again is a reconcile: the same four instances.
    let again = f.p.launch(&req).await.expect("relaunch");
    let mut again_ids: Vec<String> = again.iter().map(|n| n.id.0.clone()).collect();
    again_ids.sort();
    assert_eq!(again_ids, ids);
    assert_eq!(
        instance_ids(&live_instances(f.emu, "gang4", &f.owner)).len(),
        4
    );

    // One node lost: the relaunch creates just the shortfall.
    let (s, body) = f.emu.call(
        REGION,
        &[("Action", "TerminateInstances"), ("InstanceId.1", &ids[0])],
    );
    assert_eq!(s, 200, "{body}");
    let healed = f.p.launch(&req).await.expect("heal");
    assert_eq!(healed.len(), 4);
    let now = instance_ids(&live_instances(f.emu, "gang4", &f.owner));
    assert_eq!(now.len(), 4);
    assert_eq!(
        now.iter().filter(|i| ids.contains(i)).count(),
        3,
        "three kept, one new"
    );

    f.p.terminate(&req.cluster).await.expect("terminate");
    assert_nothing_left(f.emu, "gang4", &f.owner);
    // Idempotent, and describe sees nothing.
    f.p.terminate(&req.cluster).await.expect("second terminate");
    assert!(f.p.describe(&req.cluster).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_errors_become_the_failover_loops_kinds() {
    let Some(f) = fixture("errors").await else {
        return;
    };
    for (cluster, code, kind) in [
        (
            "err-cap",
            "InsufficientInstanceCapacity",
            ErrorKind::Capacity,
        ),
        (
            "err-host",
            "InsufficientCapacityOnHost",
            ErrorKind::Capacity,
        ),
        ("err-bid", "SpotMaxPriceTooLow", ErrorKind::Capacity),
        ("err-zone", "Unsupported", ErrorKind::Capacity),
        ("err-spot", "MaxSpotInstanceCountExceeded", ErrorKind::Quota),
        ("err-vcpu", "VcpuLimitExceeded", ErrorKind::Quota),
        ("err-lim", "InstanceLimitExceeded", ErrorKind::Quota),
        ("err-thr", "RequestLimitExceeded", ErrorKind::Transient),
        ("err-auth", "UnauthorizedOperation", ErrorKind::Auth),
    ] {
        f.emu.inject("RunInstances", &[cluster], code, "", 1);
        let req = request(cluster, "us-east-1a", 2, true);
        let e = f.p.launch(&req).await.expect_err(code);
        assert_eq!(e.kind, kind, "{code}: {e}");
        assert_eq!(e.provider, "aws");
        assert_eq!(e.location, "us-east-1/us-east-1a", "{e}");
        assert!(
            e.message.contains(code) && e.message.contains("RunInstances"),
            "{e}"
        );
        assert!(
            !e.to_string().contains("testing"),
            "no credentials in errors: {e}"
        );
        // Nothing was created by the refused call; the groups and key made
        // before it go with terminate (a half-created cluster).
        assert!(instance_ids(&live_instances(f.emu, cluster, &f.owner)).is_empty());
        assert!(!values(
            &tagged(f.emu, "DescribeSecurityGroups", cluster, &f.owner),
            "groupId"
        )
        .is_empty());
        f.p.terminate(&req.cluster)
            .await
            .expect("terminate half-created");
        assert_nothing_left(f.emu, cluster, &f.owner);
    }
    assert!(f.emu.fired("RunInstances", "InsufficientInstanceCapacity") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_reclaim_is_reported_as_a_preemption() {
    let Some(f) = fixture("reclaim").await else {
        return;
    };
    let req = request("reclaim", "us-east-1c", 2, true);
    let nodes = f.p.launch(&req).await.expect("launch");
    f.emu.interrupt(REGION, &nodes[1].id.0);
    let seen = f.p.describe(&req.cluster).await.unwrap();
    let lost = seen
        .iter()
        .find(|n| n.id == nodes[1].id)
        .expect("reclaimed node still listed");
    match &lost.state {
        NodeState::Preempted { reason } => {
            assert!(
                reason.contains("Server.SpotInstanceTermination"),
                "{reason}"
            )
        }
        other => panic!("expected a preemption, got {other:?}"),
    }
    let kept = seen.iter().find(|n| n.id == nodes[0].id).unwrap();
    assert_eq!(kept.state, NodeState::Running);
    // A relaunch replaces the reclaimed node.
    let back = f.p.launch(&req).await.expect("relaunch");
    assert_eq!(back.len(), 2);
    assert!(back.iter().any(|n| n.id == nodes[0].id));
    assert!(!back.iter().any(|n| n.id == nodes[1].id));
    f.p.terminate(&req.cluster).await.unwrap();
    assert_nothing_left(f.emu, "reclaim", &f.owner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_nodes_stop_and_start_but_spot_ones_refuse() {
    let Some(f) = fixture("stop").await else {
        return;
    };
    let req = request("stopper", "us-east-1a", 2, false);
    let nodes = f.p.launch(&req).await.expect("launch");
    assert!(nodes.iter().all(|n| n.extra["market"] == "on-demand"));
    f.p.stop(&req.cluster).await.expect("stop");
    let seen = f.p.describe(&req.cluster).await.unwrap();
    assert!(
        seen.iter().all(|n| n.state == NodeState::Stopped),
        "{seen:?}"
    );
    let back =
        f.p.start(&req.cluster, req.provider_config.as_ref())
            .await
            .expect("start");
    assert_eq!(back.len(), 2);
    assert!(back.iter().all(|n| n.state == NodeState::Running));
    f.p.terminate(&req.cluster).await.unwrap();

    let spot = request("stopper-spot", "us-east-1a", 1, true);
    f.p.launch(&spot).await.expect("launch spot");
    let e = f.p.stop(&spot.cluster).await.expect_err("spot stop");
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.message.contains("cannot be stopped"), "{e}");
    f.p.terminate(&spot.cluster).await.unwrap();
    assert_nothing_left(f.emu, "stopper", &f.owner);
    assert_nothing_left(f.emu, "stopper-spot", &f.owner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_sweep_finds_clusters_whose_records_were_lost() {
    let Some(f) = fixture("sweep").await else {
        return;
    };
    let req = request("orphan", "us-east-1d", 1, true);
    f.p.launch(&req).await.expect("launch");
    // The local record is gone (a lost state directory).
    std::fs::remove_dir_all(f.dir.join("aws")).unwrap();
    assert!(f.p.describe(&req.cluster).await.unwrap().is_empty());
    // The sweep lists every owner's clusters with their tags; this
    // owner's is there once, with the user tag next to the owner.
    let found = f.p.clusters().await.expect("sweep");
    let ours: Vec<&TaggedCluster> = found.iter().filter(|c| c.owner == f.owner).collect();
    assert_eq!(
        ours,
        vec![&TaggedCluster {
            name: ClusterName("orphan".into()),
            owner: f.owner.clone(),
            user: Some("tester".into()),
        }],
        "{found:?}"
    );
    f.p.terminate(&req.cluster)
        .await
        .expect("terminate what the sweep found");
    assert_nothing_left(f.emu, "orphan", &f.owner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_of_one_cluster_name_never_touch_each_others() {
    let (Some(a), Some(b)) = (fixture("twin").await, fixture("twin").await) else {
        return;
    };
    let req = request("twin", "us-east-1b", 1, true);
    a.p.launch(&req).await.expect("launch a");
    b.p.launch(&req).await.expect("launch b");
    let found = a.p.clusters().await.expect("sweep");
    for owner in [&a.owner, &b.owner] {
        assert_eq!(
            found
                .iter()
                .filter(|c| c.name.0 == "twin" && &c.owner == owner)
                .count(),
            1,
            "{found:?}"
        );
    }
    a.p.terminate(&req.cluster).await.expect("terminate a");
    assert_nothing_left(a.emu, "twin", &a.owner);
    let left = live_instances(b.emu, "twin", &b.owner);
    assert_eq!(instance_ids(&left).len(), 1, "b's cluster is gone: {left}");
    let sg = tagged(b.emu, "DescribeSecurityGroups", "twin", &b.owner);
    assert_eq!(values(&sg, "groupName").len(), 1, "{sg}");
    b.p.terminate(&req.cluster).await.expect("terminate b");
    assert_nothing_left(b.emu, "twin", &b.owner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_recorded_before_owner_ids_is_still_found_by_its_user_tag() {
    let Some(f) = fixture("legacy").await else {
        return;
    };
    // What an earlier version made: the user's name as owner, and a
    // record without an owner.
    let user = format!("{}-user", f.owner);
    let key = f.dir.join("id_ed25519.pub");
    let conf = f.p_conf.clone();
    let old = AwsProvider::new(f.dir.join("aws"), user.clone(), key.clone()).with_sdk_config(conf);
    let req = request("before-ids", "us-east-1c", 1, true);
    old.launch(&req).await.expect("launch");
    let rec = f.dir.join("aws/clusters/before-ids.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&rec).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("owner");
    std::fs::write(&rec, serde_json::to_vec(&v).unwrap()).unwrap();
    // This version, same home, its own id: without the earlier owner it
    // sees nothing of the cluster; with it, the cluster is found and goes.
    let id_only = AwsProvider::new(f.dir.join("aws"), "gw-00000000000000aa", key.clone())
        .with_sdk_config(f.p_conf.clone());
    assert!(id_only.describe(&req.cluster).await.unwrap().is_empty());
    let upgraded = AwsProvider::new(f.dir.join("aws"), "gw-00000000000000aa", key)
        .with_sdk_config(f.p_conf.clone())
        .with_legacy_owner(user.clone());
    assert_eq!(upgraded.describe(&req.cluster).await.unwrap().len(), 1);
    upgraded.terminate(&req.cluster).await.expect("terminate");
    assert_nothing_left(f.emu, "before-ids", &user);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prices_come_from_offerings_spot_history_and_the_price_list() {
    let Some(f) = fixture("prices").await else {
        return;
    };
    let prices =
        f.p.prices(
            &["p4d.24xlarge".to_string(), "no-such.type".to_string()],
            &[REGION.to_string()],
        )
        .await
        .expect("prices");
    // Every quoted zone sells p4d, so every one has its on-demand price
    // (the Price List API's): nothing to note.
    assert!(prices.notes.is_empty(), "{:?}", prices.notes);
    let quotes = prices.quotes;
    assert!(!quotes.is_empty());
    assert!(quotes
        .iter()
        .all(|q| q.instance_type == "p4d.24xlarge" && q.region == REGION));
    assert!(quotes
        .iter()
        .all(|q| q.zone.as_deref().is_some_and(|z| z.starts_with(REGION))));
    assert!(quotes.iter().any(|q| q.spot_price.is_some()), "{quotes:?}");
    let on_demand = f.emu.on_demand_price("p4d.24xlarge", REGION);
    assert!(
        quotes.iter().all(|q| q.price == Some(on_demand)),
        "on-demand prices from the Price List API: {quotes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_and_images_are_named() {
    let Some(f) = fixture("bad").await else {
        return;
    };
    let mut req = request("badcfg", "us-east-1a", 1, false);
    req.provider_config = Some(json!({"ssh_usr": "x"}));
    let e = f.p.launch(&req).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.message.contains("config.aws.ssh_usr"), "{e}");
    let mut req = request("badimg", "us-east-1a", 1, false);
    req.image_id = Some("docker:pytorch".into());
    let e = f.p.launch(&req).await.unwrap_err();
    assert!(e.message.contains("not an AMI id"), "{e}");
    f.p.terminate(&req.cluster).await.unwrap();
    assert_nothing_left(f.emu, "badimg", &f.owner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_network_asks_for_efa_interfaces() {
    let Some(f) = fixture("efa").await else {
        return;
    };
    let mut req = request("hpc-net", "us-east-1a", 1, false);
    req.network_tier = Some("best".into());
    req.provider_config = Some(json!({
        "ami_name": "Deep Learning AMI Ubuntu*", "ami_owner": "898082745236",
        "ssh_cidr": "203.0.113.7/32", "poll_ms": 20, "boot_timeout_s": 30,
        "use_internal_ips": true,
    }));
    // moto drops InterfaceType, so the request itself is checked: a rule
    // that only matches a RunInstances carrying `efa` interfaces on the
    // first and the fourth network card (p4d has four) fires.
    let probe = |cluster: &str| {
        json!({
            "action": "RunInstances", "contains": [cluster],
            "code": "InvalidParameterCombination", "message": "probe",
            "params": {
                "NetworkInterface.1.InterfaceType": "efa",
                "NetworkInterface.4.InterfaceType": "efa",
            },
        })
    };
    f.emu.inject_rule(&probe("hpc-net"));
    let e = f.p.launch(&req).await.expect_err("the probe rule fires");
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    assert!(e.message.contains("probe"), "{e}");
    let nodes = f.p.launch(&req).await.expect("launch");
    // Reached on the private address: several interfaces get no public one.
    assert_eq!(nodes[0].extra.get("ssh.host"), Some(&nodes[0].private_ip));
    let xml = live_instances(f.emu, "hpc-net", &f.owner);
    assert!(values(&xml, "networkInterfaceId").len() >= 2, "{xml}");
    f.p.terminate(&req.cluster).await.unwrap();
    assert_nothing_left(f.emu, "hpc-net", &f.owner);
    // Reached on public addresses: one EFA interface, with a public address.
    let mut public = request("hpc-pub", "us-east-1a", 1, false);
    public.network_tier = Some("best".into());
    let id = f.emu.inject_rule(&json!({
        "action": "RunInstances", "contains": ["hpc-pub"],
        "code": "InvalidParameterCombination", "message": "probe",
        "params": {"NetworkInterface.2.InterfaceType": "efa"},
    }));
    let nodes = f.p.launch(&public).await.expect("one EFA interface only");
    assert_eq!(nodes[0].extra.get("ssh.host"), nodes[0].public_ip.as_ref());
    f.emu.remove_fault(id);
    f.emu.inject_rule(&json!({
        "action": "RunInstances", "contains": ["hpc-pub"],
        "code": "InvalidParameterCombination", "message": "probe",
        "params": {
            "NetworkInterface.1.InterfaceType": "efa",
            "NetworkInterface.1.AssociatePublicIpAddress": "true",
        },
    }));
    f.p.terminate(&public.cluster).await.unwrap();
    let e =
        f.p.launch(&public)
            .await
            .expect_err("EFA with a public address");
    assert!(e.message.contains("probe"), "{e}");
    f.p.terminate(&public.cluster).await.unwrap();
    assert_nothing_left(f.emu, "hpc-pub", &f.owner);
    // Without the tier, the same type gets the plain single interface.
    let plain = request("hpc-plain", "us-east-1a", 1, false);
    let id = f.emu.inject_rule(&probe("hpc-plain"));
    if let Err(e) = f.p.launch(&plain).await {
        panic!("no EFA was asked for, yet: {e}");
    }
    f.emu.remove_fault(id);
    f.p.terminate(&plain.cluster).await.unwrap();
    assert_nothing_left(f.emu, "hpc-plain", &f.owner);
}
