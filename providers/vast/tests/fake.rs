//! The provider against the Vast.ai fake (tests/emulators/vast), without the binary: launch, describe, failover errors,
//! all-or-nothing, sweeps and teardown, with the fake's request checks at
//! zero violations. The instances are not reachable (no sshd here).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, NodeState, Placement, Provider};
use gangway_vast::key::ApiKey;
use gangway_vast::VastProvider;

const OWNER: &str = "gw-00112233445566aa";

struct Fake {
    child: Child,
    url: String,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/emulators/vast/server.py")
}

/// The fake on a free port, or `None` (said on stderr) without python3.
fn fake() -> Option<Fake> {
    let mut child = match Command::new("python3")
        .arg(server())
        .args([
            "--port",
            "0",
            "--rate-scale",
            "0.01",
            "--boot-seconds",
            "0.2",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIPPED vast fake: python3: {e}");
            return None;
        }
    };
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("READY ")
        .unwrap_or_else(|| panic!("the fake said {line:?}"))
        .to_string();
    Some(Fake { child, url })
}

impl Fake {
    fn control(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let out = Command::new("python3")
            .arg("-c")
            .arg(
                "import sys,urllib.request as u\n\
                 r=u.Request(sys.argv[1],data=(sys.argv[3].encode() if sys.argv[2]!='GET' else None),method=sys.argv[2],headers={'Content-Type':'application/json'})\n\
                 print(u.urlopen(r,timeout=20).read().decode())",
            )
            .args([format!("{}{path}", self.url), method.into(), body.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn violations(&self) -> serde_json::Value {
        self.control("GET", "/_fake/violations", serde_json::json!({}))
    }

    /// (instances left, account SSH keys).
    fn leaks(&self) -> (usize, usize) {
        let s = self.control("GET", "/_fake/state", serde_json::json!({}));
        (
            s["leaks"].as_array().unwrap().len(),
            s["ssh_keys"].as_array().unwrap().len(),
        )
    }

    fn instances(&self) -> Vec<serde_json::Value> {
        let s = self.control("GET", "/_fake/state", serde_json::json!({}));
        s["instances"].as_array().unwrap().clone()
    }
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
    let inst = fake
        .instances()
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
    assert!(fake.instances().is_empty());

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
