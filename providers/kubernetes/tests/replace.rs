//! Replacing single pods on a real control plane (tests/emulators/k8s:
//! kube-apiserver, kube-scheduler and kube-controller-manager v1.37.2):
//! the new pod of a gang that lost one prefers the survivors' topology
//! domain. Without the harness the test says `SKIPPED k8s: why`.

mod common;

use std::collections::BTreeSet;

use gangway_provider::{ClusterName, InstanceId, NodeState, Provider};
use gangway_test::k8s::{K8sHarness, NodeSpec};
use gangway_test::skip;

const OWNER: &str = "gw-00000000000c0de7";
const BLOCK: &str = "cloud.google.com/gce-topology-block";

fn pod(k8s: &K8sHarness, name: &str) -> serde_json::Value {
    let out = k8s
        .kubectl(&["get", "pod", name, "-o", "json"])
        .expect("kubectl get pod");
    serde_json::from_str(&out).expect("JSON")
}

/// Block b1 holds node-0..2, b2 node-3..5, one A100 each. A gang of 2
/// starts in b1 (b2 cordoned until it runs). Three times over, one pod is
/// removed and the gang launched again: the new pod gets a fresh name, a
/// preferred node-affinity term on the survivor's block, and lands in b1
/// (2 free nodes there, 3 in b2: without the preference, all three rounds
/// in b1 would be luck of (2/5)^3), and the survivor stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_pod_prefers_the_survivors_topology_block() {
    let nodes: Vec<NodeSpec> = (0..6)
        .map(|i| {
            NodeSpec::new(&format!("node-{i}"))
                .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB")
                .label(BLOCK, if i < 3 { "b1" } else { "b2" })
                .capacity("nvidia.com/gpu", "1")
        })
        .collect();
    let Some(k8s) = skip::gate("k8s", K8sHarness::try_start(&nodes)) else {
        return;
    };
    let p = common::provider(&k8s, OWNER, "replace");
    let c = ClusterName("prefer".into());
    let req = common::a100_gang(&c, 2, OWNER);
    let b2 = ["node-3", "node-4", "node-5"];
    for n in b2 {
        k8s.kubectl(&["cordon", n]).expect("cordon");
    }
    let first = p.launch(&req).await.expect("launch");
    for n in b2 {
        k8s.kubectl(&["uncordon", n]).expect("uncordon");
    }
    let mut ids: Vec<String> = first.iter().map(|n| n.id.0.clone()).collect();
    let mut used: BTreeSet<String> = ids.iter().cloned().collect();
    for round in 0..3 {
        let (survivor, lost) = (ids[0].clone(), ids[1].clone());
        let survivor_uid = pod(&k8s, &survivor)["metadata"]["uid"].clone();
        p.remove_nodes(&c, &[InstanceId(lost.clone())])
            .await
            .expect("remove_nodes");
        let now: Vec<String> = p
            .describe(&c)
            .await
            .expect("describe")
            .into_iter()
            .map(|n| n.id.0)
            .collect();
        assert_eq!(
            now,
            std::slice::from_ref(&survivor),
            "round {round}: after remove_nodes"
        );
        let got = p.launch(&req).await.expect("the launch that replaces");
        assert_eq!(got.len(), 2, "round {round}: {got:?}");
        assert!(got.iter().all(|n| n.state == NodeState::Running), "{got:?}");
        let new = got
            .iter()
            .map(|n| n.id.0.clone())
            .find(|id| *id != survivor)
            .expect("a new pod");
        assert!(
            used.insert(new.clone()),
            "round {round}: {new} is a name the gang used before"
        );
        assert_eq!(
            pod(&k8s, &survivor)["metadata"]["uid"],
            survivor_uid,
            "round {round}: the survivor was made again"
        );
        let spec = pod(&k8s, &new)["spec"].clone();
        let preferred = spec["affinity"]["nodeAffinity"]
            ["preferredDuringSchedulingIgnoredDuringExecution"]
            .to_string();
        assert!(
            preferred.contains(&format!(
                r#""key":"{BLOCK}","operator":"In","values":["b1"]"#
            )),
            "round {round}: no preference for the survivor's block: {spec}"
        );
        let on = spec["nodeName"].as_str().unwrap_or("").to_string();
        assert!(
            ["node-0", "node-1", "node-2"].contains(&on.as_str()),
            "round {round}: the replacement {new} is on {on}, outside the survivor's block b1"
        );
        // The next round loses the survivor and keeps the new pod.
        ids = vec![new, survivor];
    }
    p.terminate(&c).await.expect("terminate");
    let left = k8s
        .kubectl(&["get", "pods", "-l", "gangway-cluster", "-o", "name"])
        .expect("kubectl get pods");
    assert!(left.trim().is_empty(), "left: {left}");
}
