//! The Lambda provider keeps the provider contract (`gangway_test::contract`)
//! against the Lambda fake (tests/emulators/lambda): failures are the fake's
//! capacity table, its queued launch failures and its accepted keys; what a
//! cluster holds is read from the fake's state (instances by their tags,
//! the cluster's SSH key by its name). A half-made launch is one abandoned
//! while its instances boot. Without python3 the test says `SKIPPED
//! lambda: why` and passes.

use std::path::Path;
use std::time::Duration;

use gangway_lambda::key::ApiKey;
use gangway_lambda::{names, LambdaProvider};
use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_test::contract::{self, placement, Harness, Midway, Resource, Unsupported};
use gangway_test::gpu_fake::{GpuCloudFake, KEY, RATE_SCALE};
use gangway_test::skip;
use serde_json::json;

const TYPE: &str = "gpu_1x_a10";
const REGION: &str = "us-east-1";
/// How long an instance boots in the fake: a launch abandoned before
/// that has made instances that are not running yet.
const BOOT: &str = "1.5";

struct Lambda {
    fake: GpuCloudFake,
    p: LambdaProvider,
    owner: String,
    dir: tempfile::TempDir,
}

fn provider(fake: &GpuCloudFake, dir: &Path, owner: &str) -> LambdaProvider {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join("id_ed25519.pub");
    std::fs::write(
        &key,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayTestKeyGangwayTestKeyGangwayTestK t\n",
    )
    .unwrap();
    LambdaProvider::new(dir.join("records"), owner, key)
        .with_user("tester")
        .with_api(&fake.url, ApiKey::new(KEY), RATE_SCALE.parse().unwrap())
}

impl Lambda {
    fn capacity(&self, available: serde_json::Value) {
        self.fake.control(
            "POST",
            "/_fake/capacity",
            json!({"instance_type": TYPE, "region": REGION, "available": available}),
        );
    }
}

impl Harness for Lambda {
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
                placement("lambda", REGION, REGION),
                TYPE,
            )
        }
    }

    fn fail_midway(&self, _cluster: &ClusterName) -> Result<Midway, Unsupported> {
        // Launched, still booting: the launcher is gone before they run.
        Ok(Midway::Abandoned(Duration::from_millis(900)))
    }

    fn fail_with(&self, _cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        let queued = |k: &str| {
            self.fake
                .control("POST", "/_fake/launch-failure", json!({"kind": k}));
        };
        match kind {
            ErrorKind::Capacity => self.capacity(serde_json::Value::Null),
            ErrorKind::Quota => queued("quota"),
            ErrorKind::InvalidRequest => queued("invalid"),
            ErrorKind::Auth => {
                self.fake
                    .control("POST", "/_fake/api-keys", json!({"keys": ["another-key"]}));
            }
            other => return Err(Unsupported(format!("{other:?} is not a failure here"))),
        }
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        self.fake
            .control("POST", "/_fake/api-keys", json!({"keys": [KEY]}));
        self.capacity(json!(16));
    }

    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let state = self.fake.state();
        let mut out = Vec::new();
        for i in state["instances"].as_array().into_iter().flatten() {
            if matches!(i["status"].as_str(), Some("terminated" | "terminating")) {
                continue;
            }
            let tag = |k: &str| {
                i["tags"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|t| t["key"] == k)
                    .and_then(|t| t["value"].as_str())
                    .map(String::from)
            };
            let c = tag(names::TAG_CLUSTER);
            if c.as_deref() == Some(cluster.0.as_str()) {
                out.push(Resource {
                    kind: "instance".into(),
                    id: i["id"].as_str().unwrap_or_default().into(),
                    cluster: c,
                    owner: tag(names::TAG_OWNER),
                });
            }
        }
        for k in state["ssh_keys"].as_array().into_iter().flatten() {
            let name = k["name"].as_str().unwrap_or_default();
            if let Some((owner, c)) = names::parse_key_name(name) {
                if c == cluster.0 {
                    out.push(Resource {
                        kind: "ssh-key".into(),
                        id: name.into(),
                        cluster: Some(c.into()),
                        owner: Some(owner.into()),
                    });
                }
            }
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
async fn the_lambda_provider_keeps_the_provider_contract() {
    let Some(fake) = skip::gate("lambda", GpuCloudFake::start("lambda", BOOT, &[])) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let owner = "gw-00000000000c0de3".to_string();
    let h = Lambda {
        p: provider(&fake, dir.path(), &owner),
        fake,
        owner,
        dir,
    };
    h.clear_failures(&ClusterName("all".into()));
    contract::run(&h).await;
    // The only requests off the published shapes are the injected auth
    // failure's (a key the fake was told to refuse).
    let v = h.fake.violations();
    let all = v["violations"].as_array().cloned().unwrap_or_default();
    assert!(all.iter().all(|x| x["kind"] == "auth"), "{v}");
}
