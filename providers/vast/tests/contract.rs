//! The Vast.ai provider keeps the provider contract (`gangway_test::contract`)
//! against the Vast.ai fake (tests/emulators/vast), given six machines of
//! one GPU in one location so that gangs fit: failures are offers gone from
//! the market and the fake's accepted keys; what a cluster holds is read
//! from the fake's state (instances by their labels; gangway adds no
//! account key). A half-made launch is one abandoned while its instances
//! load. Without python3 the test says `SKIPPED vast: why` and passes.

use std::path::Path;
use std::time::Duration;

use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_test::contract::{self, placement, Harness, Midway, Resource, Unsupported};
use gangway_test::gpu_fake::{GpuCloudFake, KEY, RATE_SCALE};
use gangway_test::skip;
use gangway_vast::key::ApiKey;
use gangway_vast::{names, VastProvider};
use serde_json::json;

const TYPE: &str = "1x_RTX_4090";
const REGION: &str = "US";
/// The fake's one-GPU RTX 4090 offer (Washington, US), and the ones this
/// test adds like it.
const OFFERS: [u64; 6] = [41001, 51001, 51002, 51003, 51004, 51005];
/// How long an instance boots in the fake: a launch abandoned before
/// that has made instances that are not running yet.
const BOOT: &str = "1.5";

struct Vast {
    fake: GpuCloudFake,
    p: VastProvider,
    owner: String,
    dir: tempfile::TempDir,
}

fn provider(fake: &GpuCloudFake, dir: &Path, owner: &str) -> VastProvider {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join("id_ed25519.pub");
    std::fs::write(
        &key,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayTestKeyGangwayTestKeyGangwayTestK t\n",
    )
    .unwrap();
    VastProvider::new(dir.join("records"), owner, key)
        .with_user("tester")
        .with_api(&fake.url, ApiKey::new(KEY), RATE_SCALE.parse().unwrap())
}

impl Vast {
    fn offers_gone(&self, gone: bool) {
        for id in OFFERS {
            self.fake
                .control("POST", "/_fake/offer", json!({"id": id, "gone": gone}));
        }
    }
}

impl Harness for Vast {
    fn provider(&self) -> &dyn Provider {
        &self.p
    }

    fn owner(&self) -> String {
        self.owner.clone()
    }

    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest {
        LaunchRequest {
            provider_config: Some(json!({"poll_ms": 50, "boot_timeout_s": 30})),
            ..contract::request(
                cluster,
                count,
                client_token,
                &self.owner,
                placement("vast", REGION, REGION),
                TYPE,
            )
        }
    }

    fn fail_midway(&self, _cluster: &ClusterName) -> Result<Midway, Unsupported> {
        // Launched, still booting: the launcher is gone before they run.
        Ok(Midway::Abandoned(Duration::from_millis(900)))
    }

    fn fail_with(&self, _cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        match kind {
            ErrorKind::Capacity => self.offers_gone(true),
            ErrorKind::Auth => {
                self.fake
                    .control("POST", "/_fake/api-keys", json!({"keys": ["another-key"]}));
            }
            ErrorKind::Quota => {
                return Err(Unsupported(
                    "Vast.ai has no quota error: a market without the offer is capacity".into(),
                ))
            }
            ErrorKind::InvalidRequest => {
                return Err(Unsupported(
                    "the Vast.ai fake refuses no well-formed rental as invalid".into(),
                ))
            }
            other => return Err(Unsupported(format!("{other:?} is not a failure here"))),
        }
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        self.fake
            .control("POST", "/_fake/api-keys", json!({"keys": [KEY]}));
        self.offers_gone(false);
    }

    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let state = self.fake.state();
        let mut out = Vec::new();
        for i in state["instances"].as_array().into_iter().flatten() {
            let label = i["label"].as_str().unwrap_or_default();
            if let Some((owner, c, _)) = names::parse_label(label) {
                if c == cluster.0 {
                    out.push(Resource {
                        kind: "instance".into(),
                        id: i["id"].to_string(),
                        cluster: Some(c.into()),
                        owner: Some(owner.into()),
                    });
                }
            }
        }
        for k in state["ssh_keys"].as_array().into_iter().flatten() {
            out.push(Resource {
                kind: "ssh-key".into(),
                id: k.to_string(),
                cluster: None,
                owner: None,
            });
        }
        out
    }

    fn lists_clusters(&self) -> bool {
        true
    }

    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported> {
        let owner = "gw-00000000000c0de4".to_string();
        let p = provider(&self.fake, &self.dir.path().join("other"), &owner);
        Ok((Box::new(p), owner))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vast_provider_keeps_the_provider_contract() {
    let Some(fake) = skip::gate("vast", GpuCloudFake::start("vast", BOOT, &[])) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let owner = "gw-00000000000c0de3".to_string();
    let h = Vast {
        p: provider(&fake, dir.path(), &owner),
        fake,
        owner,
        dir,
    };
    for (n, id) in OFFERS.iter().enumerate().skip(1) {
        h.fake.control(
            "POST",
            "/_fake/offers",
            json!({"like": OFFERS[0], "id": id, "machine_id": 19000 + n}),
        );
    }
    h.clear_failures(&ClusterName("all".into()));
    contract::run(&h).await;
    // The only requests off the published shapes are the injected auth
    // failure's (a key the fake was told to refuse).
    let v = h.fake.violations();
    let all = v["violations"].as_array().cloned().unwrap_or_default();
    assert!(all.iter().all(|x| x["kind"] == "auth"), "{v}");
}
