//! The RunPod provider keeps the provider contract (`gangway_test::contract`)
//! against the RunPod fake's REST v2 face (tests/emulators/runpod): failures
//! are the fake's capacity table, its queued create failures and its
//! accepted keys; what a cluster holds is read from the fake's state (pods
//! by the tags in their environment; gangway puts nothing else on the
//! account). A half-made launch is one abandoned while its pods start.
//! Without python3 the test says `SKIPPED runpod: why` and passes.

use std::path::Path;
use std::time::Duration;

use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_runpod::key::ApiKey;
use gangway_runpod::{names, RunpodProvider};
use gangway_test::contract::{self, placement, Harness, Midway, Resource, Unsupported};
use gangway_test::gpu_fake::{GpuCloudFake, KEY, RATE_SCALE};
use gangway_test::skip;
use serde_json::json;

const TYPE: &str = "1x_A100-80GB_SECURE";
const GPU: &str = "NVIDIA A100 80GB PCIe";
const REGION: &str = "US-KS-2";
/// How long an instance boots in the fake: a launch abandoned before
/// that has made instances that are not running yet.
const BOOT: &str = "1.5";

struct Runpod {
    /// Spot pods (rented through GraphQL) instead of on-demand ones.
    spot: bool,
    fake: GpuCloudFake,
    p: RunpodProvider,
    owner: String,
    dir: tempfile::TempDir,
}

fn provider(fake: &GpuCloudFake, dir: &Path, owner: &str) -> RunpodProvider {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join("id_ed25519.pub");
    std::fs::write(
        &key,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayTestKeyGangwayTestKeyGangwayTestK t\n",
    )
    .unwrap();
    RunpodProvider::new(dir.join("records"), owner, key)
        .with_user("tester")
        .with_api(&fake.url, ApiKey::new(KEY), RATE_SCALE.parse().unwrap())
}

impl Runpod {
    fn capacity(&self, available: serde_json::Value) {
        self.fake.control(
            "POST",
            "/_fake/capacity",
            json!({"gpuTypeId": GPU, "dataCenterId": REGION, "cloudType": "SECURE", "gpus": available}),
        );
    }
}

impl Harness for Runpod {
    fn provider(&self) -> &dyn Provider {
        &self.p
    }

    fn owner(&self) -> String {
        self.owner.clone()
    }

    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest {
        LaunchRequest {
            // Spot gangs meet on public addresses (GraphQL's spot input has
            // no global networking): said so, or the launch is refused.
            provider_config: Some(if self.spot {
                json!({"poll_ms": 50, "boot_timeout_s": 30, "global_networking": false})
            } else {
                json!({"poll_ms": 50, "boot_timeout_s": 30})
            }),
            use_spot: self.spot,
            ..contract::request(
                cluster,
                count,
                client_token,
                &self.owner,
                placement("runpod", REGION, REGION),
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
            ErrorKind::Capacity => self.capacity(serde_json::Value::Null),
            ErrorKind::InvalidRequest if self.spot => {
                self.fake.control(
                    "POST",
                    "/_fake/create-failure",
                    json!({"api": "graphql", "status": 400, "message": "Variable \"$input\" got invalid value at \"input\"; Field \"gpuCount\" of required type \"Int!\" was not provided."}),
                );
            }
            ErrorKind::InvalidRequest => {
                self.fake.control(
                    "POST",
                    "/_fake/create-failure",
                    json!({"api": "v2", "status": 400, "message": "gpuTypeIds: exactly one of gpuTypeIds or cpuFlavorIds is required"}),
                );
            }
            ErrorKind::Auth => {
                self.fake
                    .control("POST", "/_fake/api-keys", json!({"keys": ["another-key"]}));
            }
            ErrorKind::Quota => {
                return Err(Unsupported(
                    "RunPod has no quota error: a short balance (402) is fatal, not a quota".into(),
                ))
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
        for pod in state["pods"].as_array().into_iter().flatten() {
            let env = &pod["_v2"]["env"];
            let c = env[names::TAG_CLUSTER].as_str().map(String::from);
            if c.as_deref() == Some(cluster.0.as_str()) {
                out.push(Resource {
                    kind: "pod".into(),
                    id: pod["id"].as_str().unwrap_or_default().into(),
                    cluster: c,
                    owner: env[names::TAG_OWNER].as_str().map(String::from),
                });
            }
        }
        // gangway registers no account key on RunPod (the key goes in the
        // pods' environment): any there is a leftover of no cluster.
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

/// The contract against a fresh fake, on demand or spot.
async fn keeps_the_contract(spot: bool) {
    let Some(fake) = skip::gate("runpod", GpuCloudFake::start("runpod", BOOT, &[])) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let owner = "gw-00000000000c0de3".to_string();
    let h = Runpod {
        spot,
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
    if spot {
        // Every pod it made was a spot pod, rented through GraphQL.
        let calls = &h.fake.state()["calls"];
        assert!(calls["graphql"].as_u64().unwrap_or(0) > 0, "{calls}");
        assert_eq!(calls["createPod"].as_u64().unwrap_or(0), 0, "{calls}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runpod_provider_keeps_the_provider_contract() {
    keeps_the_contract(false).await;
}

/// The same contract for spot pods: rented through GraphQL, otherwise the
/// same launch (reconcile, all or nothing, tags, teardown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runpod_provider_keeps_the_provider_contract_with_spot_pods() {
    keeps_the_contract(true).await;
}
