//! The AWS provider keeps the provider contract (`gangway_test::contract`)
//! against the EC2 emulator: failures are the emulator's fault rules, and
//! what a cluster holds is read with independent `Describe*` calls by its
//! `gangway-cluster` tag. Without the emulator the test says
//! `SKIPPED aws: why` and passes.

mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;

use gangway_aws::AwsProvider;
use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_test::contract::{self, placement, Harness, Midway, Resource, Unsupported};
use gangway_test::ec2_emulator::{values, Ec2Emulator};
use serde_json::json;

use common::provider;

const REGION: &str = "us-east-1";
const ZONE: &str = "us-east-1c";

struct Aws {
    emu: &'static Ec2Emulator,
    p: AwsProvider,
    conf: aws_config::SdkConfig,
    owner: String,
    prefix: String,
    dir: tempfile::TempDir,
    rules: Mutex<Vec<u64>>,
}

/// An owner id (`gw-` and 16 hex digits) of this test process.
fn owner_id(salt: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    format!(
        "gw-{:016x}",
        (u64::from(std::process::id()) << 32) ^ nanos ^ salt
    )
}

impl Aws {
    /// Ids (by `id_tag`) that `action` lists with these tag filters.
    fn ids(&self, action: &str, id_tag: &str, filters: &[(&str, &str)]) -> BTreeSet<String> {
        let mut params = vec![("Action".to_string(), action.to_string())];
        for (i, (k, v)) in filters.iter().enumerate() {
            params.push((format!("Filter.{}.Name", i + 1), k.to_string()));
            params.push((format!("Filter.{}.Value.1", i + 1), v.to_string()));
        }
        if action == "DescribeInstances" {
            let n = filters.len() + 1;
            params.push((format!("Filter.{n}.Name"), "instance-state-name".into()));
            for (j, s) in ["pending", "running", "stopping", "stopped"]
                .iter()
                .enumerate()
            {
                params.push((format!("Filter.{n}.Value.{}", j + 1), s.to_string()));
            }
        }
        let params: Vec<(&str, &str)> = params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let (status, xml) = self.emu.call(REGION, &params);
        assert_eq!(status, 200, "{action}: {xml}");
        values(&xml, id_tag)
            .into_iter()
            .filter(|id| id_tag != "instanceId" || id.starts_with("i-"))
            .collect()
    }

    fn inject(&self, cluster: &ClusterName, code: &str) {
        let id = self
            .emu
            .inject("RunInstances", &[cluster.0.as_str()], code, "", 1);
        self.rules.lock().unwrap().push(id);
    }
}

impl Harness for Aws {
    fn provider(&self) -> &dyn Provider {
        &self.p
    }

    fn owner(&self) -> String {
        self.owner.clone()
    }

    /// The emulator serves every test process of the run.
    fn prefix(&self) -> String {
        self.prefix.clone()
    }

    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest {
        LaunchRequest {
            disk_size_gib: Some(50),
            provider_config: Some(json!({
                // moto's images are 2017's: name one of them.
                "ami_name": "Deep Learning AMI Ubuntu*",
                "ami_owner": "898082745236",
                "ssh_cidr": "203.0.113.7/32",
                "poll_ms": 20,
                "boot_timeout_s": 30,
            })),
            ..contract::request(
                cluster,
                count,
                client_token,
                &self.owner,
                placement("aws", REGION, ZONE),
                "m5.xlarge",
            )
        }
    }

    fn fail_midway(&self, cluster: &ClusterName) -> Result<Midway, Unsupported> {
        // RunInstances comes after the security group, the key pair and
        // the record: refusing it leaves those.
        self.inject(cluster, "InsufficientInstanceCapacity");
        Ok(Midway::Fails)
    }

    fn fail_with(&self, cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        let code = match kind {
            ErrorKind::Capacity => "InsufficientInstanceCapacity",
            ErrorKind::Quota => "VcpuLimitExceeded",
            ErrorKind::Auth => "UnauthorizedOperation",
            ErrorKind::InvalidRequest => "InvalidParameterValue",
            other => return Err(Unsupported(format!("{other:?} is not a rule here"))),
        };
        self.inject(cluster, code);
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        for id in self.rules.lock().unwrap().drain(..) {
            self.emu.remove_fault(id);
        }
    }

    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let mut out = Vec::new();
        for (kind, action, id_tag) in [
            ("instance", "DescribeInstances", "instanceId"),
            ("security group", "DescribeSecurityGroups", "groupId"),
            ("placement group", "DescribePlacementGroups", "groupName"),
            ("key pair", "DescribeKeyPairs", "keyName"),
        ] {
            let by_name = self.ids(action, id_tag, &[("tag:gangway-cluster", &cluster.0)]);
            let ours = self.ids(
                action,
                id_tag,
                &[
                    ("tag:gangway-cluster", &cluster.0),
                    ("tag:gangway-owner", &self.owner),
                ],
            );
            out.extend(by_name.into_iter().map(|id| Resource {
                kind: kind.into(),
                cluster: Some(cluster.0.clone()),
                owner: ours.contains(&id).then(|| self.owner.clone()),
                id,
            }));
        }
        out
    }

    fn lists_clusters(&self) -> bool {
        true
    }

    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported> {
        let owner = owner_id(0x07e4);
        let p = provider(&self.dir.path().join("other"), &owner, &self.conf);
        Ok((Box::new(p), owner))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_provider_keeps_the_provider_contract() {
    let Some(emu) = Ec2Emulator::shared() else {
        return;
    };
    let conf = common::sdk_config(emu, REGION).await;
    let dir = tempfile::tempdir().unwrap();
    let owner = owner_id(1);
    let h = Aws {
        emu,
        p: provider(dir.path(), &owner, &conf),
        conf,
        owner,
        prefix: format!("ct{}", std::process::id()),
        dir,
        rules: Mutex::new(Vec::new()),
    };
    contract::run(&h).await;
}
