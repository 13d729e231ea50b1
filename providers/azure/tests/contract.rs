//! The Azure provider keeps the provider contract (`gangway_test::contract`)
//! against the Azure Resource Manager fake (tests/emulators/azure, every
//! request checked against the API specification): failures are the fake's
//! fault rules, and what a cluster holds is read from the fake's state (the
//! cluster's resource group, by the name the provider gives it, and what is
//! in it, with their tags). Without the fake's schema file the test says
//! `SKIPPED azure: why` and passes.

use std::path::Path;

use gangway_azure::AzureProvider;
use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_test::azure_fake::AzureFake;
use gangway_test::contract::{self, placement, Harness, Midway, Resource, Unsupported};
use gangway_test::skip;
use serde_json::{json, Value};

const SUBSCRIPTION: &str = "0c0de000-aaaa-4bbb-8ccc-000000000001";
const LOCATION: &str = "eastus";

struct Azure {
    fake: AzureFake,
    p: AzureProvider,
    owner: String,
    dir: tempfile::TempDir,
}

fn provider(dir: &Path, owner: &str) -> AzureProvider {
    AzureProvider::new(dir.join("azure"), owner, contract::public_key(dir)).with_user("tester")
}

impl Azure {
    fn fault(&self, cluster: &ClusterName, mut rule: Value) {
        // Only this cluster's VMs, in its own resource group.
        rule["method"] = json!("PUT");
        rule["type"] = json!("virtualMachines");
        rule["path"] = json!(format!(
            "/resourceGroups/{}/",
            self.p.group_name(cluster, LOCATION)
        ));
        let added = self.fake.call("POST", "/_fake/faults", &rule.to_string());
        assert!(added["id"].is_u64(), "fault rule {rule}: {added}");
    }
}

impl Harness for Azure {
    fn provider(&self) -> &dyn Provider {
        &self.p
    }

    fn owner(&self) -> String {
        self.owner.clone()
    }

    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest {
        LaunchRequest {
            accelerator: Some(("A100".into(), 1.0)),
            disk_size_gib: Some(100),
            ..contract::request(
                cluster,
                count,
                client_token,
                &self.owner,
                placement("azure", LOCATION, "eastus-1"),
                "Standard_NC24ads_A100_v4",
            )
        }
    }

    fn fail_midway(&self, cluster: &ClusterName) -> Result<Midway, Unsupported> {
        // A launch that fails deletes what it made itself (all or
        // nothing), so the half-made cluster is one whose launcher died:
        // the VMs come after the resource group, the network, the security
        // group, the placement group, the public addresses and the NICs,
        // and ARM throttles their PUT for 10 minutes; the suite gives up
        // after 5 s, as a killed launcher would.
        self.fault(
            cluster,
            json!({"error": "throttle", "retry_after": 600, "times": -1}),
        );
        Ok(Midway::Abandoned(std::time::Duration::from_secs(5)))
    }

    fn fail_with(&self, cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        let rule = match kind {
            ErrorKind::Capacity => json!({"error": "ZonalAllocationFailed", "async": true}),
            ErrorKind::Quota => json!({"error": "QuotaExceeded"}),
            ErrorKind::Auth => json!({"error": "AuthorizationFailed"}),
            ErrorKind::InvalidRequest => json!({"status": 400, "code": "InvalidParameter",
                "message": "The value of parameter vmSize is invalid."}),
            other => return Err(Unsupported(format!("{other:?} is not a rule here"))),
        };
        let mut rule = rule;
        rule["times"] = json!(-1);
        self.fault(cluster, rule);
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        // This fake serves this test alone.
        self.fake.call("DELETE", "/_fake/faults", "");
    }

    /// The cluster's resource group (this owner's: its name is made from
    /// the cluster's and the owner's) and everything in it. A resource
    /// Azure makes untagged with another (the OS disk made with a VM takes
    /// none of the VM's tags) counts as tagged as its group is.
    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let group = self.p.group_name(cluster, LOCATION).to_ascii_lowercase();
        let state = self.fake.call("GET", "/_fake/state", "");
        let tag = |tags: &Value, key: &str| tags[key].as_str().map(String::from);
        let mut out = Vec::new();
        let mut group_tags = Value::Null;
        for g in state["resource_groups"].as_array().into_iter().flatten() {
            if g["name"].as_str().map(str::to_ascii_lowercase) == Some(group.clone()) {
                group_tags = g["tags"].clone();
                out.push(Resource {
                    kind: "resource group".into(),
                    id: g["name"].as_str().unwrap_or_default().into(),
                    cluster: tag(&g["tags"], "gangway-cluster"),
                    owner: tag(&g["tags"], "gangway-owner"),
                });
            }
        }
        let inside = format!("/resourcegroups/{group}/");
        for r in state["resources"].as_array().into_iter().flatten() {
            let id = r["id"].as_str().unwrap_or_default();
            if !id.to_ascii_lowercase().contains(&inside) {
                continue;
            }
            let own = r["tags"].as_object().is_some_and(|t| !t.is_empty());
            let tags = if own || r["kind"] != "disk" {
                &r["tags"]
            } else {
                &group_tags
            };
            out.push(Resource {
                kind: r["kind"].as_str().unwrap_or_default().into(),
                id: id.rsplit('/').next().unwrap_or(id).into(),
                cluster: tag(tags, "gangway-cluster"),
                owner: tag(tags, "gangway-owner"),
            });
        }
        out
    }

    fn lists_clusters(&self) -> bool {
        true
    }

    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported> {
        let owner = "gw-00000000000a2ae4".to_string();
        let p = provider(&self.dir.path().join("other"), &owner);
        Ok((Box::new(p), owner))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_provider_keeps_the_provider_contract() {
    let Some(fake) = skip::gate("azure", AzureFake::try_start()) else {
        return;
    };
    // Edition 2021: safe. Set before any client is built; this test binary
    // has no other test.
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("GANGWAY_AZURE_ENDPOINT", &fake.url);
    std::env::set_var("AZURE_SUBSCRIPTION_ID", SUBSCRIPTION);
    std::env::set_var("AZURE_CONFIG_DIR", dir.path().join("no-az"));
    std::env::set_var("GANGWAY_AZURE_SSH_CIDR", "192.0.2.0/24");
    for v in ["AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET"] {
        std::env::remove_var(v);
    }
    let owner = "gw-00000000000a2ae3".to_string();
    let h = Azure {
        p: provider(dir.path(), &owner),
        fake,
        owner,
        dir,
    };
    contract::run(&h).await;
    let v = h.fake.violations();
    assert_eq!(v["count"], 0, "requests broke the API specification: {v:#}");
    if let Err(left) = h.fake.leak_check(SUBSCRIPTION) {
        panic!("the suite left something behind:\n{left}");
    }
}
