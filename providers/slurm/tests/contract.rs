//! The Slurm provider keeps the provider contract (`gangway_test::contract`)
//! on a real, throwaway Slurm cluster (four nodes of two fake GPUs each;
//! `tests/emulators/slurm/`): failures are requests Slurm refuses and
//! drained nodes, and what a cluster holds is the queue (`squeue`, with the
//! owner in each job's comment). Without Slurm (or root) the test says
//! `SKIPPED slurm: why` and passes.

use std::time::Duration;

use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_slurm::{Cluster, Partition, SlurmProvider};
use gangway_test::contract::{self, placement, Flag, Harness, Midway, Next, Resource, Unsupported};
use gangway_test::slurm::SlurmCluster;

const OWNER: &str = "gw-00000000000c0de5";
const OTHER: &str = "gw-00000000000c0de6";

struct Slurm {
    slurm: SlurmCluster,
    p: SlurmProvider,
    work: tempfile::TempDir,
    /// The next request's partition and GPUs per node, when a failure is
    /// a request Slurm refuses.
    next: Next<(String, f32)>,
    drained: Flag,
}

fn partition(name: &str) -> Partition {
    Partition {
        name: name.into(),
        gpu: Some(("A100".into(), 2)),
        gres_type: Some("fake".into()),
        cpus: 2.0,
        memory_gib: 1.0,
        max_nodes: 4,
        price_per_gpu_hour: 0.0,
        exclusive: false,
    }
}

fn provider(slurm: &SlurmCluster, work: &std::path::Path, owner: &str) -> SlurmProvider {
    let cluster = Cluster {
        name: "test".into(),
        login: None,
        conf: Some(slurm.conf()),
        account: None,
        qos: None,
        time_limit: None,
        work_dir: work.display().to_string(),
        max_queue_wait: Duration::from_secs(30),
        // `nosuch` is in slurm.yaml but not in Slurm: sbatch refuses it.
        partitions: vec![partition("gpu"), partition("nosuch")],
    };
    SlurmProvider::new(vec![cluster], work.join("ssh"))
        .with_poll(Duration::from_millis(200))
        .with_progress(Box::new(|_| {}))
        .with_owner(owner)
}

impl Slurm {
    fn nodes(&self, state: &str) {
        let mut args = vec!["update", "nodename=n[1-4]"];
        let st = format!("state={state}");
        args.push(&st);
        if state == "drain" {
            args.push("reason=contract");
        }
        self.slurm.cmd("scontrol", &args);
    }
}

impl Harness for Slurm {
    fn provider(&self) -> &dyn Provider {
        &self.p
    }

    fn owner(&self) -> String {
        OWNER.into()
    }

    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest {
        let (zone, gpus) = self.next.take().unwrap_or(("gpu".into(), 1.0));
        LaunchRequest {
            accelerator: Some(("A100".into(), gpus)),
            ..contract::request(
                cluster,
                count,
                client_token,
                OWNER,
                placement("slurm", "test", &zone),
                "gpu",
            )
        }
    }

    fn fail_midway(&self, _cluster: &ClusterName) -> Result<Midway, Unsupported> {
        // With every node drained the job is queued and stays pending: the
        // launcher gives up while it waits, as one killed there would.
        self.nodes("drain");
        self.drained.raise();
        Ok(Midway::Abandoned(Duration::from_secs(3)))
    }

    fn fail_with(&self, _cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        let next = match kind {
            // Three GPUs per node where nodes have two: sbatch says the
            // node configuration is not available.
            ErrorKind::Capacity => ("gpu".to_string(), 3.0),
            ErrorKind::InvalidRequest => ("nosuch".to_string(), 1.0),
            ErrorKind::Quota => {
                return Err(Unsupported(
                    "QOS limits need Slurm's accounting database, which the throwaway cluster \
                     has not"
                        .into(),
                ))
            }
            _ => {
                return Err(Unsupported(
                    "MUNGE refusing a credential would need a second key on the one host".into(),
                ))
            }
        };
        self.next.set(next);
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        self.next.take();
        if self.drained.take() {
            self.nodes("resume");
        }
    }

    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let name = format!("gangway-{}", cluster.0);
        self.slurm
            .cmd("squeue", &["-h", "-o", "%i|%j|%k|%T"])
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.splitn(4, '|').collect();
                (f.len() == 4 && f[1] == name).then(|| Resource {
                    kind: format!("job ({})", f[3]),
                    id: f[0].into(),
                    cluster: f[1].strip_prefix("gangway-").map(String::from),
                    owner: f[2].strip_prefix("gangway-owner=").map(String::from),
                })
            })
            .collect()
    }

    fn lists_clusters(&self) -> bool {
        false
    }

    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported> {
        let p = provider(&self.slurm, &self.work.path().join("other"), OTHER);
        Ok((Box::new(p), OTHER.into()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slurm_provider_keeps_the_provider_contract() {
    let Some(slurm) = SlurmCluster::start(4) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let h = Slurm {
        p: provider(&slurm, work.path(), OWNER),
        slurm,
        work,
        next: Next::default(),
        drained: Flag::default(),
    };
    contract::run(&h).await;
}
