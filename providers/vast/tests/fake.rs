//! The provider against the Vast.ai fake (tests/emulators/vast), without the binary: launch, describe, failover errors,
//! all-or-nothing, sweeps and teardown, with the fake's request checks at
//! zero violations. The instances are not reachable (no sshd here).

use std::path::Path;

use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, NodeState, Placement, Provider};
use gangway_vast::key::ApiKey;
use gangway_vast::VastProvider;

const OWNER: &str = "gw-00112233445566aa";

use gangway_test::gpu_fake::GpuCloudFake as Fake;

/// The fake on a free port, or `None` (said as a skip) without python3.
fn fake() -> Option<Fake> {
    match Fake::start("vast", "0.2", &[]) {
        Ok(f) => Some(f),
        Err(why) => {
            gangway_test::skip::skipped("vast", why);
            None
        }
    }
}

/// The fake's instances.
fn instances(fake: &Fake) -> Vec<serde_json::Value> {
    fake.state()["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn provider(fake: &Fake, dir: &Path, owner: &str) -> VastProvider {
    let key = dir.join("id_ed25519.pub");
    std::fs::write(
        &key,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayTestKey t\n",
    )
    .unwrap();
    VastProvider::new(dir.join("records"), owner, key)
        .with_user("tester")
        .with_api(&fake.url, ApiKey::new("test-key"), 0.01)
}

fn request(cluster: &str, ty: &str, country: &str, spot: bool) -> LaunchRequest {
    LaunchRequest {
        cluster: ClusterName(cluster.into()),
        owner: OWNER.into(),
        placement: Placement {
            cloud: "vast".into(),
            region: country.into(),
            zone: country.into(),
        },
        instance_type: ty.into(),
        count: 1,
        use_spot: spot,
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
async fn on_demand_and_interruptible_rentals_reconcile_an_outbid_is_a_preemption_and_down_leaves_nothing(
) {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    let check = p.check().await.unwrap();
    assert!(check.ok, "{check:?}");
    assert!(check.regions.iter().any(|r| r == "US"), "{check:?}");

    let req = request("od", "1x_RTX_4090", "US", false);
    let nodes = p.launch(&req).await.unwrap();
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n.state, NodeState::Running);
    assert_eq!(n.extra["ssh.user"], "root");
    assert_eq!(n.extra["market"], "on-demand");
    assert_eq!(n.placement.region, "US");
    let again = p.launch(&req).await.unwrap();
    assert_eq!(again[0].id, n.id);

    // Interruptible: a bid at the offer's minimum, then outbid.
    let spot = request("bid", "1x_L40S", "US", true);
    let nodes = p.launch(&spot).await.unwrap();
    assert_eq!(nodes[0].extra["market"], "spot");
    let id = nodes[0].id.0.clone();
    let inst = instances(&fake)
        .into_iter()
        .find(|i| i["id"].as_u64().map(|x| x.to_string()).as_deref() == Some(id.as_str()))
        .unwrap();
    assert_eq!(inst["is_bid"], true, "{inst}");
    assert_eq!(inst["dph_total"], 0.30, "{inst}");
    assert!(inst["label"].as_str().unwrap().starts_with(OWNER), "{inst}");
    fake.control("POST", "/_fake/outbid", serde_json::json!({"id": id}));
    let seen = p.describe(&spot.cluster).await.unwrap();
    match &seen[0].state {
        NodeState::Preempted { reason } => assert!(reason.contains("outbid"), "{reason}"),
        s => panic!("{s:?}"),
    }

    // Another owner's sweep sees ours by label; it never destroys them.
    let other = provider(&fake, dir.path(), "gw-ffeeddccbbaa9988");
    let seen = other.clusters().await.unwrap();
    assert!(
        seen.iter()
            .any(|t| t.name.0 == "od" && t.owner == OWNER && t.user.as_deref() == Some("tester")),
        "{seen:?}"
    );
    other.terminate(&req.cluster).await.unwrap();
    assert_eq!(p.describe(&req.cluster).await.unwrap().len(), 1);

    for c in [&req.cluster, &spot.cluster] {
        p.terminate(c).await.unwrap();
        assert!(p.describe(c).await.unwrap().is_empty());
    }
    assert_eq!(fake.leaks(), (0, 0));
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}

#[tokio::test]
async fn no_offer_or_a_gone_one_is_no_capacity_and_leaves_nothing() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    // No H100 machine for rent in the US; a gang needs one location.
    let e = p
        .launch(&request("none", "8x_H100_SXM", "US", false))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    let mut two = request("two", "1x_RTX_5090", "US", false);
    two.count = 2;
    let e = p.launch(&two).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(instances(&fake).is_empty());

    // The only offer is gone: no capacity, nothing left.
    fake.control(
        "POST",
        "/_fake/offer",
        serde_json::json!({"id": 41003, "gone": true}),
    );
    let e = p
        .launch(&request("gone", "1x_RTX_5090", "US", false))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    fake.control(
        "POST",
        "/_fake/offer",
        serde_json::json!({"id": 41003, "gone": false}),
    );
    // Back: it rents.
    p.launch(&request("a", "1x_RTX_5090", "US", false))
        .await
        .unwrap();
    p.launch(&request("b", "1x_A100_PCIE", "US", false))
        .await
        .unwrap();
    for c in ["none", "two", "gone", "a", "b"] {
        p.terminate(&ClusterName(c.into())).await.unwrap();
    }
    assert_eq!(fake.leaks(), (0, 0));
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}

#[tokio::test]
async fn prices_are_quoted_only_where_an_offer_is_for_rent_now() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    let types = ["1x_RTX_5090".to_string(), "1x_RTX_4090".to_string()];
    let regions = ["US".to_string(), "VN".to_string()];
    let got = p.prices(&types, &regions).await.unwrap();
    let quoted: Vec<(&str, &str, Option<f64>, Option<f64>)> = got
        .quotes
        .iter()
        .map(|q| {
            (
                q.instance_type.as_str(),
                q.region.as_str(),
                q.price,
                q.spot_price,
            )
        })
        .collect();
    // The fake's market: one 5090 in Texas, one 4090 in Washington; none
    // in Vietnam. The spot price is the offer's minimum bid.
    assert_eq!(
        quoted,
        [
            ("1x_RTX_5090", "US", Some(0.48), Some(0.25)),
            ("1x_RTX_4090", "US", Some(0.40), Some(0.18)),
        ]
    );
    assert!(
        got.notes
            .iter()
            .any(|n| n.contains("no Vast.ai offer in VN")),
        "{:?}",
        got.notes
    );
    // The 5090 is rented by someone else: no longer quoted.
    fake.control(
        "POST",
        "/_fake/offer",
        serde_json::json!({"id": 41003, "gone": true}),
    );
    let got = p.prices(&types, &regions).await.unwrap();
    assert!(
        got.quotes.iter().all(|q| q.instance_type != "1x_RTX_5090"),
        "{:?}",
        got.quotes
    );
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}
