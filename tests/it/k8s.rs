//! Gangs of pods on a real Kubernetes control plane: each test starts its
//! own harness (tests/emulators/k8s: etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager from k8s.io/kubernetes v1.37.2, node agents
//! that run pods as local processes with their own loopback address) and
//! drives the binary against it through `$GANGWAY_HOME/kubernetes.yaml`.
//!
//! Without the harness (no Go, no `GANGWAY_TEST_K8S_HARNESS`) each test
//! says `SKIPPED k8s: why` (tests/support/src/skip.rs) and passes.

use std::collections::BTreeSet;

use crate::common::{assert_no_marker_procs, parts, TestHome};
use gangway_test::k8s::{K8sHarness, NodeSpec};
use gangway_test::skip;

/// `n` nodes with `gpus` A100s each (named `node-0`...).
fn gpu_nodes(n: usize, gpus: u32) -> Vec<NodeSpec> {
    (0..n)
        .map(|i| {
            NodeSpec::new(&format!("node-{i}"))
                .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB")
                .capacity("cpu", "8")
                .capacity("memory", "32Gi")
                .capacity("nvidia.com/gpu", &gpus.to_string())
        })
        .collect()
}

fn start(nodes: &[NodeSpec]) -> Option<K8sHarness> {
    skip::gate("k8s", K8sHarness::try_start(nodes))
}

/// Points `home`'s Kubernetes provider at the harness (its kubeconfig's
/// context is `harness`, namespace `default`); the image is ignored there.
fn configure(home: &TestHome, k8s: &K8sHarness, launch_timeout: &str) {
    home.file(
        "kubernetes.yaml",
        &format!(
            "kubeconfig: {}\nimage: ignored-by-the-harness\nlaunch_timeout: {launch_timeout}\n",
            k8s.kubeconfig().display()
        ),
    );
}

/// The names of the objects of `kinds` labelled with gangway's cluster tag.
fn gangway_objects(k8s: &K8sHarness, kinds: &str) -> Vec<String> {
    k8s.kubectl(&["get", kinds, "-A", "-l", "gangway-cluster", "-o", "name"])
        .expect("kubectl get")
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until no pod or secret carries gangway's cluster label.
fn assert_nothing_left(k8s: &K8sHarness, after: &str) {
    let left = gangway_objects(k8s, "pods,secrets");
    assert!(left.is_empty(), "left after {after}: {left:?}");
}

fn pods_json(k8s: &K8sHarness, cluster: &str) -> serde_json::Value {
    let out = k8s
        .kubectl(&[
            "get",
            "pods",
            "-l",
            &format!("gangway-cluster={cluster}"),
            "-o",
            "json",
        ])
        .expect("kubectl get pods");
    serde_json::from_str(&out).expect("JSON")
}

#[test]
fn hello_runs_in_pods_with_secrets_off_the_pod_spec_and_down_leaves_nothing() {
    let Some(k8s) = start(&gpu_nodes(2, 2)) else {
        return;
    };
    let home = TestHome::new();
    configure(&home, &k8s, "30s");
    let task = home.file(
        "hello.yaml",
        &format!(
            "name: hello\nnum_nodes: 2\nresources:\n  accelerators: A100:1\nenvs:\n  {}: {}\n\
             run: |\n  echo \"rank $GANGWAY_NODE_RANK of $GANGWAY_NUM_NODES at $HARNESS_POD_IP head $GANGWAY_HEAD_IP secret=${{#GW_SECRET}}\"\n",
            crate::common::MARKER_ENV,
            home.marker
        ),
    );
    let o = home.run([
        "launch",
        &task,
        "--infra",
        "k8s/harness",
        "-c",
        "hello",
        "-y",
        "--secret",
        "GW_SECRET=hunter2-not-in-the-pod-spec",
    ]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "launch failed:\n{out}\n{err}");
    let pods = pods_json(&k8s, "hello");
    let items = pods["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{pods}");
    let ips: BTreeSet<&str> = items
        .iter()
        .map(|p| p["status"]["podIP"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ips.len(), 2, "two pods, two addresses: {ips:?}");
    let nodes = home.nodes("hello");
    let head = nodes
        .iter()
        .find(|n| n.rank == 0)
        .expect("rank 0")
        .ip
        .clone();
    for n in &nodes {
        assert!(
            ips.contains(n.ip.as_str()),
            "{} is no pod's IP: {ips:?}",
            n.ip
        );
        let want = format!("rank {} of 2 at {} head {head} secret=27", n.rank, n.ip);
        assert!(out.contains(&want), "no '{want}' in:\n{out}\n{err}");
    }
    for p in items {
        assert_eq!(
            p["metadata"]["labels"]["gangway-owner"]
                .as_str()
                .map(|o| o.starts_with("gw-")),
            Some(true),
            "{p}"
        );
        assert_eq!(p["spec"]["restartPolicy"], "Never", "{p}");
        assert_eq!(
            p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1",
            "{p}"
        );
    }
    let everything = k8s
        .kubectl(&["get", "pods,secrets,configmaps", "-A", "-o", "json"])
        .expect("kubectl get");
    assert!(
        !everything.contains("hunter2"),
        "the secret is in an API object"
    );
    assert!(!out.contains("hunter2") && !err.contains("hunter2"));
    // describe through status --refresh: both pods running.
    let (code, out, err) = parts(&home.run(["status", "-r", "hello"]));
    assert_eq!(code, 0, "status failed:\n{out}\n{err}");
    assert!(out.contains("UP"), "{out}");
    let o = home.run(["down", "-y", "hello"]);
    assert_eq!(parts(&o).0, 0, "down failed: {}", parts(&o).2);
    assert_nothing_left(&k8s, "down");
    assert_no_marker_procs(&home.marker, "down");
}

#[test]
fn ddp_rendezvous_runs_unchanged_on_four_pods() {
    let Some(k8s) = start(&gpu_nodes(4, 1)) else {
        return;
    };
    let home = TestHome::new();
    configure(&home, &k8s, "30s");
    let o = home.run([
        "launch",
        "examples/ddp-rendezvous.yaml",
        "--infra",
        "k8s/harness",
        "-c",
        "rdv",
        "-y",
        "--down",
    ]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "launch failed:\n{out}\n{err}");
    assert!(
        out.contains("sum of ranks 6, expected 6: ok"),
        "the rendezvous did not add up:\n{out}\n{err}"
    );
    let heard = out
        .lines()
        .find(|l| l.contains("rank 0 heard from"))
        .unwrap_or_else(|| panic!("no rank 0 line:\n{out}"));
    let ips: BTreeSet<&str> = heard
        .split('\'')
        .filter(|s| s.starts_with("127."))
        .collect();
    assert_eq!(ips.len(), 4, "four distinct pod IPs: {heard}");
    assert_nothing_left(&k8s, "launch --down");
}

#[test]
fn a_failing_rank_stops_the_gang_and_is_named() {
    let Some(k8s) = start(&gpu_nodes(3, 1)) else {
        return;
    };
    let home = TestHome::new();
    configure(&home, &k8s, "30s");
    let task = home.file(
        "fail.yaml",
        &format!(
            "name: fail\nnum_nodes: 3\nresources:\n  accelerators: A100:1\nenvs:\n  {}: {}\n\
             run: |\n  if [ \"$NODE_RANK\" = 1 ]; then sleep 1; exit 3; fi\n  sleep 300\n",
            crate::common::MARKER_ENV,
            home.marker
        ),
    );
    let o = home.run(["launch", &task, "--infra", "k8s/harness", "-c", "fl", "-y"]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 1, "a failed rank must fail the launch:\n{out}\n{err}");
    let all = format!("{out}\n{err}");
    assert!(
        all.contains("rank 1") && all.contains("code 3"),
        "the failure does not name rank 1 and its code:\n{all}"
    );
    // The other ranks were stopped in their pods.
    assert_no_marker_procs(&home.marker, "a rank failed");
    let o = home.run(["down", "-y", "fl"]);
    assert_eq!(parts(&o).0, 0, "down failed: {}", parts(&o).2);
    assert_nothing_left(&k8s, "down");
}

#[test]
fn ranks_follow_the_nodes_block_and_sub_block_labels() {
    // Names and labels deliberately out of order.
    let layout = [
        ("node-a", "b2", "s1"),
        ("node-b", "b1", "s2"),
        ("node-c", "b2", "s2"),
        ("node-d", "b1", "s1"),
    ];
    let nodes: Vec<NodeSpec> = layout
        .iter()
        .map(|(n, b, s)| {
            NodeSpec::new(n)
                .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB")
                .label("cloud.google.com/gce-topology-block", b)
                .label("cloud.google.com/gce-topology-subblock", s)
                .capacity("cpu", "8")
                .capacity("memory", "32Gi")
                .capacity("nvidia.com/gpu", "1")
        })
        .collect();
    let Some(k8s) = start(&nodes) else {
        return;
    };
    let home = TestHome::new();
    configure(&home, &k8s, "30s");
    let task = home.file(
        "topo.yaml",
        "num_nodes: 4\nresources:\n  accelerators: A100:1\n\
         run: echo \"R=$NODE_RANK/$NNODES node=$HARNESS_NODE_NAME topo=$GANGWAY_NODE_TOPOLOGY\"\n",
    );
    let o = home.run([
        "launch",
        &task,
        "--infra",
        "k8s/harness",
        "-c",
        "topo",
        "-y",
        "--down",
    ]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "launch failed:\n{out}\n{err}");
    for (rank, want) in [
        (0, "node=node-d topo=b1/s1/node-d"),
        (1, "node=node-b topo=b1/s2/node-b"),
        (2, "node=node-a topo=b2/s1/node-a"),
        (3, "node=node-c topo=b2/s2/node-c"),
    ] {
        let want = format!("R={rank}/4 {want}");
        assert!(out.contains(&want), "no '{want}' in:\n{out}\n{err}");
    }
    assert_nothing_left(&k8s, "launch --down");
}

#[test]
fn too_few_gpus_deletes_the_pods_and_an_ordered_task_falls_back_to_local() {
    let Some(k8s) = start(&gpu_nodes(2, 1)) else {
        return;
    };
    let home = TestHome::new();
    configure(&home, &k8s, "3s");
    let task = home.file(
        "ordered.yaml",
        &format!(
            "num_nodes: 3\nresources:\n  accelerators: A100:1\n  ordered:\n    - infra: k8s/harness\n    - infra: local\n\
             envs:\n  {}: {}\nrun: echo \"ran on $GANGWAY_CLUSTER rank $NODE_RANK pod=${{HARNESS_POD_IP:-none}}\"\n",
            crate::common::MARKER_ENV,
            home.marker
        ),
    );
    let o = home.run(["launch", &task, "-c", "ord", "-y"]);
    let (code, out, err) = parts(&o);
    assert_eq!(code, 0, "launch failed:\n{out}\n{err}");
    let all = format!("{out}\n{err}");
    assert!(
        all.contains("kubernetes/harness/default")
            && all.contains("unschedulable")
            && all.contains("Insufficient nvidia.com/gpu"),
        "the scheduler's reason is not reported:\n{all}"
    );
    for r in 0..3 {
        let want = format!("ran on ord rank {r} pod=none");
        assert!(out.contains(&want), "no '{want}' (not on local):\n{all}");
    }
    assert_eq!(
        home.cluster("ord")["cloud"],
        "local",
        "{}",
        home.cluster("ord")
    );
    // The two pods that did run were deleted with the third.
    assert_nothing_left(&k8s, "falling back");
    let o = home.run(["down", "-y", "ord"]);
    assert_eq!(parts(&o).0, 0, "down failed: {}", parts(&o).2);
}

#[test]
fn check_lists_the_context_its_gpus_and_free_gpus() {
    let Some(k8s) = start(&gpu_nodes(2, 4)) else {
        return;
    };
    let home = TestHome::new();
    configure(&home, &k8s, "30s");
    let (code, out, err) = parts(&home.run(["check", "kubernetes", "-o", "json"]));
    assert_eq!(code, 0, "check failed:\n{out}\n{err}");
    let doc = crate::common::json_doc(&out);
    let k = doc["clouds"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["cloud"] == "kubernetes"))
        .unwrap_or_else(|| panic!("no kubernetes in {doc}"))
        .clone();
    assert_eq!(k["ok"], true, "{k}");
    assert_eq!(
        k["regions"][0], "harness/default (2 nodes; A100 8/8 free)",
        "{k}"
    );
    // Offers from the nodes: up to 4 A100s per pod, at price 0.
    let (code, out, err) = parts(&home.run([
        "optimize",
        "examples/hello.yaml",
        "--infra",
        "k8s/harness",
        "--gpus",
        "A100:4",
        "-o",
        "json",
    ]));
    assert_eq!(code, 0, "optimize failed:\n{out}\n{err}");
    assert!(
        out.contains("A100x4-7.2c-28.8g"),
        "no 4-GPU pod shape offered:\n{out}"
    );
}

/// The GPU operator labels an 80 GB A100 `NVIDIA-A100-SXM4-80GB` and a
/// 40 GB one `NVIDIA-A100-SXM4-40GB`: a task asking for `A100-80GB` is
/// offered the first node only, one asking for `A100` the second.
#[test]
fn gpu_operator_labels_keep_the_40_and_80_gb_a100_apart() {
    let node = |name: &str, product: &str| {
        NodeSpec::new(name)
            .label("nvidia.com/gpu.product", product)
            .capacity("cpu", "8")
            .capacity("memory", "32Gi")
            .capacity("nvidia.com/gpu", "2")
    };
    let Some(k8s) = start(&[
        node("big", "NVIDIA-A100-SXM4-80GB"),
        node("small", "NVIDIA-A100-SXM4-40GB"),
    ]) else {
        return;
    };
    let home = TestHome::new();
    configure(&home, &k8s, "30s");
    let (code, out, err) = parts(&home.run(["check", "kubernetes", "-o", "json"]));
    assert_eq!(code, 0, "check failed:\n{out}\n{err}");
    assert!(
        out.contains("A100-80GB 2/2 free") && out.contains("A100 2/2 free"),
        "check does not tell the two A100s apart:\n{out}"
    );
    for (gpus, want) in [("A100-80GB:2", "A100-80GBx2-"), ("A100:2", "A100x2-")] {
        let (code, out, err) = parts(&home.run([
            "optimize",
            "examples/hello.yaml",
            "--infra",
            "k8s/harness",
            "--gpus",
            gpus,
            "-o",
            "json",
        ]));
        assert_eq!(code, 0, "optimize {gpus} failed:\n{out}\n{err}");
        let doc = crate::common::json_doc(&out);
        let types: Vec<String> = doc["plan"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter_map(|o| o["instance_type"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            !types.is_empty() && types.iter().all(|t| t.starts_with(want)),
            "{gpus}: offers {types:?} ({doc})"
        );
    }
}

/// A kubeconfig alone (no `$GANGWAY_HOME/kubernetes.yaml`) may name a
/// workplace's clusters: they are offered to tasks that name k8s, never
/// picked for a task that does not for being free; with the file they are.
#[test]
fn a_kubeconfig_alone_offers_its_clusters_only_to_tasks_that_name_k8s() {
    let Some(k8s) = start(&gpu_nodes(1, 2)) else {
        return;
    };
    let home = TestHome::new();
    let task = home.file(
        "anywhere.yaml",
        "resources:\n  accelerators: A100:1\nrun: nvidia-smi\n",
    );
    let clouds = |extra: &[&str]| -> BTreeSet<String> {
        let mut c = crate::common::command_in(home.path());
        c.env("KUBECONFIG", k8s.kubeconfig())
            .args(["optimize", &task, "-o", "json"])
            .args(extra);
        let (code, out, err) = parts(&crate::common::Running::start(c).wait());
        assert_eq!(code, 0, "optimize failed:\n{out}\n{err}");
        crate::common::json_doc(&out)["plan"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["cloud"].as_str().map(str::to_string))
            .collect()
    };
    let anywhere = clouds(&[]);
    assert!(
        !anywhere.is_empty() && !anywhere.contains("kubernetes"),
        "a kubeconfig's cluster picked for a task that did not name it: {anywhere:?}"
    );
    assert_eq!(
        clouds(&["--infra", "k8s/harness"]),
        ["kubernetes".to_string()].into_iter().collect()
    );
    // Listed in kubernetes.yaml: the user's own, offered to every task.
    home.file(
        "kubernetes.yaml",
        &format!("kubeconfig: {}\n", k8s.kubeconfig().display()),
    );
    assert!(clouds(&[]).contains("kubernetes"));
}

/// The harness with three one-A100 nodes, a home configured for it (60 s
/// to launch) and an empty directory `dir` in that home, for the ranks'
/// files; `None` (said) without the harness.
fn three_nodes_and(dir: &str) -> Option<(K8sHarness, TestHome, std::path::PathBuf)> {
    let k8s = start(&gpu_nodes(3, 1))?;
    let home = TestHome::new();
    configure(&home, &k8s, "60s");
    let path = home.path().join(dir);
    std::fs::create_dir_all(&path).unwrap();
    Some((k8s, home, path))
}

/// A managed gang of 2 one-GPU pods (`recovery`: its `job_recovery`
/// lines under `resources:`, or none). Setup says which pod it ran on.
/// Run 0: rank 0 checkpoints step 7; each rank, once a sync that began
/// after that write was kept, writes `FLAGS/rankR` = "POD NODE" and waits
/// to be preempted. Run 1 (and later): each rank writes `FLAGS/runN-rankR`
/// and waits (up to 120 s) for `FLAGS/go`, so the test can look at the
/// pods while the job still holds them, then says where it resumed.
fn managed_gang(home: &TestHome, flags: &std::path::Path, recovery: &str) -> String {
    home.file(
        "managed.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: k8s/harness\n  accelerators: A100:1\n{recovery}\
             checkpoint:\n  sync_interval: 1\nenvs:\n  {}: {}\n  FLAGS: {}\n\
             setup: echo \"setup ran on $HOSTNAME\"\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  \
             if [ \"$GANGWAY_RESTART_COUNT\" = 0 ]; then\n    \
             [ \"$NODE_RANK\" = 0 ] && echo 7 > \"$ck\"\n    t=$(date +%s%3N)\n    \
             while [ \"$(cat \"$GANGWAY_CHECKPOINT_DIR/.gangway-synced\" 2>/dev/null || echo 0)\" -lt \"$t\" ]; do sleep 0.05; done\n    \
             echo \"$HOSTNAME $HARNESS_NODE_NAME\" > \"$FLAGS/rank$NODE_RANK\"\n    sleep 300\n  fi\n  \
             touch \"$FLAGS/run$GANGWAY_RESTART_COUNT-rank$NODE_RANK\"\n  \
             n=0; while [ ! -e \"$FLAGS/go\" ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n + 1)); done\n  \
             echo \"rank $NODE_RANK resumed at step $(cat \"$ck\") in run $GANGWAY_RESTART_COUNT on $HOSTNAME $HARNESS_NODE_NAME\"\n",
            crate::common::MARKER_ENV,
            home.marker,
            flags.display()
        ),
    )
}

/// Waits until every rank of run 0 has said "POD NODE" in `flags`.
fn run0_placed(flags: &std::path::Path, launch: &crate::common::Running) -> [(String, String); 2] {
    crate::common::wait_for("run 0 to checkpoint", crate::common::DEADLINE, || {
        std::fs::read_to_string(flags.join("rank0"))
            .and_then(|_| std::fs::read_to_string(flags.join("rank1")))
            .map_err(|e| format!("{e}; launch says: {}", launch.stdout_now()))
    });
    [0, 1].map(|r| {
        let s = std::fs::read_to_string(flags.join(format!("rank{r}"))).unwrap();
        let (pod, node) = s.trim().split_once(' ').expect("POD NODE");
        (pod.to_string(), node.to_string())
    })
}

/// Waits until both ranks of run `run` have started.
fn run_started(flags: &std::path::Path, run: u32, launch: &crate::common::Running) {
    crate::common::wait_for(
        &format!("run {run} to start on both ranks"),
        std::time::Duration::from_secs(180),
        || {
            if (0..2).all(|r| flags.join(format!("run{run}-rank{r}")).exists()) {
                Ok(())
            } else {
                Err(format!("launch says: {}", launch.stdout_now()))
            }
        },
    );
}

/// The pods with label `cluster_label` (as kubectl's JSON items).
fn pods_now(k8s: &K8sHarness, cluster_label: &str) -> Vec<serde_json::Value> {
    let out = k8s
        .kubectl(&["get", "pods", "-l", cluster_label, "-o", "json"])
        .expect("kubectl get pods");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    doc["items"].as_array().cloned().unwrap_or_default()
}

/// The pod named `name` among `pods`.
fn pod_named<'a>(pods: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    pods.iter().find(|p| p["metadata"]["name"] == name)
}

/// What a replaced gang must show once it finished: both ranks resumed at
/// step 7 in run 1, rank 0 on the survivor pod, rank 1 on `new` (not the
/// lost pod); setup ran on the two first pods and then only on `new`, the
/// survivor kept its; the events name the replaced rank and the lost pod;
/// one preemption, one node replaced; nothing of the job is left.
fn assert_replaced_only(
    home: &TestHome,
    k8s: &K8sHarness,
    out: &str,
    survivor: &str,
    lost: &str,
    new: &str,
) {
    for (r, pod) in [(0, survivor), (1, new)] {
        let want = format!("rank {r} resumed at step 7 in run 1 on {pod} ");
        assert!(out.contains(&want), "no '{want}' in:\n{out}");
    }
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    assert_eq!(log.matches("setup ran on ").count(), 3, "{log}");
    assert_eq!(
        log.matches(&format!("setup ran on {new}")).count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches(&format!("setup ran on {survivor}")).count(),
        1,
        "setup ran again on the survivor:\n{log}"
    );
    assert_eq!(log.matches("setup kept on rank").count(), 1, "{log}");
    let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
    assert!(
        ev.contains("replaced rank 1") && ev.contains(lost) && ev.contains(new),
        "the replacement does not name rank 1, {lost} and {new}:\n{ev}"
    );
    assert!(!ev.contains("whole-gang recovery"), "{ev}");
    let (_, q, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["preemptions"], 1, "{j}");
    assert_eq!(j["nodes_replaced"], 1, "{j}");
    assert_nothing_left(k8s, "the managed job ended");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// `kubectl delete node` under one rank of a managed gang, no notice: the
/// default recovery removes that rank's pod and makes one new pod beside
/// the survivor, whose pod (same name and UID), node and setup stay; the
/// job resumes from the kept checkpoint on both.
#[test]
fn a_managed_gang_that_loses_one_pods_node_replaces_only_it() {
    let Some((k8s, home, flags)) = three_nodes_and("flags") else {
        return;
    };
    let t = managed_gang(&home, &flags, "");
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    let [(survivor, _), (lost, lost_node)] = run0_placed(&flags, &launch);
    let label = "gangway-cluster";
    let before = pods_now(&k8s, label);
    assert_eq!(before.len(), 2, "{before:?}");
    let uid = pod_named(&before, &survivor).expect("the survivor")["metadata"]["uid"].clone();
    k8s.kubectl(&["delete", "node", &lost_node])
        .expect("kubectl delete node");
    run_started(&flags, 1, &launch);
    let now = pods_now(&k8s, label);
    let kept = pod_named(&now, &survivor)
        .unwrap_or_else(|| panic!("the survivor {survivor} is gone: {now:?}"));
    assert_eq!(kept["metadata"]["uid"], uid, "the survivor was made again");
    assert_eq!(kept["status"]["phase"], "Running", "{kept}");
    assert_eq!(now.len(), 2, "{now:?}");
    let new = now
        .iter()
        .find(|p| p["metadata"]["name"] != survivor.as_str())
        .expect("the replacement");
    let new_name = new["metadata"]["name"].as_str().unwrap().to_string();
    assert_ne!(new_name, lost, "the lost pod's name was reused");
    assert_ne!(new["spec"]["nodeName"], lost_node.as_str(), "{new}");
    std::fs::write(flags.join("go"), "").unwrap();
    let (code, out, err) = parts(&launch.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
    assert!(
        ev.contains(&format!("node {lost_node} is gone")),
        "the reason is not the node: {ev}"
    );
    assert_replaced_only(&home, &k8s, &out, &survivor, &lost, &new_name);
}

/// A managed gang whose rank-1 node is tainted as leaving (Karpenter's
/// `karpenter.sh/disruption`, what the transport reads as a notice): the
/// run is told (SIGTERM), rank 0 checkpoints the step it reached, only the
/// tainted node's pod is replaced (on the third node: the taint keeps new
/// pods off it), the node is then deleted, and both ranks resume at the
/// noticed step and finish.
#[test]
fn a_managed_gang_told_of_one_nodes_disruption_replaces_its_pod_and_loses_no_step() {
    let Some((k8s, home, dir)) = three_nodes_and("progress") else {
        return;
    };
    let t = home.file(
        "trainer.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: k8s/harness\n  accelerators: A100:1\n\
             envs:\n  {}: {}\n  TOTAL_STEPS: 40\n\
             checkpoint:\n  sync_interval: 1\n  signal: SIGTERM\n  grace_period: 30\n\
             setup: echo \"setup ran on $HOSTNAME\"\n\
             run: |\n  ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  step=0\n  \
             [ -f \"$ck\" ] && step=$(cat \"$ck\")\n  \
             echo \"rank $GANGWAY_NODE_RANK run $GANGWAY_RESTART_COUNT resumes at step $step on $HOSTNAME\"\n  \
             echo \"$HOSTNAME $HARNESS_NODE_NAME\" > {dir}/rank$GANGWAY_NODE_RANK-run$GANGWAY_RESTART_COUNT\n  \
             on_notice() {{\n    \
               [ \"$GANGWAY_NODE_RANK\" = 0 ] && echo \"$step\" > \"$ck.tmp\" && mv \"$ck.tmp\" \"$ck\"\n    \
               echo \"rank $GANGWAY_NODE_RANK checkpointed step $step on the notice\"\n    \
               exit 0\n  \
             }}\n  \
             trap on_notice TERM\n  \
             while [ \"$step\" -lt \"$TOTAL_STEPS\" ]; do\n    \
               sleep 0.2\n    step=$((step + 1))\n    \
               [ \"$GANGWAY_NODE_RANK\" = 0 ] && touch {dir}/run$GANGWAY_RESTART_COUNT-step$step\n  \
             done\n  \
             echo \"rank $GANGWAY_NODE_RANK done at step $step\"\n",
            crate::common::MARKER_ENV,
            home.marker,
            dir = dir.display()
        ),
    );
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    crate::common::wait_for("run 0 to reach step 5", crate::common::DEADLINE, || {
        if dir.join("run0-step5").exists()
            && dir.join("rank1-run0").exists()
            && dir.join("rank0-run0").exists()
        {
            Ok(())
        } else {
            Err(format!("launch says: {}", launch.stdout_now()))
        }
    });
    let placed = |r: u32| {
        let s = std::fs::read_to_string(dir.join(format!("rank{r}-run0"))).unwrap();
        let (pod, node) = s.trim().split_once(' ').expect("POD NODE");
        (pod.to_string(), node.to_string())
    };
    let ((survivor, _), (lost, lost_node)) = (placed(0), placed(1));
    k8s.kubectl(&[
        "taint",
        "nodes",
        &lost_node,
        "karpenter.sh/disruption=disrupting:NoSchedule",
    ])
    .expect("kubectl taint");
    // The reclaim completes once gangway has let the pod go.
    crate::common::wait_for(
        "the noticed pod to be removed",
        std::time::Duration::from_secs(120),
        || {
            if pod_named(&pods_now(&k8s, "gangway-cluster"), &lost).is_none() {
                Ok(())
            } else {
                Err(format!("launch says: {}", launch.stdout_now()))
            }
        },
    );
    k8s.kubectl(&["delete", "node", &lost_node])
        .expect("kubectl delete node");
    let (code, out, err) = parts(&launch.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let noticed = crate::common::noticed_step(&out)
        .unwrap_or_else(|| panic!("no checkpoint on the notice:\n{out}\n{err}"));
    assert!(noticed >= 5, "{out}");
    let new = std::fs::read_to_string(dir.join("rank1-run1"))
        .expect("rank 1 of run 1")
        .trim()
        .split_once(' ')
        .map(|(p, n)| (p.to_string(), n.to_string()))
        .expect("POD NODE");
    assert_ne!(new.0, lost, "the noticed pod's name was reused");
    assert_ne!(new.1, lost_node, "the replacement went to the tainted node");
    for (r, pod) in [(0, survivor.as_str()), (1, new.0.as_str())] {
        let want = format!("rank {r} run 1 resumes at step {noticed} on {pod}");
        assert!(out.contains(&want), "no '{want}' in:\n{out}");
        assert!(out.contains(&format!("rank {r} done at step 40")), "{out}");
    }
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    assert_eq!(log.matches("setup ran on ").count(), 3, "{log}");
    assert_eq!(
        log.matches(&format!("setup ran on {}", new.0)).count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("setup kept on rank").count(), 1, "{log}");
    let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
    assert!(
        ev.contains("karpenter.sh/disruption") && ev.contains("replaced rank 1"),
        "the notice or the replacement is not in the events:\n{ev}"
    );
    assert!(!ev.contains("whole-gang recovery"), "{ev}");
    let (_, q, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["preemptions"], 1, "{j}");
    assert_eq!(j["nodes_replaced"], 1, "{j}");
    assert_nothing_left(&k8s, "the managed job ended");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// With `job_recovery: EAGER_NEXT_REGION` the same loss recovers the gang
/// whole: both pods are made again (the survivor's too), and run 1 finds
/// step 7 restored in both.
#[test]
fn a_whole_gang_strategy_recovers_a_managed_job_from_its_checkpoint_after_kubectl_delete_node() {
    let Some((k8s, home, flags)) = three_nodes_and("flags") else {
        return;
    };
    let t = managed_gang(
        &home,
        &flags,
        "  job_recovery:\n    strategy: EAGER_NEXT_REGION\n",
    );
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    let [_, (_, lost_node)] = run0_placed(&flags, &launch);
    k8s.kubectl(&["delete", "node", &lost_node])
        .expect("kubectl delete node");
    run_started(&flags, 1, &launch);
    std::fs::write(flags.join("go"), "").unwrap();
    let (code, out, err) = parts(&launch.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..2 {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("rank {r} resumed at step 7 in run 1")))
            .unwrap_or_else(|| panic!("rank {r} did not resume from step 7:\n{out}\n{err}"));
        assert!(
            !line.ends_with(&format!(" {lost_node}")),
            "rank {r} ran again on the deleted node: {line}"
        );
    }
    // Both pods made again: setup ran on 4 pods, none kept it.
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    assert_eq!(log.matches("setup ran on ").count(), 4, "{log}");
    assert_eq!(log.matches("setup kept on rank").count(), 0, "{log}");
    let (_, q, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["preemptions"], 1, "a deleted node is a preemption: {j}");
    assert_eq!(j["nodes_replaced"], 0, "{j}");
    let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
    assert!(
        ev.contains(&format!("node {lost_node} is gone")),
        "the reason is not the node: {ev}"
    );
    assert!(!ev.contains("replaced rank"), "{ev}");
    assert_nothing_left(&k8s, "the managed job ended");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

#[test]
fn an_unreachable_cluster_offers_nothing_and_fails_no_other_command() {
    let Some(k8s) = start(&gpu_nodes(1, 1)) else {
        return;
    };
    let home = TestHome::new();
    configure(&home, &k8s, "30s");
    // The kubeconfig stays; the cluster behind it goes away.
    let kubeconfig = std::fs::read_to_string(k8s.kubeconfig()).expect("kubeconfig");
    drop(k8s);
    let kept = home.file("kubeconfig", &kubeconfig);
    home.file(
        "kubernetes.yaml",
        &format!("kubeconfig: {kept}\nlaunch_timeout: 30s\n"),
    );
    let started = std::time::Instant::now();
    let (code, out, err) = parts(&home.run(["optimize", "examples/hello.yaml"]));
    assert_eq!(
        code, 0,
        "a dead cluster failed another cloud's plan:\n{out}\n{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "optimize waited {:?}",
        started.elapsed()
    );
    let (code, out, err) = parts(&home.run(["catalog", "show"]));
    assert_eq!(code, 0, "catalog show failed:\n{out}\n{err}");
    assert!(
        out.contains("no offers from context harness"),
        "the catalog does not say why Kubernetes offers nothing:\n{out}"
    );
    let (code, out, err) = parts(&home.run([
        "launch",
        "examples/hello.yaml",
        "--infra",
        "k8s/harness",
        "-y",
    ]));
    assert_eq!(code, 3, "no offers is no resources:\n{out}\n{err}");
    let (code, out, err) = parts(&home.run(["check", "kubernetes"]));
    assert_eq!(
        code, 4,
        "check must say the cluster is not usable:\n{out}\n{err}"
    );
    assert!(
        out.contains("context harness"),
        "check does not name the context:\n{out}\n{err}"
    );
}

#[test]
fn down_orphans_finds_this_installations_pods_by_label_and_leaves_anothers() {
    let Some(k8s) = start(&gpu_nodes(2, 2)) else {
        return;
    };
    let (a, b) = (TestHome::new(), TestHome::new());
    configure(&a, &k8s, "30s");
    configure(&b, &k8s, "30s");
    // A cluster name that is no label value: hashed in the label, exact in
    // an annotation.
    for (home, name) in [(&a, "orphan.a_"), (&b, "orph-b")] {
        let (code, out, err) = parts(&home.run([
            "launch",
            "examples/hello.yaml",
            "--infra",
            "k8s/harness",
            "-c",
            name,
            "-y",
            "--provision-only",
        ]));
        assert_eq!(code, 0, "launch {name}:\n{out}\n{err}");
    }
    let all: serde_json::Value = serde_json::from_str(
        &k8s.kubectl(&["get", "pods", "-o", "json"])
            .expect("kubectl get pods"),
    )
    .expect("JSON");
    let hashed = all["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|p| p["metadata"]["annotations"]["gangway.dev/cluster-name"] == "orphan.a_")
        .map(|p| {
            p["metadata"]["labels"]["gangway-cluster"]
                .as_str()
                .unwrap_or("")
        })
        .collect::<Vec<_>>();
    assert!(
        hashed.len() == 2 && hashed.iter().all(|l| l.starts_with("h-")),
        "A's pods' cluster labels: {hashed:?}"
    );
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(a.path().join(f));
    }
    let (code, out, err) = parts(&a.run(["down", "--orphans", "-y"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("orphan.a_"), "{out}");
    assert!(!out.contains("orph-b"), "another installation's: {out}");
    let left = gangway_objects(&k8s, "pods");
    assert_eq!(left.len(), 2, "only B's two pods stay: {left:?}");
    let b_pods = pods_json(&k8s, "orph-b");
    assert_eq!(
        b_pods["items"].as_array().map(Vec::len),
        Some(2),
        "{b_pods}"
    );
    let (code, out, err) = parts(&b.run(["down", "-y", "orph-b"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert_nothing_left(&k8s, "both sweeps");
}

/// A harness with Kueue running (suite `kueue`): skipped, and said so,
/// where Kueue cannot be built or found.
fn start_with_kueue(nodes: &[NodeSpec]) -> Option<K8sHarness> {
    skip::gate("kueue", K8sHarness::try_start_with_kueue(nodes))
}

/// A ResourceFlavor (`flavor`, with `extra` in its spec), a ClusterQueue
/// `cq` with `gpus` of quota (and plenty of CPU and memory) in it, and the
/// LocalQueue `lq` in namespace default.
fn kueue_queues(k8s: &K8sHarness, flavor: &str, extra: &str, gpus: u32) {
    let yaml = format!(
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata:\n  name: {flavor}\nspec: {{{extra}}}\n\
         ---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata:\n  name: cq\nspec:\n  namespaceSelector: {{}}\n  resourceGroups:\n\
         \x20 - coveredResources: [cpu, memory, nvidia.com/gpu]\n    flavors:\n    - name: {flavor}\n      resources:\n\
         \x20     - {{name: cpu, nominalQuota: 1000}}\n      - {{name: memory, nominalQuota: 10000Gi}}\n\
         \x20     - {{name: nvidia.com/gpu, nominalQuota: {gpus}}}\n\
         ---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata:\n  name: lq\n  namespace: default\nspec:\n  clusterQueue: cq\n"
    );
    k8s.kubectl_stdin(&["apply", "-f", "-"], &yaml)
        .expect("Kueue's queues");
}

/// Kueue's Workloads in namespace default: (name, Admitted status).
fn workloads(k8s: &K8sHarness) -> Vec<(String, String)> {
    let out = k8s
        .kubectl(&["get", "workloads.kueue.x-k8s.io", "-o", "json"])
        .expect("kubectl get workloads");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    doc["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|w| {
            let admitted = w["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Admitted"))
                .and_then(|c| c["status"].as_str())
                .unwrap_or("")
                .to_string();
            (
                w["metadata"]["name"].as_str().unwrap_or("").to_string(),
                admitted,
            )
        })
        .collect()
}

/// Waits (up to 60 s) until Kueue's Workloads are exactly `want` by name.
fn wait_workloads(k8s: &K8sHarness, want: &[&str], after: &str) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let now: BTreeSet<String> = workloads(k8s).into_iter().map(|(n, _)| n).collect();
        if now == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after {after}: Workloads {now:?}, want {want:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Kueue admits a gang whole or not at all: the first gang (4 of the
/// ClusterQueue's 5 GPUs) is one pod group, admitted and running; the
/// second (2 GPUs: the third node has room for both pods, the quota for
/// one) is created but stays gated, no pod bound, until the launch
/// gives up with Kueue's words, exit 3, leaving nothing; after the first
/// gang's down it launches whole.
#[test]
fn kueue_admits_a_gang_whole_or_not_at_all() {
    let Some(k8s) = start_with_kueue(&gpu_nodes(3, 2)) else {
        return;
    };
    kueue_queues(&k8s, "default-flavor", "", 5);
    // A queue kubernetes.yaml names must be there: no pod is made.
    let wrong = TestHome::new();
    wrong.file(
        "kubernetes.yaml",
        &format!(
            "kubeconfig: {}\nimage: ignored-by-the-harness\nqueue: nope\n",
            k8s.kubeconfig().display()
        ),
    );
    let (code, out, err) = parts(&wrong.run([
        "launch",
        "examples/hello.yaml",
        "--infra",
        "k8s/harness",
        "-c",
        "wrong",
        "-y",
    ]));
    assert_ne!(code, 0, "a missing LocalQueue launched:\n{out}\n{err}");
    assert!(
        format!("{out}{err}")
            .contains("names Kueue queue 'nope', but namespace default has LocalQueues lq"),
        "{out}\n{err}"
    );
    assert!(pods_json(&k8s, "wrong")["items"]
        .as_array()
        .is_some_and(Vec::is_empty));
    let home = TestHome::new();
    // Generous for the gangs that fit (a loaded CI machine); the one that
    // must give up sets its own 12 s.
    configure(&home, &k8s, "90s");
    let task = |file: &str, name: &str, gpus: u32, extra: &str| {
        home.file(
            &format!("{file}.yaml"),
            &format!(
                "num_nodes: 2\nresources:\n  accelerators: A100:{gpus}\nenvs:\n  {}: {}\n\
                 run: echo \"{name} rank $NODE_RANK on $HARNESS_NODE_NAME\"\n{extra}",
                crate::common::MARKER_ENV,
                home.marker
            ),
        )
    };
    let big = task("big", "big", 2, "");
    let small = task("small", "small", 1, "");
    let small_12s = task(
        "small-12s",
        "small",
        1,
        "config:\n  kubernetes:\n    launch_timeout: 12s\n",
    );
    let (code, out, err) =
        parts(&home.run(["launch", &big, "--infra", "k8s/harness", "-c", "big", "-y"]));
    assert_eq!(code, 0, "launch big:\n{out}\n{err}");
    for r in 0..2 {
        assert!(
            out.contains(&format!("big rank {r} on node-")),
            "{out}\n{err}"
        );
    }
    let pods = pods_json(&k8s, "big");
    let items = pods["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{pods}");
    let group = items[0]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
        .as_str()
        .unwrap_or_else(|| panic!("no pod group label: {pods}"))
        .to_string();
    for p in items {
        let l = &p["metadata"]["labels"];
        assert_eq!(l["kueue.x-k8s.io/queue-name"], "lq", "{p}");
        assert_eq!(l["kueue.x-k8s.io/pod-group-name"], group.as_str(), "{p}");
        assert_eq!(
            p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "2",
            "{p}"
        );
        assert_eq!(p["status"]["phase"], "Running", "{p}");
    }
    assert_eq!(
        workloads(&k8s),
        [(group.clone(), "True".to_string())],
        "one Workload, admitted"
    );

    // The second gang: created, gated whole, never bound, then given up.
    let mut second = home.spawn([
        "launch",
        &small_12s,
        "--infra",
        "k8s/harness",
        "-c",
        "small",
        "-y",
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen_gated = 0;
    while !second.exited() && std::time::Instant::now() < deadline {
        let pods = pods_json(&k8s, "small");
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        for p in &items {
            // Pending; once the launch gives up and deletes it, podgc marks
            // the unscheduled terminating pod Failed. Never bound.
            assert!(
                p["spec"]["nodeName"].is_null()
                    && (p["status"]["phase"] == "Pending"
                        || !p["metadata"]["deletionTimestamp"].is_null()),
                "a pod of the gang Kueue did not admit was bound or ran: {p}"
            );
            let gates = p["spec"]["schedulingGates"].to_string();
            assert!(gates.contains("kueue.x-k8s.io/admission"), "not gated: {p}");
        }
        if items.len() == 2 {
            seen_gated += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert!(
        seen_gated >= 3,
        "the second gang's 2 pods were not seen gated a while"
    );
    let (code, out, err) = parts(&second.wait());
    let all = format!("{out}\n{err}");
    assert_eq!(code, 3, "no capacity is exit 3:\n{all}");
    assert!(
        all.contains("0 of 2 pods running after 12 s")
            || all.contains("0 of 2 pods running after 13 s"),
        "not the task's 12 s launch_timeout:\n{all}"
    );
    assert!(
        all.contains("not admitted by Kueue (queue lq)")
            && all.contains("insufficient unused quota for nvidia.com/gpu"),
        "Kueue's reason is not reported:\n{all}"
    );
    assert!(
        pods_json(&k8s, "small")["items"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "the second gang's pods are left"
    );
    wait_workloads(&k8s, &[&group], "the second launch gave up");

    // The first gang's down frees the quota: pods and Workload go.
    let (code, out, err) = parts(&home.run(["down", "-y", "big"]));
    assert_eq!(code, 0, "down big:\n{out}\n{err}");
    assert_nothing_left(&k8s, "down big");
    wait_workloads(&k8s, &[], "down big");
    let (code, out, err) = parts(&home.run([
        "launch",
        &small,
        "--infra",
        "k8s/harness",
        "-c",
        "small",
        "-y",
        "--down",
    ]));
    assert_eq!(code, 0, "launch small after down big:\n{out}\n{err}");
    for r in 0..2 {
        assert!(
            out.contains(&format!("small rank {r} on node-")),
            "{out}\n{err}"
        );
    }
    assert_nothing_left(&k8s, "launch small --down");
    wait_workloads(&k8s, &[], "launch small --down");
    assert_no_marker_procs(&home.marker, "every down");
}

/// A Kueue cluster with topology-aware scheduling by block: one node of
/// A100 GPUs per `(name, block, gpus)` of `layout`, a `blocks` Topology
/// (block, then host), a queue `lq` holding `quota_gpus`, and a home whose
/// kubernetes.yaml uses that queue and asks for the block level.
fn tas_cluster(layout: &[(&str, &str, &str)], quota_gpus: u32) -> Option<(K8sHarness, TestHome)> {
    let nodes: Vec<NodeSpec> = layout
        .iter()
        .map(|(n, b, g)| {
            NodeSpec::new(n)
                .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB")
                .label("cloud.google.com/gce-topology-block", b)
                .capacity("cpu", "8")
                .capacity("memory", "32Gi")
                .capacity("nvidia.com/gpu", g)
        })
        .collect();
    let k8s = start_with_kueue(&nodes)?;
    k8s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Topology\nmetadata:\n  name: blocks\nspec:\n  levels:\n\
         \x20 - nodeLabel: cloud.google.com/gce-topology-block\n  - nodeLabel: kubernetes.io/hostname\n",
    )
    .expect("Topology");
    kueue_queues(
        &k8s,
        "tas-flavor",
        "nodeLabels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB}, topologyName: blocks",
        quota_gpus,
    );
    let home = TestHome::new();
    home.file(
        "kubernetes.yaml",
        &format!(
            "kubeconfig: {}\nimage: ignored-by-the-harness\nlaunch_timeout: 90s\nqueue: lq\n\
             topology: cloud.google.com/gce-topology-block\n",
            k8s.kubeconfig().display()
        ),
    );
    Some((k8s, home))
}

/// Kueue's topology-aware scheduling: with `topology:` a block label in
/// kubernetes.yaml, a gang of 3 one-GPU pods lands in the one block that
/// holds it (b2: 2 nodes of 2 GPUs), never in b1 (2 nodes of 1 GPU, empty
/// and as attractive to the scheduler), and its Workload carries Kueue's
/// topology assignment.
#[test]
fn kueue_topology_puts_a_gang_in_one_block() {
    let layout = [
        ("node-a", "b1", "1"),
        ("node-b", "b2", "2"),
        ("node-c", "b1", "1"),
        ("node-d", "b2", "2"),
    ];
    let Some((k8s, home)) = tas_cluster(&layout, 6) else {
        return;
    };
    let task = home.file(
        "tas.yaml",
        "num_nodes: 3\nresources:\n  accelerators: A100:1\nrun: echo \"R=$NODE_RANK node=$HARNESS_NODE_NAME\"\n",
    );
    let (code, out, err) =
        parts(&home.run(["launch", &task, "--infra", "k8s/harness", "-c", "tas", "-y"]));
    assert_eq!(code, 0, "launch:\n{out}\n{err}");
    let pods = pods_json(&k8s, "tas");
    let items = pods["items"].as_array().expect("items");
    assert_eq!(items.len(), 3, "{pods}");
    let on: BTreeSet<&str> = items
        .iter()
        .map(|p| p["spec"]["nodeName"].as_str().unwrap_or(""))
        .collect();
    assert!(
        on.iter().all(|n| *n == "node-b" || *n == "node-d"),
        "the gang is not in block b2: {on:?}"
    );
    for p in items {
        assert_eq!(
            p["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"],
            "cloud.google.com/gce-topology-block",
            "{p}"
        );
    }
    let wl = k8s
        .kubectl(&["get", "workloads.kueue.x-k8s.io", "-o", "json"])
        .expect("workloads");
    assert!(
        wl.contains("topologyAssignment"),
        "no topology assignment: {wl}"
    );
    let (code, out, err) = parts(&home.run(["down", "-y", "tas"]));
    assert_eq!(code, 0, "down:\n{out}\n{err}");
    assert_nothing_left(&k8s, "down");
    wait_workloads(&k8s, &[], "down");
}

/// The name and UID of each of Kueue's Workloads in namespace default.
fn workload_uids(k8s: &K8sHarness) -> Vec<(String, String)> {
    let out = k8s
        .kubectl(&["get", "workloads.kueue.x-k8s.io", "-o", "json"])
        .expect("kubectl get workloads");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    doc["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            (
                w["metadata"]["name"].as_str().unwrap_or("").to_string(),
                w["metadata"]["uid"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// A managed gang under a LocalQueue whose quota is exactly the gang's 2
/// GPUs loses one pod's node: the replacement joins the gang's admitted
/// pod group (the same Workload, still admitted: a new group would need
/// quota the old one holds), Kueue lifts its gate, the survivor stays,
/// and when the job ends its pods and Workload go.
#[test]
fn kueue_replaces_a_lost_pod_inside_the_gangs_admitted_group() {
    let Some(k8s) = start_with_kueue(&gpu_nodes(3, 1)) else {
        return;
    };
    kueue_queues(&k8s, "default-flavor", "", 2);
    let home = TestHome::new();
    configure(&home, &k8s, "60s");
    let flags = home.path().join("flags");
    std::fs::create_dir_all(&flags).unwrap();
    let t = managed_gang(&home, &flags, "");
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    let [(survivor, _), (lost, lost_node)] = run0_placed(&flags, &launch);
    let label = "gangway-cluster";
    let before = pods_now(&k8s, label);
    assert_eq!(before.len(), 2, "{before:?}");
    let group = before[0]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
        .as_str()
        .unwrap_or_else(|| panic!("no pod group: {before:?}"))
        .to_string();
    let wl = workload_uids(&k8s);
    assert_eq!(wl.len(), 1, "{wl:?}");
    assert_eq!(wl[0].0, group);
    assert_eq!(workloads(&k8s), [(group.clone(), "True".to_string())]);
    let uid = pod_named(&before, &survivor).expect("the survivor")["metadata"]["uid"].clone();
    let lost_at = std::time::Instant::now();
    k8s.kubectl(&["delete", "node", &lost_node])
        .expect("kubectl delete node");
    run_started(&flags, 1, &launch);
    eprintln!(
        "kueue: run 1 started on both ranks {:.1} s after the node's deletion",
        lost_at.elapsed().as_secs_f64()
    );
    let now = pods_now(&k8s, label);
    assert_eq!(now.len(), 2, "{now:?}");
    let kept = pod_named(&now, &survivor)
        .unwrap_or_else(|| panic!("the survivor {survivor} is gone: {now:?}"));
    assert_eq!(kept["metadata"]["uid"], uid, "the survivor was made again");
    let new = now
        .iter()
        .find(|p| p["metadata"]["name"] != survivor.as_str())
        .expect("the replacement");
    let new_name = new["metadata"]["name"].as_str().unwrap().to_string();
    assert_ne!(new_name, lost);
    assert_eq!(
        new["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"],
        group.as_str(),
        "the replacement is not in the gang's group: {new}"
    );
    assert_eq!(new["status"]["phase"], "Running", "{new}");
    assert!(
        !new["spec"]["schedulingGates"]
            .to_string()
            .contains("kueue.x-k8s.io/admission"),
        "still gated: {new}"
    );
    assert_eq!(
        workload_uids(&k8s),
        wl,
        "the gang's Workload was not kept through the replacement"
    );
    assert_eq!(workloads(&k8s), [(group.clone(), "True".to_string())]);
    std::fs::write(flags.join("go"), "").unwrap();
    let (code, out, err) = parts(&launch.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
    for l in ev.lines().filter(|l| l.contains("replaced rank")) {
        eprintln!("kueue: {l}");
    }
    assert_replaced_only(&home, &k8s, &out, &survivor, &lost, &new_name);
    wait_workloads(&k8s, &[], "the managed job ended");
}

/// Kueue's topology-aware scheduling and a lost pod: a gang of 2 one-GPU
/// pods required in one block lands in b2 (b1 has one GPU); its rank-1
/// node is deleted; the replacement joins the admitted group and Kueue
/// places it in b2 again (its third node), never in b1's empty node.
#[test]
fn kueue_topology_replaces_a_lost_pod_in_the_gangs_block() {
    let layout = [
        ("node-a", "b1", "1"),
        ("node-b", "b2", "1"),
        ("node-c", "b2", "1"),
        ("node-d", "b2", "1"),
    ];
    let Some((k8s, home)) = tas_cluster(&layout, 4) else {
        return;
    };
    let flags = home.path().join("flags");
    std::fs::create_dir_all(&flags).unwrap();
    let t = managed_gang(&home, &flags, "");
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    let [(survivor, survivor_node), (lost, lost_node)] = run0_placed(&flags, &launch);
    for n in [&survivor_node, &lost_node] {
        assert_ne!(n.as_str(), "node-a", "the gang is not in block b2");
    }
    let lost_at = std::time::Instant::now();
    k8s.kubectl(&["delete", "node", &lost_node])
        .expect("kubectl delete node");
    run_started(&flags, 1, &launch);
    eprintln!(
        "kueue tas: run 1 started on both ranks {:.1} s after the node's deletion",
        lost_at.elapsed().as_secs_f64()
    );
    let now = pods_now(&k8s, "gangway-cluster");
    assert_eq!(now.len(), 2, "{now:?}");
    let new = now
        .iter()
        .find(|p| p["metadata"]["name"] != survivor.as_str())
        .expect("the replacement");
    let on = new["spec"]["nodeName"].as_str().unwrap_or("");
    assert!(
        on != "node-a" && on != lost_node && on != survivor_node,
        "the replacement is on {on}, not b2's third node: {new}"
    );
    // Kueue moved the lost pod's slot of the topology assignment to a free
    // node of the block and pinned the replacement there.
    assert_eq!(
        new["spec"]["nodeSelector"]["kubernetes.io/hostname"], on,
        "the replacement is not pinned by Kueue's topology assignment: {new}"
    );
    let wl = k8s
        .kubectl(&["get", "workloads.kueue.x-k8s.io", "-o", "json"])
        .expect("workloads");
    let wl: serde_json::Value = serde_json::from_str(&wl).expect("JSON");
    eprintln!(
        "kueue tas: survivor on {survivor_node}, lost {lost_node}, replacement on {on} \
         (node selector {}); the Workload's topology assignment now: {}",
        new["spec"]["nodeSelector"],
        wl["items"][0]["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    );
    std::fs::write(flags.join("go"), "").unwrap();
    let (code, out, err) = parts(&launch.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let new_name = new["metadata"]["name"].as_str().unwrap().to_string();
    assert_replaced_only(&home, &k8s, &out, &survivor, &lost, &new_name);
    wait_workloads(&k8s, &[], "the managed job ended");
}

/// A replacement that cannot come up: a gang of 2 loses one node and its
/// new pod has nowhere to run (the third node cordoned). After
/// `launch_timeout` only the new pod is deleted (the survivor is left
/// running), the controller recovers the gang whole and says why; with
/// the third node uncordoned the whole gang runs again from the kept
/// checkpoint.
#[test]
fn a_replacement_that_cannot_run_deletes_only_its_pod_and_the_gang_is_recovered_whole() {
    let Some(k8s) = start(&gpu_nodes(3, 1)) else {
        return;
    };
    replacement_cannot_run(&k8s, false);
}

/// The same under a LocalQueue whose quota is the gang's 2 GPUs: the
/// replacement is admitted into the group but cannot run; the whole-gang
/// teardown ends the group (its Workload goes and frees the quota), and
/// the new gang is admitted as a new group.
#[test]
fn kueue_a_replacement_that_cannot_run_ends_in_a_new_group_for_the_whole_gang() {
    let Some(k8s) = start_with_kueue(&gpu_nodes(3, 1)) else {
        return;
    };
    kueue_queues(&k8s, "default-flavor", "", 2);
    replacement_cannot_run(&k8s, true);
}

fn replacement_cannot_run(k8s: &K8sHarness, kueue: bool) {
    let home = TestHome::new();
    // node-2 is held back (cordoned) until the replacement gave up; the
    // timeout leaves the whole-gang relaunch time to find it uncordoned.
    k8s.kubectl(&["cordon", "node-2"]).expect("cordon");
    configure(&home, k8s, "20s");
    let flags = home.path().join("flags");
    std::fs::create_dir_all(&flags).unwrap();
    let t = managed_gang(&home, &flags, "");
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    let [(survivor, _), (_, lost_node)] = run0_placed(&flags, &launch);
    let first_group = if kueue { workloads(k8s) } else { Vec::new() };
    assert_eq!(first_group.len(), usize::from(kueue), "{first_group:?}");
    k8s.kubectl(&["delete", "node", &lost_node])
        .expect("kubectl delete node");
    // Until the fallback is recorded the survivor runs (its pods read
    // before the events: a teardown after the event is no failure).
    let mut saw_new = false;
    let ev = crate::common::wait_for(
        "the replacement to give up",
        std::time::Duration::from_secs(120),
        || {
            let pods = pods_now(k8s, "gangway-cluster");
            let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
            if ev.contains("whole-gang recovery") {
                return Ok(ev);
            }
            assert!(
                pod_named(&pods, &survivor).is_some(),
                "the survivor {survivor} went before the fallback: {pods:?}\n{ev}"
            );
            saw_new |= pods.len() == 2;
            Err(format!(
                "events:\n{ev}\nlaunch says: {}",
                launch.stdout_now()
            ))
        },
    );
    assert!(saw_new, "no replacement pod was ever made");
    assert!(
        ev.contains("whole-gang recovery: replacing rank(s) failed")
            && ev.contains("out of capacity")
            && ev.contains("the 1 new pod(s) deleted, the 1 kept left running")
            && ev.contains("after 20 s"),
        "the fallback does not say the replacement failed and what it deleted:\n{ev}"
    );
    k8s.kubectl(&["uncordon", "node-2"]).expect("uncordon");
    crate::common::wait_for(
        "run 1 to start on both ranks",
        std::time::Duration::from_secs(180),
        || {
            if (0..2).all(|r| flags.join(format!("run1-rank{r}")).exists()) {
                Ok(())
            } else {
                let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
                let log = std::fs::read_to_string(home.path().join("jobs/controller.log"))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let pods = k8s
                    .kubectl(&["get", "pods,nodes", "-A", "-o", "wide"])
                    .unwrap_or_else(|e| e);
                Err(format!(
                    "events:\n{ev}\ncontroller log (last lines first):\n{}\npods:\n{pods}\nlaunch says: {}",
                    tail.join("\n"),
                    launch.stdout_now()
                ))
            }
        },
    );
    if kueue {
        // The first gang's group ended with it (finished, its quota
        // released: the queue holds one gang) and goes once its pods are
        // gone; the new gang is a new group, admitted.
        let now = workloads(k8s);
        let new: Vec<&(String, String)> =
            now.iter().filter(|(n, _)| *n != first_group[0].0).collect();
        assert_eq!(new.len(), 1, "{now:?}");
        assert_eq!(new[0].1, "True", "{now:?}");
        wait_workloads(k8s, &[&new[0].0], "the whole-gang recovery");
    }
    std::fs::write(flags.join("go"), "").unwrap();
    let (code, out, err) = parts(&launch.wait());
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank {r} resumed at step 7 in run 1 on ")),
            "rank {r} did not resume from step 7:\n{out}\n{err}"
        );
    }
    let (_, q, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(j["nodes_replaced"], 0, "{j}");
    assert_nothing_left(k8s, "the managed job ended");
    if kueue {
        wait_workloads(k8s, &[], "the managed job ended");
    }
    assert_no_marker_procs(&home.marker, "the managed job ended");
}

/// A spot node reclaimed while a managed gang's setup runs (`kubectl
/// delete pod --force` on rank 1's pod, 2 s into a setup that would take
/// 120 s): the driver's exec to that pod breaks and setup fails there.
/// That is a loss to recover, not a failed setup: the provider reports the
/// pod gone, it is replaced, setup runs again on both pods (neither had
/// finished it), and the job succeeds.
#[test]
fn a_managed_gang_that_loses_a_pod_during_setup_is_recovered_not_failed() {
    let Some((k8s, home, flags)) = three_nodes_and("flags") else {
        return;
    };
    let t = home.file(
        "setup-loss.yaml",
        &format!(
            "num_nodes: 2\nresources:\n  infra: k8s/harness\n  accelerators: A100:1\n\
             envs:\n  {}: {}\n  FLAGS: {}\n\
             setup: |\n  echo \"setup ran on $HOSTNAME\"\n  \
             echo \"$HOSTNAME\" > \"$FLAGS/setup$SKYPILOT_SETUP_NODE_RANK\"\n  \
             [ -e \"$FLAGS/lost\" ] || sleep 120\n\
             run: echo \"rank $NODE_RANK ran in run $GANGWAY_RESTART_COUNT\"\n",
            crate::common::MARKER_ENV,
            home.marker,
            flags.display()
        ),
    );
    let launch = home.spawn(["jobs", "launch", &t, "-y"]);
    crate::common::wait_for(
        "setup to start on both pods",
        crate::common::DEADLINE,
        || {
            std::fs::read_to_string(flags.join("setup0"))
                .and_then(|_| std::fs::read_to_string(flags.join("setup1")))
                .map_err(|e| format!("{e}; launch says: {}", launch.stdout_now()))
        },
    );
    let lost = std::fs::read_to_string(flags.join("setup1")).unwrap();
    let lost = lost.trim();
    std::fs::write(flags.join("lost"), "").unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    k8s.kubectl(&["delete", "pod", lost, "--grace-period=0", "--force"])
        .expect("kubectl delete pod");
    let (code, out, err) = parts(&launch.wait());
    let (_, ev, _) = parts(&home.run(["jobs", "events", "1"]));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}\nevents:\n{ev}");
    assert!(ev.contains("setup runs again"), "{ev}");
    let (_, q, _) = parts(&home.run(["jobs", "queue", "-o", "json"]));
    let j = crate::common::json_doc(&q)["jobs"][0].clone();
    assert_eq!(j["state"], "SUCCEEDED", "{j}");
    assert_eq!(
        (&j["preemptions"], &j["nodes_replaced"]),
        (&1.into(), &1.into()),
        "{j}"
    );
    let (_, log, _) = parts(&home.run(["jobs", "logs", "1"]));
    assert_eq!(log.matches("setup on 2 node(s)").count(), 2, "{log}");
    for r in 0..2 {
        assert!(log.contains(&format!("rank {r} ran in run 1")), "{log}");
    }
    assert_nothing_left(&k8s, "the managed job ended");
    assert_no_marker_procs(&home.marker, "the managed job ended");
}
