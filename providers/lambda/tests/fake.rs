//! The provider against the Lambda fake (tests/emulators/lambda), without
//! the binary: launch, describe, failover errors, all-or-nothing, sweeps
//! and teardown, with the fake's request checks at zero violations. The
//! instances are not reachable (no sshd here); the binary's suite
//! (`tests/it/lambda.rs`) runs commands on them.

use std::path::Path;

use gangway_lambda::key::ApiKey;
use gangway_lambda::LambdaProvider;
use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, NodeState, Placement, Provider};

const OWNER: &str = "gw-00112233445566aa";

use gangway_test::gpu_fake::GpuCloudFake as Fake;

/// The fake on a free port, or `None` (said as a skip) without python3.
fn fake() -> Option<Fake> {
    match Fake::start("lambda", "0.2", &[]) {
        Ok(f) => Some(f),
        Err(why) => {
            gangway_test::skip::skipped("lambda", why);
            None
        }
    }
}

fn provider(fake: &Fake, dir: &Path, owner: &str) -> LambdaProvider {
    let key = dir.join("id_ed25519.pub");
    std::fs::write(
        &key,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayTestKeyGangwayTestKeyGangwayTestK t\n",
    )
    .unwrap();
    LambdaProvider::new(dir.join("records"), owner, key)
        .with_user("tester")
        .with_api(&fake.url, ApiKey::new("test-key"), 0.01)
}

fn request(cluster: &str, ty: &str, region: &str, count: u32) -> LaunchRequest {
    LaunchRequest {
        cluster: ClusterName(cluster.into()),
        owner: OWNER.into(),
        placement: Placement {
            cloud: "lambda".into(),
            region: region.into(),
            zone: region.into(),
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
async fn a_gang_launches_reconciles_and_terminates_leaving_nothing() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    let check = p.check().await.unwrap();
    assert!(check.ok, "{check:?}");

    let req = request("gang", "gpu_8x_h100_sxm5", "us-south-2", 2);
    let nodes = p.launch(&req).await.unwrap();
    assert_eq!(nodes.len(), 2);
    for n in &nodes {
        assert_eq!(n.state, NodeState::Running);
        assert_eq!(n.placement.region, "us-south-2");
        assert_eq!(n.extra["ssh.port"], "22");
        assert_eq!(n.extra["ssh.user"], "ubuntu");
        assert!(n.public_ip.is_some());
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

    p.terminate(&req.cluster).await.unwrap();
    assert!(p.describe(&req.cluster).await.unwrap().is_empty());
    p.terminate(&req.cluster).await.unwrap();
    assert_eq!(fake.leaks(), (0, 0));
    assert_eq!(fake.violations()["count"], 0, "{}", fake.violations());
}

#[tokio::test]
async fn no_capacity_fails_over_and_a_half_launched_gang_is_undone() {
    let Some(fake) = fake() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&fake, dir.path(), OWNER);
    // The type has no capacity in this region at all.
    let e = p
        .launch(&request("none", "gpu_1x_a10", "us-west-2", 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.kind.fails_over());
    assert!(e.message.contains("insufficient-capacity"), "{e}");
    assert!(!e.to_string().contains("test-key"), "{e}");

    // Room for one of three: the one is terminated, the error is capacity.
    fake.control(
        "POST",
        "/_fake/capacity",
        serde_json::json!({"instance_type": "gpu_1x_a100_sxm4", "region": "us-east-1", "available": 1}),
    );
    let req = request("half", "gpu_1x_a100_sxm4", "us-east-1", 3);
    let e = p.launch(&req).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(p.describe(&req.cluster).await.unwrap().is_empty());
    let s = fake.control("GET", "/_fake/state", serde_json::json!({}));
    assert!(
        s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["status"] != "active" && i["status"] != "booting"),
        "{s}"
    );

    // Quota is a quota error; rate limiting is retried, not an error.
    fake.control(
        "POST",
        "/_fake/launch-failure",
        serde_json::json!({"kind": "quota"}),
    );
    let e = p
        .launch(&request("q", "gpu_1x_a10", "us-east-1", 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Quota, "{e}");
    fake.control(
        "POST",
        "/_fake/launch-failure",
        serde_json::json!({"kind": "rate", "times": 2}),
    );
    let ok = p
        .launch(&request("r", "gpu_1x_a10", "us-east-1", 1))
        .await
        .unwrap();
    assert_eq!(ok.len(), 1);
    for c in ["none", "half", "q", "r"] {
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
    let p = LambdaProvider::new(dir.path().join("r"), OWNER, key).with_api(
        &fake.url,
        ApiKey::new("secret_wrong_key_123"),
        0.01,
    );
    let c = p.check().await.unwrap();
    assert!(!c.ok);
    let hint = c.hint.unwrap_or_default();
    assert!(
        hint.contains("invalid-api-key") && !hint.contains("secret_wrong"),
        "{hint}"
    );
    let e = p.describe(&ClusterName("x".into())).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth);
    assert!(!format!("{e:?}").contains("secret_wrong"));
}
