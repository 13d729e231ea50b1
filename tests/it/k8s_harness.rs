//! The Kubernetes harness (tests/emulators/k8s) as the Kubernetes provider's
//! tests will use it: nodes come up with the labels and capacity given.
use gangway_test::k8s::{K8sHarness, NodeSpec};
use gangway_test::skip;

#[test]
fn nodes_have_the_labels_and_capacity_given() {
    let nodes = [
        NodeSpec::new("cpu-0")
            .label("topology.kubernetes.io/zone", "zone-a")
            .label("karpenter.sh/capacity-type", "spot")
            .capacity("cpu", "8")
            .capacity("memory", "32Gi"),
        NodeSpec::new("gpu-0")
            .label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
            .label("cloud.google.com/gce-topology-block", "b1")
            .capacity("cpu", "32")
            .capacity("nvidia.com/gpu", "8")
            .taint("nvidia.com/gpu", "present", "NoSchedule"),
    ];
    let Some(k8s) = skip::gate("k8s", K8sHarness::try_start(&nodes)) else {
        return;
    };
    let out = k8s
        .kubectl(&["get", "nodes", "-o", "json"])
        .expect("kubectl get nodes");
    let list: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{out}");
    for spec in &nodes {
        let node = items
            .iter()
            .find(|n| n["metadata"]["name"] == spec.name.as_str())
            .unwrap_or_else(|| panic!("no node {}: {out}", spec.name));
        for (k, v) in &spec.labels {
            assert_eq!(
                node["metadata"]["labels"][k],
                v.as_str(),
                "{} label {k}",
                spec.name
            );
        }
        for (k, v) in &spec.capacity {
            assert_eq!(
                node["status"]["capacity"][k],
                v.as_str(),
                "{} capacity {k}",
                spec.name
            );
            assert_eq!(
                node["status"]["allocatable"][k],
                v.as_str(),
                "{} allocatable {k}",
                spec.name
            );
        }
        let ready = node["status"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{} not Ready: {node}", spec.name);
    }
    let gpu = items
        .iter()
        .find(|n| n["metadata"]["name"] == "gpu-0")
        .expect("gpu-0");
    assert!(
        gpu["spec"]["taints"].as_array().is_some_and(|t| t
            .iter()
            .any(|t| t["key"] == "nvidia.com/gpu" && t["effect"] == "NoSchedule")),
        "gpu-0's taint: {gpu}"
    );
    // The node agent's pod IPs and a pod's life, through kubectl.
    k8s.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": "cpu-0"},
              "containers": [{"name": "main", "image": "none", "command": ["bash", "-c", "echo hi; sleep 600"]}]}}"#,
    )
    .expect("kubectl apply");
    k8s.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/hello",
        "--timeout=60s",
    ])
    .expect("pod Ready");
    let logs = k8s.kubectl(&["logs", "hello"]).expect("kubectl logs");
    assert_eq!(logs.trim(), "hi");
    let echoed = k8s
        .kubectl_stdin(&["exec", "-i", "hello", "--", "cat"], "from stdin")
        .expect("kubectl exec");
    assert_eq!(echoed, "from stdin");
    let where_ = k8s.pod("default", "hello");
    assert_eq!(where_["node"], "cpu-0", "{where_}");
    assert!(
        where_["ip"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("127.")),
        "{where_}"
    );
}
