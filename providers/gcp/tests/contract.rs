//! The GCP provider keeps the provider contract (`gangway_test::contract`)
//! against the Compute Engine fake: failures are the fake's fault rules,
//! and what a cluster holds is read from the fake's state (VMs by their
//! labels and metadata; firewall rules and placement policies by the name
//! base, which is made from the cluster's name and its owner). Without the
//! fake's venv the test says `SKIPPED gcp: why` and passes.

use std::path::Path;

use gangway_gcp::{GcpProvider, Names};
use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_test::contract::{self, placement, Harness, Midway, Resource, Unsupported};
use gangway_test::gce_fake::GceFake;
use gangway_test::skip;
use serde_json::json;

const ZONE: &str = "us-central1-a";

struct Gcp {
    fake: GceFake,
    p: GcpProvider,
    owner: String,
    dir: tempfile::TempDir,
}

fn provider(dir: &Path, owner: &str) -> GcpProvider {
    GcpProvider::new(dir.join("gcp"), owner, contract::public_key(dir)).with_user("Test User")
}

impl Gcp {
    fn fault(&self, rule: serde_json::Value) {
        let added = self.fake.call("POST", "/_gangway/fault", &rule.to_string());
        assert!(added["id"].is_u64(), "fault rule {rule}: {added}");
    }
}

impl Harness for Gcp {
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
                placement("gcp", "us-central1", ZONE),
                "a2-highgpu-1g",
            )
        }
    }

    fn fail_midway(&self, cluster: &ClusterName) -> Result<Midway, Unsupported> {
        // The VMs' bulkInsert comes after the firewall rule (and, for a
        // gang, the placement policy): a stockout there leaves those.
        let base = Names::new(&cluster.0, &self.owner).base;
        self.fault(json!({"method": "instances.bulkInsert", "contains": base,
            "operation_error": "ZONE_RESOURCE_POOL_EXHAUSTED"}));
        Ok(Midway::Fails)
    }

    fn fail_with(&self, cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        let base = Names::new(&cluster.0, &self.owner).base;
        let rule = match kind {
            ErrorKind::Capacity => json!({"operation_error": "ZONE_RESOURCE_POOL_EXHAUSTED"}),
            ErrorKind::Quota => json!({"operation_error": "QUOTA_EXCEEDED"}),
            ErrorKind::Auth => json!({"http_status": 403, "reason": "forbidden",
                "message": "Required 'compute.instances.create' permission"}),
            ErrorKind::InvalidRequest => json!({"http_status": 400,
                "message": "Invalid value for field 'resource.machineType'"}),
            other => return Err(Unsupported(format!("{other:?} is not a rule here"))),
        };
        let mut rule = rule;
        rule["method"] = json!("instances.bulkInsert");
        rule["contains"] = json!(base);
        self.fault(rule);
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        // This fake serves this test alone.
        self.fake.call("DELETE", "/_gangway/faults", "");
    }

    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let base = Names::new(&cluster.0, &self.owner).base;
        let mut out = Vec::new();
        for vm in self.fake.named("instances", &base) {
            let meta = vm["metadata"]["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|i| i["key"] == "gangway-cluster")
                .and_then(|i| i["value"].as_str())
                .map(String::from);
            let label = vm["labels"]["gangway-cluster"].as_str();
            out.push(Resource {
                kind: "instance".into(),
                id: vm["name"].as_str().unwrap_or_default().into(),
                // The label is the name base (label values are restricted);
                // the exact name is in the metadata.
                cluster: meta.filter(|_| label == Some(base.as_str())),
                owner: vm["labels"]["gangway-owner"].as_str().map(String::from),
            });
        }
        for kind in ["firewalls", "resourcePolicies"] {
            for r in self.fake.named(kind, &base) {
                out.push(Resource {
                    kind: kind.into(),
                    id: r["name"].as_str().unwrap_or_default().into(),
                    // Neither takes labels: the name base is made from the
                    // cluster and the owner.
                    cluster: Some(cluster.0.clone()),
                    owner: Some(self.owner.clone()),
                });
            }
        }
        out
    }

    fn lists_clusters(&self) -> bool {
        true
    }

    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported> {
        let owner = "gw-00000000000c0de4".to_string();
        let p = provider(&self.dir.path().join("other"), &owner);
        Ok((Box::new(p), owner))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gcp_provider_keeps_the_provider_contract() {
    let Some(fake) = skip::gate("gcp", GceFake::try_start()) else {
        return;
    };
    // Edition 2021: safe. Set before any client is built; this test binary
    // has no other test.
    std::env::set_var("GANGWAY_GCP_ENDPOINT", &fake.url);
    std::env::set_var("GOOGLE_CLOUD_PROJECT", "gangway-test");
    std::env::set_var("GANGWAY_GCP_SSH_CIDR", "192.0.2.0/24");
    let dir = tempfile::tempdir().unwrap();
    let owner = "gw-00000000000c0de3".to_string();
    let h = Gcp {
        p: provider(dir.path(), &owner),
        fake,
        owner,
        dir,
    };
    contract::run(&h).await;
}
