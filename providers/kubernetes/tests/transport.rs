//! The exec transport's files on a real control plane
//! (tests/emulators/k8s): a tree goes into a pod and comes back byte for
//! byte, and both ways are streams: a 192 MiB file grows this process's
//! peak memory by far less than its size (a checkpoint can be larger than
//! the controller's memory). Without the harness the test says
//! `SKIPPED k8s: why`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use gangway_provider::{ClusterName, NodeRow, Provider};
use gangway_test::k8s::{K8sHarness, NodeSpec};
use gangway_test::skip;

const OWNER: &str = "gw-00000000000c0de8";
const BIG_MIB: usize = 192;

/// This process's peak resident memory so far, in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

/// Every file under `root`, relative, with its bytes.
fn tree(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_path_buf();
                out.push((rel, std::fs::read(&p).expect("read")));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_goes_into_a_pod_and_back_as_streams_not_in_memory() {
    let nodes = [NodeSpec::new("node-0")
        .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB")
        .capacity("nvidia.com/gpu", "1")];
    let Some(k8s) = skip::gate("k8s", K8sHarness::try_start(&nodes)) else {
        return;
    };
    let p = common::provider(&k8s, OWNER, "files");
    let c = ClusterName("files".into());
    let req = common::a100_gang(&c, 1, OWNER);
    let launched = p.launch(&req).await.expect("launch");
    let node = &launched[0];
    let row = NodeRow {
        rank: 0,
        instance_id: node.id.0.clone(),
        private_ip: node.private_ip.clone(),
        public_ip: node.public_ip.clone(),
        zone: String::new(),
        topology: String::new(),
        state: "running".into(),
        extra: node.extra.clone(),
    };
    let t = p
        .transport(Path::new("/nonexistent"), &c.0)
        .expect("a transport");

    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("shards/a")).unwrap();
    for i in 0..50 {
        std::fs::write(
            src.join(format!("shards/a/{i}.txt")),
            format!("shard {i}\n"),
        )
        .unwrap();
    }
    // Incompressible enough not to matter: the bytes are compared.
    let mut big = std::fs::File::create(src.join("big.bin")).unwrap();
    let mut block = vec![0u8; 1 << 20];
    for i in 0..BIG_MIB {
        for (j, b) in block.iter_mut().enumerate() {
            *b = (i.wrapping_mul(31) ^ j.wrapping_mul(7)) as u8;
        }
        big.write_all(&block).unwrap();
    }
    drop(big);
    let back = work.path().join("back");
    let empty = work.path().join("empty");

    let (src2, back2, empty2) = (src.clone(), back.clone(), empty.clone());
    let (before, after, nothing) = tokio::task::spawn_blocking(move || {
        let before = peak_kib();
        t.upload(&row, &src2, "~/in").expect("upload");
        // `download` takes the node's own spelling of the path.
        let there = t.node_path(&row, "~/in");
        let skipped = t.download(&row, &there, &back2).expect("download");
        assert!(skipped.is_empty(), "{skipped:?}");
        let after = peak_kib();
        let nothing = t
            .download(&row, "~/not-there", &empty2)
            .expect("download nothing");
        (before, after, nothing)
    })
    .await
    .unwrap();
    assert_eq!(tree(&back), tree(&src), "the tree came back changed");
    // A pod without the directory sends nothing, and nothing is made.
    assert!(nothing.is_empty());
    assert!(
        !empty.exists() || std::fs::read_dir(&empty).unwrap().next().is_none(),
        "a download of nothing made files"
    );
    let grew_mib = after.saturating_sub(before) / 1024;
    assert!(
        grew_mib < (BIG_MIB / 2) as u64,
        "peak memory grew {grew_mib} MiB moving a {BIG_MIB} MiB file: it was held whole"
    );
    p.terminate(&c).await.expect("terminate");
}
