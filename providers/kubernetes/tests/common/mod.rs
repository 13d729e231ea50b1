//! What the harness tests of single pods share: a provider pointed at the
//! harness, and a request for a gang of one-A100 pods there.

use std::time::Duration;

use gangway_kubernetes::config::Config;
use gangway_kubernetes::KubernetesProvider;
use gangway_provider::{ClusterName, LaunchRequest};
use gangway_test::contract::{self, placement};
use gangway_test::k8s::K8sHarness;

/// A provider of installation `owner` on the harness (30 s to launch).
pub fn provider(k8s: &K8sHarness, owner: &str, name: &str) -> KubernetesProvider {
    let cfg = Config {
        kubeconfig: Some(k8s.kubeconfig().to_path_buf()),
        launch_timeout: Duration::from_secs(30),
        ..Config::default()
    };
    KubernetesProvider::new(cfg, owner, name).with_progress(Box::new(|_| {}))
}

/// Cluster `c` of `n` pods of one A100 each, in the harness's default
/// namespace.
pub fn a100_gang(c: &ClusterName, n: u32, owner: &str) -> LaunchRequest {
    LaunchRequest {
        accelerator: Some(("A100".into(), 1.0)),
        ..contract::request(
            c,
            n,
            &format!("{}-1", c.0),
            owner,
            placement("kubernetes", "harness", "default"),
            "A100x1-0.5c-1g",
        )
    }
}
