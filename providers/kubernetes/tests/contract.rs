//! The Kubernetes provider keeps the provider contract
//! (`gangway_test::contract`) on a real control plane built from source
//! (tests/emulators/k8s: kube-apiserver, kube-scheduler and
//! kube-controller-manager v1.37.2, two nodes of two A100s each). Failures
//! are what the scheduler and the API really answer: pods that cannot be
//! scheduled (more GPUs than a node has, or every node cordoned), a
//! ResourceQuota of no pods, a shape that is no pod shape. What a cluster holds is its labelled pods, read
//! with kubectl. Without the harness the test says `SKIPPED k8s: why`.

use std::time::Duration;

use gangway_kubernetes::config::Config;
use gangway_kubernetes::KubernetesProvider;
use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_test::contract::{self, placement, Flag, Harness, Midway, Next, Resource, Unsupported};
use gangway_test::k8s::{K8sHarness, NodeSpec};
use gangway_test::skip;

const OWNER: &str = "gw-00000000000c0de5";
const OTHER: &str = "gw-00000000000c0de6";

struct K8s {
    k8s: K8sHarness,
    p: KubernetesProvider,
    /// The next request's instance type, when a failure is a request the
    /// cluster refuses.
    next: Next<String>,
    cordoned: Flag,
    quota: Flag,
}

fn provider(k8s: &K8sHarness, owner: &str) -> KubernetesProvider {
    let cfg = Config {
        kubeconfig: Some(k8s.kubeconfig().to_path_buf()),
        launch_timeout: Duration::from_secs(3),
        ..Config::default()
    };
    KubernetesProvider::new(cfg, owner, "contract").with_progress(Box::new(|_| {}))
}

impl K8s {
    /// A ResourceQuota of no pods in the namespace: the apiserver's quota
    /// admission refuses every pod (403, "exceeded quota"), once the quota
    /// controller has written the quota's status.
    fn no_pods_quota(&self) {
        self.k8s
            .kubectl_stdin(
                &["apply", "-f", "-"],
                r#"{"apiVersion": "v1", "kind": "ResourceQuota",
                    "metadata": {"name": "contract-no-pods", "namespace": "default"},
                    "spec": {"hard": {"pods": "0"}}}"#,
            )
            .expect("kubectl apply quota");
        for _ in 0..100 {
            let hard = self
                .k8s
                .kubectl(&[
                    "get",
                    "resourcequota",
                    "contract-no-pods",
                    "-o",
                    "jsonpath={.status.hard.pods}",
                ])
                .unwrap_or_default();
            if hard.trim() == "0" {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.quota.raise();
    }

    fn nodes(&self, verb: &str) {
        for n in ["node-0", "node-1"] {
            self.k8s
                .kubectl(&[verb, n])
                .expect("kubectl cordon/uncordon");
        }
    }
}

impl Harness for K8s {
    fn provider(&self) -> &dyn Provider {
        &self.p
    }

    fn owner(&self) -> String {
        OWNER.into()
    }

    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest {
        let it = self.next.take().unwrap_or_else(|| "A100x1-0.5c-1g".into());
        LaunchRequest {
            accelerator: Some(("A100".into(), 1.0)),
            ..contract::request(
                cluster,
                count,
                client_token,
                OWNER,
                placement("kubernetes", "harness", "default"),
                it,
            )
        }
    }

    fn fail_midway(&self, _cluster: &ClusterName) -> Result<Midway, Unsupported> {
        // Every node cordoned: the pods are made and stay unschedulable;
        // the launcher gives up while it waits, as one killed there would.
        self.nodes("cordon");
        self.cordoned.raise();
        Ok(Midway::Abandoned(Duration::from_millis(1500)))
    }

    fn fail_with(&self, _cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        let next = match kind {
            // Three GPUs per pod where nodes have two: the scheduler says
            // Insufficient nvidia.com/gpu until the launch timeout.
            ErrorKind::Capacity => "A100x3-0.5c-1g",
            ErrorKind::InvalidRequest => "m5.large",
            ErrorKind::Quota => {
                self.no_pods_quota();
                return Ok(());
            }
            _ => {
                return Err(Unsupported(
                    "the harness's apiserver has one admin identity; a refused credential \
                     would need a second kubeconfig user"
                        .into(),
                ))
            }
        };
        self.next.set(next.to_string());
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        self.next.take();
        if self.quota.take() {
            self.k8s
                .kubectl(&["delete", "resourcequota", "contract-no-pods"])
                .expect("kubectl delete quota");
        }
        if self.cordoned.take() {
            self.nodes("uncordon");
        }
    }

    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let out = self
            .k8s
            .kubectl(&[
                "get",
                "pods,secrets",
                "-l",
                &format!(
                    "gangway-cluster={}",
                    gangway_kubernetes::names::label_value(&cluster.0)
                ),
                "-o",
                "json",
            ])
            .expect("kubectl get");
        let list: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| Resource {
                kind: p["kind"].as_str().unwrap_or("?").to_lowercase(),
                id: p["metadata"]["name"].as_str().unwrap_or("").into(),
                cluster: p["metadata"]["annotations"]["gangway.dev/cluster-name"]
                    .as_str()
                    .map(String::from),
                owner: p["metadata"]["labels"]["gangway-owner"]
                    .as_str()
                    .map(String::from),
            })
            .collect()
    }

    fn lists_clusters(&self) -> bool {
        true
    }

    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported> {
        Ok((Box::new(provider(&self.k8s, OTHER)), OTHER.into()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_provider_keeps_the_provider_contract() {
    let nodes: Vec<NodeSpec> = (0..2)
        .map(|i| {
            NodeSpec::new(&format!("node-{i}"))
                .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB")
                .capacity("nvidia.com/gpu", "2")
        })
        .collect();
    let Some(k8s) = skip::gate("k8s", K8sHarness::try_start(&nodes)) else {
        return;
    };
    let h = K8s {
        p: provider(&k8s, OWNER),
        k8s,
        next: Next::default(),
        cordoned: Flag::default(),
        quota: Flag::default(),
    };
    contract::run(&h).await;
}
