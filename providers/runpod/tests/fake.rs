//! The provider against the RunPod fake (tests/emulators/runpod, its REST
//! v2 face), without the binary: launch, describe, failover errors,
//! all-or-nothing, sweeps and teardown, spot pods rented through its
//! GraphQL face and preempted, with the fake's request checks at zero
//! violations. The pods are not reachable (no sshd here); the
//! binary's suite (`tests/it/runpod.rs`) runs commands on them.

use std::path::Path;

use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, NodeState, Placement, Provider};
use gangway_runpod::key::ApiKey;
use gangway_runpod::RunpodProvider;

const OWNER: &str = "gw-00112233445566aa";

use gangway_test::gpu_fake::GpuCloudFake as Fake;

/// The fake on a free port, or `None` (said as a skip) without python3.
fn fake() -> Option<Fake> {
    match Fake::start("runpod", "0.2", &[]) {
        Ok(f) => Some(f),
        Err(why) => {
            gangway_test::skip::skipped("runpod", why);
            None
        }
    }
}

/// The fake's pods.
fn pods(fake: &Fake) -> Vec<serde_json::Value> {
    fake.state()["pods"].as_array().cloned().unwrap_or_default()
}

const PUBLIC_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayTestKeyGangwayTestKeyGangwayTestK t";

fn provider(fake: &Fake, dir: &Path, owner: &str) -> RunpodProvider {
    let key = dir.join("id_ed25519.pub");
    std::fs::write(&key, format!("{PUBLIC_KEY}\n")).unwrap();
    RunpodProvider::new(dir.join("records"), owner, key)
        .with_user("tester")
        .with_api(&fake.url, ApiKey::new("test-key"), 0.01)
}

fn request(cluster: &str, ty: &str, dc: &str, count: u32) -> LaunchRequest {
    LaunchRequest {
        cluster: ClusterName(cluster.into()),
        owner: OWNER.into(),
        placement: Placement {
            cloud: "runpod".into(),
            region: dc.into(),
            zone: dc.into(),
        },
        instance_type: ty.into(),
        count,
        use_spot: false,
        accelerator: None,
        disk_size_gib: None,
        image_id: None,
        client_token: "t".into(),
        provider_config: Some(serde_json::json!({"poll_ms": 50, "boot_timeout_s": 20})),
        network_tier: None,
        max_price: None,
        ports: Vec::new(),
        labels: Default::default(),
    }
}

#[tokio::test]
async fn a_gang_launches_in_one_data_center_reconciles_and_terminates_leaving_nothing() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    let check = p.check().await.unwrap();
    assert!(check.ok, "{check:?}");
    assert!(check.regions.iter().any(|r| r == "US-KS-2"), "{check:?}");

    let req = request("gang", "1x_A100-80GB_SECURE", "US-KS-2", 2);
    let nodes = p.launch(&req).await.unwrap();
    assert_eq!(nodes.len(), 2);
    for n in &nodes {
        assert_eq!(n.state, NodeState::Running);
        assert_eq!(n.placement.zone, "US-KS-2");
        assert_eq!(n.extra["ssh.user"], "root");
        assert!(n.extra["ssh.port"].parse::<u16>().is_ok());
        // The gang is on RunPod's private network: the ranks' addresses.
        assert!(n.private_ip.starts_with("10."), "{n:?}");
    }
    for pod in pods(&fake) {
        let v2 = &pod["_v2"];
        assert_eq!(v2["env"]["PUBLIC_KEY"], PUBLIC_KEY, "{pod}");
        assert_eq!(v2["env"]["GANGWAY_TAG_OWNER"], OWNER, "{pod}");
        assert_eq!(v2["globalNetworking"]["enabled"], true, "{pod}");
        assert_eq!(v2["ports"], serde_json::json!(["22/tcp"]), "{pod}");
    }
    // Again: the same nodes, nothing created.
    let again = p.launch(&req).await.unwrap();
    let ids = |v: &[gangway_provider::Node]| v.iter().map(|n| n.id.0.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&again), ids(&nodes));
    assert_eq!(ids(&p.describe(&req.cluster).await.unwrap()), ids(&nodes));

    // Another owner's sweep sees ours by tag; it never terminates them.
    let other = provider(&fake, dir.path(), "gw-ffeeddccbbaa9988");
    let seen = other.clusters().await.unwrap();
    assert!(
        seen.iter()
            .any(|t| t.name.0 == "gang" && t.owner == OWNER && t.user.as_deref() == Some("tester")),
        "{seen:?}"
    );
    other.terminate(&req.cluster).await.unwrap();
    assert_eq!(p.describe(&req.cluster).await.unwrap().len(), 2);

    // A pod stopped behind gangway's back reads as lost.
    let first = nodes[0].id.0.clone();
    fake.control(
        "POST",
        "/_fake/preempt",
        serde_json::json!({"id": first, "force": true}),
    );
    let seen = p.describe(&req.cluster).await.unwrap();
    assert!(
        seen.iter()
            .any(|n| n.id.0 == first && matches!(n.state, NodeState::Preempted { .. })),
        "{seen:?}"
    );

    p.terminate(&req.cluster).await.unwrap();
    assert!(p.describe(&req.cluster).await.unwrap().is_empty());
    p.terminate(&req.cluster).await.unwrap();
    assert_eq!(fake.leaks(), (0, 0));
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}

#[tokio::test]
async fn no_room_fails_over_and_a_half_created_gang_is_undone() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    // No H100s in this data center at all.
    let e = p
        .launch(&request("none", "1x_H100_SECURE", "US-KS-2", 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.message.contains("no longer any instances"), "{e}");
    assert!(!e.to_string().contains("test-key"), "{e}");

    // Room for one of three pods: the one is terminated, the error is
    // capacity.
    fake.control(
        "POST",
        "/_fake/capacity",
        serde_json::json!({"gpuTypeId": "NVIDIA L40S", "dataCenterId": "US-KS-2", "cloudType": "SECURE", "gpus": 1}),
    );
    let req = request("half", "1x_L40S_SECURE", "US-KS-2", 3);
    let e = p.launch(&req).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(p.describe(&req.cluster).await.unwrap().is_empty());
    assert!(pods(&fake).is_empty(), "{:?}", pods(&fake));

    // Throttling is retried, not an error.
    fake.control(
        "POST",
        "/_fake/create-failure",
        serde_json::json!({"api": "v2", "status": 429, "message": "rate limit exceeded for the minute window", "times": 2}),
    );
    let ok = p
        .launch(&request("r", "1x_RTX4090_SECURE", "EU-RO-1", 1))
        .await
        .unwrap();
    assert_eq!(ok.len(), 1);
    for c in ["none", "half", "r"] {
        p.terminate(&ClusterName(c.into())).await.unwrap();
    }
    assert_eq!(fake.leaks(), (0, 0));
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}

#[tokio::test]
async fn a_wrong_key_is_an_auth_error_that_never_shows_the_key() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k.pub");
    std::fs::write(&key, "ssh-ed25519 AAAA t\n").unwrap();
    let p = RunpodProvider::new(dir.path().join("r"), OWNER, key).with_api(
        &fake.url,
        ApiKey::new("secret_wrong_key_123"),
        0.01,
    );
    let c = p.check().await.unwrap();
    assert!(!c.ok);
    let hint = c.hint.unwrap_or_default();
    assert!(
        hint.contains("401") && !hint.contains("secret_wrong"),
        "{hint}"
    );
    let e = p.describe(&ClusterName("x".into())).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth);
    assert!(!format!("{e:?}").contains("secret_wrong"));
}

fn spot(cluster: &str, ty: &str, dc: &str, count: u32) -> LaunchRequest {
    LaunchRequest {
        use_spot: true,
        ..request(cluster, ty, dc, count)
    }
}

/// The fake's pod `id`.
fn pod(fake: &Fake, id: &str) -> serde_json::Value {
    pods(fake)
        .into_iter()
        .find(|p| p["id"] == id)
        .unwrap_or_default()
}

#[tokio::test]
async fn spot_pods_are_rented_through_graphql_at_the_spot_price_and_an_interrupted_one_is_replaced()
{
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    let req = spot("sp", "1x_A100-80GB_SECURE", "US-KS-2", 1);
    let nodes = p.launch(&req).await.unwrap();
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n.state, NodeState::Running);
    assert_eq!(n.extra["market"], "spot");
    assert_eq!(n.extra["ssh.user"], "root");
    assert_eq!(n.placement.zone, "US-KS-2");
    let first = pod(&fake, &n.id.0);
    // Bid the secure cloud's spot price per GPU ($0.70), not its $1.39.
    assert_eq!(first["interruptible"], true, "{first}");
    assert_eq!(first["_bid"], 0.7, "{first}");
    let env = &first["_v2"]["env"];
    assert_eq!(env["GANGWAY_TAG_MARKET"], "spot", "{first}");
    assert_eq!(env["GANGWAY_TAG_OWNER"], OWNER, "{first}");
    assert!(env["PUBLIC_KEY"]
        .as_str()
        .unwrap_or_default()
        .starts_with("ssh-ed25519"));
    assert_eq!(
        first["_v2"]["ports"],
        serde_json::json!(["22/tcp"]),
        "{first}"
    );
    assert_eq!(first["_v2"]["name"], "sp-0", "{first}");

    // Launching again keeps it; an on-demand launch of the cluster does not
    // take a spot pod for its own.
    let again = p.launch(&req).await.unwrap();
    assert_eq!(again[0].id, n.id);

    // RunPod interrupts it: v2 shows it EXITED, gangway preempted.
    fake.control("POST", "/_fake/preempt", serde_json::json!({"id": n.id.0}));
    let seen = p.describe(&req.cluster).await.unwrap();
    match &seen[0].state {
        NodeState::Preempted { reason } => {
            assert!(reason.contains("interrupted spot pod"), "{reason}")
        }
        s => panic!("{s:?}"),
    }
    // The recovery's launch terminates it and rents another.
    let next = p.launch(&req).await.unwrap();
    assert_ne!(next[0].id, n.id);
    assert_eq!(pods(&fake).len(), 1, "{:?}", pods(&fake));
    assert_eq!(next[0].extra["market"], "spot");

    // A cap under the spot price per GPU is no capacity, and asks nothing.
    let capped = LaunchRequest {
        max_price: Some(1.0),
        ..spot("cap", "2x_A100-80GB_SECURE", "US-KS-2", 1)
    };
    let e = p.launch(&capped).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.message.contains("max_hourly_cost"), "{e}");
    // No spot H100 in US-KS-2: RunPod's capacity words, which fail over.
    let e = p
        .launch(&spot("none", "1x_H100_SECURE", "US-KS-2", 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.message.contains("no longer any instances"), "{e}");
    assert!(!e.to_string().contains("test-key"), "{e}");
    // A throttled rent is retried.
    fake.control(
        "POST",
        "/_fake/create-failure",
        serde_json::json!({"api": "graphql", "status": 429, "message": "slow down", "times": 2}),
    );
    let ok = p
        .launch(&spot("r", "1x_RTX4090_SECURE", "EU-RO-1", 1))
        .await
        .unwrap();
    assert_eq!(ok[0].extra["market"], "spot");
    assert_eq!(pod(&fake, &ok[0].id.0)["_bid"], 0.35);
    for c in ["sp", "cap", "none", "r"] {
        p.terminate(&ClusterName(c.into())).await.unwrap();
    }
    assert_eq!(fake.leaks(), (0, 0));
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}

#[tokio::test]
async fn a_spot_gang_is_all_or_nothing_and_refused_where_its_ranks_could_not_meet() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    // No global networking through GraphQL: a gang of spot pods says why.
    let e = p
        .launch(&spot("g", "1x_A100-80GB_SECURE", "US-KS-2", 2))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    assert!(e.message.contains("global networking"), "{e}");
    assert!(pods(&fake).is_empty());

    // Asked to meet on public addresses: two pods, or none.
    let public = |cluster: &str, ty: &str, n: u32| LaunchRequest {
        provider_config: Some(
            serde_json::json!({"poll_ms": 50, "boot_timeout_s": 20, "global_networking": false}),
        ),
        ..spot(cluster, ty, "US-KS-2", n)
    };
    let nodes = p
        .launch(&public("g", "1x_A100-80GB_SECURE", 2))
        .await
        .unwrap();
    assert_eq!(nodes.len(), 2);
    assert!(nodes.iter().all(|n| n.extra["market"] == "spot"));
    fake.control(
        "POST",
        "/_fake/capacity",
        serde_json::json!({"gpuTypeId": "NVIDIA L40S", "dataCenterId": "US-KS-2", "cloudType": "SECURE", "gpus": 1}),
    );
    let half = public("half", "1x_L40S_SECURE", 3);
    let e = p.launch(&half).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(p.describe(&half.cluster).await.unwrap().is_empty());
    for c in ["g", "half"] {
        p.terminate(&ClusterName(c.into())).await.unwrap();
    }
    assert_eq!(fake.leaks(), (0, 0));
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}
