//! Gang startup: every node set up, a barrier, then the run on every node
//! at once with topology-ordered ranks; any rank failing stops the gang.
//!
//! A job is driven by one process (`gangway __drive`, detached from the
//! terminal) that owns the job's lock, so the job outlives the terminal that
//! launched it and `status` can always tell a live job from a dead driver.

mod driver;
mod files;
pub(crate) mod gpus;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub(crate) use crate::core::transport::{NodeCommand, Transport, TransportError};
pub(crate) use driver::{drive, DriveError, GRACE};

use crate::core::state::NodeRow;

/// The port rank 0 listens on unless the task sets `MASTER_PORT`.
pub(crate) const DEFAULT_MASTER_PORT: u16 = 29500;

/// Where a task's workdir lands on every node (SkyPilot's path).
pub(crate) const WORKDIR_ON_NODE: &str = "~/sky_workdir";

/// Where checkpoints go on a node unless the task says otherwise.
pub(crate) const DEFAULT_CHECKPOINT_DIR: &str = "~/gangway_checkpoints";

/// The [`NodeRow::extra`] fact of a node that survived the loss of
/// others in its gang (`core::replace`): its setup already ran and is not
/// run again, and its checkpoint directory is rolled back to the kept
/// checkpoint before the run resumes, like the new nodes'.
pub(crate) const SURVIVOR_FACT: &str = "gang.survivor";

/// Whether `n` carries [`SURVIVOR_FACT`].
pub(crate) fn survivor(n: &NodeRow) -> bool {
    n.extra.contains_key(SURVIVOR_FACT)
}

/// What a job runs, as stored with it. Never holds secret values: those go
/// to the driver over a pipe and only into the nodes' environments.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct JobSpec {
    /// Task name.
    pub(crate) name: Option<String>,
    /// Setup script (skipped by `exec`).
    pub(crate) setup: Option<String>,
    /// Run script.
    pub(crate) run: Option<String>,
    /// Environment values (secrets excluded).
    pub(crate) envs: Vec<(String, String)>,
    /// Names of the secrets the driver must be handed.
    pub(crate) secret_names: Vec<String>,
    /// Local workdir to sync to every node.
    pub(crate) workdir: Option<PathBuf>,
    /// A git workdir (`workdir: {url, ref}`), cloned on every node in its
    /// storage step.
    #[serde(default)]
    pub(crate) git_workdir: Option<GitWorkdir>,
    /// `(path on node, local path)` pairs to copy.
    pub(crate) file_mounts: Vec<(String, PathBuf)>,
    /// Nodes the job runs on (the first `num_nodes` ranks).
    pub(crate) num_nodes: u32,
    /// GPUs per node.
    pub(crate) gpus_per_node: u32,
    /// `checkpoint.path`, if the task set one.
    pub(crate) checkpoint_dir: Option<String>,
    /// Tear the cluster down once the job ends.
    pub(crate) down_after: bool,
    /// `GANGWAY_JOB_ID` to give (a managed job keeps its id across runs);
    /// default: the cluster job's id.
    #[serde(default)]
    pub(crate) job_id: Option<String>,
    /// `GANGWAY_RESTART_COUNT`.
    #[serde(default)]
    pub(crate) restart_count: u32,
    /// A kept checkpoint to copy into every node's checkpoint directory
    /// before setup.
    #[serde(default)]
    pub(crate) restore_from: Option<PathBuf>,
    /// The task's `ports` (inclusive ranges), for `GANGWAY_PORT_<p>`.
    #[serde(default)]
    pub(crate) ports: Vec<(u16, u16)>,
    /// Bucket `file_mounts`, made on every node by rclone before setup.
    #[serde(default)]
    pub(crate) bucket_mounts: Vec<crate::core::storage::BucketMount>,
    /// A bucket checkpoint to restore into every node's checkpoint
    /// directory before setup.
    #[serde(default)]
    pub(crate) restore_bucket: Option<crate::core::storage::Restore>,
}

impl JobSpec {
    /// Takes what this machine uploads to the nodes (the workdir, then the
    /// local file mounts) as (where on the node, local path) pairs.
    pub(crate) fn take_local_files(&mut self) -> Vec<(String, PathBuf)> {
        let mut files = Vec::new();
        if let Some(w) = self.workdir.take() {
            files.push((WORKDIR_ON_NODE.to_string(), w));
        }
        files.append(&mut self.file_mounts);
        files
    }
}

/// `workdir: {url: ..., ref: ...}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct GitWorkdir {
    /// The repository.
    pub(crate) url: String,
    /// Branch, tag or commit; the default branch when absent.
    pub(crate) git_ref: Option<String>,
}

/// Which phase a command belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Bucket mounts, before setup.
    Storage,
    /// `setup`.
    Setup,
    /// `run`.
    Run,
}

/// Everything a node's environment is made from.
pub(crate) struct GangInfo<'a> {
    /// The job.
    pub(crate) spec: &'a JobSpec,
    /// Secret values (from the driver's pipe).
    pub(crate) secrets: &'a [(String, String)],
    /// Nodes in rank order.
    pub(crate) nodes: &'a [NodeRow],
    /// Cluster name.
    pub(crate) cluster: &'a str,
    /// Job id.
    pub(crate) job_id: i64,
    /// Checkpoint directory as each node (by rank) sees it.
    pub(crate) checkpoint_dirs: Vec<String>,
    /// The storage step's credentials (rclone's settings for each bucket):
    /// given to that step only.
    pub(crate) storage_env: Vec<(String, String)>,
    /// Each bucket mount's path as each node (by rank) sees it.
    pub(crate) mount_dirs: Vec<Vec<String>>,
    /// The workdir's path as each node (by rank) sees it.
    pub(crate) workdir_dirs: Vec<String>,
}

/// The environment of one node's setup or run: the task's values and
/// secrets, then gangway's, torchrun's and SkyPilot's names.
pub(crate) fn node_env(phase: Phase, g: &GangInfo<'_>, rank: usize) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = g.spec.envs.clone();
    vars.extend(g.secrets.iter().cloned());
    let mut env = NodeEnv { g, rank, vars };
    env.gang();
    match phase {
        Phase::Storage => env.storage(),
        Phase::Setup => env.setup(),
        Phase::Run => env.run(),
    }
    env.vars
}

/// One node's environment being built from its gang's [`GangInfo`].
struct NodeEnv<'g> {
    g: &'g GangInfo<'g>,
    rank: usize,
    vars: Vec<(String, String)>,
}

impl NodeEnv<'_> {
    /// Sets `k` to `v`, dropping an earlier value: the new one goes last.
    fn set(&mut self, k: &str, v: String) {
        self.vars.retain(|(name, _)| name != k);
        self.vars.push((k.to_string(), v));
    }

    /// Every phase's names: the gang's size and ids, and this node's GPUs,
    /// topology and checkpoint directory.
    fn gang(&mut self) {
        let (g, rank) = (self.g, self.rank);
        let (spec, nodes, cluster) = (g.spec, g.nodes, g.cluster);
        let checkpoint_dir = g.checkpoint_dirs.get(rank).map_or("", String::as_str);
        let n = nodes.len().to_string();
        // GPUs found on the node itself (ssh pools) win over the catalog's.
        let gpus = nodes[rank]
            .extra
            .get("gpus.discovered")
            .cloned()
            .unwrap_or_else(|| spec.gpus_per_node.to_string());
        let task_id = match &spec.job_id {
            Some(id) => format!("gangway-job-{id}"),
            None => format!("gangway-{cluster}-{}", g.job_id),
        };
        self.set("GANGWAY_NUM_NODES", n.clone());
        self.set("GANGWAY_NUM_GPUS_PER_NODE", gpus.clone());
        self.set("GANGWAY_CLUSTER", cluster.to_string());
        let job_id = spec.job_id.clone().unwrap_or_else(|| g.job_id.to_string());
        self.set("GANGWAY_JOB_ID", job_id);
        self.set("GANGWAY_NODE_TOPOLOGY", nodes[rank].topology.clone());
        self.set("GANGWAY_CHECKPOINT_DIR", checkpoint_dir.to_string());
        // The cluster job this process belongs to: how a process is matched
        // to its run before anyone signals it (pids are reused).
        self.set("GANGWAY_RUN", g.job_id.to_string());
        self.set("SKYPILOT_NUM_NODES", n);
        self.set("SKYPILOT_NUM_GPUS_PER_NODE", gpus);
        self.set("SKYPILOT_TASK_ID", task_id);
    }

    /// The storage step's: the buckets' credentials, where each bucket
    /// mount goes and the git workdir to clone.
    fn storage(&mut self) {
        let (g, rank) = (self.g, self.rank);
        self.vars.extend(g.storage_env.iter().cloned());
        if let Some(dirs) = g.mount_dirs.get(rank) {
            for (i, d) in dirs.iter().enumerate() {
                self.set(&format!("GANGWAY_MOUNT_{i}"), d.clone());
            }
        }
        if let (Some(git), Some(dir)) = (&g.spec.git_workdir, g.workdir_dirs.get(rank)) {
            self.set("GANGWAY_WORKDIR", dir.clone());
            self.set("GW_GIT_URL", git.url.clone());
            self.set("GW_GIT_REF", git.git_ref.clone().unwrap_or_default());
        }
    }

    /// Setup's: this node's rank and every node's address.
    fn setup(&mut self) {
        let ips = node_ips(self.g.nodes);
        self.set("GANGWAY_SETUP_NODE_RANK", self.rank.to_string());
        self.set("GANGWAY_SETUP_NODE_IPS", ips.clone());
        self.set("SKYPILOT_SETUP_NODE_RANK", self.rank.to_string());
        self.set("SKYPILOT_SETUP_NODE_IPS", ips);
    }

    /// The run's: ports, this node's rank, every node's address, the head
    /// and torchrun's `MASTER_ADDR`/`MASTER_PORT`.
    fn run(&mut self) {
        let (g, rank) = (self.g, self.rank);
        let ips = node_ips(g.nodes);
        let head = g
            .nodes
            .first()
            .map(|n| n.private_ip.clone())
            .unwrap_or_default();
        let port = master_port(g.spec, g.nodes);
        self.ports();
        self.set("GANGWAY_NODE_RANK", rank.to_string());
        self.set("GANGWAY_NODE_IPS", ips.clone());
        self.set("GANGWAY_HEAD_IP", head.clone());
        self.set("GANGWAY_RESTART_COUNT", g.spec.restart_count.to_string());
        self.set("MASTER_ADDR", head);
        self.set("MASTER_PORT", port);
        self.set("NODE_RANK", rank.to_string());
        self.set("NNODES", g.nodes.len().to_string());
        self.set("SKYPILOT_NODE_RANK", rank.to_string());
        self.set("SKYPILOT_NODE_IPS", ips);
    }

    /// On a node sharing its address: its own port range and every node's
    /// first port; then where each of the task's ports is on this node.
    fn ports(&mut self) {
        let (g, rank) = (self.g, self.rank);
        if let Some((first, last)) = node_ports(&g.nodes[rank]) {
            self.set("GANGWAY_PORT_RANGE", format!("{first}-{last}"));
            let firsts: Vec<String> = g
                .nodes
                .iter()
                .map(|n| node_ports(n).map_or(String::new(), |p| p.0.to_string()))
                .collect();
            self.set("GANGWAY_NODE_PORTS", firsts.join("\n"));
        }
        for (task_port, here) in task_ports(&g.spec.ports, node_ports(&g.nodes[rank])) {
            self.set(&format!("GANGWAY_PORT_{task_port}"), here.to_string());
        }
    }
}

/// Every node's private address, one a line, in rank order.
fn node_ips(nodes: &[NodeRow]) -> String {
    let ips: Vec<&str> = nodes.iter().map(|n| n.private_ip.as_str()).collect();
    ips.join("\n")
}

/// The port rank 0 listens on. Nodes that share one address (the local
/// provider where only 127.0.0.1 answers) each own a port range: rank 0
/// listens on the first port of its own, whatever the task asked for;
/// otherwise the task's `MASTER_PORT`, or the default.
fn master_port(spec: &JobSpec, nodes: &[NodeRow]) -> String {
    match nodes.first().and_then(node_ports) {
        Some((first, _)) => first.to_string(),
        None => spec
            .envs
            .iter()
            .find(|(k, _)| k == "MASTER_PORT")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| DEFAULT_MASTER_PORT.to_string()),
    }
}

/// The node's own port range, where it shares its address with others
/// ([`gangway_provider::PORT_RANGE_FACT`]).
fn node_ports(node: &NodeRow) -> Option<(u16, u16)> {
    node.extra
        .get(gangway_provider::PORT_RANGE_FACT)
        .and_then(|r| gangway_provider::parse_port_range(r))
}

/// Where each of the task's ports is on a node: itself on a node with an
/// address of its own; on a node with a port range `(first, last)`, the
/// next ports after `first` (which is `MASTER_PORT`'s), in the order the
/// task lists them. Ports beyond the range get none (the local provider
/// refuses such a launch).
fn task_ports(ports: &[(u16, u16)], range: Option<(u16, u16)>) -> Vec<(u16, u16)> {
    let wanted = ports
        .iter()
        .flat_map(|(a, b)| *a..=*b)
        .collect::<std::collections::BTreeSet<u16>>();
    match range {
        None => wanted.into_iter().map(|p| (p, p)).collect(),
        Some((first, last)) => wanted
            .into_iter()
            .zip(first.saturating_add(1)..=last)
            .collect(),
    }
}

/// Stores a job on `cluster` and starts its driver (`gangway __drive`,
/// detached in its own process group); secrets go to it over a pipe and
/// are never stored. Returns the job id.
pub(crate) fn submit(
    store: &crate::core::state::Store,
    home: &std::path::Path,
    cluster: &str,
    spec: &JobSpec,
    secrets: &[(String, String)],
) -> Result<i64, std::io::Error> {
    use std::io::Write;
    use std::process::Stdio;
    let text = serde_json::to_string(spec)?;
    let id = store
        .add_job(cluster, spec.name.as_deref(), &text)
        .map_err(std::io::Error::other)?;
    let log_dir = store.job_log_dir(id);
    std::fs::create_dir_all(&log_dir)?;
    let driver_log = std::fs::File::create(log_dir.join("driver.log"))?;
    // Its own process group: Ctrl-C in the launching terminal reaches only
    // the launcher, which decides what the driver is told.
    let exe = std::env::current_exe()?;
    let mut cmd = crate::core::runtime::detached(&exe, home, &["__drive", &id.to_string()]);
    cmd.stdin(Stdio::piped()).stderr(driver_log);
    // The driver records its own pid once it holds the job's lock.
    let mut child = cmd.spawn()?;
    {
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(serde_json::to_string(secrets)?.as_bytes())?;
    }
    // Reap it when it exits, so a long-lived caller (the managed-job
    // controller) collects no zombies; without a thread per driver, which
    // a controller of a thousand jobs would hold a thousand of.
    reap_later(child);
    Ok(id)
}

/// Drivers this process started and has not seen exit.
static DRIVERS: gangway_provider::children::Children = gangway_provider::children::Children::new();

fn reap_later(child: std::process::Child) {
    DRIVERS.adopt(child);
}

/// Waits for the drivers this process started that have exited (never
/// blocks). A long-lived caller calls it now and then; [`submit`] does too.
pub(crate) fn reap_drivers() {
    DRIVERS.reap();
}

/// Marks jobs whose driver died as `FAILED_DRIVER` and kills the ranks
/// they left running (recorded by the driver in the job's `pids` file), so
/// a dead driver never leaves a gang behind.
pub(crate) fn reap(
    store: &crate::core::state::Store,
) -> Result<usize, crate::core::state::StateError> {
    let reaped = store.reap_dead_jobs()?;
    for job in &reaped {
        let Some(cluster) = store.cluster(&job.cluster)? else {
            continue;
        };
        let Some(transport) = cluster
            .cloud
            .as_deref()
            .and_then(|c| transport_for(c, store.home(), &job.cluster))
        else {
            continue;
        };
        let nodes = store.nodes(&job.cluster)?;
        // Remote ranks are reached over a connection this process does not
        // have yet (a transport without connections answers at once).
        // reap is synchronous and may run inside a runtime, so the
        // connection is made on a thread of its own.
        let connected = std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .is_ok_and(|rt| rt.block_on(transport.connect(&nodes)).is_ok())
            })
            .join()
            .unwrap_or(false)
        });
        if !connected {
            tracing::warn!(
                "job {} on {}: cannot reach the nodes to stop its ranks",
                job.id,
                job.cluster
            );
            continue;
        }
        signal_run(store, transport.as_ref(), &nodes, job.id, libc::SIGKILL);
    }
    Ok(reaped.len())
}

/// Sends `signal` to every rank of cluster job `run`, from the process
/// groups its driver recorded (each checked against the run's id before it
/// is signalled, so a reused pid is never hit).
pub(crate) fn signal_run(
    store: &crate::core::state::Store,
    transport: &dyn Transport,
    nodes: &[NodeRow],
    run: i64,
    signal: i32,
) {
    signal_ranks(&store.job_log_dir(run), transport, nodes, run, signal);
}

/// [`signal_run`] for the run whose logs are in `log_dir`: needs no store,
/// so it can run on a thread of its own.
pub(crate) fn signal_ranks(
    log_dir: &std::path::Path,
    transport: &dyn Transport,
    nodes: &[NodeRow],
    run: i64,
    signal: i32,
) {
    let pids = std::fs::read_to_string(log_dir.join("pids")).unwrap_or_default();
    for line in pids.lines() {
        let mut it = line
            .split_whitespace()
            .filter_map(|w| w.parse::<u32>().ok());
        if let (Some(rank), Some(pgid)) = (it.next(), it.next()) {
            if let Some(node) = nodes.iter().find(|n| n.rank == rank) {
                transport.signal_job(node, pgid, run, signal);
            }
        }
    }
}

/// The transport for the nodes of `cloud` in `cluster`: the one its
/// provider brings ([`gangway_provider::Provider::transport`]), else SSH
/// with host keys verified strictly. `None` for a cloud this build has no
/// provider for.
pub(crate) fn transport_for(
    cloud: &str,
    home: &std::path::Path,
    cluster: &str,
) -> Option<Box<dyn Transport>> {
    crate::core::registry::Providers::new(home).transport(cloud, home, cluster)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(rank: u32, ip: &str, path: &str) -> NodeRow {
        NodeRow {
            rank,
            instance_id: format!("i-{rank}"),
            private_ip: ip.into(),
            public_ip: None,
            zone: "local-a".into(),
            topology: path.into(),
            state: "running".into(),
            extra: Default::default(),
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn run_env_has_every_name_torchrun_and_skypilot_tasks_expect() {
        let spec = JobSpec {
            envs: vec![
                ("MODEL".into(), "gpt2".into()),
                ("NODE_RANK".into(), "99".into()),
            ],
            gpus_per_node: 8,
            num_nodes: 3,
            ..JobSpec::default()
        };
        let secrets = vec![("TOKEN".to_string(), "t0k".to_string())];
        let nodes = [
            node(0, "10.0.0.5", "s1/l1"),
            node(1, "10.0.0.7", "s1/l1"),
            node(2, "10.0.0.2", "s1/l2"),
        ];
        let g = GangInfo {
            spec: &spec,
            secrets: &secrets,
            nodes: &nodes,
            cluster: "c",
            job_id: 7,
            checkpoint_dirs: vec!["/ck".into(); 3],
            storage_env: vec![],
            mount_dirs: vec![],
            workdir_dirs: vec![],
        };
        let env = node_env(Phase::Run, &g, 2);
        for (k, v) in [
            ("GANGWAY_NODE_RANK", "2"),
            ("NODE_RANK", "2"),
            ("SKYPILOT_NODE_RANK", "2"),
            ("GANGWAY_NUM_NODES", "3"),
            ("NNODES", "3"),
            ("SKYPILOT_NUM_NODES", "3"),
            ("GANGWAY_NODE_IPS", "10.0.0.5\n10.0.0.7\n10.0.0.2"),
            ("SKYPILOT_NODE_IPS", "10.0.0.5\n10.0.0.7\n10.0.0.2"),
            ("GANGWAY_HEAD_IP", "10.0.0.5"),
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29500"),
            ("GANGWAY_NUM_GPUS_PER_NODE", "8"),
            ("SKYPILOT_NUM_GPUS_PER_NODE", "8"),
            ("GANGWAY_CLUSTER", "c"),
            ("GANGWAY_JOB_ID", "7"),
            ("SKYPILOT_TASK_ID", "gangway-c-7"),
            ("GANGWAY_CHECKPOINT_DIR", "/ck"),
            ("GANGWAY_RESTART_COUNT", "0"),
            ("GANGWAY_NODE_TOPOLOGY", "s1/l2"),
            ("MODEL", "gpt2"),
            ("TOKEN", "t0k"),
        ] {
            assert_eq!(get(&env, k), Some(v), "{k}");
        }
        // gangway's own value wins over a task env of the same name, once.
        assert_eq!(env.iter().filter(|(k, _)| k == "NODE_RANK").count(), 1);
        assert_eq!(get(&env, "SKYPILOT_SETUP_NODE_RANK"), None);
    }

    #[test]
    fn setup_env_has_setup_names_and_a_task_master_port_is_kept() {
        let spec = JobSpec {
            envs: vec![("MASTER_PORT".into(), "12345".into())],
            ..JobSpec::default()
        };
        let nodes = [node(0, "10.0.0.1", ""), node(1, "10.0.0.2", "")];
        let g = GangInfo {
            spec: &spec,
            secrets: &[],
            nodes: &nodes,
            cluster: "c",
            job_id: 1,
            checkpoint_dirs: vec!["/ck".into(); 3],
            storage_env: vec![],
            mount_dirs: vec![],
            workdir_dirs: vec![],
        };
        let setup = node_env(Phase::Setup, &g, 1);
        assert_eq!(get(&setup, "SKYPILOT_SETUP_NODE_RANK"), Some("1"));
        assert_eq!(get(&setup, "GANGWAY_SETUP_NODE_RANK"), Some("1"));
        assert_eq!(
            get(&setup, "SKYPILOT_SETUP_NODE_IPS"),
            Some("10.0.0.1\n10.0.0.2")
        );
        assert_eq!(get(&setup, "NODE_RANK"), None);
        assert_eq!(get(&setup, "GANGWAY_NODE_RANK"), None);
        let run = node_env(Phase::Run, &g, 0);
        assert_eq!(get(&run, "MASTER_PORT"), Some("12345"));
    }

    #[test]
    fn nodes_sharing_an_address_are_told_apart_by_port() {
        let spec = JobSpec {
            envs: vec![("MASTER_PORT".into(), "12345".into())],
            ports: vec![(8080, 8081), (9000, 9000)],
            ..JobSpec::default()
        };
        let mut nodes = [node(0, "127.0.0.1", ""), node(1, "127.0.0.1", "")];
        for (n, range) in nodes.iter_mut().zip(["20100-20149", "20150-20199"]) {
            n.extra
                .insert(gangway_provider::PORT_RANGE_FACT.into(), range.into());
        }
        let g = GangInfo {
            spec: &spec,
            secrets: &[],
            nodes: &nodes,
            cluster: "c",
            job_id: 1,
            checkpoint_dirs: vec!["/ck".into(); 2],
            storage_env: vec![],
            mount_dirs: vec![],
            workdir_dirs: vec![],
        };
        let run = node_env(Phase::Run, &g, 1);
        // Every rank meets rank 0 on the head's first port, not the task's.
        assert_eq!(get(&run, "MASTER_ADDR"), Some("127.0.0.1"));
        assert_eq!(get(&run, "MASTER_PORT"), Some("20100"));
        assert_eq!(get(&run, "GANGWAY_PORT_RANGE"), Some("20150-20199"));
        assert_eq!(get(&run, "GANGWAY_NODE_PORTS"), Some("20100\n20150"));
        assert_eq!(get(&run, "GANGWAY_PORT_8080"), Some("20151"));
        assert_eq!(get(&run, "GANGWAY_PORT_8081"), Some("20152"));
        assert_eq!(get(&run, "GANGWAY_PORT_9000"), Some("20153"));
        let head = node_env(Phase::Run, &g, 0);
        assert_eq!(get(&head, "MASTER_PORT"), Some("20100"));
        assert_eq!(get(&head, "GANGWAY_PORT_8080"), Some("20101"));

        // With addresses of their own, a task's port is itself.
        let plain = [node(0, "10.0.0.1", ""), node(1, "10.0.0.2", "")];
        let g = GangInfo { nodes: &plain, ..g };
        let run = node_env(Phase::Run, &g, 1);
        assert_eq!(get(&run, "MASTER_PORT"), Some("12345"));
        assert_eq!(get(&run, "GANGWAY_PORT_8081"), Some("8081"));
        assert_eq!(get(&run, "GANGWAY_PORT_RANGE"), None);
        assert_eq!(get(&run, "GANGWAY_NODE_PORTS"), None);
    }
}
